// Control-plane wire protocol (docs/architecture.md): framing, payload (de)serialisation, the HMAC
// challenge-response handshake, and a heartbeated, leased TCP connection.
//
// Frame on the wire (all integers little-endian):
//   magic u32 ("SKYF") | version u16 | type u16 | payload length u32 | payload
// The payload of a handshake frame (Challenge, AuthReply, AuthOk) is raw bytes; every other
// payload is a Boost.Serialization binary archive (no header) of the struct messages.hpp names
// for its type. Binary archives are not endian-portable: host and workers share an architecture.
//
// Handshake (the server speaks first; nothing is Boost-deserialised before it succeeds):
//   server -> Challenge  : server nonce (32 random bytes) | server X25519 key share (32)
//   client -> AuthReply  : node u32 LE | client nonce (32) | client key share (32) | client proof (32)
//   server -> AuthOk     : server proof (32)
// The proofs are HMAC-SHA256 of the pool secret over everything both sides sent, and every frame
// after the handshake travels sealed in a record (ChaCha20-Poly1305, keys from the X25519 secret
// and the pool secret): secure_channel.hpp holds that part. A peer that fails, sends anything
// else, or stays silent past the handshake timeout is disconnected and reported through the
// server's on_rejected callback; it never reaches the owner and no frame of it is ever delivered.
//
// Threading: a Connection serialises all of its handlers on one strand of the io_context it was
// created on, so the io_context may be run by any number of threads. on_frame and on_close run
// on that strand (never inside send/close/abort/start), so they may take locks the caller of
// those functions holds.
#pragma once

#include <boost/archive/binary_iarchive_impl.hpp>
#include <boost/archive/binary_oarchive.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/serialization/array_optimization.hpp>
#include <boost/serialization/collection_size_type.hpp>
#include <boost/serialization/item_version_type.hpp>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <streambuf>
#include <string>
#include <string_view>
#include <typeinfo>

#include "messages.hpp"
#include "secure_channel.hpp"

namespace skyforge::net {

constexpr uint32_t kMagic = 0x46594B53;  // bytes 'S' 'K' 'Y' 'F' read as a little-endian u32
constexpr uint16_t kProtocolVersion = 6;  // 2: Job holds a NodeIdentity; its mode is a byte (JobMode); 3: TaskBatch.tasks; 4: Progress.status; 5: OutputAck (a worker stops forwarding output without it; an older host never sends it); 6: key shares in the handshake, sealed records after it
constexpr size_t kHeaderSize = 12;
constexpr uint32_t kDefaultMaxFrame = 16u << 20;  // bound on one frame's payload, in bytes
constexpr size_t kNonceSize = 32;
constexpr size_t kMacSize = 32;

// Anything a peer sent that this end cannot accept. The connection it came from is unusable.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// The handshake failed: the peer does not hold the pool secret (or we do not hold its).
class AuthError : public ProtocolError {
 public:
  using ProtocolError::ProtocolError;
};

struct Frame {
  msg::Type type;
  std::string payload;
};

struct FrameHeader {
  uint16_t version = 0;
  msg::Type type{};
  uint32_t length = 0;  // payload bytes
};

// Parses and validates a kHeaderSize-byte header: magic, version, known type, length <= max_frame.
// Throws ProtocolError naming what is wrong.
FrameHeader decode_header(const char* header, uint32_t max_frame);
// Header + payload. Throws ProtocolError if the payload does not fit a u32 length.
std::string encode_frame(msg::Type type, std::string_view payload);
// Appends the encoded frame to `out` (saves a copy on hot paths).
void append_frame(std::string& out, msg::Type type, std::string_view payload);

// Incremental decoder for a byte stream. Errors are sticky: once a header is rejected every
// later next() throws the same error. A header is validated as soon as its 12 bytes are in, so an
// oversized frame is refused before any of its payload is buffered.
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_frame = kDefaultMaxFrame);
  void feed(const char* data, size_t size);
  // The next complete frame, or nullopt if more bytes are needed. Throws ProtocolError.
  std::optional<Frame> next();
  // At end of stream: throws ProtocolError ("truncated frame: got X of Y bytes") if a partial
  // frame is pending (or the sticky error, if any).
  void finish();
  size_t buffered() const { return buf_.size() - pos_; }
  uint32_t max_frame() const { return max_frame_; }

 private:
  void check_header();
  uint32_t max_frame_;
  std::string buf_;
  size_t pos_ = 0;
  std::optional<FrameHeader> header_;  // validated header of the frame at pos_
  std::string error_;
};

// ---- payloads -------------------------------------------------------------------------------

namespace detail {
// A read-only streambuf over caller-owned bytes.
class ViewBuf : public std::streambuf {
 public:
  explicit ViewBuf(std::string_view v);
  size_t remaining() const { return static_cast<size_t>(egptr() - gptr()); }
};

// A write-only streambuf appending to a std::string.
class StringSinkBuf : public std::streambuf {
 public:
  explicit StringSinkBuf(std::string& out) : out_(out) {}

 protected:
  int_type overflow(int_type c) override;
  std::streamsize xsputn(const char* s, std::streamsize n) override;

 private:
  std::string& out_;
};

// boost::archive::binary_iarchive with every length prefix checked against the bytes that are
// left, so a forged length cannot make the reader allocate more than a small multiple of the
// payload it actually received (worst case: sizeof(element) * payload size, and the payload is
// itself bounded by the frame limit). Also rejects bools other than 0/1, and class information
// the writer never produces (a class or element version other than 0, object tracking: messages hold no
// pointers), so that whatever it accepts serialises back to the same bytes.
class BoundedIArchive
    : public boost::archive::binary_iarchive_impl<BoundedIArchive, char, std::char_traits<char>> {
  using Base = boost::archive::binary_iarchive_impl<BoundedIArchive, char, std::char_traits<char>>;
  friend class boost::archive::detail::interface_iarchive<BoundedIArchive>;
  friend class boost::archive::basic_binary_iarchive<BoundedIArchive>;
  friend class boost::archive::load_access;

 public:
  explicit BoundedIArchive(ViewBuf& buf);
  size_t remaining() const { return buf_.remaining(); }

 public:  // Boost's primitive loaders reach these through the most derived type
  using Base::load;
  void load(std::string& s);
  void load(bool& b);

 protected:
  template <class T>
  void load_override(T& t) {
    Base::load_override(t);
  }
  void load_override(boost::serialization::collection_size_type& t);
  void load_override(boost::archive::version_type& t);
  void load_override(boost::serialization::item_version_type& t);
  void load_override(boost::archive::tracking_type& t);

 private:
  ViewBuf& buf_;
};

[[noreturn]] void throw_malformed(const char* type_name, const char* what);
}  // namespace detail
}  // namespace skyforge::net

// The writer (binary_oarchive) writes a vector of arithmetic values as one block; the reader
// must read it the same way (the trait is per archive type). The block's count is checked
// against the bytes left like every other length.
BOOST_SERIALIZATION_USE_ARRAY_OPTIMIZATION(skyforge::net::detail::BoundedIArchive)

namespace skyforge::net {

template <class T>
std::string serialize(const T& value) {
  std::string out;
  {
    detail::StringSinkBuf sink(out);
    boost::archive::binary_oarchive ar(sink, boost::archive::no_header | boost::archive::no_codecvt);
    ar << value;
  }
  return out;
}

// Throws ProtocolError ("malformed <type> payload: ...") on truncated, oversized, trailing or
// otherwise invalid input; never allocates more than a small multiple of payload.size().
template <class T>
T deserialize(std::string_view payload) {
  T value{};
  try {
    detail::ViewBuf buf(payload);
    detail::BoundedIArchive ar(buf);
    ar >> value;
    if (ar.remaining() != 0)
      throw ProtocolError(std::to_string(ar.remaining()) + " trailing bytes after the message");
  } catch (const ProtocolError& e) {
    detail::throw_malformed(typeid(T).name(), e.what());
  } catch (const std::bad_alloc&) {
    detail::throw_malformed(typeid(T).name(), "a length prefix is too large");
  } catch (const std::exception& e) {  // boost::archive::archive_exception, std::length_error, ...
    detail::throw_malformed(typeid(T).name(), e.what());
  }
  return value;
}

// ---- crypto helpers -------------------------------------------------------------------------

std::string hmac_sha256(std::string_view key, std::string_view data);  // 32 raw bytes
std::string random_bytes(size_t n);                                     // CSPRNG (RAND_bytes)
std::string random_hex(size_t bytes);                                   // 2*bytes hex digits

// ---- connection -----------------------------------------------------------------------------

struct ConnectionOptions {
  uint32_t max_frame = kDefaultMaxFrame;  // largest payload accepted (and sent)
  int heartbeat_ms = 500;                 // a Heartbeat frame goes out this often
  int lease_ms = 5000;                    // no bytes from the peer for this long: connection lost
  int handshake_timeout_ms = 5000;        // server side: the whole handshake must finish in time
  size_t max_queued_bytes = size_t{1} << 30;  // send queue bound; beyond it the connection fails
};

// After the host's Shutdown at a restart: how long the host waits for a node's workers to be
// gone (a lease, at least 1 s, and 10 s more), and the part of it a worker gives its app before
// it ends without it (docs/training.md, "Surviving a lost node"): 6 s less, so the worker is gone first.
inline std::chrono::milliseconds shutdown_wait(int lease_ms) {
  return std::chrono::milliseconds((lease_ms > 1000 ? lease_ms : 1000) + 10000);
}
inline std::chrono::milliseconds stop_grace(int lease_ms) {
  return shutdown_wait(lease_ms) - std::chrono::milliseconds(6000);
}

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using FrameHandler = std::function<void(msg::Type, std::string&& payload)>;
  using CloseHandler = std::function<void(const std::string& reason)>;

  // Used by Server and connect(); `socket` has completed the handshake as `node`, which gave
  // this connection its record keys.
  Connection(boost::asio::ip::tcp::socket socket, uint32_t node, ConnectionOptions options, const SessionKeys& keys);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Begins the read loop, heartbeats and the lease. Call once. Heartbeat frames are consumed
  // here and never reach on_frame. on_close is called exactly once, with the reason, after
  // which neither handler is called again (and both are released). If the connection was
  // closed before start(), on_close is called with that reason.
  void start(FrameHandler on_frame, CloseHandler on_close);

  // Thread-safe; frames go out in call order, never interleaved. Sending on a closed or
  // closing connection is a silent no-op. Throws ProtocolError if payload > max_frame.
  void send(msg::Type type, std::string payload);
  template <class T>
  void send_msg(msg::Type type, const T& m) {
    send(type, serialize(m));
  }

  // Graceful: stop accepting sends, flush what is queued, send FIN, then wait (up to lease_ms)
  // for the peer's FIN so the peer reads everything; on_close("closed locally"). Frames that
  // arrive after close() are discarded. Asynchronous: returns at once.
  void close();
  // Immediate: drops queued data; on_close("aborted locally"). Asynchronous: returns at once.
  void abort();
  // Blocks until on_close has run (or the timeout passes); false on timeout. Never call it
  // from a handler of this connection's io_context.
  bool wait_closed(int timeout_ms);
  bool is_closed() const;
  // The reason given to on_close, once closed; empty before.
  std::string close_reason() const;

  std::string remote_address() const { return remote_; }
  uint32_t node() const { return node_; }
  const ConnectionOptions& options() const { return opts_; }

 private:
  void do_start(FrameHandler on_frame, CloseHandler on_close);
  void read_some();
  void on_read(const boost::system::error_code& ec, size_t n);
  void do_write();
  void begin_linger();
  void arm_heartbeat();
  void arm_lease(std::chrono::steady_clock::time_point deadline);
  void finish(const std::string& reason);

  boost::asio::ip::tcp::socket socket_;
  boost::asio::strand<boost::asio::any_io_executor> strand_;
  boost::asio::steady_timer heartbeat_timer_;
  boost::asio::steady_timer lease_timer_;
  const uint32_t node_;
  const ConnectionOptions opts_;
  const std::string remote_;

  // strand-only state
  RecordOpener opener_;
  FrameDecoder decoder_;
  FrameHandler on_frame_;
  CloseHandler on_close_;
  std::array<char, 64 * 1024> rbuf_{};
  std::string wbuf_;  // bytes being written
  std::chrono::steady_clock::time_point last_rx_;
  bool started_ = false;
  bool closing_ = false;  // close() requested: flushing, then lingering for the peer's FIN
  bool lingering_ = false;
  bool closed_ = false;

  // shared with senders
  mutable std::mutex out_mu_;
  RecordSealer sealer_;  // records are numbered in the order they enter the outbox
  std::string outbox_;
  bool accepting_ = true;
  bool write_pending_ = false;  // a do_write is posted or an async_write is in flight

  // close notification for wait_closed()
  mutable std::mutex done_mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::string reason_;
};

// Accepts connections, runs the server side of the handshake, and hands authenticated
// connections (not yet started) to on_authenticated. Callbacks run on the io_context.
class Server {
 public:
  using AuthenticatedHandler = std::function<void(std::shared_ptr<Connection>)>;
  using RejectedHandler = std::function<void(const std::string& peer, const std::string& why)>;

  // Binds and listens at once (throws std::system_error-derived boost::system::system_error
  // or ProtocolError on failure), so port() is valid on return.
  Server(boost::asio::io_context& io, const std::string& bind_address, uint16_t port, std::string secret,
         ConnectionOptions options, AuthenticatedHandler on_authenticated, RejectedHandler on_rejected = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const { return port_; }
  // Synchronous and idempotent: the listening socket is closed and pending handshakes are
  // cancelled when it returns; no callback starts after that.
  void close();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

// Client side: connects and runs the handshake synchronously with blocking socket operations
// bounded by `timeout_ms` in total (it does not need the io_context to be running, and is safe
// while another thread runs it). Returns a connection, not yet started, bound to `io`.
// Throws ProtocolError ("connection refused to host:port", "timed out ...") or AuthError.
std::shared_ptr<Connection> connect(boost::asio::io_context& io, const std::string& host, uint16_t port,
                                    const std::string& secret, uint32_t node, ConnectionOptions options,
                                    int timeout_ms);

}  // namespace skyforge::net
