// The base of the providers whose nodes each run one NodeSession (ssh, slurm; aws through ssh):
// the node table and the hooks that only ask a node's session (start_worker, worker_alive,
// worker_exit). A node that moves to another machine (replace_node) keeps its id and index: its
// entry is marked gone and a newer one added, and the newest entry of an id is the node.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <skyforge/sdk.hpp>

#include "node_session.hpp"
#include "spawn.hpp"

namespace skyforge::providers {

// What every node of a SessionProvider has; a provider's own node type adds where it runs.
struct SessionNode {
  uint32_t index = 0;
  std::string id;
  NodeSession session;  // bootstrap, then the worker
  bool gone = false;    // terminated, or replaced by a newer entry under the same id
};

// Sends a worker to `session`; its errors as the provider reports them: bad argv or environment
// "<who>: ..." (SF_ERR_INVALID), a session that ended "<where>: ..." with SF_ERR_GONE (the
// machine is gone: the host may replace the node), anything else "<where>: ...".
void start_session_worker(NodeSession& session, const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& env, const std::string& who,
                          const std::string& where);
// The worker_exit hook for a started session: 0 while its worker runs; 1 with `out` filled once
// it has ended (the agent's 128+N is signal N).
int session_worker_exit(NodeSession& session, Provider::WorkerExit& out);

template <class Node>
class SessionProvider : public Provider {
 public:
  void start_worker(const std::string& node_id, const std::vector<std::string>& argv,
                    const std::map<std::string, std::string>& env) override {
    Node& n = require(node_id, "start_worker");
    start_session_worker(n.session, argv, env, who_, where(n));
  }
  int worker_alive(const std::string& node_id) override {
    Node* n = find(node_id);
    return n ? n->session.alive() : -1;
  }
  int worker_exit(const std::string& node_id, WorkerExit& out) override {
    Node* n = find(node_id);
    if (!n || !n->session.started()) return -1;
    const int known = session_worker_exit(n->session, out);
    if (known == 1 && out.exit_code == 255 && out.last_words.empty()) out.last_words = session_lost(*n);
    return known;
  }

 protected:
  // `who` begins the provider's errors ("ssh provider").
  SessionProvider(const Context& ctx, std::string who) : Provider(ctx), who_(std::move(who)) {}

  // How an error about node `n` begins ("ssh host 'h1': node-0", "slurm provider: node-0 (n1)").
  virtual std::string where(const Node& n) const = 0;
  // A worker's last words when its session ended with status 255 and it printed nothing (ssh:
  // the connection went); "": none.
  virtual std::string session_lost(const Node&) const { return ""; }

  // The newest entry of `id`, or nullptr.
  Node* find(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it)
      if ((*it)->id == id) return it->get();
    return nullptr;
  }
  // The node `id` for the hook `op`; throws Error when it is unknown (SF_ERR_INVALID) or gone.
  Node& require(const std::string& id, const char* op) {
    Node* n = find(id);
    if (!n) throw Error(who_ + ": " + op + ": unknown node " + id, SF_ERR_INVALID);
    std::lock_guard<std::mutex> lock(mu_);
    if (n->gone) throw Error(who_ + ": " + op + ": node " + id + " was terminated");
    return *n;
  }

  // The rest hold mu_. A new node "node-<index>".
  Node& add_node_locked(uint32_t index) {
    auto n = std::make_unique<Node>();
    n->index = index;
    n->id = "node-" + std::to_string(index);
    nodes_.push_back(std::move(n));
    return *nodes_.back();
  }
  // `old` is gone; a new entry under its id and index takes its place and is returned.
  Node& replace_node_locked(Node& old) {
    old.gone = true;
    auto n = std::make_unique<Node>();
    n->index = old.index;
    n->id = old.id;
    nodes_.push_back(std::move(n));
    return *nodes_.back();
  }
  // Marks the nodes named in `ids` (every node when empty) gone and returns those that were not.
  std::vector<Node*> take_nodes_locked(const std::vector<std::string>& ids) {
    std::vector<Node*> taken;
    for (auto& n : nodes_)
      if (!n->gone && (ids.empty() || std::find(ids.begin(), ids.end(), n->id) != ids.end())) {
        n->gone = true;
        taken.push_back(n.get());
      }
    return taken;
  }
  bool all_gone_locked() const {
    return std::all_of(nodes_.begin(), nodes_.end(), [](const auto& n) { return n->gone; });
  }

  // The long-lived children (the sessions; ssh's masters too) die with this process. Declared
  // before nodes_, it outlives the sessions.
  Spawner spawner_;
  mutable std::mutex mu_;  // guards nodes_ and what the provider keeps beside them
  std::vector<std::unique_ptr<Node>> nodes_;

 private:
  std::string who_;
};

}  // namespace skyforge::providers
