// The listening end of the control plane: accepts connections, runs the server's side of the
// handshake (handshake.hpp) on each, and hands the authenticated ones over as Connections. A
// peer that fails the handshake, sends anything else, or stays silent past the handshake timeout
// is disconnected and reported through on_rejected; it never reaches the owner and no frame of
// it is ever delivered.
#pragma once

#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "connection.hpp"

namespace skyforge::net {

// Accepts connections, runs the server side of the handshake, and hands authenticated
// connections (not yet started) to on_authenticated. Callbacks run on the io_context.
class Server {
 public:
  using AuthenticatedHandler = std::function<void(std::shared_ptr<Connection>)>;
  using RejectedHandler = std::function<void(const std::string& peer, const std::string& why)>;

  // Binds and listens at once (throws std::system_error-derived boost::system::system_error
  // or ProtocolError on failure), so port() is valid on return.
  Server(boost::asio::io_context& io, const std::string& bind_address, uint16_t port, std::string secret,
         ConnectionOptions options, AuthenticatedHandler on_authenticated, RejectedHandler on_rejected = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const { return port_; }
  // Synchronous and idempotent: the listening socket is closed and pending handshakes are
  // cancelled when it returns; no callback starts after that.
  void close();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace skyforge::net
