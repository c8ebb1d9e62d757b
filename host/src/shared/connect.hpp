// Connects to the listening end and runs the client's side of the handshake (handshake.hpp),
// with blocking socket operations.
#pragma once

#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "connection.hpp"

namespace skyforge::net {

// Client side: connects and runs the handshake synchronously with blocking socket operations
// bounded by `timeout_ms` in total (it does not need the io_context to be running, and is safe
// while another thread runs it). Returns a connection, not yet started, bound to `io`.
// Throws ProtocolError ("connection refused to host:port", "timed out ...") or AuthError.
std::shared_ptr<Connection> connect(boost::asio::io_context& io, const std::string& host, uint16_t port,
                                    const std::string& secret, uint32_t node, ConnectionOptions options,
                                    int timeout_ms);

}  // namespace skyforge::net
