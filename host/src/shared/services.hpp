// The sf_host_services table the host lends to every plugin (docs/plugins.md): logging, this
// node's identity, the head's rendezvous store, job configuration and (ABI 1.1) the pool's
// communicator and the node's compute backends. One per process.
//
// The table is always the full 1.1 table (struct_size = sizeof(sf_host_services)); on the client
// communicator() returns NULL and compute_backend() SF_ERR_UNSUPPORTED.
#pragma once

#include <skyforge/abi.h>

#include <functional>
#include <vector>
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
  // Builds the pool's communicator: collective (every node calls it once), may block up to
  // the collective timeout, throws std::exception with the reason on failure. The returned
  // pointer keeps whatever owns the table alive.
  using CommunicatorFactory = std::function<std::shared_ptr<const sf_communicator>()>;

  explicit Services(LogFn log);
  ~Services();
  Services(const Services&) = delete;
  Services& operator=(const Services&) = delete;

  const sf_host_services* table() const { return &table_; }

  // Node side: identity from the job, and the store every node shares.
  void set_instance(const msg::NodeIdentity& id, const std::string& work_dir);
  void set_store(std::unique_ptr<net::StoreClient> store);
  // The store is connected on first use, not at job start: a node that never calls kv_* or
  // communicator() never depends on the head (a map job survives losing node 0 before another
  // node started). A failed connection is remembered and repeated.
  using StoreConnector = std::function<std::unique_ptr<net::StoreClient>()>;
  void set_store_connector(StoreConnector connect);
  void set_config(std::map<std::string, std::string> config) { config_ = std::move(config); }
  // This node's identity, as the calling thread sees it: on a task slot's thread (see
  // SlotScope) the slot's own record, whose `slot` is that slot; elsewhere the node's (slot 0).
  // Every record lives as long as this object.
  const sf_instance_info* instance() const;
  // Marks the calling thread as task slot `slot` (< concurrency) for as long as it lives.
  class SlotScope {
   public:
    explicit SlotScope(uint32_t slot);
    ~SlotScope();
    SlotScope(const SlotScope&) = delete;
    SlotScope& operator=(const SlotScope&) = delete;
  };
  // Connects on first use (set_store_connector); nullptr where no store exists (the client).
  // Throws std::runtime_error when the connection failed.
  net::StoreClient* store();

  // Node side: communicator() builds it with `factory` on first use and returns the same one
  // afterwards; a failure is remembered (a retry could not be collective) and repeated.
  void set_communicator_factory(CommunicatorFactory factory);
  // Destroys the communicator (teardown, after the app and compute backends are gone).
  void reset_communicator();

  // Node side: compute backends loaded for this job, in creation order. The host owns them;
  // compute_backend(name) hands out (hooks, self). "compute.backend" in the config names the
  // one an empty name selects.
  void add_compute_backend(const std::string& name, const sf_compute_hooks* hooks, void* self);
  void clear_compute_backends();
  // The lookup behind the compute_backend service (see abi.h); sets last_error on failure.
  sf_status find_compute_backend(const char* name, const sf_compute_hooks** hooks, void** self);

 private:
  static Services& self(void* ctx) { return *static_cast<Services*>(ctx); }
  static sf_status fail(sf_status st, std::string message);

  sf_host_services table_{};
  LogFn log_;
  std::mutex log_mutex_;
  bool has_instance_ = false;
  sf_instance_info info_{};
  std::vector<sf_instance_info> slot_infos_;  // one per task slot: info_ but for `slot`
  // storage behind info_'s strings
  msg::NodeIdentity id_;
  std::string work_dir_;
  std::mutex store_mutex_;
  StoreConnector store_connector_;
  std::string store_error_;
  std::unique_ptr<net::StoreClient> store_;
  std::map<std::string, std::string> config_;

  std::mutex comm_mutex_;
  CommunicatorFactory comm_factory_;
  std::shared_ptr<const sf_communicator> comm_;
  std::string comm_error_;  // the failure of the one attempt, repeated to later callers

  struct Backend {
    std::string name;
    const sf_compute_hooks* hooks;
    void* self;
  };
  std::mutex backends_mutex_;
  std::vector<Backend> backends_;
};

}  // namespace skyforge
