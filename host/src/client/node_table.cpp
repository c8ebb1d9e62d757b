// The pool run's node table (node_table.hpp).
#include "node_table.hpp"

#include <algorithm>
#include <map>

namespace skyforge {

void NodeTable::add(std::string id, std::string address) {
  Node n;
  n.id = std::move(id);
  n.address = std::move(address);
  nodes_.push_back(std::move(n));
}

std::vector<std::string> NodeTable::ids() const {
  std::vector<std::string> out;
  for (const auto& n : nodes_) out.push_back(n.id);
  return out;
}

bool NodeTable::attach(uint32_t node, const std::shared_ptr<net::Connection>& conn) {
  if (node >= nodes_.size() || nodes_[node].conn) return false;
  nodes_[node].conn = conn;
  nodes_[node].acks = std::make_shared<OutputAcks>(
      [w = std::weak_ptr<net::Connection>(conn)](uint64_t total) {
        if (auto c = w.lock()) c->send_msg(msg::Type::OutputAck, msg::OutputAck{total});
      },
      msg::kOutputWindow);
  return true;
}

std::vector<uint32_t> NodeTable::not_joined() const {
  std::vector<uint32_t> out;
  for (uint32_t i = 0; i < nodes_.size(); ++i)
    if (!nodes_[i].hello) out.push_back(i);
  return out;
}

bool NodeTable::all_settled() const {
  return std::all_of(nodes_.begin(), nodes_.end(), [](const Node& n) { return n.ready || n.result || n.closed; });
}

bool NodeTable::all_done() const {
  return std::all_of(nodes_.begin(), nodes_.end(), [](const Node& n) { return n.result.has_value(); });
}

bool NodeTable::all_closed() const {
  return std::none_of(nodes_.begin(), nodes_.end(), [](const Node& n) { return n.open(); });
}

std::vector<uint32_t> NodeTable::open() const {
  std::vector<uint32_t> out;
  for (uint32_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].open()) out.push_back(i);
  return out;
}

std::vector<NodeTable::Local> NodeTable::local_ranks() const {
  std::map<std::string, uint32_t> per_addr, seen;
  for (const auto& n : nodes_) per_addr[n.address]++;
  std::vector<Local> out;
  for (const auto& n : nodes_) out.push_back({seen[n.address]++, per_addr[n.address]});
  return out;
}

void NodeTable::reset_workers() {
  for (auto& n : nodes_) {
    if (n.conn) n.conn->abort();
    Node fresh;
    fresh.id = std::move(n.id);
    fresh.address = std::move(n.address);
    n = std::move(fresh);
  }
}

void NodeTable::abort_all() {
  for (auto& n : nodes_)
    if (n.conn) n.conn->abort();
}

std::string NodeTable::ranks(const std::vector<uint32_t>& nodes, const char* sep) {
  std::string s;
  for (size_t k = 0; k < nodes.size(); ++k) s += (k ? sep : "") + std::to_string(nodes[k]);
  return s;
}

}  // namespace skyforge
