#include "protocol.hpp"

#include <boost/archive/detail/archive_serializer_map.hpp>
#include <boost/archive/impl/archive_serializer_map.ipp>
#include <boost/archive/impl/basic_binary_iarchive.ipp>
#include <boost/archive/impl/basic_binary_iprimitive.ipp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/core/demangle.hpp>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

// The bounded archive's out-of-line members come from Boost's own implementation files.
namespace boost::archive {
namespace detail {
template class archive_serializer_map<skyforge::net::detail::BoundedIArchive>;
}
template class basic_binary_iprimitive<skyforge::net::detail::BoundedIArchive, char, std::char_traits<char>>;
template class basic_binary_iarchive<skyforge::net::detail::BoundedIArchive>;
}  // namespace boost::archive

namespace skyforge::msg {
bool known_type(uint16_t t) {
  switch (static_cast<Type>(t)) {
    case Type::Challenge:
    case Type::AuthReply:
    case Type::AuthOk:
    case Type::Hello:
    case Type::Job:
    case Type::Heartbeat:
    case Type::Log:
    case Type::TaskBatch:
    case Type::TaskResults:
    case Type::RunResult:
    case Type::Shutdown:
    case Type::Ready:
    case Type::Progress:
    case Type::OutputAck:
    case Type::KvSet:
    case Type::KvGet:
    case Type::KvAdd:
    case Type::KvReply:
      return true;
  }
  return false;
}
}  // namespace skyforge::msg

namespace skyforge::net {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// Asio opens and accepts sockets without SOCK_CLOEXEC: mark each one at once, so that no
// process a worker or a plugin starts inherits a pool connection (docs/architecture.md).
void close_on_exec(int fd) {
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

void put_u16(char* p, uint16_t v) {
  p[0] = static_cast<char>(v & 0xff);
  p[1] = static_cast<char>(v >> 8);
}
void put_u32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint16_t get_u16(const char* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8));
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}
std::string le32(uint32_t v) {
  std::string s(4, '\0');
  put_u32(s.data(), v);
  return s;
}

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08X", v);
  return b;
}

std::string endpoint_text(const tcp::endpoint& ep) {
  const auto a = ep.address();
  if (a.is_v6()) return "[" + a.to_string() + "]:" + std::to_string(ep.port());
  return a.to_string() + ":" + std::to_string(ep.port());
}

constexpr size_t kChallengeSize = kNonceSize + kKeyShareSize;
constexpr size_t kKeptOutboxCapacity = 256 * 1024;  // an idle connection keeps at most this much send buffer
constexpr size_t kAuthReplySize = 4 + kNonceSize + kKeyShareSize + kMacSize;
constexpr uint32_t kHandshakeMaxFrame = 256;

}  // namespace

// ---- framing --------------------------------------------------------------------------------

FrameHeader decode_header(const char* p, uint32_t max_frame) {
  const uint32_t magic = get_u32(p);
  if (magic != kMagic)
    throw ProtocolError("bad magic: expected " + hex32(kMagic) + " (\"SKYF\"), got " + hex32(magic) +
                        " (not a skyforge peer)");
  FrameHeader h;
  h.version = get_u16(p + 4);
  if (h.version != kProtocolVersion)
    throw ProtocolError("unsupported protocol version " + std::to_string(h.version) + " (this build speaks version " +
                        std::to_string(kProtocolVersion) + ")");
  const uint16_t type = get_u16(p + 6);
  if (!msg::known_type(type)) throw ProtocolError("unknown frame type " + std::to_string(type));
  h.type = static_cast<msg::Type>(type);
  h.length = get_u32(p + 8);
  if (h.length > max_frame)
    throw ProtocolError("frame too large: " + std::to_string(h.length) + " bytes of payload exceed the limit of " +
                        std::to_string(max_frame) + " bytes");
  return h;
}

namespace {
std::array<char, kHeaderSize> frame_header(msg::Type type, size_t payload_size) {
  if (payload_size > UINT32_MAX)
    throw ProtocolError("frame too large: " + std::to_string(payload_size) + " bytes do not fit a frame");
  std::array<char, kHeaderSize> h{};
  put_u32(h.data(), kMagic);
  put_u16(h.data() + 4, kProtocolVersion);
  put_u16(h.data() + 6, static_cast<uint16_t>(type));
  put_u32(h.data() + 8, static_cast<uint32_t>(payload_size));
  return h;
}
}  // namespace

void append_frame(std::string& out, msg::Type type, std::string_view payload) {
  const auto h = frame_header(type, payload.size());
  out.append(h.data(), h.size());
  out.append(payload.data(), payload.size());
}

std::string encode_frame(msg::Type type, std::string_view payload) {
  std::string out;
  out.reserve(kHeaderSize + payload.size());
  append_frame(out, type, payload);
  return out;
}

FrameDecoder::FrameDecoder(uint32_t max_frame) : max_frame_(max_frame) {}

void FrameDecoder::check_header() {
  if (!error_.empty() || header_ || buffered() < kHeaderSize) return;
  try {
    header_ = decode_header(buf_.data() + pos_, max_frame_);
  } catch (const ProtocolError& e) {
    error_ = e.what();
    buf_.clear();
    buf_.shrink_to_fit();
    pos_ = 0;
  }
}

void FrameDecoder::feed(const char* data, size_t size) {
  if (!error_.empty() || size == 0) return;  // a rejected stream is not buffered any further
  if (pos_ > 0 && (pos_ == buf_.size() || pos_ >= buf_.size() / 2)) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  // Validate a pending header before buffering more than it, so an oversized frame never gets
  // its payload stored.
  if (!header_ && buffered() < kHeaderSize) {
    const size_t take = std::min(size, kHeaderSize - buffered());
    buf_.append(data, take);
    data += take;
    size -= take;
    check_header();
    if (!error_.empty()) return;
  }
  buf_.append(data, size);
}

std::optional<Frame> FrameDecoder::next() {
  check_header();
  if (!error_.empty()) throw ProtocolError(error_);
  if (!header_) return std::nullopt;
  const size_t total = kHeaderSize + header_->length;
  if (buffered() < total) return std::nullopt;
  Frame f{header_->type, buf_.substr(pos_ + kHeaderSize, header_->length)};
  pos_ += total;
  header_.reset();
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  return f;
}

void FrameDecoder::finish() {
  check_header();
  if (!error_.empty()) throw ProtocolError(error_);
  const size_t have = buffered();
  if (have == 0) return;
  const size_t want = header_ ? kHeaderSize + header_->length : kHeaderSize;
  throw ProtocolError("truncated frame: got " + std::to_string(have) + " of " + std::to_string(want) + " bytes");
}

// ---- payloads -------------------------------------------------------------------------------

namespace detail {

ViewBuf::ViewBuf(std::string_view v) {
  char* p = const_cast<char*>(v.data());  // never written through: this buffer has no put area
  setg(p, p, p + v.size());
}

StringSinkBuf::int_type StringSinkBuf::overflow(int_type c) {
  if (!traits_type::eq_int_type(c, traits_type::eof())) out_.push_back(traits_type::to_char_type(c));
  return traits_type::not_eof(c);
}

std::streamsize StringSinkBuf::xsputn(const char* s, std::streamsize n) {
  out_.append(s, static_cast<size_t>(n));
  return n;
}

BoundedIArchive::BoundedIArchive(ViewBuf& buf)
    : Base(static_cast<std::streambuf&>(buf), boost::archive::no_header | boost::archive::no_codecvt), buf_(buf) {
  init(boost::archive::no_header | boost::archive::no_codecvt);
}

void BoundedIArchive::load_override(boost::serialization::collection_size_type& t) {
  Base::load_override(t);
  // Every element takes at least one byte, so a count above what is left is a lie.
  if (static_cast<size_t>(t) > remaining())
    throw ProtocolError("a collection claims " + std::to_string(static_cast<size_t>(t)) + " elements but only " +
                        std::to_string(remaining()) + " bytes are left");
}

void BoundedIArchive::load_override(boost::archive::version_type& t) {
  Base::load_override(t);
  if (t != boost::archive::version_type(0))
    throw ProtocolError("class version " + std::to_string(static_cast<unsigned>(t)) + " (this protocol writes 0)");
}

void BoundedIArchive::load_override(boost::serialization::item_version_type& t) {
  Base::load_override(t);
  if (t != boost::serialization::item_version_type(0))
    throw ProtocolError("element version " + std::to_string(static_cast<unsigned>(t)) + " (this protocol writes 0)");
}

void BoundedIArchive::load_override(boost::archive::tracking_type& t) {
  // Written as one raw byte (a bool): read it as a byte, never into a bool.
  unsigned char c = 0;
  load_binary(&c, 1);
  if (c != 0) throw ProtocolError("object tracking flag " + std::to_string(c) + " (messages hold no pointers)");
  t = boost::archive::tracking_type(false);
}

void BoundedIArchive::load(std::string& s) {
  std::size_t n = 0;
  load_binary(&n, sizeof n);
  if (n > remaining())
    throw ProtocolError("a string claims " + std::to_string(n) + " bytes but only " + std::to_string(remaining()) +
                        " are left");
  s.resize(n);
  if (n > 0) load_binary(s.data(), n);
}

void BoundedIArchive::load(bool& b) {
  unsigned char c = 0;
  load_binary(&c, 1);
  if (c > 1) throw ProtocolError("invalid bool value " + std::to_string(c));
  b = c != 0;
}

void throw_malformed(const char* type_name, const char* what) {
  std::string name = boost::core::demangle(type_name);
  if (auto p = name.rfind("::"); p != std::string::npos) name = name.substr(p + 2);
  throw ProtocolError("malformed " + name + " payload: " + what);
}

}  // namespace detail

// ---- crypto ---------------------------------------------------------------------------------

std::string hmac_sha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  static const unsigned char kEmpty = 0;
  const void* k = key.empty() ? static_cast<const void*>(&kEmpty) : key.data();
  const auto* d = data.empty() ? &kEmpty : reinterpret_cast<const unsigned char*>(data.data());
  if (!HMAC(EVP_sha256(), k, static_cast<int>(key.size()), d, data.size(), out, &len) || len != kMacSize)
    throw std::runtime_error("HMAC-SHA256 failed (OpenSSL)");
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string random_bytes(size_t n) {
  std::string s(n, '\0');
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char*>(s.data()), static_cast<int>(n)) != 1)
    throw std::runtime_error("RAND_bytes failed: the system's random source is unavailable");
  return s;
}

std::string random_hex(size_t bytes) {
  static const char* kDigits = "0123456789abcdef";
  const std::string raw = random_bytes(bytes);
  std::string out;
  out.reserve(2 * bytes);
  for (unsigned char c : raw) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

// ---- Connection -----------------------------------------------------------------------------

Connection::Connection(tcp::socket socket, uint32_t node, ConnectionOptions options, const SessionKeys& keys)
    : socket_(std::move(socket)),
      strand_(asio::make_strand(socket_.get_executor())),
      heartbeat_timer_(strand_),
      lease_timer_(strand_),
      node_(node),
      opts_(options),
      remote_([this] {
        boost::system::error_code ec;
        auto ep = socket_.remote_endpoint(ec);
        return ec ? std::string("(unknown peer)") : endpoint_text(ep);
      }()),
      opener_(keys.recv_key, keys.recv_iv, kHeaderSize + size_t{options.max_frame}),
      decoder_(options.max_frame),
      sealer_(keys.send_key, keys.send_iv) {
  boost::system::error_code ec;
  socket_.set_option(tcp::no_delay(true), ec);  // small control frames: latency matters
}

Connection::~Connection() = default;

void Connection::start(FrameHandler on_frame, CloseHandler on_close) {
  asio::post(strand_, [self = shared_from_this(), f = std::move(on_frame), c = std::move(on_close)]() mutable {
    self->do_start(std::move(f), std::move(c));
  });
}

void Connection::do_start(FrameHandler on_frame, CloseHandler on_close) {
  if (started_) return;
  started_ = true;
  if (closed_) {
    if (on_close) on_close(close_reason());
    return;
  }
  on_frame_ = std::move(on_frame);
  on_close_ = std::move(on_close);
  last_rx_ = Clock::now();
  read_some();
  if (closing_) {
    begin_linger();
    return;
  }
  arm_heartbeat();
  arm_lease(last_rx_ + std::chrono::milliseconds(opts_.lease_ms));
}

void Connection::read_some() {
  socket_.async_read_some(asio::buffer(rbuf_),
                          asio::bind_executor(strand_, [self = shared_from_this()](const boost::system::error_code& ec,
                                                                                   size_t n) { self->on_read(ec, n); }));
}

void Connection::on_read(const boost::system::error_code& ec, size_t n) {
  if (closed_) return;
  if (ec) {
    if (closing_) {
      finish("closed locally");
    } else if (ec == asio::error::eof) {
      try {
        opener_.finish();
        decoder_.finish();
        finish("peer closed the connection");
      } catch (const ProtocolError& e) {
        finish(std::string("protocol error: ") + e.what());
      }
    } else if (ec == asio::error::connection_reset) {
      finish("connection reset by peer");
    } else {
      finish("read error: " + ec.message());
    }
    return;
  }
  last_rx_ = Clock::now();  // any bytes from the peer renew the lease
  if (closing_) {           // lingering for the peer's FIN: discard
    read_some();
    return;
  }
  try {
    opener_.feed(rbuf_.data(), n);
    while (auto record = opener_.next()) {
      decoder_.feed(record->data(), record->size());
      while (auto f = decoder_.next()) {
        if (f->type == msg::Type::Heartbeat) continue;
        if (f->type == msg::Type::Challenge || f->type == msg::Type::AuthReply || f->type == msg::Type::AuthOk)
          throw ProtocolError("unexpected handshake frame (type " + std::to_string(static_cast<int>(f->type)) +
                              ") after authentication");
        if (closing_ || closed_ || !on_frame_) break;
        try {
          on_frame_(f->type, std::move(f->payload));
        } catch (const std::exception& e) {
          finish(std::string("frame handler failed: ") + e.what());
          return;
        }
      }
      if (closing_ || closed_) break;
    }
  } catch (const ProtocolError& e) {
    finish(std::string("protocol error: ") + e.what());
    return;
  }
  read_some();
}

void Connection::send(msg::Type type, std::string payload) {
  if (payload.size() > opts_.max_frame)
    throw ProtocolError("frame too large: " + std::to_string(payload.size()) +
                        " bytes of payload exceed the limit of " + std::to_string(opts_.max_frame) + " bytes");
  bool post_write = false;
  bool overflow = false;
  size_t queued = 0;
  {
    std::lock_guard<std::mutex> lock(out_mu_);
    if (!accepting_) return;
    // Sealed under the lock, so records enter the outbox (and the socket) in their numbers' order.
    const auto header = frame_header(type, payload.size());
    const std::string_view head(header.data(), header.size());
    if (!write_pending_ && outbox_.empty()) {
      // Fast path: no write in flight and nothing queued, so the record goes to the kernel from
      // the calling thread (non-blocking). This saves a wake-up of the io thread per frame,
      // which dominates the round trip of small task frames. Whatever the socket does not take
      // now, and any error, is left to the asynchronous path below.
      sealer_.seal(outbox_, head, payload);  // the outbox is empty: sealed there, sent from there
      ssize_t n = ::send(socket_.native_handle(), outbox_.data(), outbox_.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n == static_cast<ssize_t>(outbox_.size())) {
        if (outbox_.capacity() > kKeptOutboxCapacity) std::string().swap(outbox_);  // a big frame's buffer is not kept
        else outbox_.clear();
        return;
      }
      if (n > 0) outbox_.erase(0, static_cast<size_t>(n));
    } else {
      sealer_.seal(outbox_, head, payload);
    }
    queued = outbox_.size();
    if (queued > opts_.max_queued_bytes) {
      overflow = true;
      accepting_ = false;
      outbox_.clear();
    } else if (!write_pending_) {
      write_pending_ = true;
      post_write = true;
    }
  }
  if (overflow) {
    asio::post(strand_, [self = shared_from_this(), queued] {
      self->finish("send queue overflow: " + std::to_string(queued) + " bytes queued, the peer is not reading");
    });
  } else if (post_write) {
    asio::post(strand_, [self = shared_from_this()] { self->do_write(); });
  }
}

void Connection::do_write() {
  if (closed_) return;
  {
    std::lock_guard<std::mutex> lock(out_mu_);
    if (outbox_.empty()) {
      write_pending_ = false;
    } else {
      wbuf_.swap(outbox_);
      outbox_.clear();
    }
  }
  if (wbuf_.empty()) {
    if (closing_) begin_linger();
    return;
  }
  asio::async_write(socket_, asio::buffer(wbuf_),
                    asio::bind_executor(strand_, [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                      if (self->closed_) return;
                      if (ec) {
                        self->finish(ec == asio::error::broken_pipe || ec == asio::error::connection_reset
                                         ? "connection reset by peer"
                                         : "write error: " + ec.message());
                        return;
                      }
                      self->wbuf_.clear();
                      self->do_write();
                    }));
}

void Connection::close() {
  {
    std::lock_guard<std::mutex> lock(out_mu_);
    accepting_ = false;
  }
  asio::post(strand_, [self = shared_from_this()] {
    if (self->closed_ || self->closing_) return;
    self->closing_ = true;
    bool pending;
    {
      std::lock_guard<std::mutex> lock(self->out_mu_);
      pending = self->write_pending_;
    }
    if (!pending) self->begin_linger();  // else the write chain calls it once the queue drains
  });
}

void Connection::begin_linger() {
  if (closed_ || lingering_) return;
  lingering_ = true;
  heartbeat_timer_.cancel();
  if (!started_) {
    finish("closed locally");
    return;
  }
  boost::system::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);  // FIN after everything queued
  if (ec) {
    finish("closed locally");
    return;
  }
  arm_lease(Clock::now() + std::chrono::milliseconds(std::min(opts_.lease_ms, 2000)));
}

void Connection::abort() {
  {
    std::lock_guard<std::mutex> lock(out_mu_);
    accepting_ = false;
    outbox_.clear();
  }
  asio::post(strand_, [self = shared_from_this()] { self->finish("aborted locally"); });
}

void Connection::arm_heartbeat() {
  heartbeat_timer_.expires_after(std::chrono::milliseconds(opts_.heartbeat_ms));
  heartbeat_timer_.async_wait(
      asio::bind_executor(strand_, [self = shared_from_this()](const boost::system::error_code& ec) {
        if (ec || self->closed_ || self->closing_) return;
        self->send(msg::Type::Heartbeat, std::string());
        self->arm_heartbeat();
      }));
}

void Connection::arm_lease(Clock::time_point deadline) {
  lease_timer_.expires_at(deadline);
  lease_timer_.async_wait(asio::bind_executor(strand_, [self = shared_from_this()](const boost::system::error_code& ec) {
    if (ec || self->closed_) return;
    if (self->lingering_) {  // the peer did not answer our FIN in time
      self->finish("closed locally");
      return;
    }
    const auto lease = std::chrono::milliseconds(self->opts_.lease_ms);
    if (Clock::now() - self->last_rx_ >= lease) {
      self->finish("lease expired: no frame from the peer for " + std::to_string(self->opts_.lease_ms) + " ms");
      return;
    }
    self->arm_lease(self->last_rx_ + lease);
  }));
}

void Connection::finish(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  closing_ = true;
  heartbeat_timer_.cancel();
  lease_timer_.cancel();
  {
    // Before the socket closes: send()'s fast path writes to the descriptor under out_mu_,
    // and must never see a closed (possibly reused) descriptor number.
    std::lock_guard<std::mutex> lock(out_mu_);
    accepting_ = false;
    outbox_.clear();
  }
  boost::system::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  wbuf_.clear();
  CloseHandler cb = std::move(on_close_);
  on_close_ = nullptr;
  on_frame_ = nullptr;
  {
    std::lock_guard<std::mutex> lock(done_mu_);
    reason_ = reason;
  }
  if (cb) {
    try {
      cb(reason);
    } catch (...) {
      // The owner's close handler must not take the io thread down with it.
    }
  }
  {
    std::lock_guard<std::mutex> lock(done_mu_);
    done_ = true;
  }
  done_cv_.notify_all();
}

bool Connection::wait_closed(int timeout_ms) {
  std::unique_lock<std::mutex> lock(done_mu_);
  return done_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return done_; });
}

bool Connection::is_closed() const {
  std::lock_guard<std::mutex> lock(done_mu_);
  return done_;
}

std::string Connection::close_reason() const {
  std::lock_guard<std::mutex> lock(done_mu_);
  return reason_;
}

// ---- Server ---------------------------------------------------------------------------------

namespace {
struct Handshake;
}

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(asio::io_context& io, std::string secret, ConnectionOptions opts, AuthenticatedHandler ok, RejectedHandler rej)
      : acceptor(io),
        strand(asio::make_strand(io)),
        retry_timer(strand),
        secret(std::move(secret)),
        opts(opts),
        on_authenticated(std::move(ok)),
        on_rejected(std::move(rej)) {}

  void accept();
  void on_accept(const boost::system::error_code& ec, tcp::socket socket);
  void rejected(const std::shared_ptr<Handshake>& h, const std::string& peer, const std::string& why);
  void authenticated(const std::shared_ptr<Handshake>& h, tcp::socket socket, uint32_t node, const SessionKeys& keys);

  tcp::acceptor acceptor;
  asio::strand<asio::io_context::executor_type> strand;
  asio::steady_timer retry_timer;
  const std::string secret;
  const ConnectionOptions opts;
  const AuthenticatedHandler on_authenticated;
  const RejectedHandler on_rejected;

  std::mutex mu;  // guards the acceptor, `closed` and `handshakes` against Server::close()
  bool closed = false;
  std::set<std::shared_ptr<Handshake>> handshakes;
  static constexpr size_t kMaxPendingHandshakes = 1024;
};

namespace {

// Server side of one handshake; every handler runs on Impl::strand.
struct Handshake : std::enable_shared_from_this<Handshake> {
  Handshake(std::shared_ptr<Server::Impl> server, tcp::socket s)
      : server(std::move(server)), socket(std::move(s)), timer(this->server->strand) {
    boost::system::error_code ec;
    auto ep = socket.remote_endpoint(ec);
    peer = ec ? std::string("(unknown peer)") : endpoint_text(ep);
  }

  template <class F>
  auto on_strand(F&& f) {
    return asio::bind_executor(server->strand, std::forward<F>(f));
  }

  void start() {
    auto self = shared_from_this();
    timer.expires_after(std::chrono::milliseconds(server->opts.handshake_timeout_ms));
    timer.async_wait(on_strand([self](const boost::system::error_code& ec) {
      if (!ec)
        self->reject("handshake timed out after " + std::to_string(self->server->opts.handshake_timeout_ms) +
                     " ms: the peer did not authenticate");
    }));
    server_nonce = random_bytes(kNonceSize);
    out = encode_frame(msg::Type::Challenge, server_nonce + share.public_key());
    asio::async_write(socket, asio::buffer(out), on_strand([self](const boost::system::error_code& ec, size_t) {
                        if (self->done) return;
                        if (ec) return self->io_failed(ec);
                        self->read_header();
                      }));
  }

  void read_header() {
    asio::async_read(socket, asio::buffer(header),
                     on_strand([self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                       if (self->done) return;
                       if (ec) return self->io_failed(ec);
                       self->on_header();
                     }));
  }

  void on_header() {
    FrameHeader h;
    try {
      h = decode_header(header.data(), kHandshakeMaxFrame);
    } catch (const ProtocolError& e) {
      return reject(std::string("protocol error before authentication: ") + e.what());
    }
    if (h.type != msg::Type::AuthReply)
      return reject("expected an AuthReply frame first, got a frame of type " +
                    std::to_string(static_cast<int>(h.type)));
    if (h.length != kAuthReplySize)
      return reject("malformed AuthReply: " + std::to_string(h.length) + " bytes instead of " +
                    std::to_string(kAuthReplySize));
    payload.resize(kAuthReplySize);
    asio::async_read(socket, asio::buffer(payload),
                     on_strand([self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                       if (self->done) return;
                       if (ec) return self->io_failed(ec);
                       self->on_reply();
                     }));
  }

  void on_reply() {
    node = get_u32(payload.data());
    const std::string_view client_nonce(payload.data() + 4, kNonceSize);
    const std::string_view client_share(payload.data() + 4 + kNonceSize, kKeyShareSize);
    const std::string_view mac(payload.data() + 4 + kNonceSize + kKeyShareSize, kMacSize);
    const std::string transcript =
        handshake_transcript(server_nonce, share.public_key(), node, client_nonce, client_share);
    const std::string expected = client_proof(server->secret, transcript);
    if (CRYPTO_memcmp(expected.data(), mac.data(), kMacSize) != 0)
      return reject("authentication failed: wrong pool secret (peer claimed node " + std::to_string(node) + ")");
    try {
      keys = derive_session_keys(server->secret, share.agree(client_share), transcript, /*is_server=*/true);
    } catch (const ProtocolError& e) {
      return reject(std::string("handshake failed: ") + e.what());
    }
    out = encode_frame(msg::Type::AuthOk, server_proof(server->secret, transcript));
    asio::async_write(socket, asio::buffer(out),
                      on_strand([self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                        if (self->done) return;
                        if (ec) return self->io_failed(ec);
                        self->done = true;
                        self->timer.cancel();
                        self->server->authenticated(self, std::move(self->socket), self->node, self->keys);
                      }));
  }

  void io_failed(const boost::system::error_code& ec) {
    if (ec == asio::error::operation_aborted) return reject("handshake cancelled");
    if (ec == asio::error::eof) return reject("peer closed the connection during the handshake");
    reject("handshake failed: " + ec.message());
  }

  void reject(const std::string& why) {
    if (done) return;
    done = true;
    timer.cancel();
    boost::system::error_code ec;
    socket.close(ec);
    server->rejected(shared_from_this(), peer, why);
  }

  // Server::close(): no callback, just drop.
  void cancel() {
    if (done) return;
    done = true;
    timer.cancel();
    boost::system::error_code ec;
    socket.close(ec);
  }

  std::shared_ptr<Server::Impl> server;
  tcp::socket socket;
  asio::steady_timer timer;
  std::string peer;
  KeyShare share;  // this connection's ephemeral X25519 key
  SessionKeys keys;
  std::string server_nonce;
  std::string out;
  std::array<char, kHeaderSize> header{};
  std::string payload;
  uint32_t node = 0;
  bool done = false;
};

}  // namespace

void Server::Impl::accept() {
  // Called with `mu` held (or before the Impl is shared with any other thread).
  acceptor.async_accept(asio::bind_executor(
      strand, [self = shared_from_this()](const boost::system::error_code& ec, tcp::socket socket) {
        self->on_accept(ec, std::move(socket));
      }));
}

void Server::Impl::on_accept(const boost::system::error_code& ec, tcp::socket socket) {
  if (ec == asio::error::operation_aborted) return;
  if (!ec) close_on_exec(socket.native_handle());
  std::shared_ptr<Handshake> h;
  std::string refused;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (closed) return;
    if (ec) {
      // Out of descriptors or similar: back off instead of spinning, then accept again.
      retry_timer.expires_after(std::chrono::milliseconds(100));
      retry_timer.async_wait(asio::bind_executor(strand, [self = shared_from_this()](const boost::system::error_code& e) {
        if (e) return;
        std::lock_guard<std::mutex> lock(self->mu);
        if (!self->closed) self->accept();
      }));
      return;
    }
    if (handshakes.size() >= kMaxPendingHandshakes) {
      boost::system::error_code e;
      auto ep = socket.remote_endpoint(e);
      refused = e ? std::string("(unknown peer)") : endpoint_text(ep);
      socket.close(e);
    } else {
      h = std::make_shared<Handshake>(shared_from_this(), std::move(socket));
      handshakes.insert(h);
    }
    accept();
  }
  if (h) h->start();
  if (!refused.empty() && on_rejected)
    on_rejected(refused, "too many pending handshakes (" + std::to_string(kMaxPendingHandshakes) + ")");
}

void Server::Impl::rejected(const std::shared_ptr<Handshake>& h, const std::string& peer, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu);
    handshakes.erase(h);
    if (closed) return;
  }
  if (on_rejected) {
    try {
      on_rejected(peer, why);
    } catch (...) {
    }
  }
}

void Server::Impl::authenticated(const std::shared_ptr<Handshake>& h, tcp::socket socket, uint32_t node,
                                 const SessionKeys& keys) {
  {
    std::lock_guard<std::mutex> lock(mu);
    handshakes.erase(h);
    if (closed) return;  // the socket closes here
  }
  auto conn = std::make_shared<Connection>(std::move(socket), node, opts, keys);
  try {
    if (on_authenticated) on_authenticated(conn);
  } catch (const std::exception& e) {
    conn->abort();
    if (on_rejected) on_rejected(conn->remote_address(), std::string("on_authenticated handler failed: ") + e.what());
  }
}

Server::Server(asio::io_context& io, const std::string& bind_address, uint16_t port, std::string secret,
               ConnectionOptions options, AuthenticatedHandler on_authenticated, RejectedHandler on_rejected)
    : impl_(std::make_shared<Impl>(io, std::move(secret), options, std::move(on_authenticated),
                                   std::move(on_rejected))) {
  const std::string where = bind_address + ":" + std::to_string(port);
  try {
    tcp::endpoint ep;
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(bind_address.empty() ? "0.0.0.0" : bind_address, ec);
    if (!ec) {
      ep = tcp::endpoint(addr, port);
    } else {
      tcp::resolver resolver(io);
      auto results = resolver.resolve(bind_address, std::to_string(port), tcp::resolver::passive);
      if (results.empty()) throw ProtocolError("cannot resolve " + bind_address);
      ep = results.begin()->endpoint();
    }
    impl_->acceptor.open(ep.protocol());
    close_on_exec(impl_->acceptor.native_handle());
    impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
    impl_->acceptor.bind(ep);
    impl_->acceptor.listen(asio::socket_base::max_listen_connections);
    port_ = impl_->acceptor.local_endpoint().port();
  } catch (const ProtocolError& e) {
    throw ProtocolError("cannot listen on " + where + ": " + e.what());
  } catch (const std::exception& e) {
    throw ProtocolError("cannot listen on " + where + ": " + e.what());
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->accept();
}

Server::~Server() { close(); }

void Server::close() {
  std::set<std::shared_ptr<Handshake>> pending;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->closed) return;
    impl_->closed = true;
    boost::system::error_code ec;
    impl_->acceptor.close(ec);  // the pending accept completes with operation_aborted
    pending.swap(impl_->handshakes);
  }
  // Handshake sockets belong to the strand: cancel them there.
  for (auto& h : pending) asio::post(impl_->strand, [h] { h->cancel(); });
  asio::post(impl_->strand, [impl = impl_] { impl->retry_timer.cancel(); });
}

// ---- client ---------------------------------------------------------------------------------

namespace {

class BlockingIo {
 public:
  BlockingIo(int fd, Clock::time_point deadline, std::string where) : fd_(fd), deadline_(deadline), where_(std::move(where)) {}

  // false on timeout
  bool wait(short events) {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd_, events, 0};
      int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, INT32_MAX)));
      if (r > 0) return true;
      if (r < 0 && errno != EINTR) throw ProtocolError("poll failed on the connection to " + where_ + ": " + std::strerror(errno));
    }
  }

  // Reads exactly n bytes. Returns the number read before EOF (n on success). Throws on
  // timeout (`waiting_for` names what) or on a socket error (ECONNRESET reported as EOF).
  size_t read_exact(char* p, size_t n, const std::string& waiting_for, int timeout_ms) {
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::recv(fd_, p + got, n - got, 0);
      if (r > 0) {
        got += static_cast<size_t>(r);
      } else if (r == 0) {
        return got;
      } else if (errno == EINTR) {
        continue;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait(POLLIN)) throw ProtocolError("timed out after " + std::to_string(timeout_ms) + " ms waiting for " + waiting_for + " from " + where_);
      } else if (errno == ECONNRESET) {
        return got;
      } else {
        throw ProtocolError("reading from " + where_ + " failed: " + std::strerror(errno));
      }
    }
    return got;
  }

  void write_all(const std::string& data, int timeout_ms) {
    size_t sent = 0;
    while (sent < data.size()) {
      ssize_t r = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (r >= 0) {
        sent += static_cast<size_t>(r);
      } else if (errno == EINTR) {
        continue;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait(POLLOUT)) throw ProtocolError("timed out after " + std::to_string(timeout_ms) + " ms sending to " + where_);
      } else {
        throw ProtocolError("sending to " + where_ + " failed: " + std::strerror(errno));
      }
    }
  }

 private:
  int fd_;
  Clock::time_point deadline_;
  std::string where_;
};

// Reads one handshake frame of the expected type and exact size. Returns nullopt on EOF before
// its first byte... or anywhere inside it (the caller decides what EOF means at that point).
std::optional<std::string> read_handshake_frame(BlockingIo& io, msg::Type want, size_t size, const std::string& what,
                                                const std::string& where, int timeout_ms) {
  std::array<char, kHeaderSize> h{};
  if (io.read_exact(h.data(), h.size(), what, timeout_ms) != h.size()) return std::nullopt;
  FrameHeader fh;
  try {
    fh = decode_header(h.data(), kHandshakeMaxFrame);
  } catch (const ProtocolError& e) {
    throw ProtocolError("handshake with " + where + " failed: " + e.what());
  }
  if (fh.type != want || fh.length != size)
    throw ProtocolError("handshake with " + where + " failed: expected " + what + " (type " +
                        std::to_string(static_cast<int>(want)) + ", " + std::to_string(size) + " bytes), got type " +
                        std::to_string(static_cast<int>(fh.type)) + " with " + std::to_string(fh.length) + " bytes");
  std::string payload(size, '\0');
  if (io.read_exact(payload.data(), size, what, timeout_ms) != size) return std::nullopt;
  return payload;
}

}  // namespace

std::shared_ptr<Connection> connect(asio::io_context& io, const std::string& host, uint16_t port,
                                    const std::string& secret, uint32_t node, ConnectionOptions options,
                                    int timeout_ms) {
  const std::string where = host + ":" + std::to_string(port);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  if (ec || endpoints.empty())
    throw ProtocolError("cannot resolve host '" + host + "': " + (ec ? ec.message() : std::string("no address")));

  tcp::socket socket(io);
  std::string last_error;
  bool connected = false;
  for (const auto& entry : endpoints) {
    const tcp::endpoint ep = entry.endpoint();
    socket.close(ec);
    socket.open(ep.protocol(), ec);
    if (ec) {
      last_error = "cannot create a socket: " + ec.message();
      continue;
    }
    close_on_exec(socket.native_handle());
    socket.non_blocking(true, ec);
    const int fd = socket.native_handle();
    int r = ::connect(fd, ep.data(), static_cast<socklen_t>(ep.size()));
    int err = r == 0 ? 0 : errno;
    if (err == EINPROGRESS || err == EINTR) {
      BlockingIo waiter(fd, deadline, where);
      if (!waiter.wait(POLLOUT)) {
        last_error = "timed out after " + std::to_string(timeout_ms) + " ms connecting to " + where;
        break;
      }
      socklen_t len = sizeof err;
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
    if (err == 0) {
      connected = true;
      break;
    }
    last_error = err == ECONNREFUSED ? "connection refused to " + where
                                     : "cannot connect to " + where + ": " + std::strerror(err);
  }
  if (!connected) throw ProtocolError(last_error);

  BlockingIo bio(socket.native_handle(), deadline, where);
  auto challenge = read_handshake_frame(bio, msg::Type::Challenge, kChallengeSize, "the host's challenge", where, timeout_ms);
  if (!challenge)
    throw ProtocolError("handshake with " + where + " failed: the peer closed the connection before its challenge");
  const std::string_view server_nonce(challenge->data(), kNonceSize);
  const std::string_view server_share(challenge->data() + kNonceSize, kKeyShareSize);
  const std::string client_nonce = random_bytes(kNonceSize);
  const KeyShare share;
  const std::string transcript = handshake_transcript(server_nonce, server_share, node, client_nonce, share.public_key());
  bio.write_all(encode_frame(msg::Type::AuthReply,
                             le32(node) + client_nonce + share.public_key() + client_proof(secret, transcript)),
                timeout_ms);
  auto ok = read_handshake_frame(bio, msg::Type::AuthOk, kMacSize, "the host's AuthOk", where, timeout_ms);
  if (!ok) throw AuthError("authentication failed: the host rejected this worker's pool secret (" + where + ")");
  const std::string expected = server_proof(secret, transcript);
  if (CRYPTO_memcmp(expected.data(), ok->data(), kMacSize) != 0)
    throw AuthError("authentication failed: the host at " + where + " did not prove the pool secret");
  SessionKeys keys;
  try {
    keys = derive_session_keys(secret, share.agree(server_share), transcript, /*is_server=*/false);
  } catch (const ProtocolError& e) {
    throw ProtocolError("handshake with " + where + " failed: " + e.what());
  }
  socket.non_blocking(false, ec);
  return std::make_shared<Connection>(std::move(socket), node, options, keys);
}

}  // namespace skyforge::net
