// The sf_host_services table the host lends to every plugin (DESIGN.md §3): logging, this
// node's identity, the head's rendezvous store and job configuration. One per process.
#pragma once

#include <skyforge/abi.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "messages.hpp"

namespace skyforge {
namespace net {
class StoreClient;
}

class Services {
 public:
  using LogFn = std::function<void(int32_t level, const std::string& message)>;

  explicit Services(LogFn log);
  ~Services();
  Services(const Services&) = delete;
  Services& operator=(const Services&) = delete;

  const sf_host_services* table() const { return &table_; }

  // Node side: identity from the job, and the store every node shares.
  void set_instance(const msg::Job& job, const std::string& work_dir);
  void set_store(std::unique_ptr<net::StoreClient> store);
  void set_config(std::map<std::string, std::string> config) { config_ = std::move(config); }
  const sf_instance_info* instance() const { return has_instance_ ? &info_ : nullptr; }

 private:
  static Services& self(void* ctx) { return *static_cast<Services*>(ctx); }
  static sf_status fail(sf_status st, std::string message);

  sf_host_services table_{};
  LogFn log_;
  std::mutex log_mutex_;
  bool has_instance_ = false;
  sf_instance_info info_{};
  // storage behind info_'s strings
  std::string head_addr_, private_ip_, accelerator_, pool_id_, store_addr_, work_dir_;
  std::unique_ptr<net::StoreClient> store_;
  std::map<std::string, std::string> config_;
};

}  // namespace skyforge
