// "host:port" for a listener address, with brackets around an IPv6 literal, and the network
// interface that holds an address (header-only).
#pragma once

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace skyforge::fw {

inline std::string host_port(std::string_view host, uint16_t port) {
  std::string h(host);
  if (h.find(':') != std::string::npos && (h.empty() || h.front() != '[')) h = "[" + h + "]";
  return h + ":" + std::to_string(port);
}

// The name of this machine's interface that holds `address` ("eth0" for 10.0.0.5, "lo" for
// 127.0.0.1); "" when none does. Collective libraries bind to the interface their hostname
// resolves to unless told (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME): on hosts whose name resolves
// to a loopback address that is the wrong one for a pool of several machines.
inline std::string interface_of(const std::string& address) {
  unsigned char want[sizeof(in6_addr)] = {};
  const int family = address.find(':') != std::string::npos ? AF_INET6 : AF_INET;
  if (::inet_pton(family, address.c_str(), want) != 1) return "";
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string name;
  for (ifaddrs* a = list; a && name.empty(); a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != family) continue;
    const void* have = family == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr)
                                         : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr);
    if (std::memcmp(have, want, family == AF_INET ? sizeof(in_addr) : sizeof(in6_addr)) == 0) name = a->ifa_name;
  }
  ::freeifaddrs(list);
  return name;
}

}  // namespace skyforge::fw
