// The client's end (connect.hpp): resolve, connect and run the handshake with blocking socket
// operations under one deadline.
#include "connect.hpp"

#include <openssl/crypto.h>

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include "crypto.hpp"
#include "handshake.hpp"
#include "sockets.hpp"

namespace skyforge::net {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

class BlockingIo {
 public:
  BlockingIo(int fd, Clock::time_point deadline, std::string where) : fd_(fd), deadline_(deadline), where_(std::move(where)) {}

  // false on timeout
  bool wait(short events) {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd_, events, 0};
      int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, INT32_MAX)));
      if (r > 0) return true;
      if (r < 0 && errno != EINTR) throw ProtocolError("poll failed on the connection to " + where_ + ": " + std::strerror(errno));
    }
  }

  // Reads exactly n bytes. Returns the number read before EOF (n on success). Throws on
  // timeout (`waiting_for` names what) or on a socket error (ECONNRESET reported as EOF).
  size_t read_exact(char* p, size_t n, const std::string& waiting_for, int timeout_ms) {
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::recv(fd_, p + got, n - got, 0);
      if (r > 0) {
        got += static_cast<size_t>(r);
      } else if (r == 0) {
        return got;
      } else if (errno == EINTR) {
        continue;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait(POLLIN)) throw ProtocolError("timed out after " + std::to_string(timeout_ms) + " ms waiting for " + waiting_for + " from " + where_);
      } else if (errno == ECONNRESET) {
        return got;
      } else {
        throw ProtocolError("reading from " + where_ + " failed: " + std::strerror(errno));
      }
    }
    return got;
  }

  void write_all(const std::string& data, int timeout_ms) {
    size_t sent = 0;
    while (sent < data.size()) {
      ssize_t r = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (r >= 0) {
        sent += static_cast<size_t>(r);
      } else if (errno == EINTR) {
        continue;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait(POLLOUT)) throw ProtocolError("timed out after " + std::to_string(timeout_ms) + " ms sending to " + where_);
      } else {
        throw ProtocolError("sending to " + where_ + " failed: " + std::strerror(errno));
      }
    }
  }

 private:
  int fd_;
  Clock::time_point deadline_;
  std::string where_;
};

// Reads one handshake frame of the expected type and exact size. Returns nullopt on EOF before
// its first byte... or anywhere inside it (the caller decides what EOF means at that point).
std::optional<std::string> read_handshake_frame(BlockingIo& io, msg::Type want, size_t size, const std::string& what,
                                                const std::string& where, int timeout_ms) {
  std::array<char, kHeaderSize> h{};
  if (io.read_exact(h.data(), h.size(), what, timeout_ms) != h.size()) return std::nullopt;
  FrameHeader fh;
  try {
    fh = decode_header(h.data(), handshake::kMaxFrame);
  } catch (const ProtocolError& e) {
    throw ProtocolError("handshake with " + where + " failed: " + e.what());
  }
  if (fh.type != want || fh.length != size)
    throw ProtocolError("handshake with " + where + " failed: expected " + what + " (type " +
                        std::to_string(static_cast<int>(want)) + ", " + std::to_string(size) + " bytes), got type " +
                        std::to_string(static_cast<int>(fh.type)) + " with " + std::to_string(fh.length) + " bytes");
  std::string payload(size, '\0');
  if (io.read_exact(payload.data(), size, what, timeout_ms) != size) return std::nullopt;
  return payload;
}

}  // namespace

std::shared_ptr<Connection> connect(asio::io_context& io, const std::string& host, uint16_t port,
                                    const std::string& secret, uint32_t node, ConnectionOptions options,
                                    int timeout_ms) {
  const std::string where = host + ":" + std::to_string(port);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  if (ec || endpoints.empty())
    throw ProtocolError("cannot resolve host '" + host + "': " + (ec ? ec.message() : std::string("no address")));

  tcp::socket socket(io);
  std::string last_error;
  bool connected = false;
  for (const auto& entry : endpoints) {
    const tcp::endpoint ep = entry.endpoint();
    socket.close(ec);
    socket.open(ep.protocol(), ec);
    if (ec) {
      last_error = "cannot create a socket: " + ec.message();
      continue;
    }
    close_on_exec(socket.native_handle());
    socket.non_blocking(true, ec);
    const int fd = socket.native_handle();
    int r = ::connect(fd, ep.data(), static_cast<socklen_t>(ep.size()));
    int err = r == 0 ? 0 : errno;
    if (err == EINPROGRESS || err == EINTR) {
      BlockingIo waiter(fd, deadline, where);
      if (!waiter.wait(POLLOUT)) {
        last_error = "timed out after " + std::to_string(timeout_ms) + " ms connecting to " + where;
        break;
      }
      socklen_t len = sizeof err;
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
    if (err == 0) {
      connected = true;
      break;
    }
    last_error = err == ECONNREFUSED ? "connection refused to " + where
                                     : "cannot connect to " + where + ": " + std::strerror(err);
  }
  if (!connected) throw ProtocolError(last_error);

  BlockingIo bio(socket.native_handle(), deadline, where);
  auto challenge =
      read_handshake_frame(bio, msg::Type::Challenge, handshake::kChallengeSize, "the host's challenge", where, timeout_ms);
  if (!challenge)
    throw ProtocolError("handshake with " + where + " failed: the peer closed the connection before its challenge");
  const auto [server_nonce, server_share] = handshake::read_challenge(*challenge);
  const std::string client_nonce = random_bytes(kNonceSize);
  const KeyShare share;
  const std::string transcript = handshake_transcript(server_nonce, server_share, node, client_nonce, share.public_key());
  bio.write_all(encode_frame(msg::Type::AuthReply,
                             handshake::auth_reply(node, client_nonce, share.public_key(), client_proof(secret, transcript))),
                timeout_ms);
  auto ok = read_handshake_frame(bio, msg::Type::AuthOk, handshake::kAuthOkSize, "the host's AuthOk", where, timeout_ms);
  if (!ok) throw AuthError("authentication failed: the host rejected this worker's pool secret (" + where + ")");
  const std::string expected = server_proof(secret, transcript);
  if (CRYPTO_memcmp(expected.data(), ok->data(), kMacSize) != 0)
    throw AuthError("authentication failed: the host at " + where + " did not prove the pool secret");
  SessionKeys keys;
  try {
    keys = derive_session_keys(secret, share.agree(server_share), transcript, /*is_server=*/false);
  } catch (const ProtocolError& e) {
    throw ProtocolError("handshake with " + where + " failed: " + e.what());
  }
  socket.non_blocking(false, ec);
  return std::make_shared<Connection>(std::move(socket), node, options, keys);
}

}  // namespace skyforge::net
