// The pool run's node table: one row per node (its rank is its index), from the provider's
// handle and address to what its worker has said over the control connection. Not locked
// itself: the pool run holds its mutex around every use (run_state.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "messages.hpp"
#include "protocol.hpp"
#include "run_output.hpp"

namespace skyforge {

struct Node {
  std::string id;       // provider's handle
  std::string address;  // as other nodes see it
  std::shared_ptr<net::Connection> conn;
  std::optional<msg::Hello> hello;
  bool ready = false;
  bool closed = false;
  std::string lost;  // why the connection ended before the node was done
  std::optional<msg::RunResult> result;
  bool cancelled = false;  // told to shut down while its part was still running
  std::optional<msg::Progress> progress;  // its communicator's collectives (the watchdog's input)
  std::chrono::steady_clock::time_point progress_at{};
  std::shared_ptr<OutputAcks> acks;  // its output's flow control (msg::OutputAck)

  bool open() const { return conn && !closed; }  // its worker's connection is up
};

class NodeTable {
 public:
  void add(std::string id, std::string address);  // the provider made the next node
  size_t size() const { return nodes_.size(); }
  Node& operator[](uint32_t node) { return nodes_[node]; }
  const Node& operator[](uint32_t node) const { return nodes_[node]; }
  auto begin() { return nodes_.begin(); }
  auto end() { return nodes_.end(); }
  auto begin() const { return nodes_.begin(); }
  auto end() const { return nodes_.end(); }

  std::vector<std::string> ids() const;  // the provider's handles, by rank

  // A worker's authenticated connection claims `node`: false (and nothing kept) when there is
  // no such node or it already has one. Its output is acknowledged over it.
  bool attach(uint32_t node, const std::shared_ptr<net::Connection>& conn);

  std::vector<uint32_t> not_joined() const;  // no Hello yet
  bool all_joined() const { return not_joined().empty(); }
  bool all_settled() const;  // every node ready, finished or gone
  bool all_done() const;     // every node sent its result
  bool all_closed() const;   // no connection still up
  std::vector<uint32_t> open() const;  // the nodes whose connection is up

  // Each node's place among the nodes sharing its machine address: local_rank, local_world_size.
  struct Local {
    uint32_t rank = 0, size = 0;
  };
  std::vector<Local> local_ranks() const;

  // A restart: every connection aborted, each node back to its provider's handle and address.
  void reset_workers();
  void abort_all();  // every connection, at the end
  // "0,2" (sep ",") or "0, 2": the ranks as a message names them.
  static std::string ranks(const std::vector<uint32_t>& nodes, const char* sep);

 private:
  std::vector<Node> nodes_;
};

}  // namespace skyforge
