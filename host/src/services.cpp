#include "services.hpp"

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
    Services& s = self(ctx);
    std::lock_guard<std::mutex> lock(s.log_mutex_);
    if (s.log_) s.log_(level, message ? message : "");
  };
  table_.instance_info = [](void* ctx) -> const sf_instance_info* { return self(ctx).instance(); };
  table_.kv_set = [](void* ctx, const char* key, const char* value, size_t size) -> sf_status {
    Services& s = self(ctx);
    if (!s.store_) return fail(SF_ERR_UNSUPPORTED, "the rendezvous store exists only on nodes");
    try {
      s.store_->set(key, std::string_view(value, size));
      return SF_OK;
    } catch (const std::exception& e) {
      return fail(SF_ERR, e.what());
    }
  };
  table_.kv_get = [](void* ctx, const char* key, int64_t timeout_ms, sf_sink out) -> sf_status {
    Services& s = self(ctx);
    if (!s.store_) return fail(SF_ERR_UNSUPPORTED, "the rendezvous store exists only on nodes");
    try {
      std::string v = s.store_->get(key, timeout_ms);
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
    if (!s.store_) return fail(SF_ERR_UNSUPPORTED, "the rendezvous store exists only on nodes");
    try {
      *result = s.store_->add(key, delta);
      return SF_OK;
    } catch (const std::exception& e) {
      return fail(SF_ERR, e.what());
    }
  };
  table_.config = [](void* ctx, const char* key) -> const char* {
    Services& s = self(ctx);
    auto it = s.config_.find(key ? key : "");
    return it == s.config_.end() ? nullptr : it->second.c_str();
  };
  table_.last_error = [](void*) -> const char* { return t_error.c_str(); };
}

Services::~Services() = default;

void Services::set_instance(const msg::Job& job, const std::string& work_dir) {
  head_addr_ = job.head_addr;
  private_ip_ = job.private_ip;
  accelerator_ = job.accelerator;
  pool_id_ = job.pool_id;
  store_addr_ = job.store_addr;
  work_dir_ = work_dir;
  info_ = sf_instance_info{};
  info_.struct_size = sizeof(sf_instance_info);
  info_.node = job.node;
  info_.total_nodes = job.total_nodes;
  info_.is_head = job.node == 0 ? 1 : 0;
  info_.head_addr = head_addr_.c_str();
  info_.private_ip = private_ip_.c_str();
  info_.local_rank = job.local_rank;
  info_.local_world_size = job.local_world_size;
  info_.accelerators = job.accelerators;
  info_.accelerator = accelerator_.c_str();
  info_.concurrency = job.concurrency;
  info_.slot = 0;
  info_.pool_id = pool_id_.c_str();
  info_.store_addr = store_addr_.c_str();
  info_.work_dir = work_dir_.c_str();
  has_instance_ = true;
}

void Services::set_store(std::unique_ptr<net::StoreClient> store) { store_ = std::move(store); }

}  // namespace skyforge
