// A heartbeated, leased connection of the control plane (docs/architecture.md, "The control
// plane"), made by Server or connect() once the handshake has given it its record keys. Every
// frame it sends or receives travels sealed in a record (secure_channel.hpp).
//
// Threading: a Connection serialises all of its handlers on one strand of the io_context it was
// created on, so the io_context may be run by any number of threads. on_frame and on_close run
// on that strand (never inside send/close/abort/start), so they may take locks the caller of
// those functions holds. send() is thread-safe and, when nothing is queued, writes from the
// caller's thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "bounded_archive.hpp"
#include "framing.hpp"
#include "secure_channel.hpp"

namespace skyforge::net {

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

}  // namespace skyforge::net
