// What every socket of the control plane gets, whichever end opened it: close-on-exec, and its
// peer's address as the messages about it write it.
#pragma once

#include <boost/asio/ip/tcp.hpp>

#include <string>

namespace skyforge::net {

// Asio opens and accepts sockets without SOCK_CLOEXEC: mark each one at once, so that no
// process a worker or a plugin starts inherits a pool connection (docs/architecture.md).
void close_on_exec(int fd);

// "host:port" ("[v6]:port"), or "(unknown peer)" when the socket has none.
std::string peer_address(const boost::asio::ip::tcp::socket& socket);

}  // namespace skyforge::net
