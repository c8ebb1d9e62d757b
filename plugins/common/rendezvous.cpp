#include "rendezvous.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace skyforge::fw {

// The wildcard bind is deliberate: the listeners (torch's TCPStore, jax's coordinator, TF's
// gRPC server) bind the wildcard, so the port must be free on all addresses. As with torchrun's
// standalone mode the port is released before the framework binds it: only another process
// binding the same ephemeral port in that short window could take it.
uint16_t pick_free_port(const std::string& who) {
  std::string why;
  for (int family : {AF_INET6, AF_INET}) {
    int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    sockaddr_storage addr{};
    socklen_t len = 0;
    if (family == AF_INET6) {
      int off = 0;
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      len = sizeof(sockaddr_in6);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      len = sizeof(sockaddr_in);
    }
    uint16_t port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                      : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    } else {
      why = std::strerror(errno);
    }
    ::close(fd);
    if (port != 0) return port;
  }
  throw Error(who + ": cannot find a free TCP port on this node: " + why);
}

uint16_t parse_port_text(const std::string& text, const std::string& key, const std::string& who) {
  unsigned value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value == 0 || value > 65535)
    throw Error(who + ": rendezvous key " + key + " holds '" + text + "', not a TCP port");
  return uint16_t(value);
}

std::string publish_once(const Host& host, const std::string& key, int64_t timeout_ms,
                         const std::function<std::string()>& make, const std::string& who, const std::string& hint) {
  if (make && host.kv_add(key + "/claim", 1) == 1) {
    std::string value = make();
    host.kv_set(key, value);
    host.log(SF_LOG_DEBUG, who + ": published " + key + " = " + value);
    return value;
  }
  try {
    return host.kv_get(key, timeout_ms);
  } catch (const Error& e) {
    if (e.status() != SF_ERR_TIMEOUT) throw;
    throw Error(who + ": " + key + " was not published within " + std::to_string(timeout_ms / 1000) + " s" +
                    (hint.empty() ? "" : "; " + hint),
                SF_ERR_TIMEOUT);
  }
}

uint16_t head_port(const Host& host, const InstanceInfo& info, const std::string& key, const RendezvousOptions& opts,
                   const std::string& who, const std::string& what) {
  if (opts.port != 0) return opts.port;
  std::function<std::string()> make;
  if (info.is_head) make = [&] { return std::to_string(pick_free_port(who)); };
  std::string text = publish_once(host, key, opts.timeout_ms, make, who,
                                  "the head node did not publish " + what + "; raise the rendezvous_timeout option");
  return parse_port_text(text, key, who);
}

RendezvousOptions rendezvous_options(const Options& o, const std::string& who, const std::string& port_name) {
  const int64_t port = o.get_int(port_name, 0);
  if (port < 0 || port > 65535)
    throw Error(who + ": " + port_name + ": expected 0 (automatic) or a TCP port 1..65535, got " + std::to_string(port),
                SF_ERR_INVALID);
  const int64_t timeout_s = o.get_int("rendezvous_timeout", 120);
  if (timeout_s <= 0)
    throw Error(who + ": rendezvous_timeout: expected a positive number of seconds, got " + std::to_string(timeout_s),
                SF_ERR_INVALID);
  return RendezvousOptions{.port = uint16_t(port), .timeout_ms = timeout_s * 1000};
}

}  // namespace skyforge::fw
