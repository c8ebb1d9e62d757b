// The collective watchdog ([job] collective_timeout): from the collectives each node's
// communicator reports (msg::Progress), whether the run hangs in one, and which node to blame.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "node_table.hpp"

namespace skyforge {

// Why the run must stop, when some node has sat in collective #N for `timeout_s` while another
// never entered it (naming the laggards and where they were last seen), or every node sits in it
// and none finishes (a link between them down). Nothing while the nodes keep going.
std::optional<std::string> collective_hang(const NodeTable& nodes, double timeout_s,
                                           std::chrono::steady_clock::time_point now);

}  // namespace skyforge
