// The collective watchdog (watchdog.hpp).
#include "watchdog.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace skyforge {

std::optional<std::string> collective_hang(const NodeTable& nodes, double timeout_s,
                                           std::chrono::steady_clock::time_point now) {
  const double limit_ms = timeout_s * 1000;
  auto ms_since = [&](const Node& n) {
    return double(n.progress->since_ms) + std::chrono::duration<double, std::milli>(now - n.progress_at).count();
  };
  auto inside = [](const Node& n) { return n.progress && n.progress->entered > n.progress->done; };
  // The newest collective some node has sat in for the limit.
  uint64_t seq = 0;
  std::string op;
  for (const auto& n : nodes)
    if (!n.closed && inside(n) && ms_since(n) >= limit_ms && n.progress->entered > seq) {
      seq = n.progress->entered;
      op = n.progress->op;
    }
  if (seq == 0) return std::nullopt;
  std::vector<uint32_t> waiting, never;
  double waited_ms = 0;
  for (uint32_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    const uint64_t entered = n.progress ? n.progress->entered : 0;
    if (entered < seq) {
      never.push_back(i);
    } else if (inside(n) && entered == seq) {
      waiting.push_back(i);
      waited_ms = std::max(waited_ms, ms_since(n));
    }
  }
  auto list = [](const std::vector<uint32_t>& v) {
    return (v.size() == 1 ? "node " : "nodes ") + NodeTable::ranks(v, ",");
  };
  auto secs = [](double ms) {
    char b[32];
    std::snprintf(b, sizeof b, "%.0f s", ms / 1000);
    return std::string(b);
  };
  const std::string what = op + " #" + std::to_string(seq);
  if (never.empty()) {
    if (waiting.size() < nodes.size()) return std::nullopt;
    const auto& p0 = nodes[0].progress;
    return "every node has been in " + what + " for " + secs(waited_ms) +
           " and none has finished it ([job] collective_timeout = " + secs(limit_ms) +
           "): a link between nodes may be down" + (p0 && !p0->status.empty() ? "; node 0 was at " + p0->status : "");
  }
  std::string why = list(never) + " never entered " + what + " (" + list(waiting) + " waiting " + secs(waited_ms) +
                    ", [job] collective_timeout = " + secs(limit_ms) + ")";
  for (uint32_t i : never) {
    const Node& n = nodes[i];
    why += "; node " + std::to_string(i);
    if (n.result) why += "'s job had already ended";
    else if (!n.progress || n.progress->entered == 0) why += " has made no collective call yet";
    else if (inside(n)) why += " is in " + n.progress->op + " #" + std::to_string(n.progress->entered) + " since " + secs(ms_since(n));
    else why += "'s last was " + n.progress->op + " #" + std::to_string(n.progress->done) + ", " + secs(ms_since(n)) + " ago";
    if (n.progress && !n.progress->status.empty()) why += ", last seen at " + n.progress->status;
  }
  return why;
}

}  // namespace skyforge
