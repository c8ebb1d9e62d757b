// The pool communicator's shared-memory transport (communicator.hpp says when it is chosen and
// how it works): where every rank runs, the segment every rank maps, and the collectives over it.
#include "communicator_internal.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "io_loop.hpp"
#include "store.hpp"

namespace skyforge {

struct ShmGroup::OpDesc {
  uint32_t kind = 0, dtype = 0, op = 0, root = 0;
  uint64_t count = 0;  // elements (allreduce) or bytes (broadcast, allgather: per rank)
  bool operator==(const OpDesc&) const = default;
};

// One per rank, in the segment. seq is a futex word: the number of times the rank published
// (data in place / arrived). desc[p] describes the operation of its last publication with
// slot parity p, so that a mismatch of collective calls is an error, not garbage.
struct alignas(64) ShmGroup::RankCtl {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> waiters;  // peers asleep on seq (FUTEX_WAIT): the publisher wakes them
  std::atomic<uint32_t> state;    // kLive, kClosed (communicator destroyed), kBroken (a call failed)
  std::atomic<int32_t> pid;
  OpDesc desc[2];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free);

namespace {

using OpDesc = ShmGroup::OpDesc;
using RankCtl = ShmGroup::RankCtl;

constexpr uint64_t kShmMagic = 0x316d6873676b7366ull;  // "fskgshm1"
constexpr uint32_t kShmVersion = 1;
constexpr const char* kShmPrefix = "skyforge-comm-";  // every segment's name starts with it
// Allreduce of up to this many bytes per chunk: every rank reduces the whole chunk (one
// synchronisation); above it, reduce-scatter then allgather (two synchronisations, 1/size of
// the arithmetic per rank). Both sum in rank order, so either gives the same bits.
constexpr size_t kOnePhaseBytes = size_t{16} << 10;
constexpr size_t kReduceBlockBytes = size_t{8} << 10;  // reductions over > 2 ranks go by L1 blocks
constexpr size_t kShmBudget = size_t{128} << 20;       // all slots of a segment, unless slots are tiny

enum : uint32_t { kLive = 0, kClosed = 1, kBroken = 2 };
enum : uint32_t { kOpBarrier = 1, kOpAllreduce = 2, kOpBroadcast = 3, kOpAllgather = 4 };

struct ShmHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t size;
  uint64_t slot_bytes;
  uint64_t total_bytes;
};

constexpr size_t kCtlOffset = 4096;
size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
size_t data_offset(uint32_t size) { return round_up(kCtlOffset + size * sizeof(RankCtl), 4096); }
size_t segment_bytes(uint32_t size, size_t slot) { return data_offset(size) + size_t{2} * size * slot; }

uint32_t* futex_word(std::atomic<uint32_t>& a) { return reinterpret_cast<uint32_t*>(&a); }
void futex_wake_all(std::atomic<uint32_t>& a) {
  ::syscall(SYS_futex, futex_word(a), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}
// Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
void futex_wait(std::atomic<uint32_t>& a, uint32_t seen, std::chrono::nanoseconds d) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(d.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(d.count() % 1000000000);
  ::syscall(SYS_futex, futex_word(a), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

std::string errno_text(const std::string& what, int e = errno) { return what + ": " + std::strerror(e); }

std::string node_list(const std::vector<uint32_t>& ranks) {
  std::string s = ranks.size() == 1 ? "node " : "nodes ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// Element-wise c = f(a, b) (c may be a or b) with 16-byte vectors: the same IEEE operations
// as the scalar loop, so the bits do not depend on how the elements are split.
template <class T, class F>
void combine(T* c, const T* a, const T* b, size_t n, F f) {
  typedef T V __attribute__((vector_size(16)));
  constexpr size_t L = sizeof(V) / sizeof(T);
  size_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    V x[4], y[4];
    std::memcpy(x, a + i, sizeof x);
    std::memcpy(y, b + i, sizeof y);
    for (int k = 0; k < 4; ++k) x[k] = f(x[k], y[k]);
    std::memcpy(c + i, x, sizeof x);
  }
  for (; i + L <= n; i += L) {
    V x, y;
    std::memcpy(&x, a + i, sizeof x);
    std::memcpy(&y, b + i, sizeof y);
    x = f(x, y);
    std::memcpy(c + i, &x, sizeof x);
  }
  for (; i < n; ++i) c[i] = f(a[i], b[i]);
}

// The same semantics as the Gloo transport's reductions (communicator_gloo.cpp): wrapping integer
// sums, NaN-propagating max and min.
template <class T>
void combine_op(T* c, const T* a, const T* b, size_t n, sf_reduce_op op) {
  if (op == SF_REDUCE_SUM) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      combine(reinterpret_cast<U*>(c), reinterpret_cast<const U*>(a), reinterpret_cast<const U*>(b), n,
              [](auto x, auto y) { return x + y; });
    } else {
      combine(c, a, b, n, [](auto x, auto y) { return x + y; });
    }
  } else if (op == SF_REDUCE_MAX) {
    combine(c, a, b, n, [](auto x, auto y) { return ((x < y) | (y != y)) ? y : x; });
  } else {
    combine(c, a, b, n, [](auto x, auto y) { return ((y < x) | (y != y)) ? y : x; });
  }
}

int pidfd_open(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

std::string inode_of(const char* path) {
  struct stat st {};
  if (::stat(path, &st) != 0) return "";
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
}

// What this rank says about itself under "<prefix>shm/host/<rank>".
struct HostRecord {
  bool shm = false;      // shared memory allowed on this rank (and /dev/shm exists)
  int64_t pid = 0;
  std::string pidns;     // dev:inode of /proc/self/ns/pid: pids are only comparable within one
  std::string token;     // rank 0: the segment's name
  std::string host;      // identity: equal on every rank <=> one host

  std::string format() const {
    return "shm=" + std::string(shm ? "1" : "0") + " pid=" + std::to_string(pid) + " pidns=" +
           (pidns.empty() ? "-" : pidns) + " token=" + (token.empty() ? "-" : token) + " host=" + host;
  }
  static HostRecord parse(const std::string& text) {
    HostRecord r;
    const size_t h = text.find(" host=");
    r.host = h == std::string::npos ? "?" + text : text.substr(h + 6);
    std::istringstream in(text.substr(0, h));
    std::string kv;
    while (in >> kv) {
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) continue;
      const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
      if (k == "shm") r.shm = v == "1";
      else if (k == "pid") r.pid = std::atoll(v.c_str());
      else if (k == "pidns") r.pidns = v == "-" ? "" : v;
      else if (k == "token") r.token = v == "-" ? "" : v;
    }
    return r;
  }
};

// This host as far as POSIX shared memory goes: the kernel instance (boot id), the network
// namespace (netns-isolated "hosts" are other hosts, and use Gloo over their own addresses),
// the /dev/shm mount (containers with a private /dev/shm cannot share a segment by name) and
// the user (segments are created 0600). Empty when it cannot be told.
std::string detect_host_identity() {
  const std::string boot = read_first_line("/proc/sys/kernel/random/boot_id");
  const std::string net = inode_of("/proc/self/ns/net");
  const std::string shm = inode_of("/dev/shm");
  if (boot.empty() || net.empty() || shm.empty()) return "";
  return "boot:" + boot + "/netns:" + net + "/shm:" + shm + "/uid:" + std::to_string(::geteuid());
}

// "dev:inode" of a pid namespace -> the inode's digits ("0" when unknown).
std::string ns_digits(const std::string& pidns) {
  std::string ns;
  for (char ch : pidns.substr(pidns.find(':') == std::string::npos ? 0 : pidns.find(':') + 1))
    if (std::isdigit(static_cast<unsigned char>(ch))) ns += ch;
  return ns.empty() ? "0" : ns;
}

// The creator's (rank 0's) pid namespace and pid let a later rank 0 remove a segment that a
// killed creator could not (see sweep_stale_segments); the pool id says whose it is; the
// random token keeps communicators apart.
std::string segment_name(const std::string& pidns, int64_t pid, const std::string& tag, const std::string& token) {
  std::string t;
  for (char ch : tag)
    if (t.size() < 48) t += (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_') ? ch : '_';
  return "/" + std::string(kShmPrefix) + ns_digits(pidns) + "-" + std::to_string(pid) + "-" + (t.empty() ? "pool" : t) +
         "-" + token;
}

// A segment lives in /dev/shm only while its communicator is being built (every rank unlinks
// it once all have mapped it, or when the construction fails). Only a creator killed in that
// window, with every peer killed too, can leave one: remove those whose creator (same pid
// namespace) is gone and that were not touched for a minute.
void sweep_stale_segments(const std::string& my_pidns) {
  DIR* d = ::opendir("/dev/shm");
  if (!d) return;
  const std::string mine = std::string(kShmPrefix) + ns_digits(my_pidns) + "-";
  const time_t now = ::time(nullptr);
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, mine.size(), mine) != 0) continue;
    const pid_t pid = static_cast<pid_t>(std::atoll(name.c_str() + mine.size()));
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    struct stat st {};
    if (::fstatat(::dirfd(d), e->d_name, &st, 0) != 0 || now - st.st_mtime < 60) continue;
    ::shm_unlink(("/" + name).c_str());
  }
  ::closedir(d);
}

}  // namespace

ShmGroup::~ShmGroup() {
  uint32_t live = kLive;
  ctl(c_.rank).state.compare_exchange_strong(live, kClosed);
  futex_wake_all(ctl(c_.rank).seq);
  for (int fd : pidfds_)
    if (fd >= 0) ::close(fd);
  ::munmap(base_, len_);
}

void ShmGroup::watch_peers(bool same_pidns) {
  pidfds_.assign(c_.size, -1);
  pids_.assign(c_.size, 0);
  if (!same_pidns) return;
  for (uint32_t r = 0; r < c_.size; ++r) {
    const pid_t pid = ctl(r).pid.load(std::memory_order_acquire);
    if (r == c_.rank || pid <= 0 || pid == ::getpid()) continue;
    pids_[r] = pid;
    pidfds_[r] = pidfd_open(pid);  // -1: fall back to kill(pid, 0)
  }
}

void ShmGroup::mark_broken() {
  ctl(c_.rank).state.store(kBroken, std::memory_order_seq_cst);
  futex_wake_all(ctl(c_.rank).seq);
}

void ShmGroup::barrier() {
  OpDesc d{kOpBarrier, 0, 0, 0, 0};
  sync(d, true);
  ++ops_;
}

void ShmGroup::allreduce(void* data, size_t count, sf_dtype dtype, sf_reduce_op op) {
  switch (dtype) {
    case SF_DTYPE_F32: allreduce_typed(static_cast<float*>(data), count, dtype, op); break;
    case SF_DTYPE_F64: allreduce_typed(static_cast<double*>(data), count, dtype, op); break;
    case SF_DTYPE_I32: allreduce_typed(static_cast<int32_t*>(data), count, dtype, op); break;
    case SF_DTYPE_I64: allreduce_typed(static_cast<int64_t*>(data), count, dtype, op); break;
  }
}

template <class T>
void ShmGroup::allreduce_typed(T* data, size_t count, sf_dtype dtype, sf_reduce_op op) {
  const OpDesc d{kOpAllreduce, static_cast<uint32_t>(dtype), static_cast<uint32_t>(op), 0, count};
  const size_t per = std::max<size_t>(1, c_.slot / sizeof(T));
  for (size_t off = 0; off < count; off += per) allreduce_chunk(data + off, std::min(per, count - off), d, op);
}

void ShmGroup::broadcast(uint8_t* data, size_t bytes, uint32_t root) {
  const OpDesc d{kOpBroadcast, 0, 0, root, bytes};
  for (size_t off = 0; off < bytes; off += c_.slot) {
    const size_t n = std::min(c_.slot, bytes - off);
    const uint32_t p = parity();
    if (c_.rank == root) std::memcpy(slot(root, p), data + off, n);
    sync(d, true);
    if (c_.rank != root) std::memcpy(data + off, slot(root, p), n);
    ++ops_;
  }
}

void ShmGroup::allgather(const uint8_t* in, size_t bytes, uint8_t* out) {
  const OpDesc d{kOpAllgather, 0, 0, 0, bytes};
  for (size_t off = 0; off < bytes; off += c_.slot) {
    const size_t n = std::min(c_.slot, bytes - off);
    const uint32_t p = parity();
    std::memcpy(slot(c_.rank, p), in + off, n);
    sync(d, true);
    // Every chunk from the slots, this rank's too: `in` may overlap `out` (in place, as Gloo
    // allows), and the lower ranks' copies would overwrite it before it is read.
    for (uint32_t r = 0; r < c_.size; ++r) std::memcpy(out + r * bytes + off, slot(r, p), n);
    ++ops_;
  }
}

ShmGroup::RankCtl& ShmGroup::ctl(uint32_t r) const { return reinterpret_cast<RankCtl*>(base_ + kCtlOffset)[r]; }

uint8_t* ShmGroup::slot(uint32_t r, uint32_t p) const {
  return base_ + data_offset(c_.size) + (size_t{2} * r + p) * c_.slot;
}
// Operation k writes slot k % 2. A peer reads my slot of operation k before its first
// publication of operation k + 1, and I write that slot again (operation k + 2) only after
// every rank's first publication of operation k + 1: no slot is overwritten while read.
uint32_t ShmGroup::parity() const { return static_cast<uint32_t>(ops_ & 1); }

bool ShmGroup::reached(uint32_t seq, uint32_t target) { return static_cast<int32_t>(seq - target) >= 0; }

// Publish (my data for this step is in place), then wait until every rank has published as
// often. `first`: the operation's first step, whose description every rank compares.
void ShmGroup::sync(const OpDesc& d, bool first) {
  RankCtl& me = ctl(c_.rank);
  if (first) me.desc[parity()] = d;
  const uint32_t target = ++pub_;
  me.seq.store(target, std::memory_order_seq_cst);
  if (me.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(me.seq);
  wait_all(target);
  if (first)
    for (uint32_t r = 0; r < c_.size; ++r)
      if (r != c_.rank && !(ctl(r).desc[parity()] == d)) mismatch(r, ctl(r).desc[parity()], d);
}

uint32_t ShmGroup::next_pending(uint32_t from, uint32_t target) const {
  for (uint32_t r = from; r < c_.size; ++r)
    if (r != c_.rank && !reached(ctl(r).seq.load(std::memory_order_acquire), target)) return r;
  return c_.size;
}

// A pending peer that can no longer arrive: fail now rather than after the timeout.
void ShmGroup::check_state(uint32_t r, uint32_t target) const {
  const uint32_t st = ctl(r).state.load(std::memory_order_acquire);
  if (st == kLive || reached(ctl(r).seq.load(std::memory_order_acquire), target)) return;
  throw std::runtime_error(st == kBroken ? "node " + std::to_string(r) + " failed an earlier collective"
                                         : "node " + std::to_string(r) + " closed its communicator (its app returned or failed)");
}
void ShmGroup::check_alive(uint32_t from, uint32_t target) const {
  for (uint32_t r = from; r < c_.size; ++r) {
    if (r == c_.rank || reached(ctl(r).seq.load(std::memory_order_acquire), target)) continue;
    check_state(r, target);
    if (pids_.empty() || pids_[r] <= 0) continue;
    bool gone = false;
    if (pidfds_[r] >= 0) {
      pollfd pf{pidfds_[r], POLLIN, 0};
      gone = ::poll(&pf, 1, 0) > 0;
    } else {
      gone = ::kill(pids_[r], 0) != 0 && errno == ESRCH;
    }
    if (gone && !reached(ctl(r).seq.load(std::memory_order_acquire), target))
      throw std::runtime_error("node " + std::to_string(r) + " is gone: its process (pid " + std::to_string(pids_[r]) +
                               ") exited");
  }
}

// Spin, then yield, then sleep on the futex of the first rank not there yet.
void ShmGroup::wait_all(uint32_t target) {
  uint32_t r = next_pending(0, target);
  if (r == c_.size) return;
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const auto spin_end = t0 + c_.spin, yield_end = spin_end + c_.yield, deadline = t0 + c_.timeout;
  auto checked = t0;
  for (;;) {
    r = next_pending(r, target);
    if (r == c_.size) return;
    check_state(r, target);
    const auto now = Clock::now();
    if (now < spin_end) {
      for (int i = 0; i < 8; ++i) cpu_relax();
      continue;
    }
    if (now - checked >= std::chrono::milliseconds(2)) {
      check_alive(r, target);
      checked = now;
    }
    if (now >= deadline) {
      std::vector<uint32_t> missing;
      for (uint32_t q = r; (q = next_pending(q, target)) < c_.size; ++q) missing.push_back(q);
      if (missing.empty()) return;
      throw std::runtime_error("timed out waiting for " + node_list(missing) +
                               " to reach the same collective (shared-memory transport)");
    }
    if (now < yield_end) {
      ::sched_yield();
      continue;
    }
    RankCtl& c = ctl(r);
    c.waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = c.seq.load(std::memory_order_seq_cst);
    if (!reached(seen, target) && c.state.load(std::memory_order_seq_cst) == kLive)
      futex_wait(c.seq, seen, std::min<std::chrono::nanoseconds>(deadline - now, std::chrono::milliseconds(20)));
    c.waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void ShmGroup::mismatch(uint32_t r, const OpDesc& theirs, const OpDesc& mine) const {
  auto text = [](const OpDesc& d) {
    switch (d.kind) {
      case kOpBarrier: return std::string("barrier()");
      case kOpAllreduce: {
        const char* t = dtype_name(static_cast<sf_dtype>(d.dtype));
        const char* o = d.op == SF_REDUCE_SUM ? "sum" : d.op == SF_REDUCE_MAX ? "max" : "min";
        return "allreduce(" + std::to_string(d.count) + " " + (t ? t : "?") + ", " + o + ")";
      }
      case kOpBroadcast:
        return "broadcast(" + std::to_string(d.count) + " bytes from node " + std::to_string(d.root) + ")";
      case kOpAllgather: return "allgather(" + std::to_string(d.count) + " bytes)";
      default: return std::string("an unknown operation");
    }
  };
  throw std::runtime_error("collective mismatch: this node called " + text(mine) + " but node " + std::to_string(r) +
                           " called " + text(theirs) + " (every node must make the same collective calls in the same order)");
}

// Rank r's share of a chunk of n elements in the reduce-scatter: [lo, hi), on 64-byte bounds.
template <class T>
std::pair<size_t, size_t> ShmGroup::share(size_t n, uint32_t r) const {
  const size_t a = std::max<size_t>(1, 64 / sizeof(T));
  const size_t units = (n + a - 1) / a;
  auto at = [&](uint32_t q) { return std::min(n, units * q / c_.size * a); };
  return {at(r), at(r + 1)};
}

// dst[lo, hi) = op over ranks 0, 1, ..., size-1 of their elements (mine from `own`, the
// others' from their slots of parity p), in that order for every element.
template <class T>
void ShmGroup::reduce_range(T* dst, const T* own, size_t lo, size_t hi, uint32_t p, sf_reduce_op op, T* copy_to) {
  const size_t block = c_.size <= 2 ? hi - lo : std::max<size_t>(1, kReduceBlockBytes / sizeof(T));
  for (size_t b = lo; b < hi; b += block) {
    const size_t n = std::min(block, hi - b);
    auto src = [&](uint32_t r) { return r == c_.rank ? own + b : reinterpret_cast<const T*>(slot(r, p)) + b; };
    combine_op(dst + b, src(0), src(1), n, op);
    for (uint32_t r = 2; r < c_.size; ++r) combine_op(dst + b, dst + b, src(r), n, op);
    if (copy_to) std::memcpy(copy_to + b, dst + b, n * sizeof(T));
  }
}

template <class T>
void ShmGroup::allreduce_chunk(T* data, size_t n, const OpDesc& d, sf_reduce_op op) {
  const uint32_t p = parity();
  T* mine = reinterpret_cast<T*>(slot(c_.rank, p));
  if (n * sizeof(T) <= kOnePhaseBytes) {
    // Everyone reduces everything: one synchronisation.
    std::memcpy(mine, data, n * sizeof(T));
    sync(d, true);
    // My operand comes from my slot (same bits): `data` is the destination.
    reduce_range(data, static_cast<const T*>(mine), 0, n, p, op, static_cast<T*>(nullptr));
  } else {
    // Reduce-scatter: my share is reduced by me only (into my slot, where the others fetch
    // it), so my slot needs everything but my share.
    const auto [lo, hi] = share<T>(n, c_.rank);
    std::memcpy(mine, data, lo * sizeof(T));
    std::memcpy(mine + hi, data + hi, (n - hi) * sizeof(T));
    sync(d, true);
    reduce_range(mine, data, lo, hi, p, op, data);
    sync(d, false);
    for (uint32_t r = 0; r < c_.size; ++r) {
      if (r == c_.rank) continue;
      const auto [rlo, rhi] = share<T>(n, r);
      std::memcpy(data + rlo, reinterpret_cast<const T*>(slot(r, p)) + rlo, (rhi - rlo) * sizeof(T));
    }
  }
  ++ops_;
}

bool GlooCommunicator::parse_shm_switch(const char* env_value) {
  if (!env_value || !*env_value) return true;
  std::string v = env_value;
  for (auto& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  throw std::invalid_argument(std::string("SKYFORGE_COMM_SHM = '") + env_value +
                              "': expected 0 (Gloo/TCP only) or 1 (shared memory between the nodes of one host)");
}

// Where is everyone? Collective: every rank publishes its host, then reads all (a missing rank
// is named after the timeout, as by Gloo's own rendezvous); every rank decides the same.
bool GlooCommunicator::try_shm(net::StoreClient& store) {
  const bool shm_allowed = opt_.shm && parse_shm_switch(std::getenv("SKYFORGE_COMM_SHM"));
  KvStore kv(store, opt_.prefix, opt_.timeout);
  HostRecord me;
  me.host = opt_.host_identity.empty() ? detect_host_identity() : opt_.host_identity;
  me.shm = shm_allowed && !me.host.empty();
  me.pid = ::getpid();
  me.pidns = inode_of("/proc/self/ns/pid");
  if (opt_.rank == 0) me.token = net::random_hex(16);
  std::vector<std::string> keys;
  for (uint32_t r = 0; r < opt_.size; ++r) keys.push_back("shm/host/" + std::to_string(r));
  store.set(opt_.prefix + keys[opt_.rank], me.format());
  kv.wait(keys);
  std::vector<HostRecord> all;
  for (const auto& k : keys) all.push_back(HostRecord::parse(store.get(opt_.prefix + k, 0)));
  // Every rank decides the same from the same records.
  bool same_pidns = true;
  for (uint32_t r = 0; r < opt_.size; ++r) {
    if (all[r].pidns.empty() || all[r].pidns != all[0].pidns) same_pidns = false;
    if (shm_fallback_.empty() && !all[r].shm)
      shm_fallback_ = "shared memory is switched off (SKYFORGE_COMM_SHM=0) or unavailable on node " + std::to_string(r);
    if (shm_fallback_.empty() && all[r].host != all[0].host)
      shm_fallback_ = "node " + std::to_string(r) + " is on another host than node 0";
  }
  if (!shm_fallback_.empty()) return false;
  std::string tag = opt_.shm_tag;
  if (tag.empty())
    if (const char* pool = std::getenv("SKYFORGE_POOL_ID")) tag = pool;
  return setup_shm(store, segment_name(all[0].pidns, all[0].pid, tag, all[0].token), same_pidns && !all[0].pidns.empty());
}

// Collective. Rank 0 creates the segment (name known to every rank from rank 0's record, so any
// rank can unlink it), the others map it, each says so under "<prefix>shm/ok/<rank>"; once all
// have, everyone unlinks it (the first unlink wins). A rank that cannot map it makes every rank
// fall back to Gloo; a rank that does not answer fails the construction after the timeout.
bool GlooCommunicator::setup_shm(net::StoreClient& store, const std::string& name, bool same_pidns) {
  KvStore kv(store, opt_.prefix, opt_.timeout);
  struct Unlink {
    const std::string& name;
    ~Unlink() { ::shm_unlink(name.c_str()); }
  } unlink_on_every_path{name};
  struct Mapping {
    void* base = nullptr;
    size_t len = 0;
    RankCtl* mine = nullptr;  // set once this rank's pid is published: peers may count on it
    ~Mapping() {
      if (!base) return;
      // Not handed to a ShmGroup (this rank's setup threw, e.g. it timed out waiting while the
      // others went on): tell them now, or their first collective would wait for the timeout.
      if (mine) {
        mine->state.store(kBroken, std::memory_order_seq_cst);
        futex_wake_all(mine->seq);
      }
      ::munmap(base, len);
    }
  } map;
  const uint32_t W = opt_.size;
  // Two slots per rank, allocated for the communicator's life: at most kShmBudget in all
  // (many local nodes get smaller slots, and chunk more).
  const size_t want = std::min(opt_.shm_slot_bytes, std::max<size_t>(size_t{64} << 10, kShmBudget / (2 * W)));
  const size_t slot = round_up(std::max<size_t>(want, 64), want >= 4096 ? 4096 : 64);
  const size_t total = segment_bytes(W, slot);
  auto map_fd = [&](int fd) -> std::string {
    void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return errno_text("mmap of " + std::to_string(total) + " bytes");
    map.base = p;
    map.len = total;
    return "";
  };
  std::string error;
  if (opt_.rank == 0) {
    sweep_stale_segments(inode_of("/proc/self/ns/pid"));
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      error = errno_text("shm_open(" + name + ")");
    } else if (int e = ::posix_fallocate(fd, 0, static_cast<off_t>(total)); e != 0) {
      ::close(fd);
      error = errno_text("allocating " + std::to_string(total >> 20) + " MiB in /dev/shm", e);
    } else {
      error = map_fd(fd);
    }
    if (error.empty()) {
      auto* h = new (map.base) ShmHeader{};
      h->version = kShmVersion;
      h->size = W;
      h->slot_bytes = slot;
      h->total_bytes = total;
      for (uint32_t r = 0; r < W; ++r) {
        auto* c = new (static_cast<uint8_t*>(map.base) + kCtlOffset + r * sizeof(RankCtl)) RankCtl{};
        c->seq.store(0);
        c->waiters.store(0);
        c->state.store(kLive);
        c->pid.store(0);
      }
      std::atomic_thread_fence(std::memory_order_release);
      h->magic = kShmMagic;
    }
  } else {
    kv.wait({"shm/ok/0"});
    const std::string zero = store.get(opt_.prefix + "shm/ok/0", 0);
    if (zero != "1") {
      error = "not created";
    } else {
      const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
      if (fd < 0) {
        error = errno_text("shm_open(" + name + ")");
      } else if (struct stat st {}; ::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != total) {
        ::close(fd);
        error = "the segment " + name + " is not " + std::to_string(total) + " bytes long";
      } else {
        error = map_fd(fd);
      }
      if (error.empty()) {
        const auto* h = static_cast<const ShmHeader*>(map.base);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (h->magic != kShmMagic || h->version != kShmVersion || h->size != W || h->slot_bytes != slot)
          error = "the segment " + name + " does not match this communicator";
      }
    }
  }
  if (error.empty()) {
    map.mine = reinterpret_cast<RankCtl*>(static_cast<uint8_t*>(map.base) + kCtlOffset) + opt_.rank;
    map.mine->pid.store(::getpid(), std::memory_order_release);
  }
  store.set(opt_.prefix + "shm/ok/" + std::to_string(opt_.rank), error.empty() ? "1" : "0 " + error);
  std::vector<std::string> keys;
  for (uint32_t r = 0; r < W; ++r) keys.push_back("shm/ok/" + std::to_string(r));
  kv.wait(keys);
  for (uint32_t r = 0; r < W && shm_fallback_.empty(); ++r) {
    const std::string v = store.get(opt_.prefix + keys[r], 0);
    if (v != "1" && v != "0 not created")
      shm_fallback_ = "shared memory could not be set up on node " + std::to_string(r) + ": " +
                      (v.size() > 2 ? v.substr(2) : v);
  }
  if (!shm_fallback_.empty()) return false;
  ::shm_unlink(name.c_str());  // every rank has mapped it: nothing is left in /dev/shm from now on
  std::atomic_thread_fence(std::memory_order_acquire);
  ShmGroup::Config c;
  c.rank = opt_.rank;
  c.size = W;
  c.slot = slot;
  c.timeout = opt_.timeout;
  c.spin = opt_.shm_spin;
  c.yield = opt_.shm_yield;
  shm_ = std::make_unique<ShmGroup>(map.base, map.len, c);
  map.base = nullptr;  // owned by shm_
  shm_->watch_peers(same_pidns);
  return true;
}

}  // namespace skyforge
