// Control-plane messages (docs/architecture.md). Each is the Boost.Serialization payload of one frame;
// the frame's type field says which. Nothing here is deserialised before a peer has proved
// the pool secret (see protocol.hpp).
#pragma once

#include <boost/serialization/map.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/utility.hpp>
#include <boost/serialization/vector.hpp>

#include "job_mode.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace skyforge::msg {

enum class Type : uint16_t {
  // handshake: raw payloads, never deserialised with Boost
  // (secure_channel.hpp: the proofs' transcript, and the records every later frame travels in)
  Challenge = 1,  // server -> client: nonce(32) | X25519 key share(32)
  AuthReply = 2,  // client -> server: node(u32 LE) | client nonce(32) | key share(32) | client proof(32)
  AuthOk = 3,     // server -> client: server proof(32)
  // pool
  Hello = 10,       // worker -> host
  Job = 11,         // host -> worker
  Heartbeat = 12,   // both ways, empty payload
  Log = 13,         // worker -> host
  TaskBatch = 14,   // host -> worker
  TaskResults = 15, // worker -> host
  RunResult = 16,   // worker -> host
  Shutdown = 17,    // host -> worker
  Ready = 18,       // worker -> host: plugins loaded, around_app entered
  Progress = 19,    // worker -> host: its collectives so far and its app's status (the host's watchdog)
  OutputAck = 20,   // host -> worker: how much of its job's output the host has written (flow control)
  // the job's files, after the run's final Shutdown (docs/manifest.md, "Getting files back")
  OutputsBegin = 21,  // worker -> host: how many files and bytes follow
  OutputChunk = 22,   // worker -> host: a piece of one file (the first names it, the last ends it)
  OutputsEnd = 23,    // worker -> host: every file sent; what was left behind and why
  OutputsAck = 24,    // host -> worker: how many of those bytes the host has written (flow control)
  // rendezvous store
  KvSet = 30,
  KvGet = 31,
  KvAdd = 32,
  KvReply = 33,
};
constexpr uint16_t kMaxType = 33;
bool known_type(uint16_t t);

struct Hello {
  uint32_t node = 0;
  int64_t pid = 0;
  std::string hostname;
  std::string private_ip;
  std::string store_addr;  // head only: host:port of its rendezvous store
  template <class A>
  void serialize(A& a, unsigned) {
    a & node & pid & hostname & private_ip & store_addr;
  }
};

struct PluginSpec {
  std::string name;
  std::string library;  // absolute path of the .so
  std::vector<std::pair<std::string, std::string>> options;
  template <class A>
  void serialize(A& a, unsigned) {
    a & name & library & options;
  }
};

// Who a node is in its pool: what the host tells each node in its Job, and — copied once, by
// Services::set_instance — what its plugins read as sf_instance_info.
struct NodeIdentity {
  uint32_t node = 0;
  uint32_t total_nodes = 1;
  std::string head_addr;
  std::string private_ip;
  uint32_t local_rank = 0;
  uint32_t local_world_size = 1;
  uint32_t accelerators = 0;
  std::string accelerator;
  uint32_t concurrency = 1;
  std::string pool_id;
  std::string store_addr;
  template <class A>
  void serialize(A& a, unsigned) {
    a & node & total_nodes & head_addr & private_ip & local_rank & local_world_size & accelerators & accelerator &
        concurrency & pool_id & store_addr;
  }
};

struct Job {
  NodeIdentity id;
  // what to run
  std::vector<PluginSpec> frameworks;  // manifest order
  PluginSpec app;                      // empty name for a command app
  JobMode mode = JobMode::broadcast;
  std::vector<std::string> command;
  std::map<std::string, std::string> env;  // image env
  std::map<std::string, std::string> config;
  template <class A>
  void serialize(A& a, unsigned) {
    uint8_t m = static_cast<uint8_t>(mode);
    a & id & frameworks & app & m & command & env & config;
    if (m > static_cast<uint8_t>(JobMode::map)) throw std::runtime_error("job mode " + std::to_string(m) + " out of range");
    mode = static_cast<JobMode>(m);
  }
};

struct Log {
  uint32_t node = 0;
  uint8_t stream = 1;  // 1 stdout, 2 stderr, 3 skyforge worker's own log
  std::string text;    // one or more whole lines, '\n'-terminated
  template <class A>
  void serialize(A& a, unsigned) {
    a & node & stream & text;
  }
};

struct TaskBatch {
  uint64_t first = 0;           // the task of inputs[0]; TaskResults.first names the batch with it
  std::vector<uint64_t> tasks;  // each input's task when they are not first, first+1, ... (a task
                                // backend may hand out any set); empty when they are
  std::vector<std::string> inputs;
  uint64_t task(size_t k) const { return tasks.empty() ? first + k : tasks[k]; }
  template <class A>
  void serialize(A& a, unsigned) {
    a & first & tasks & inputs;
  }
};

struct TaskResult {
  bool ok = true;
  uint32_t slot = 0;
  std::string value;  // output, or the error message
  template <class A>
  void serialize(A& a, unsigned) {
    a & ok & slot & value;
  }
};

struct TaskResults {
  uint64_t first = 0;
  uint64_t elapsed_ns = 0;  // time the worker spent on the batch, for auto-batching
  std::vector<TaskResult> results;
  template <class A>
  void serialize(A& a, unsigned) {
    a & first & elapsed_ns & results;
  }
};

struct RunResult {
  uint32_t node = 0;
  bool ok = true;
  int32_t exit_code = 0;  // command apps; -signal when killed by one
  std::string value;      // native app's result
  std::string error;
  template <class A>
  void serialize(A& a, unsigned) {
    a & node & ok & exit_code & value & error;
  }
};

// Output flow control (docs/architecture.md, "Output"): a worker forwards its job's stdout and
// stderr (Log streams 1 and 2) at most kOutputWindow bytes of Log text ahead of what the host has
// acknowledged; beyond that it stops reading the job's pipes, so the job blocks in its own write()
// as on a stalled terminal, while heartbeats go on. The host acknowledges the bytes it is done
// with (written to its stdout/stderr, or not shown by the output policy) as a running total, at
// least every quarter window. Stream 3 (the worker's own log) is not counted.
constexpr uint64_t kOutputWindow = uint64_t{1} << 20;
struct OutputAck {
  uint64_t bytes = 0;  // Log text bytes of streams 1 and 2 since the connection began
  template <class A>
  void serialize(A& a, unsigned) {
    a & bytes;
  }
};

// What a node's communicator has done (sent every heartbeat interval once it has one): the
// host's collective watchdog compares the nodes' sequence numbers (every rank makes the same
// collective calls in the same order, so collective #N is the same call everywhere).
struct Progress {
  uint64_t entered = 0;   // collectives entered: the current one's number while inside one
  uint64_t done = 0;      // collectives completed (entered - done is 1 inside one, else 0)
  std::string op;         // the current or last one: allreduce, broadcast, allgather, barrier
  uint64_t bytes = 0;     // its payload on this node
  int64_t since_ms = 0;   // inside one: for how long; else since the last one ended
  std::string status;     // the app's last SF_LOG_STATUS ("epoch 3/6, step 412/900; ..."), may be empty
  template <class A>
  void serialize(A& a, unsigned) {
    a & entered & done & op & bytes & since_ms & status;
  }
};

struct Shutdown {
  std::string reason;
  bool outputs = false;  // the run's end (not a restart): send the job's files before leaving
  template <class A>
  void serialize(A& a, unsigned) {
    a & reason & outputs;
  }
};

// The job's files (docs/manifest.md, "Getting files back"): after a Shutdown with `outputs`, a
// worker sends OutputsBegin, then each file as OutputChunks in order (one file at a time), then
// OutputsEnd. It sends at most kOutputsWindow bytes of chunk data ahead of the host's
// OutputsAck, so that neither side holds more than that in memory; a chunk holds at most
// kOutputChunk bytes. The host checks every name before it becomes a path and the per-node cap
// itself: a node is never trusted to have done so.
constexpr uint64_t kOutputChunk = uint64_t{1} << 20;
constexpr uint64_t kOutputsWindow = uint64_t{8} << 20;
struct OutputsBegin {
  uint64_t files = 0;  // to be sent
  uint64_t bytes = 0;  // their sizes, as the node saw them
  template <class A>
  void serialize(A& a, unsigned) {
    a & files & bytes;
  }
};
// Why `name` cannot be an OutputChunk's path (nullptr: it can): a path relative to node-<N>/,
// '/'-separated, of at most 4096 bytes; each part non-empty, at most 255 bytes, neither "." nor
// ".."; no NUL or other control character. The host checks every name a node sends with it
// before the name becomes a path; the manifest checks [job] outputs' globs with it.
inline const char* output_name_problem(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name.size() > 4096) return "is longer than 4096 bytes";
  if (name.front() == '/') return "is absolute (it must be relative)";
  for (unsigned char c : name)
    if (c < 0x20 || c == 0x7f) return "holds a control character";
  for (size_t b = 0; b <= name.size();) {
    const size_t e = std::min(name.find('/', b), name.size());
    const std::string_view part = name.substr(b, e - b);
    if (part.empty()) return "has an empty part ('//' or a trailing '/')";
    if (part == "..") return "has a '..' part (it must stay inside its directory)";
    if (part == ".") return "has a '.' part";
    if (part.size() > 255) return "has a part longer than 255 bytes";
    b = e + 1;
  }
  return nullptr;
}

struct OutputChunk {
  std::string path;   // a file's first chunk: its path under node-<N>/ ('/'-separated, relative); else empty
  std::string data;   // at most kOutputChunk bytes
  bool last = false;  // the file ends with this chunk
  std::string error;  // with `last`: the node could not read the file to its end (it is dropped)
  template <class A>
  void serialize(A& a, unsigned) {
    a & path & data & last & error;
  }
};
// A file the node did not send, and why.
struct OutputLeft {
  enum Why : uint8_t { over_cap = 1, not_regular = 2, unreadable = 3, too_many = 4, bad_name = 5 };
  std::string path;
  uint64_t size = 0;
  uint8_t why = over_cap;
  template <class A>
  void serialize(A& a, unsigned) {
    a & path & size & why;
  }
};
constexpr size_t kOutputsLeftListed = 20;  // OutputsEnd names at most this many; the rest are counted
struct OutputsEnd {
  std::vector<OutputLeft> left;  // the first kOutputsLeftListed
  uint64_t left_files = 0;       // all of them (listed or not)
  uint64_t left_bytes = 0;
  template <class A>
  void serialize(A& a, unsigned) {
    a & left & left_files & left_bytes;
  }
};
struct OutputsAck {
  uint64_t bytes = 0;  // chunk data bytes written (or dropped) in all
  template <class A>
  void serialize(A& a, unsigned) {
    a & bytes;
  }
};

struct KvRequest {
  uint64_t id = 0;
  std::string key;
  std::string value;       // KvSet
  int64_t delta = 0;       // KvAdd
  int64_t timeout_ms = 0;  // KvGet
  template <class A>
  void serialize(A& a, unsigned) {
    a & id & key & value & delta & timeout_ms;
  }
};

struct KvReply {
  uint64_t id = 0;
  int32_t status = 0;  // sf_status
  std::string value;
  std::string error;
  template <class A>
  void serialize(A& a, unsigned) {
    a & id & status & value & error;
  }
};

}  // namespace skyforge::msg
