// Close-on-exec and peer addresses for the control plane's sockets (sockets.hpp).
#include "sockets.hpp"

#include <fcntl.h>

namespace skyforge::net {

void close_on_exec(int fd) {
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

std::string peer_address(const boost::asio::ip::tcp::socket& socket) {
  boost::system::error_code ec;
  const auto ep = socket.remote_endpoint(ec);
  if (ec) return "(unknown peer)";
  const auto a = ep.address();
  if (a.is_v6()) return "[" + a.to_string() + "]:" + std::to_string(ep.port());
  return a.to_string() + ":" + std::to_string(ep.port());
}

}  // namespace skyforge::net
