#include "services.hpp"
#include "lent.hpp"

#include <skyforge/config_keys.hpp>

#include <algorithm>
#include <stdexcept>

#include "store.hpp"

namespace skyforge {
namespace {
thread_local std::string t_error;
}

sf_status Services::fail(sf_status st, std::string message) {
  t_error = std::move(message);
  return st;
}

Services::Services(LogFn log) : log_(std::move(log)) {
  table_.struct_size = sizeof(sf_host_services);
  table_.abi_major = SKYFORGE_ABI_MAJOR;
  table_.abi_minor = SKYFORGE_ABI_MINOR;
  table_.ctx = this;
  table_.log = [](void* ctx, int32_t level, const char* message) {
    lent([&] {
      Services& s = self(ctx);
      std::lock_guard<std::mutex> lock(s.log_mutex_);
      if (s.log_) s.log_(level, message ? message : "");
    });
  };
  table_.instance_info = [](void* ctx) -> const sf_instance_info* { return self(ctx).instance(); };
  table_.kv_set = [](void* ctx, const char* key, const char* value, size_t size) -> sf_status {
    Services& s = self(ctx);
    try {
      net::StoreClient* store = s.store();
      if (!store) return fail(SF_ERR_UNSUPPORTED, "the rendezvous store exists only on nodes");
      store->set(key, std::string_view(value, size));
      return SF_OK;
    } catch (const std::exception& e) {
      return fail(SF_ERR, e.what());
    }
  };
  table_.kv_get = [](void* ctx, const char* key, int64_t timeout_ms, sf_sink out) -> sf_status {
    Services& s = self(ctx);
    try {
      net::StoreClient* store = s.store();
      if (!store) return fail(SF_ERR_UNSUPPORTED, "the rendezvous store exists only on nodes");
      std::string v = store->get(key, timeout_ms);
      if (out.write) out.write(out.ctx, v.data(), v.size());
      return SF_OK;
    } catch (const net::StoreTimeout& e) {
      return fail(SF_ERR_TIMEOUT, e.what());
    } catch (const std::exception& e) {
      return fail(SF_ERR, e.what());
    }
  };
  table_.kv_add = [](void* ctx, const char* key, int64_t delta, int64_t* result) -> sf_status {
    Services& s = self(ctx);
    try {
      net::StoreClient* store = s.store();
      if (!store) return fail(SF_ERR_UNSUPPORTED, "the rendezvous store exists only on nodes");
      *result = store->add(key, delta);
      return SF_OK;
    } catch (const std::exception& e) {
      return fail(SF_ERR, e.what());
    }
  };
  table_.config = [](void* ctx, const char* key) -> const char* {
    return lent<const char*>(nullptr, [&]() -> const char* {
      Services& s = self(ctx);
      auto it = s.config_.find(key ? key : "");
      return it == s.config_.end() ? nullptr : it->second.c_str();
    });
  };
  table_.last_error = [](void*) -> const char* { return t_error.c_str(); };
  table_.communicator = [](void* ctx) -> const sf_communicator* {
    return lent<const sf_communicator*>(nullptr, [&]() -> const sf_communicator* {
      Services& s = self(ctx);
      std::lock_guard<std::mutex> lock(s.comm_mutex_);
      if (s.comm_) return s.comm_.get();
      if (!s.comm_error_.empty()) {
        fail(SF_ERR, s.comm_error_);
        return nullptr;
      }
      if (!s.comm_factory_) {
        fail(SF_ERR_UNSUPPORTED, "there is no communicator here: it exists only on a pool's nodes");
        return nullptr;
      }
      try {
        s.comm_ = s.comm_factory_();
        if (!s.comm_) throw std::runtime_error("the communicator could not be built");
        return s.comm_.get();
      } catch (const std::exception& e) {
        s.comm_error_ = e.what();
      } catch (...) {
        s.comm_error_ = "the communicator could not be built (unknown error)";
      }
      fail(SF_ERR, s.comm_error_);
      return nullptr;
    });
  };
  table_.compute_backend = [](void* ctx, const char* name, const sf_compute_hooks** hooks,
                              void** self_out) -> sf_status {
    return lent<sf_status>(SF_ERR, [&] { return self(ctx).find_compute_backend(name, hooks, self_out); });
  };
}

void Services::set_communicator_factory(CommunicatorFactory factory) {
  std::lock_guard<std::mutex> lock(comm_mutex_);
  comm_factory_ = std::move(factory);
}

void Services::reset_communicator() {
  std::shared_ptr<const sf_communicator> old;
  {
    std::lock_guard<std::mutex> lock(comm_mutex_);
    old = std::move(comm_);
    comm_factory_ = nullptr;
    comm_error_ = "the communicator is gone: the job is over";
  }
  old.reset();  // outside the lock
}

void Services::add_compute_backend(const std::string& name, const sf_compute_hooks* hooks, void* self) {
  std::lock_guard<std::mutex> lock(backends_mutex_);
  backends_.push_back(Backend{name, hooks, self});
}

void Services::clear_compute_backends() {
  std::lock_guard<std::mutex> lock(backends_mutex_);
  backends_.clear();
}

sf_status Services::find_compute_backend(const char* name, const sf_compute_hooks** hooks, void** self_out) {
  if (!hooks || !self_out) return fail(SF_ERR_INVALID, "compute_backend: hooks and self must not be NULL");
  std::lock_guard<std::mutex> lock(backends_mutex_);
  auto loaded = [&] {
    if (backends_.empty()) return std::string("none is loaded on this node; list one in the manifest's [[plugins]]");
    std::string l = "loaded: ";
    for (size_t i = 0; i < backends_.size(); ++i) l += (i ? ", '" : "'") + backends_[i].name + "'";
    return l;
  };
  auto give = [&](const Backend& b) {
    *hooks = b.hooks;
    *self_out = b.self;
    return SF_OK;
  };
  auto find = [&](const std::string& n) -> const Backend* {
    for (const auto& b : backends_)
      if (b.name == n) return &b;
    return nullptr;
  };
  if (!has_instance_ && backends_.empty())
    return fail(SF_ERR_UNSUPPORTED, "compute backends exist only on a pool's nodes");
  if (name && *name) {
    if (const Backend* b = find(name)) return give(*b);
    return fail(SF_ERR_INVALID, std::string("no compute backend named '") + name + "' (" + loaded() + ")");
  }
  if (auto it = config_.find(std::string(config::keys::compute_backend.name)); it != config_.end() && !it->second.empty()) {
    if (const Backend* b = find(it->second)) return give(*b);
    return fail(SF_ERR_INVALID, "the selected compute backend '" + it->second + "' (compute.backend) is not loaded (" +
                                    loaded() + ")");
  }
  if (backends_.size() == 1) return give(backends_.front());
  return fail(SF_ERR_INVALID, "no compute backend is selected (" + loaded() +
                                  (backends_.empty() ? "" : "; pass a name") + ")");
}

Services::~Services() = default;

void Services::set_instance(const msg::NodeIdentity& id, const std::string& work_dir) {
  id_ = id;  // info_'s strings point into this copy
  work_dir_ = work_dir;
  info_ = sf_instance_info{};
  info_.struct_size = sizeof(sf_instance_info);
  info_.node = id_.node;
  info_.total_nodes = id_.total_nodes;
  info_.is_head = id_.node == 0 ? 1 : 0;
  info_.head_addr = id_.head_addr.c_str();
  info_.private_ip = id_.private_ip.c_str();
  info_.local_rank = id_.local_rank;
  info_.local_world_size = id_.local_world_size;
  info_.accelerators = id_.accelerators;
  info_.accelerator = id_.accelerator.c_str();
  info_.concurrency = id_.concurrency;
  info_.slot = 0;
  info_.pool_id = id_.pool_id.c_str();
  info_.store_addr = id_.store_addr.c_str();
  info_.work_dir = work_dir_.c_str();
  slot_infos_.assign(std::max<uint32_t>(id_.concurrency, 1), info_);
  for (uint32_t s = 0; s < slot_infos_.size(); ++s) slot_infos_[s].slot = s;
  has_instance_ = true;
}

namespace {
thread_local int64_t t_slot = -1;  // the task slot the calling thread runs, -1: none
}

Services::SlotScope::SlotScope(uint32_t slot) { t_slot = slot; }
Services::SlotScope::~SlotScope() { t_slot = -1; }

const sf_instance_info* Services::instance() const {
  if (!has_instance_) return nullptr;
  if (t_slot >= 0 && static_cast<size_t>(t_slot) < slot_infos_.size()) return &slot_infos_[static_cast<size_t>(t_slot)];
  return &info_;
}

void Services::set_store(std::unique_ptr<net::StoreClient> store) {
  std::lock_guard<std::mutex> lock(store_mutex_);
  store_ = std::move(store);
  if (!store_) store_connector_ = nullptr;  // the job is over: no new connection
}

void Services::set_store_connector(StoreConnector connect) {
  std::lock_guard<std::mutex> lock(store_mutex_);
  store_connector_ = std::move(connect);
}

net::StoreClient* Services::store() {
  std::lock_guard<std::mutex> lock(store_mutex_);
  if (store_ || !store_connector_) return store_.get();
  if (!store_error_.empty()) throw std::runtime_error(store_error_);
  try {
    store_ = store_connector_();
  } catch (const std::exception& e) {
    store_error_ = std::string("the rendezvous store: ") + e.what();
    throw std::runtime_error(store_error_);
  }
  return store_.get();
}

}  // namespace skyforge
