// Test helpers: an io_context on its own thread, a raw POSIX TCP peer for speaking (or
// mis-speaking) the protocol byte by byte, small synchronisation utilities and the checks of a
// close or rejection reason.
#pragma once

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../support/contains.hpp"
#include "protocol.hpp"

namespace sftest {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class IoThread {
 public:
  IoThread() : guard_(boost::asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {}
  ~IoThread() { stop(); }
  void stop() {
    guard_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }
  boost::asio::io_context& io() { return io_; }

 private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_;
  std::thread thread_;
};

// A value set once from any thread and awaited with a timeout.
template <class T>
class Latch {
 public:
  void set(T v) {
    std::lock_guard<std::mutex> l(mu_);
    if (!value_) value_ = std::move(v);
    ++count_;
    cv_.notify_all();
  }
  std::optional<T> wait(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, timeout, [&] { return value_.has_value(); });
    return value_;
  }
  bool is_set() {
    std::lock_guard<std::mutex> l(mu_);
    return value_.has_value();
  }
  int count() {
    std::lock_guard<std::mutex> l(mu_);
    return count_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<T> value_;
  int count_ = 0;
};

// The reason `latch` is set to within `timeout` (a connection's close, a handshake's
// rejection); "" and a test failure when it is not set by then.
inline std::string reason(Latch<std::string>& latch, std::chrono::milliseconds timeout = 2000ms) {
  std::optional<std::string> why = latch.wait(timeout);
  EXPECT_TRUE(why) << "no reason within " << timeout.count() << " ms";
  return why.value_or("");
}

using skyforge::test::contains;

// Blocking POSIX TCP client with per-call timeouts.
class RawPeer {
 public:
  explicit RawPeer(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      throw std::runtime_error(std::string("RawPeer connect: ") + std::strerror(errno));
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~RawPeer() {
    if (fd_ >= 0) ::close(fd_);
  }

  void write(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t r = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (r < 0) throw std::runtime_error(std::string("RawPeer send: ") + std::strerror(errno));
      off += static_cast<size_t>(r);
    }
  }

  // Exactly n bytes, or nullopt on EOF/reset/timeout.
  std::optional<std::string> read(size_t n, std::chrono::milliseconds timeout = 2000ms) {
    std::string out(n, '\0');
    size_t got = 0;
    const auto deadline = Clock::now() + timeout;
    while (got < n) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      ssize_t r = ::recv(fd_, out.data() + got, n - got, 0);
      if (r <= 0) return std::nullopt;
      got += static_cast<size_t>(r);
    }
    return out;
  }

  std::optional<skyforge::net::Frame> read_frame(std::chrono::milliseconds timeout = 2000ms) {
    auto h = read(skyforge::net::kHeaderSize, timeout);
    if (!h) return std::nullopt;
    auto hdr = skyforge::net::decode_header(h->data(), skyforge::net::kDefaultMaxFrame);
    auto p = read(hdr.length, timeout);
    if (!p) return std::nullopt;
    return skyforge::net::Frame{hdr.type, *p};
  }

  // True if the peer closes (EOF or reset) within the timeout; other bytes are skipped.
  bool closed_within(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    char buf[4096];
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      ssize_t r = ::recv(fd_, buf, sizeof buf, 0);
      if (r <= 0) return true;
    }
  }

  // Client side of the handshake by hand (docs/architecture.md). Returns true if the server
  // answered with a valid AuthOk; the record keys are then set, for write_sealed/read_sealed.
  bool authenticate(const std::string& secret, uint32_t node) {
    using namespace skyforge;
    auto challenge = read_frame();
    if (!challenge || challenge->type != msg::Type::Challenge || challenge->payload.size() != 64) return false;
    const std::string server_nonce = challenge->payload.substr(0, 32);
    const std::string server_share = challenge->payload.substr(32);
    std::string node_le(4, '\0');
    for (int i = 0; i < 4; ++i) node_le[i] = static_cast<char>((node >> (8 * i)) & 0xff);
    const std::string nonce = net::random_bytes(32);
    const net::KeyShare share;
    const std::string transcript = net::handshake_transcript(server_nonce, server_share, node, nonce, share.public_key());
    write(net::encode_frame(msg::Type::AuthReply,
                            node_le + nonce + share.public_key() + net::client_proof(secret, transcript)));
    auto ok = read_frame();
    if (!ok || ok->type != msg::Type::AuthOk || ok->payload != net::server_proof(secret, transcript)) return false;
    const auto keys = net::derive_session_keys(secret, share.agree(server_share), transcript, false);
    sealer_.emplace(keys.send_key, keys.send_iv);
    opener_.emplace(keys.recv_key, keys.recv_iv, net::kHeaderSize + net::kDefaultMaxFrame);
    return true;
  }

  // Seals `bytes` (normally one encoded frame) into one record, as an authenticated peer does.
  std::string seal(const std::string& bytes) {
    std::string out;
    sealer_->seal(out, bytes);
    return out;
  }
  void write_sealed(const std::string& bytes) { write(seal(bytes)); }

  // The next frame from an authenticated server (heartbeats skipped), or nullopt.
  std::optional<skyforge::net::Frame> read_sealed_frame(std::chrono::milliseconds timeout = 2000ms) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left <= 0ms) return std::nullopt;
      auto h = read(skyforge::net::kRecordHeaderSize, left);
      if (!h) return std::nullopt;
      uint32_t n = 0;
      for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<uint8_t>((*h)[i])) << (8 * i);
      auto body = read(n + skyforge::net::kRecordTagSize, left);
      if (!body) return std::nullopt;
      opener_->feed(h->data(), h->size());
      opener_->feed(body->data(), body->size());
      auto plain = opener_->next();
      if (!plain) return std::nullopt;
      auto hdr = skyforge::net::decode_header(plain->data(), skyforge::net::kDefaultMaxFrame);
      if (hdr.type == skyforge::msg::Type::Heartbeat) continue;
      return skyforge::net::Frame{hdr.type, std::string(plain->substr(skyforge::net::kHeaderSize))};
    }
  }

  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  std::optional<skyforge::net::RecordSealer> sealer_;
  std::optional<skyforge::net::RecordOpener> opener_;
};

// A bare listening socket (for playing a misbehaving server).
class RawListener {
 public:
  RawListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, 16);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~RawListener() { ::close(fd_); }
  int accept() { return ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC); }
  uint16_t port() const { return port_; }
  int fd() const { return fd_; }

 private:
  int fd_;
  uint16_t port_ = 0;
};

// A TCP relay on loopback between one client and `target_port`, for watching (and tampering
// with) what crosses the wire. `edit` sees every chunk with its offset in its direction's stream
// and may change its bytes in place.
class Relay {
 public:
  using Edit = std::function<void(bool client_to_server, size_t offset, std::string& chunk)>;
  Relay(uint16_t target_port, Edit edit = {}) : target_(target_port), edit_(std::move(edit)) {
    thread_ = std::thread([this] { run(); });
  }
  ~Relay() {
    stop_ = true;
    ::shutdown(listener_.fd(), SHUT_RDWR);  // wakes a pending accept()
    if (thread_.joinable()) thread_.join();
  }
  uint16_t port() const { return listener_.port(); }
  std::string seen(bool client_to_server) {
    std::lock_guard<std::mutex> l(mu_);
    return client_to_server ? c2s_ : s2c_;
  }

 private:
  void run() {
    int c = listener_.accept();
    if (c < 0) return;
    RawPeer upstream(target_);
    int s = upstream.fd();
    size_t off[2] = {0, 0};
    char buf[65536];
    while (!stop_) {
      pollfd p[2] = {{c, POLLIN, 0}, {s, POLLIN, 0}};
      if (::poll(p, 2, 100) <= 0) continue;
      bool done = false;
      for (int i = 0; i < 2; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t r = ::recv(p[i].fd, buf, sizeof buf, 0);
        if (r <= 0) {
          done = true;
          break;
        }
        std::string chunk(buf, static_cast<size_t>(r));
        const bool c2s = i == 0;
        if (edit_) edit_(c2s, off[i], chunk);
        off[i] += static_cast<size_t>(r);
        {
          std::lock_guard<std::mutex> l(mu_);
          (c2s ? c2s_ : s2c_) += chunk;
        }
        ::send(c2s ? s : c, chunk.data(), chunk.size(), MSG_NOSIGNAL);
      }
      if (done) break;
    }
    ::close(c);
  }

  RawListener listener_;
  uint16_t target_;
  Edit edit_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::string c2s_, s2c_;
  std::thread thread_;
};

inline bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return pred();
}

// A port nothing listens on (bound then closed; may race with other processes, which is fine
// for a refused-connection test on loopback).
inline uint16_t unused_port() {
  RawListener l;
  return l.port();
}

}  // namespace sftest
