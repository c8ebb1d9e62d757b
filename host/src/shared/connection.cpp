// The leased connection (connection.hpp): its read loop, the send path (from the caller's
// thread when nothing is queued, else through the strand), heartbeats, the lease, and an
// orderly or immediate close.
#include "connection.hpp"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include <sys/socket.h>

#include <algorithm>

#include "sockets.hpp"

namespace skyforge::net {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {
constexpr size_t kKeptOutboxCapacity = 256 * 1024;  // an idle connection keeps at most this much send buffer
}  // namespace

Connection::Connection(tcp::socket socket, uint32_t node, ConnectionOptions options, const SessionKeys& keys)
    : socket_(std::move(socket)),
      strand_(asio::make_strand(socket_.get_executor())),
      heartbeat_timer_(strand_),
      lease_timer_(strand_),
      node_(node),
      opts_(options),
      remote_(peer_address(socket_)),
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
    const auto header = encode_header(type, payload.size());
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

}  // namespace skyforge::net
