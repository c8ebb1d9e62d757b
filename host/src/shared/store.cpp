#include "store.hpp"

#include <skyforge/abi.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

namespace skyforge::net {
namespace asio = boost::asio;

namespace {

std::string quote(const std::string& key) {
  constexpr size_t kShown = 200;
  return "'" + (key.size() > kShown ? key.substr(0, kShown) + "..." : key) + "'";
}

msg::KvReply reply(uint64_t id, int32_t status, std::string value = {}, std::string error = {}) {
  msg::KvReply r;
  r.id = id;
  r.status = status;
  r.value = std::move(value);
  r.error = std::move(error);
  return r;
}

}  // namespace

// ---- server ---------------------------------------------------------------------------------

struct StoreServer::State : std::enable_shared_from_this<StoreServer::State> {
  explicit State(asio::io_context& io) : io(io) {}

  struct Waiter {
    std::weak_ptr<Connection> conn;
    Connection* owner = nullptr;
    uint64_t request = 0;
    std::string key;
    int64_t timeout_ms = 0;
    std::unique_ptr<asio::steady_timer> timer;
  };
  struct Client {
    std::shared_ptr<Connection> conn;
    size_t waiters = 0;
  };
  using Outgoing = std::vector<std::pair<std::shared_ptr<Connection>, msg::KvReply>>;

  void on_connection(const std::shared_ptr<Connection>& conn);
  void on_frame(const std::shared_ptr<Connection>& conn, msg::Type type, std::string&& payload);
  void on_closed(Connection* conn);
  void expire(uint64_t wid);
  void close();

  // With mu held: hands every waiter on key the value.
  void wake(const std::string& key, const std::string& value, Outgoing& out);
  void drop_waiter(std::unordered_map<uint64_t, Waiter>::iterator it);
  // With mu held: accounts for storing value at key; false (and an error) if over the limits.
  bool store(const std::string& key, std::string value, std::string& error);

  asio::io_context& io;
  std::mutex mu;
  bool closed = false;
  std::unordered_map<std::string, std::string> kv;
  size_t bytes = 0;
  std::unordered_map<Connection*, Client> clients;
  std::unordered_map<uint64_t, Waiter> waiters;             // by waiter id
  std::unordered_map<std::string, std::vector<uint64_t>> by_key;  // key -> waiter ids
  uint64_t next_waiter = 1;
};

void StoreServer::State::on_connection(const std::shared_ptr<Connection>& conn) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (closed) {
      conn->abort();
      return;
    }
    clients[conn.get()] = Client{conn, 0};
  }
  std::weak_ptr<State> weak_state = shared_from_this();
  std::weak_ptr<Connection> weak_conn = conn;
  Connection* raw = conn.get();
  conn->start(
      [weak_state, weak_conn](msg::Type type, std::string&& payload) {
        auto state = weak_state.lock();
        auto c = weak_conn.lock();
        if (state && c) state->on_frame(c, type, std::move(payload));
      },
      [weak_state, raw](const std::string&) {
        if (auto state = weak_state.lock()) state->on_closed(raw);
      });
}

bool StoreServer::State::store(const std::string& key, std::string value, std::string& error) {
  auto it = kv.find(key);
  const size_t old_size = it == kv.end() ? 0 : key.size() + it->second.size();
  const size_t new_size = key.size() + value.size();
  if (it == kv.end() && kv.size() >= kMaxKeys) {
    error = "the store is full: it holds the maximum of " + std::to_string(kMaxKeys) + " keys";
    return false;
  }
  if (bytes - old_size + new_size > kMaxStoreBytes) {
    error = "the store is full: setting " + quote(key) + " would exceed " + std::to_string(kMaxStoreBytes) + " bytes";
    return false;
  }
  bytes = bytes - old_size + new_size;
  if (it == kv.end()) kv.emplace(key, std::move(value));
  else it->second = std::move(value);
  return true;
}

void StoreServer::State::drop_waiter(std::unordered_map<uint64_t, Waiter>::iterator it) {
  auto c = clients.find(it->second.owner);
  if (c != clients.end() && c->second.waiters > 0) --c->second.waiters;
  auto k = by_key.find(it->second.key);
  if (k != by_key.end()) {
    auto& ids = k->second;
    ids.erase(std::remove(ids.begin(), ids.end(), it->first), ids.end());
    if (ids.empty()) by_key.erase(k);
  }
  waiters.erase(it);  // destroying the timer cancels its wait
}

void StoreServer::State::wake(const std::string& key, const std::string& value, Outgoing& out) {
  auto k = by_key.find(key);
  if (k == by_key.end()) return;
  std::vector<uint64_t> ids = std::move(k->second);
  by_key.erase(k);
  for (uint64_t wid : ids) {
    auto it = waiters.find(wid);
    if (it == waiters.end()) continue;
    if (auto c = it->second.conn.lock()) out.emplace_back(std::move(c), reply(it->second.request, SF_OK, value));
    auto cl = clients.find(it->second.owner);
    if (cl != clients.end() && cl->second.waiters > 0) --cl->second.waiters;
    waiters.erase(it);
  }
}

void StoreServer::State::on_frame(const std::shared_ptr<Connection>& conn, msg::Type type, std::string&& payload) {
  if (type != msg::Type::KvSet && type != msg::Type::KvGet && type != msg::Type::KvAdd)
    throw ProtocolError("unexpected frame type " + std::to_string(static_cast<int>(type)) +
                        " on the rendezvous store");
  msg::KvRequest req = deserialize<msg::KvRequest>(payload);
  Outgoing out;
  auto respond = [&](msg::KvReply r) { out.emplace_back(conn, std::move(r)); };

  if (req.key.empty() || req.key.size() > kMaxKeyBytes) {
    respond(reply(req.id, SF_ERR_INVALID, {},
                  "invalid key: keys must have 1 to " + std::to_string(kMaxKeyBytes) + " bytes, got " +
                      std::to_string(req.key.size())));
  } else {
    std::lock_guard<std::mutex> lock(mu);
    if (closed) return;
    switch (type) {
      case msg::Type::KvSet: {
        std::string error;
        const std::string value = req.value;
        if (!store(req.key, std::move(req.value), error)) {
          respond(reply(req.id, SF_ERR, {}, error));
          break;
        }
        wake(req.key, value, out);
        respond(reply(req.id, SF_OK));
        break;
      }
      case msg::Type::KvAdd: {
        int64_t current = 0;
        auto it = kv.find(req.key);
        if (it != kv.end()) {
          const std::string& s = it->second;
          auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), current);
          if (ec != std::errc() || p != s.data() + s.size()) {
            respond(reply(req.id, SF_ERR_INVALID, {}, "cannot add to key " + quote(req.key) + ": its value is not a decimal integer"));
            break;
          }
        }
        int64_t result = 0;
        if (__builtin_add_overflow(current, req.delta, &result)) {
          respond(reply(req.id, SF_ERR_INVALID, {},
                        "cannot add " + std::to_string(req.delta) + " to key " + quote(req.key) + ": int64 overflow"));
          break;
        }
        std::string text = std::to_string(result);
        std::string error;
        if (!store(req.key, text, error)) {
          respond(reply(req.id, SF_ERR, {}, error));
          break;
        }
        wake(req.key, text, out);
        respond(reply(req.id, SF_OK, std::move(text)));
        break;
      }
      case msg::Type::KvGet: {
        auto it = kv.find(req.key);
        if (it != kv.end()) {
          respond(reply(req.id, SF_OK, it->second));
          break;
        }
        if (req.timeout_ms == 0) {
          respond(reply(req.id, SF_ERR_TIMEOUT, {}, "key " + quote(req.key) + " is not set"));
          break;
        }
        auto cl = clients.find(conn.get());
        if (cl == clients.end()) return;  // closing
        if (cl->second.waiters >= kMaxWaitersPerClient) {
          respond(reply(req.id, SF_ERR, {},
                        "too many pending gets on this connection (" + std::to_string(kMaxWaitersPerClient) + ")"));
          break;
        }
        ++cl->second.waiters;
        const uint64_t wid = next_waiter++;
        Waiter& w = waiters[wid];
        w.conn = conn;
        w.owner = conn.get();
        w.request = req.id;
        w.key = req.key;
        w.timeout_ms = req.timeout_ms;
        by_key[req.key].push_back(wid);
        if (req.timeout_ms > 0) {
          w.timer = std::make_unique<asio::steady_timer>(io);
          w.timer->expires_after(std::chrono::milliseconds(req.timeout_ms));
          w.timer->async_wait([weak = weak_from_this(), wid](const boost::system::error_code& ec) {
            if (ec) return;
            if (auto state = weak.lock()) state->expire(wid);
          });
        }
        break;
      }
      default:
        break;
    }
  }
  for (auto& [c, r] : out) c->send_msg(msg::Type::KvReply, r);
}

void StoreServer::State::expire(uint64_t wid) {
  std::shared_ptr<Connection> conn;
  msg::KvReply r;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = waiters.find(wid);
    if (it == waiters.end()) return;  // answered meanwhile
    conn = it->second.conn.lock();
    r = reply(it->second.request, SF_ERR_TIMEOUT, {},
              "timed out after " + std::to_string(it->second.timeout_ms) + " ms waiting for key " +
                  quote(it->second.key));
    drop_waiter(it);
  }
  if (conn) conn->send_msg(msg::Type::KvReply, r);
}

void StoreServer::State::on_closed(Connection* conn) {
  std::shared_ptr<Connection> keep;  // released outside the lock
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = waiters.begin(); it != waiters.end();) {
    auto next = std::next(it);
    if (it->second.owner == conn) drop_waiter(it);
    it = next;
  }
  auto c = clients.find(conn);
  if (c != clients.end()) {
    keep = std::move(c->second.conn);
    clients.erase(c);
  }
}

void StoreServer::State::close() {
  std::unordered_map<Connection*, Client> dropped;
  std::unordered_map<uint64_t, Waiter> old_waiters;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (closed) return;
    closed = true;
    dropped.swap(clients);
    old_waiters.swap(waiters);
    by_key.clear();
  }
  for (auto& [raw, client] : dropped) client.conn->abort();
}

StoreServer::StoreServer(asio::io_context& io, const std::string& bind_address, uint16_t port, std::string secret,
                         ConnectionOptions options)
    : state_(std::make_shared<State>(io)) {
  std::weak_ptr<State> weak = state_;
  server_ = std::make_unique<Server>(io, bind_address, port, std::move(secret), options,
                                     [weak](std::shared_ptr<Connection> c) {
                                       if (auto s = weak.lock()) s->on_connection(c);
                                       else c->abort();
                                     });
}

StoreServer::~StoreServer() { close(); }

uint16_t StoreServer::port() const { return server_->port(); }

void StoreServer::close() {
  server_->close();
  state_->close();
}

// ---- client ---------------------------------------------------------------------------------

struct StoreClient::Impl {
  struct Pending {
    std::condition_variable cv;
    std::optional<msg::KvReply> reply;
  };

  Impl() : guard(asio::make_work_guard(io)) {}

  // Sends one request and waits for its reply; wait_ms < 0 waits as long as the connection lives.
  msg::KvReply call(msg::Type type, msg::KvRequest req, int64_t wait_ms) {
    auto p = std::make_shared<Pending>();
    {
      std::lock_guard<std::mutex> lock(mu);
      if (closed) throw std::runtime_error("rendezvous store connection lost: " + close_reason);
      req.id = next_id++;
      pending[req.id] = p;
    }
    try {
      conn->send_msg(type, req);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      pending.erase(req.id);
      throw;
    }
    std::unique_lock<std::mutex> lock(mu);
    auto ready = [&] { return p->reply.has_value() || closed; };
    if (wait_ms < 0) {
      p->cv.wait(lock, ready);
    } else if (!p->cv.wait_for(lock, std::chrono::milliseconds(wait_ms), ready)) {
      pending.erase(req.id);
      throw StoreTimeout("no reply from the rendezvous store within " + std::to_string(wait_ms) +
                         " ms for key " + quote(req.key));
    }
    pending.erase(req.id);
    if (!p->reply) throw std::runtime_error("rendezvous store connection lost: " + close_reason);
    return std::move(*p->reply);
  }

  void on_frame(msg::Type type, std::string&& payload) {
    if (type != msg::Type::KvReply)
      throw ProtocolError("unexpected frame type " + std::to_string(static_cast<int>(type)) + " from the store");
    auto r = deserialize<msg::KvReply>(payload);
    std::lock_guard<std::mutex> lock(mu);
    auto it = pending.find(r.id);
    if (it == pending.end()) return;  // its caller gave up
    it->second->reply = std::move(r);
    it->second->cv.notify_all();
  }

  void on_close(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu);
    closed = true;
    close_reason = reason;
    for (auto& [id, p] : pending) p->cv.notify_all();
  }

  static void check_status(const msg::KvReply& r, const std::string& what) {
    if (r.status == SF_OK) return;
    if (r.status == SF_ERR_TIMEOUT) throw StoreTimeout(r.error);
    throw std::runtime_error("rendezvous store: " + what + ": " + r.error);
  }

  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> guard;
  std::thread thread;
  std::shared_ptr<Connection> conn;

  std::mutex mu;
  uint64_t next_id = 1;
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> pending;
  bool closed = false;
  std::string close_reason;

  static constexpr int64_t kReplyGraceMs = 5000;   // on top of a get's own timeout
  static constexpr int64_t kRequestWaitMs = 60000;  // set/add: the store answers at once
};

StoreClient::StoreClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<StoreClient> StoreClient::connect(const std::string& host, uint16_t port, const std::string& secret,
                                                  uint32_t node, int timeout_ms) {
  auto impl = std::make_unique<Impl>();
  Impl* raw = impl.get();
  // The handshake is synchronous and needs no running io_context; the io thread starts after.
  impl->conn = net::connect(impl->io, host, port, secret, node, ConnectionOptions{}, timeout_ms);
  impl->thread = std::thread([raw] { raw->io.run(); });
  impl->conn->start([raw](msg::Type t, std::string&& p) { raw->on_frame(t, std::move(p)); },
                    [raw](const std::string& reason) { raw->on_close(reason); });
  return std::unique_ptr<StoreClient>(new StoreClient(std::move(impl)));
}

StoreClient::~StoreClient() {
  if (!impl_) return;
  impl_->conn->close();
  impl_->conn->wait_closed(2000);
  impl_->guard.reset();
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void StoreClient::set(const std::string& key, std::string_view value) {
  msg::KvRequest req;
  req.key = key;
  req.value.assign(value.data(), value.size());
  Impl::check_status(impl_->call(msg::Type::KvSet, std::move(req), Impl::kRequestWaitMs), "set " + quote(key));
}

std::string StoreClient::get(const std::string& key, int64_t timeout_ms) {
  msg::KvRequest req;
  req.key = key;
  req.timeout_ms = timeout_ms;
  const int64_t wait = timeout_ms < 0 ? -1 : timeout_ms + Impl::kReplyGraceMs;
  auto r = impl_->call(msg::Type::KvGet, std::move(req), wait);
  Impl::check_status(r, "get " + quote(key));
  return std::move(r.value);
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  msg::KvRequest req;
  req.key = key;
  req.delta = delta;
  auto r = impl_->call(msg::Type::KvAdd, std::move(req), Impl::kRequestWaitMs);
  Impl::check_status(r, "add to " + quote(key));
  int64_t v = 0;
  auto [p, ec] = std::from_chars(r.value.data(), r.value.data() + r.value.size(), v);
  if (ec != std::errc() || p != r.value.data() + r.value.size())
    throw std::runtime_error("rendezvous store: add to " + quote(key) + " returned a non-integer");
  return v;
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys) {
    try {
      get(k, 0);
    } catch (const StoreTimeout&) {
      return false;
    }
  }
  return true;
}

void StoreClient::wait(const std::vector<std::string>& keys, int64_t timeout_ms) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (const auto& k : keys) {
    int64_t left = -1;
    if (timeout_ms >= 0)
      left = std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    get(k, left == 0 && timeout_ms > 0 ? 1 : left);
  }
}

}  // namespace skyforge::net
