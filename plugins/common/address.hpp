// "host:port" for a listener address, with brackets around an IPv6 literal (header-only).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace skyforge::fw {

inline std::string host_port(std::string_view host, uint16_t port) {
  std::string h(host);
  if (h.find(':') != std::string::npos && (h.empty() || h.front() != '[')) h = "[" + h + "]";
  return h + ":" + std::to_string(port);
}

}  // namespace skyforge::fw
