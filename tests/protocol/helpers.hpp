// Test helpers: an io_context on its own thread, a raw POSIX TCP peer for speaking (or
// mis-speaking) the protocol byte by byte, and small synchronisation utilities.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

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

  // Client side of the handshake by hand. Returns true if the server answered with a valid AuthOk.
  bool authenticate(const std::string& secret, uint32_t node) {
    using namespace skyforge;
    auto challenge = read_frame();
    if (!challenge || challenge->type != msg::Type::Challenge) return false;
    std::string node_le(4, '\0');
    for (int i = 0; i < 4; ++i) node_le[i] = static_cast<char>((node >> (8 * i)) & 0xff);
    const std::string nonce = net::random_bytes(32);
    write(net::encode_frame(msg::Type::AuthReply,
                            node_le + nonce + net::hmac_sha256(secret, challenge->payload + node_le)));
    auto ok = read_frame();
    return ok && ok->type == msg::Type::AuthOk && ok->payload == net::hmac_sha256(secret, nonce + "host");
  }

  int fd() const { return fd_; }

 private:
  int fd_ = -1;
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

 private:
  int fd_;
  uint16_t port_ = 0;
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
