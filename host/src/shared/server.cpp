// The listening end (server.hpp): the acceptor, the server's side of each handshake, and the
// hand-over of authenticated sockets as Connections.
#include "server.hpp"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <openssl/crypto.h>

#include <array>
#include <set>

#include "crypto.hpp"
#include "handshake.hpp"
#include "sockets.hpp"

namespace skyforge::net {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {
struct Handshake;
}

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(asio::io_context& io, std::string secret, ConnectionOptions opts, AuthenticatedHandler ok, RejectedHandler rej)
      : acceptor(io),
        strand(asio::make_strand(io)),
        retry_timer(strand),
        secret(std::move(secret)),
        opts(opts),
        on_authenticated(std::move(ok)),
        on_rejected(std::move(rej)) {}

  void accept();
  void on_accept(const boost::system::error_code& ec, tcp::socket socket);
  void rejected(const std::shared_ptr<Handshake>& h, const std::string& peer, const std::string& why);
  void authenticated(const std::shared_ptr<Handshake>& h, tcp::socket socket, uint32_t node, const SessionKeys& keys);

  tcp::acceptor acceptor;
  asio::strand<asio::io_context::executor_type> strand;
  asio::steady_timer retry_timer;
  const std::string secret;
  const ConnectionOptions opts;
  const AuthenticatedHandler on_authenticated;
  const RejectedHandler on_rejected;

  std::mutex mu;  // guards the acceptor, `closed` and `handshakes` against Server::close()
  bool closed = false;
  std::set<std::shared_ptr<Handshake>> handshakes;
  static constexpr size_t kMaxPendingHandshakes = 1024;
};

namespace {

// Server side of one handshake; every handler runs on Impl::strand.
struct Handshake : std::enable_shared_from_this<Handshake> {
  Handshake(std::shared_ptr<Server::Impl> server, tcp::socket s)
      : server(std::move(server)), socket(std::move(s)), timer(this->server->strand), peer(peer_address(socket)) {}

  // The completion handler of a read or write of this handshake: `next`, on the strand, unless
  // the handshake ended meanwhile or the operation failed.
  auto then(void (Handshake::*next)()) {
    return asio::bind_executor(server->strand,
                               [self = shared_from_this(), next](const boost::system::error_code& ec, size_t) {
                                 if (self->done) return;
                                 if (ec) return self->io_failed(ec);
                                 ((*self).*next)();
                               });
  }

  void start() {
    timer.expires_after(std::chrono::milliseconds(server->opts.handshake_timeout_ms));
    timer.async_wait(asio::bind_executor(server->strand, [self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec)
        self->reject("handshake timed out after " + std::to_string(self->server->opts.handshake_timeout_ms) +
                     " ms: the peer did not authenticate");
    }));
    server_nonce = random_bytes(kNonceSize);
    out = encode_frame(msg::Type::Challenge, server_nonce + share.public_key());
    asio::async_write(socket, asio::buffer(out), then(&Handshake::read_header));
  }

  void read_header() { asio::async_read(socket, asio::buffer(header), then(&Handshake::on_header)); }

  void on_header() {
    FrameHeader h;
    try {
      h = decode_header(header.data(), handshake::kMaxFrame);
    } catch (const ProtocolError& e) {
      return reject(std::string("protocol error before authentication: ") + e.what());
    }
    if (h.type != msg::Type::AuthReply)
      return reject("expected an AuthReply frame first, got a frame of type " +
                    std::to_string(static_cast<int>(h.type)));
    if (h.length != handshake::kAuthReplySize)
      return reject("malformed AuthReply: " + std::to_string(h.length) + " bytes instead of " +
                    std::to_string(handshake::kAuthReplySize));
    payload.resize(handshake::kAuthReplySize);
    asio::async_read(socket, asio::buffer(payload), then(&Handshake::on_reply));
  }

  void on_reply() {
    const handshake::AuthReply reply = handshake::read_auth_reply(payload);
    node = reply.node;
    const std::string transcript = handshake_transcript(server_nonce, share.public_key(), node, reply.nonce, reply.share);
    const std::string expected = client_proof(server->secret, transcript);
    if (CRYPTO_memcmp(expected.data(), reply.proof.data(), kMacSize) != 0)
      return reject("authentication failed: wrong pool secret (peer claimed node " + std::to_string(node) + ")");
    try {
      keys = derive_session_keys(server->secret, share.agree(reply.share), transcript, /*is_server=*/true);
    } catch (const ProtocolError& e) {
      return reject(std::string("handshake failed: ") + e.what());
    }
    out = encode_frame(msg::Type::AuthOk, server_proof(server->secret, transcript));
    asio::async_write(socket, asio::buffer(out), then(&Handshake::succeed));
  }

  void succeed() {
    done = true;
    timer.cancel();
    server->authenticated(shared_from_this(), std::move(socket), node, keys);
  }

  void io_failed(const boost::system::error_code& ec) {
    if (ec == asio::error::operation_aborted) return reject("handshake cancelled");
    if (ec == asio::error::eof) return reject("peer closed the connection during the handshake");
    reject("handshake failed: " + ec.message());
  }

  void reject(const std::string& why) {
    if (done) return;
    done = true;
    timer.cancel();
    boost::system::error_code ec;
    socket.close(ec);
    server->rejected(shared_from_this(), peer, why);
  }

  // Server::close(): no callback, just drop.
  void cancel() {
    if (done) return;
    done = true;
    timer.cancel();
    boost::system::error_code ec;
    socket.close(ec);
  }

  std::shared_ptr<Server::Impl> server;
  tcp::socket socket;
  asio::steady_timer timer;
  std::string peer;
  KeyShare share;  // this connection's ephemeral X25519 key
  SessionKeys keys;
  std::string server_nonce;
  std::string out;
  std::array<char, kHeaderSize> header{};
  std::string payload;
  uint32_t node = 0;
  bool done = false;
};

}  // namespace

void Server::Impl::accept() {
  // Called with `mu` held (or before the Impl is shared with any other thread).
  acceptor.async_accept(asio::bind_executor(
      strand, [self = shared_from_this()](const boost::system::error_code& ec, tcp::socket socket) {
        self->on_accept(ec, std::move(socket));
      }));
}

void Server::Impl::on_accept(const boost::system::error_code& ec, tcp::socket socket) {
  if (ec == asio::error::operation_aborted) return;
  if (!ec) close_on_exec(socket.native_handle());
  std::shared_ptr<Handshake> h;
  std::string refused;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (closed) return;
    if (ec) {
      // Out of descriptors or similar: back off instead of spinning, then accept again.
      retry_timer.expires_after(std::chrono::milliseconds(100));
      retry_timer.async_wait(asio::bind_executor(strand, [self = shared_from_this()](const boost::system::error_code& e) {
        if (e) return;
        std::lock_guard<std::mutex> lock(self->mu);
        if (!self->closed) self->accept();
      }));
      return;
    }
    if (handshakes.size() >= kMaxPendingHandshakes) {
      refused = peer_address(socket);
      boost::system::error_code e;
      socket.close(e);
    } else {
      h = std::make_shared<Handshake>(shared_from_this(), std::move(socket));
      handshakes.insert(h);
    }
    accept();
  }
  if (h) h->start();
  if (!refused.empty() && on_rejected)
    on_rejected(refused, "too many pending handshakes (" + std::to_string(kMaxPendingHandshakes) + ")");
}

void Server::Impl::rejected(const std::shared_ptr<Handshake>& h, const std::string& peer, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu);
    handshakes.erase(h);
    if (closed) return;
  }
  if (on_rejected) {
    try {
      on_rejected(peer, why);
    } catch (...) {
    }
  }
}

void Server::Impl::authenticated(const std::shared_ptr<Handshake>& h, tcp::socket socket, uint32_t node,
                                 const SessionKeys& keys) {
  {
    std::lock_guard<std::mutex> lock(mu);
    handshakes.erase(h);
    if (closed) return;  // the socket closes here
  }
  auto conn = std::make_shared<Connection>(std::move(socket), node, opts, keys);
  try {
    if (on_authenticated) on_authenticated(conn);
  } catch (const std::exception& e) {
    conn->abort();
    if (on_rejected) on_rejected(conn->remote_address(), std::string("on_authenticated handler failed: ") + e.what());
  }
}

Server::Server(asio::io_context& io, const std::string& bind_address, uint16_t port, std::string secret,
               ConnectionOptions options, AuthenticatedHandler on_authenticated, RejectedHandler on_rejected)
    : impl_(std::make_shared<Impl>(io, std::move(secret), options, std::move(on_authenticated),
                                   std::move(on_rejected))) {
  const std::string where = bind_address + ":" + std::to_string(port);
  try {
    tcp::endpoint ep;
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(bind_address.empty() ? "0.0.0.0" : bind_address, ec);
    if (!ec) {
      ep = tcp::endpoint(addr, port);
    } else {
      tcp::resolver resolver(io);
      auto results = resolver.resolve(bind_address, std::to_string(port), tcp::resolver::passive);
      if (results.empty()) throw ProtocolError("cannot resolve " + bind_address);
      ep = results.begin()->endpoint();
    }
    impl_->acceptor.open(ep.protocol());
    close_on_exec(impl_->acceptor.native_handle());
    impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
    impl_->acceptor.bind(ep);
    impl_->acceptor.listen(asio::socket_base::max_listen_connections);
    port_ = impl_->acceptor.local_endpoint().port();
  } catch (const ProtocolError& e) {
    throw ProtocolError("cannot listen on " + where + ": " + e.what());
  } catch (const std::exception& e) {
    throw ProtocolError("cannot listen on " + where + ": " + e.what());
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->accept();
}

Server::~Server() { close(); }

void Server::close() {
  std::set<std::shared_ptr<Handshake>> pending;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->closed) return;
    impl_->closed = true;
    boost::system::error_code ec;
    impl_->acceptor.close(ec);  // the pending accept completes with operation_aborted
    pending.swap(impl_->handshakes);
  }
  // Handshake sockets belong to the strand: cancel them there.
  for (auto& h : pending) asio::post(impl_->strand, [h] { h->cancel(); });
  asio::post(impl_->strand, [impl = impl_] { impl->retry_timer.cancel(); });
}

}  // namespace skyforge::net
