// A fault-injecting HTTP proxy between the aws provider and moto, on loopback: what moto cannot
// do itself (a lost response, an API that is down for a while, an error AWS would give under
// load). One request per connection: the proxy reads it, decides by its Action, forwards it to
// moto with "Connection: close", and relays (or drops) the answer.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "moto.hpp"

namespace skyforge::aws::testing {

class ApiProxy {
 public:
  explicit ApiProxy(int upstream_port) : upstream_(upstream_port) {
    listen_ = loopback_socket(port_, 64);
    thread_ = std::thread([this] { accept_loop(); });
  }
  ~ApiProxy() {
    stop_ = true;
    ::shutdown(listen_, SHUT_RDWR);
    thread_.join();
    ::close(listen_);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& t : workers_) t.join();
  }

  int port() const { return port_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // The next `n` requests for `action`: forwarded, but the answer is dropped (the connection is
  // closed without a reply), as a lost network would.
  void drop_answers(const std::string& action, int n) {
    std::lock_guard<std::mutex> lock(mu_);
    drops_[action] += n;
  }
  // The next `n` requests for `action` get this AWS error (400) without reaching moto.
  void fail_with(const std::string& action, const std::string& code, int n) {
    std::lock_guard<std::mutex> lock(mu_);
    errors_[action].assign(size_t(n), code);
  }
  // Every request for `action` waits this long before it is forwarded.
  void delay(const std::string& action, std::chrono::milliseconds d) {
    std::lock_guard<std::mutex> lock(mu_);
    delays_[action] = d;
  }
  // Every request gets 503 until `until`.
  void down_until(std::chrono::steady_clock::time_point until) {
    std::lock_guard<std::mutex> lock(mu_);
    down_until_ = until;
  }
  // Requests seen per action (reached the proxy, whatever became of them).
  int seen(const std::string& action) {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_[action];
  }

 private:
  static std::string action_of(const std::string& body) {
    size_t p = body.find("Action=");
    if (p == std::string::npos) return "";
    size_t e = body.find('&', p);
    return body.substr(p + 7, e == std::string::npos ? std::string::npos : e - p - 7);
  }

  static bool read_request(int fd, std::string& req) {
    char buf[65536];
    size_t header_end = std::string::npos;
    size_t content_length = 0;
    for (;;) {
      if (header_end != std::string::npos && req.size() >= header_end + 4 + content_length) return true;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 5000) != 1) return false;
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return false;
      req.append(buf, size_t(n));
      if (header_end == std::string::npos && (header_end = req.find("\r\n\r\n")) != std::string::npos) {
        std::string head = req.substr(0, header_end);
        for (auto& ch : head) ch = char(std::tolower(static_cast<unsigned char>(ch)));
        size_t cl = head.find("content-length:");
        if (cl != std::string::npos) content_length = std::stoul(head.substr(cl + 15));
      }
    }
  }

  static void send_all(int fd, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += size_t(n);
    }
  }

  static std::string reply(int status, const std::string& reason, const std::string& body) {
    return "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: text/xml\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  }

  void serve(int fd) {
    std::string req;
    if (!read_request(fd, req)) {
      ::close(fd);
      return;
    }
    const std::string action = action_of(req.substr(req.find("\r\n\r\n") + 4));
    bool drop = false;
    std::string error;
    bool down = false;
    std::chrono::milliseconds wait{0};
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++seen_[action];
      wait = delays_[action];
      down = std::chrono::steady_clock::now() < down_until_;
      if (!down && drops_[action] > 0) {
        --drops_[action];
        drop = true;
      }
      if (!down && !drop && !errors_[action].empty()) {
        error = errors_[action].back();
        errors_[action].pop_back();
      }
    }
    if (down) {
      send_all(fd, reply(503, "Service Unavailable",
                         "<Response><Errors><Error><Code>Unavailable</Code><Message>the test's proxy is down"
                         "</Message></Error></Errors></Response>"));
      ::close(fd);
      return;
    }
    if (!error.empty()) {
      send_all(fd, reply(400, "Bad Request",
                         "<Response><Errors><Error><Code>" + error + "</Code><Message>injected by the test's proxy"
                         "</Message></Error></Errors><RequestID>proxy</RequestID></Response>"));
      ::close(fd);
      return;
    }
    std::this_thread::sleep_for(wait);
    // Forward with Connection: close, so the answer ends at EOF.
    size_t eol = req.find("\r\n");
    req.insert(eol + 2, "Connection: close\r\n");
    int up = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(upstream_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string answer;
    if (::connect(up, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      send_all(up, req);
      char buf[65536];
      ssize_t n;
      while ((n = ::recv(up, buf, sizeof buf, 0)) > 0) answer.append(buf, size_t(n));
    }
    ::close(up);
    if (!drop) send_all(fd, answer);
    ::close(fd);
  }

  void accept_loop() {
    while (!stop_) {
      int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (stop_) return;
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      workers_.emplace_back([this, fd] { serve(fd); });
    }
  }

  int upstream_;
  int listen_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::thread> workers_;
  std::map<std::string, int> drops_;
  std::map<std::string, std::vector<std::string>> errors_;
  std::map<std::string, int> seen_;
  std::map<std::string, std::chrono::milliseconds> delays_;
  std::chrono::steady_clock::time_point down_until_{};
};

}  // namespace skyforge::aws::testing
