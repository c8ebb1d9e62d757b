// GlooCommunicator over a real rendezvous store (StoreServer on loopback), one thread per rank,
// with tiny chunks so that every chunked path (remainders included) runs on small buffers. Also
// the failure paths (a rank that never joins, a stalled peer, a dead peer) and the Services
// wiring (communicator() caching, compute_backend() selection). The Transport tests run twice:
// on the shared-memory transport (every rank of these tests is on this host) and on Gloo/TCP
// (Options::shm = false); the Shm tests are about the shared-memory path itself (choice of
// transport, rank-order bit-identical reductions, dead processes, /dev/shm left clean).
#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <functional>
#include <limits>
#include <set>
#include <thread>
#include <vector>

#include "communicator.hpp"
#include "services.hpp"
#include "store.hpp"

using namespace skyforge;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kSecret = "comm-secret";

// This process's shared-memory segments in /dev/shm (a segment's name carries its creator's pid).
std::vector<std::string> my_segments() {
  std::vector<std::string> out;
  const std::string pid = "-" + std::to_string(::getpid()) + "-";
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind("skyforge-comm-", 0) == 0 && n.find(pid) != std::string::npos) out.push_back(n);
    }
    ::closedir(d);
  }
  return out;
}

class Pool : public ::testing::Test {
 protected:
  Pool() : guard_(boost::asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {
    server_ = std::make_unique<net::StoreServer>(io_, "127.0.0.1", 0, kSecret);
  }
  ~Pool() override {
    server_->close();
    guard_.reset();
    io_.stop();
    thread_.join();
  }
  void TearDown() override {
    // Segments are unlinked once every rank has mapped them, or when the construction fails.
    auto left = my_segments();
    EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << left[0];
    for (const auto& n : left) ::shm_unlink(("/" + n).c_str());
  }

  GlooCommunicator::Options options(uint32_t rank, uint32_t size) const {
    GlooCommunicator::Options o;
    o.rank = rank;
    o.size = size;
    o.prefix = prefix_;
    o.timeout = std::chrono::milliseconds(timeout_ms_);
    o.chunk_bytes = chunk_bytes_;
    o.shm = shm_;
    o.shm_slot_bytes = slot_bytes_;
    if (tweak_) tweak_(rank, o);
    return o;
  }
  std::unique_ptr<net::StoreClient> client(uint32_t rank) {
    return net::StoreClient::connect("127.0.0.1", server_->port(), kSecret, rank, 5000);
  }
  // Runs body(rank, comm) on `size` threads, each with its own store client and communicator;
  // ranks listed in `absent` never build theirs. Failures are reported per rank.
  void run_ranks(uint32_t size, const std::function<void(uint32_t, GlooCommunicator&)>& body,
                 std::vector<uint32_t> absent = {}) {
    std::vector<std::thread> threads;
    std::vector<std::string> errors(size), transports(size), fallbacks(size);
    for (uint32_t r = 0; r < size; ++r) {
      if (std::find(absent.begin(), absent.end(), r) != absent.end()) continue;
      threads.emplace_back([&, r] {
        try {
          auto c = client(r);
          GlooCommunicator comm(*c, options(r, size));
          transports[r] = comm.transport();
          fallbacks[r] = comm.shm_fallback();
          body(r, comm);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    errors_ = errors;
    transports_ = transports;
    fallbacks_ = fallbacks;
  }
  std::string stored(const std::string& key) { return client(99)->get(key, 0); }

  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_;
  std::thread thread_;
  std::unique_ptr<net::StoreServer> server_;
  int timeout_ms_ = 10000;
  size_t chunk_bytes_ = 256;  // tiny: every operation below is chunked
  size_t slot_bytes_ = 256;   // the same on shared memory
  bool shm_ = true;
  std::string prefix_ = "gloo/test/";
  std::function<void(uint32_t, GlooCommunicator::Options&)> tweak_;
  std::vector<std::string> errors_, transports_, fallbacks_;
};

// The tests that hold for either transport: run on both.
class Transport : public Pool, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override { shm_ = GetParam() == "shm"; }
  void TearDown() override {
    for (size_t r = 0; r < transports_.size(); ++r)
      if (!transports_[r].empty() && transports_.size() > 1) {
        EXPECT_EQ(transports_[r], GetParam()) << "rank " << r;
      }
    Pool::TearDown();
  }
};

float noisy(uint32_t r, size_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t(r + 1) * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 29;
  return float(double(x % 1000003) / 777.0 - 600.0);
}

#define OK(call) ASSERT_EQ((call), SF_OK) << GlooCommunicator::last_error()

}  // namespace

TEST_P(Transport, EveryOperationWithChunksAndRemainders) {
  const uint32_t size = 3;
  std::vector<std::vector<float>> noisy_results(size);
  run_ranks(size, [&](uint32_t rank, GlooCommunicator& c) {
    EXPECT_EQ(c.table()->rank, rank);
    EXPECT_EQ(c.table()->size, size);
    EXPECT_EQ(c.table()->struct_size, sizeof(sf_communicator));
    for (size_t n : {size_t(0), size_t(1), size_t(2), size_t(63), size_t(64), size_t(65), size_t(1001)}) {
      std::vector<int64_t> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = int64_t(i) * (rank + 1) + (int64_t(1) << 40);
      OK(c.allreduce(v.data(), n, SF_DTYPE_I64, SF_REDUCE_SUM));
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(v[i], int64_t(i) * 6 + 3 * (int64_t(1) << 40)) << n << " " << i;
      std::vector<int32_t> m(n);
      for (size_t i = 0; i < n; ++i) m[i] = int32_t((i + rank) % 5) - 2;
      std::vector<int32_t> lo = m;
      OK(c.allreduce(m.data(), n, SF_DTYPE_I32, SF_REDUCE_MAX));
      OK(c.allreduce(lo.data(), n, SF_DTYPE_I32, SF_REDUCE_MIN));
      for (size_t i = 0; i < n; ++i) {
        int32_t hi = -100, low = 100;
        for (uint32_t r = 0; r < size; ++r) hi = std::max(hi, int32_t((i + r) % 5) - 2), low = std::min(low, int32_t((i + r) % 5) - 2);
        ASSERT_EQ(m[i], hi);
        ASSERT_EQ(lo[i], low);
      }
      std::vector<double> d(n, 0.25 * (rank + 1));
      OK(c.allreduce(d.data(), n, SF_DTYPE_F64, SF_REDUCE_SUM));
      for (double x : d) ASSERT_EQ(x, 1.5);
    }
    std::vector<float> f(5000);
    for (size_t i = 0; i < f.size(); ++i) f[i] = noisy(rank, i);
    OK(c.allreduce(f.data(), f.size(), SF_DTYPE_F32, SF_REDUCE_SUM));
    noisy_results[rank] = f;
    // broadcast from every root, sizes around the chunk size
    for (uint32_t root = 0; root < size; ++root)
      for (size_t n : {size_t(1), size_t(255), size_t(256), size_t(257), size_t(3000)}) {
        std::vector<uint8_t> b(n);
        for (size_t i = 0; i < n; ++i) b[i] = uint8_t(rank * 40 + i);
        OK(c.broadcast(b.data(), n, root));
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(b[i], uint8_t(root * 40 + i)) << root << " " << n << " " << i;
      }
    // allgather: direct (small) and sliced (larger than chunk/size)
    for (size_t n : {size_t(1), size_t(85), size_t(86), size_t(1000)}) {
      std::vector<uint8_t> in(n), out(n * size, 0xEE);
      for (size_t i = 0; i < n; ++i) in[i] = uint8_t(rank * 91 + i * 3);
      OK(c.allgather(in.data(), n, out.data()));
      for (uint32_t r = 0; r < size; ++r)
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[r * n + i], uint8_t(r * 91 + i * 3)) << n << " " << r << " " << i;
    }
    OK(c.barrier());
    // through the C table, as a plugin sees it
    const sf_communicator* t = c.table();
    int32_t one = 1;
    OK(t->allreduce(t->ctx, &one, 1, SF_DTYPE_I32, SF_REDUCE_SUM));
    EXPECT_EQ(one, int32_t(size));
    OK(t->barrier(t->ctx));
  });
  for (uint32_t r = 0; r < size; ++r) EXPECT_EQ(errors_[r], "") << "rank " << r;
  for (uint32_t r = 1; r < size; ++r)
    EXPECT_EQ(0, std::memcmp(noisy_results[0].data(), noisy_results[r].data(), 5000 * sizeof(float)))
        << "rank " << r << " holds different bits";
}

TEST_P(Transport, InvalidArgumentsAreRefusedWithoutBreakingTheGroup) {
  run_ranks(2, [&](uint32_t rank, GlooCommunicator& c) {
    float x = 1;
    EXPECT_EQ(c.allreduce(&x, 1, 99, SF_REDUCE_SUM), SF_ERR_INVALID);
    EXPECT_NE(std::string(GlooCommunicator::last_error()).find("dtype"), std::string::npos);
    EXPECT_EQ(c.allreduce(&x, 1, SF_DTYPE_F32, 42), SF_ERR_INVALID);
    EXPECT_EQ(c.broadcast(&x, 4, 2), SF_ERR_INVALID);
    EXPECT_NE(std::string(GlooCommunicator::last_error()).find("root 2"), std::string::npos);
    EXPECT_EQ(c.allreduce(nullptr, 3, SF_DTYPE_F32, SF_REDUCE_SUM), SF_ERR_INVALID);
    EXPECT_EQ(c.allreduce(nullptr, 0, SF_DTYPE_F32, SF_REDUCE_SUM), SF_OK);  // nothing to do
    OK(c.allreduce(&x, 1, SF_DTYPE_F32, SF_REDUCE_SUM));
    EXPECT_EQ(x, 2.0f);
  });
  EXPECT_EQ(errors_[0], "");
  EXPECT_EQ(errors_[1], "");
}

TEST_P(Transport, SizeOneIsLocal) {
  run_ranks(1, [&](uint32_t, GlooCommunicator& c) {
    double d[3] = {1, 2, 3};
    OK(c.allreduce(d, 3, SF_DTYPE_F64, SF_REDUCE_SUM));
    EXPECT_EQ(d[2], 3.0);
    char in[4] = {'a', 'b', 'c', 'd'}, out[4] = {};
    OK(c.allgather(in, 4, out));
    EXPECT_EQ(std::string(out, 4), "abcd");
    OK(c.broadcast(in, 4, 0));
    EXPECT_EQ(c.broadcast(in, 4, 1), SF_ERR_INVALID);
    OK(c.barrier());
  });
  EXPECT_EQ(errors_[0], "");
}

TEST_P(Transport, ARankThatNeverJoinsIsNamedAfterTheTimeout) {
  timeout_ms_ = 1500;
  auto t0 = Clock::now();
  run_ranks(3, [&](uint32_t, GlooCommunicator&) { ADD_FAILURE() << "joined without rank 2"; }, {2});
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(s, 10);
  for (uint32_t r : {0u, 1u}) {
    EXPECT_NE(errors_[r].find("node 2 did not join the communicator within 1.5 s"), std::string::npos) << errors_[r];
  }
}

TEST_P(Transport, AStalledPeerTimesOutAndTheGroupStaysBroken) {
  timeout_ms_ = 1500;
  std::atomic<bool> done{false};
  run_ranks(2, [&](uint32_t rank, GlooCommunicator& c) {
    if (rank == 1) {  // joins, then never calls the allreduce
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    float x[100] = {};
    auto t0 = Clock::now();
    sf_status st = c.allreduce(x, 100, SF_DTYPE_F32, SF_REDUCE_SUM);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::string msg = GlooCommunicator::last_error();
    done = true;
    EXPECT_EQ(st, SF_ERR_TIMEOUT) << msg;
    EXPECT_GE(s, 1.0);
    EXPECT_LT(s, 8.0);
    EXPECT_NE(msg.find("allreduce failed on node 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1.5 s"), std::string::npos) << msg;
    // Unknown state from now on: later calls fail at once with the first error.
    t0 = Clock::now();
    EXPECT_EQ(c.barrier(), SF_ERR);
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 0.5);
    EXPECT_NE(std::string(GlooCommunicator::last_error()).find("unusable after an earlier failure"), std::string::npos);
  });
  EXPECT_EQ(errors_[0], "");
  EXPECT_EQ(errors_[1], "");
}

TEST_P(Transport, ADeadPeerFailsTheCollectiveWithoutWaitingForTheTimeout) {
  timeout_ms_ = 30000;
  std::atomic<bool> gone{false};
  std::string msg;
  double seconds = 0;
  run_ranks(2, [&](uint32_t rank, GlooCommunicator& c) {
    if (rank == 1) {  // returning destroys rank 1's communicator: its sockets close
      gone = true;
      return;
    }
    while (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::vector<float> x(1000, 1.0f);
    auto t0 = Clock::now();
    sf_status st = c.allreduce(x.data(), x.size(), SF_DTYPE_F32, SF_REDUCE_SUM);
    seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    msg = GlooCommunicator::last_error();
    EXPECT_EQ(st, SF_ERR) << msg;
  });
  EXPECT_LT(seconds, 10.0) << msg;
  EXPECT_NE(msg.find("allreduce failed on node 0"), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(Both, Transport, ::testing::Values("shm", "gloo"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(CollectiveTimeout, Parsing) {
  using std::chrono::milliseconds;
  EXPECT_EQ(GlooCommunicator::parse_timeout(nullptr, nullptr), milliseconds(300000));
  EXPECT_EQ(GlooCommunicator::parse_timeout("", ""), milliseconds(300000));
  EXPECT_EQ(GlooCommunicator::parse_timeout("2.5", "9"), milliseconds(2500));
  EXPECT_EQ(GlooCommunicator::parse_timeout(nullptr, "9"), milliseconds(9000));
  EXPECT_THROW(GlooCommunicator::parse_timeout("0", nullptr), std::invalid_argument);
  EXPECT_THROW(GlooCommunicator::parse_timeout("-3", nullptr), std::invalid_argument);
  EXPECT_THROW(GlooCommunicator::parse_timeout("10s", nullptr), std::invalid_argument);
  try {
    GlooCommunicator::parse_timeout(nullptr, "soon");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("SKYFORGE_COLLECTIVE_TIMEOUT"), std::string::npos);
  }
}

// ---- the shared-memory transport -------------------------------------------------------------

TEST(ShmSwitch, Parsing) {
  EXPECT_TRUE(GlooCommunicator::parse_shm_switch(nullptr));
  EXPECT_TRUE(GlooCommunicator::parse_shm_switch(""));
  EXPECT_TRUE(GlooCommunicator::parse_shm_switch("1"));
  EXPECT_TRUE(GlooCommunicator::parse_shm_switch("on"));
  EXPECT_FALSE(GlooCommunicator::parse_shm_switch("0"));
  EXPECT_FALSE(GlooCommunicator::parse_shm_switch("false"));
  EXPECT_FALSE(GlooCommunicator::parse_shm_switch("OFF"));
  try {
    GlooCommunicator::parse_shm_switch("maybe");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("SKYFORGE_COMM_SHM = 'maybe'"), std::string::npos) << e.what();
  }
}

using Shm = Pool;

TEST_F(Shm, IsChosenWhenEveryRankIsOnThisHostAndNotOtherwise) {
  auto nothing = [](uint32_t, GlooCommunicator& c) { OK(c.barrier()); };
  // Every rank here: shared memory; rank 0 records the choice in the store.
  for (uint32_t size : {2u, 3u}) {
    prefix_ = "t/" + std::to_string(size) + "/";
    run_ranks(size, nothing);
    for (uint32_t r = 0; r < size; ++r) {
      EXPECT_EQ(errors_[r], "");
      EXPECT_EQ(transports_[r], "shm") << fallbacks_[r];
      EXPECT_EQ(fallbacks_[r], "");
    }
    EXPECT_EQ(stored(prefix_ + "transport"), "shm");
  }
  // One rank on "another host" (as a node in its own network namespace): Gloo everywhere.
  prefix_ = "t/netns/";
  tweak_ = [](uint32_t r, GlooCommunicator::Options& o) { o.host_identity = r == 1 ? "host-b" : "host-a"; };
  run_ranks(3, nothing);
  for (uint32_t r = 0; r < 3; ++r) {
    EXPECT_EQ(errors_[r], "");
    EXPECT_EQ(transports_[r], "gloo");
    EXPECT_EQ(fallbacks_[r], "node 1 is on another host than node 0");
  }
  EXPECT_EQ(stored(prefix_ + "transport"), "gloo");
  // Switched off on one rank only: every rank agrees on Gloo.
  prefix_ = "t/off1/";
  tweak_ = [](uint32_t r, GlooCommunicator::Options& o) { o.shm = r != 2; };
  run_ranks(3, nothing);
  for (uint32_t r = 0; r < 3; ++r) {
    EXPECT_EQ(errors_[r], "");
    EXPECT_EQ(transports_[r], "gloo");
    EXPECT_NE(fallbacks_[r].find("switched off (SKYFORGE_COMM_SHM=0) or unavailable on node 2"), std::string::npos)
        << fallbacks_[r];
  }
  // SKYFORGE_COMM_SHM=0 in the environment.
  tweak_ = nullptr;
  prefix_ = "t/env/";
  ::setenv("SKYFORGE_COMM_SHM", "0", 1);
  run_ranks(2, nothing);
  ::unsetenv("SKYFORGE_COMM_SHM");
  EXPECT_EQ(transports_[0], "gloo");
  EXPECT_EQ(transports_[1], "gloo");
  // A value that is neither on nor off fails the construction on that rank, saying why.
  prefix_ = "t/bad/";
  timeout_ms_ = 1000;
  ::setenv("SKYFORGE_COMM_SHM", "sometimes", 1);
  run_ranks(1, nothing);  // one rank never reads it: nothing to share
  EXPECT_EQ(errors_[0], "");
  std::string what;
  try {
    auto c = client(0);
    GlooCommunicator comm(*c, options(0, 2));
  } catch (const std::exception& e) {
    what = e.what();
  }
  ::unsetenv("SKYFORGE_COMM_SHM");
  EXPECT_NE(what.find("SKYFORGE_COMM_SHM = 'sometimes'"), std::string::npos) << what;
}

namespace {

// Value i of rank r for the bit-identity test: order-sensitive floats (with a NaN, infinities
// and signed zeros), integers that wrap.
template <class T>
T value(uint32_t r, size_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t(r + 1) * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 29;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 32;
  if constexpr (std::is_floating_point_v<T>) {
    if (i == 5 && r == 1) return std::numeric_limits<T>::quiet_NaN();
    if (i == 6) return r == 0 ? std::numeric_limits<T>::infinity() : T(1);
    if (i == 8) return r % 2 ? T(-0.0) : T(0.0);
    return T(double(int64_t(x % 2000001) - 1000000) / 997.0) * T(1.0000001) * T(i % 7 == 3 ? 1e-30 : 1.0);
  } else {
    return static_cast<T>(x);  // wraps when summed
  }
}

// The reference: op over ranks 0, 1, ..., size-1 in that order, with the communicator's
// semantics (wrapping sums, NaN-propagating max/min).
template <class T>
T reference(uint32_t size, size_t i, sf_reduce_op op) {
  T acc = value<T>(0, i);
  for (uint32_t r = 1; r < size; ++r) {
    const T b = value<T>(r, i);
    if (op == SF_REDUCE_SUM) {
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        acc = static_cast<T>(static_cast<U>(acc) + static_cast<U>(b));
      } else {
        acc = acc + b;
      }
    } else if (op == SF_REDUCE_MAX) {
      acc = (acc < b || b != b) ? b : acc;
    } else {
      acc = (b < acc || b != b) ? b : acc;
    }
  }
  return acc;
}

template <class T>
sf_dtype dtype_of() {
  if constexpr (std::is_same_v<T, float>) return SF_DTYPE_F32;
  else if constexpr (std::is_same_v<T, double>) return SF_DTYPE_F64;
  else if constexpr (std::is_same_v<T, int32_t>) return SF_DTYPE_I32;
  else return SF_DTYPE_I64;
}

// Allreduce of every size on rank `rank`; returns the number of elements whose bits differ
// from the rank-order reference (first mismatch in *where).
template <class T>
size_t check_type(GlooCommunicator& c, uint32_t rank, uint32_t size, const std::vector<size_t>& sizes,
                  std::string* where) {
  size_t bad = 0;
  for (sf_reduce_op op : {SF_REDUCE_SUM, SF_REDUCE_MAX, SF_REDUCE_MIN})
    for (size_t n : sizes) {
      std::vector<T> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = value<T>(rank, i);
      if (c.allreduce(v.data(), n, dtype_of<T>(), op) != SF_OK) {
        *where = GlooCommunicator::last_error();
        return n + 1;
      }
      for (size_t i = 0; i < n; ++i) {
        const T want = reference<T>(size, i, op);
        if (std::memcmp(&v[i], &want, sizeof(T)) != 0 && bad++ == 0)
          *where = "dtype " + std::to_string(dtype_of<T>()) + " op " + std::to_string(op) + " n " + std::to_string(n) +
                   " i " + std::to_string(i);
      }
    }
  return bad;
}

}  // namespace

// Every rank gets exactly the rank-order result, bit for bit: one-phase and reduce-scatter
// sizes, sizes of 1 and odd, several slots' worth (slot = 4 KiB here and the default 4 MiB).
TEST_F(Shm, AllreduceIsTheRankOrderResultBitForBitOnEveryRank) {
  for (size_t slot : {size_t(4096), size_t(4) << 20}) {
    for (uint32_t size : {1u, 2u, 3u}) {
      prefix_ = "bits/" + std::to_string(slot) + "/" + std::to_string(size) + "/";
      slot_bytes_ = slot;
      const std::vector<size_t> sizes = slot == 4096 ? std::vector<size_t>{1, 2, 7, 1023, 1024, 1025, 3001}
                                                     : std::vector<size_t>{1, 13, 4095, 4097, 100003, 1048576 + 77};
      std::vector<size_t> bad(size);
      std::vector<std::string> where(size);
      run_ranks(size, [&](uint32_t rank, GlooCommunicator& c) {
        if (size > 1) {
          EXPECT_EQ(c.transport(), "shm");
        }
        bad[rank] += check_type<float>(c, rank, size, sizes, &where[rank]);
        bad[rank] += check_type<double>(c, rank, size, sizes, &where[rank]);
        bad[rank] += check_type<int32_t>(c, rank, size, sizes, &where[rank]);
        bad[rank] += check_type<int64_t>(c, rank, size, sizes, &where[rank]);
      });
      for (uint32_t r = 0; r < size; ++r) {
        EXPECT_EQ(errors_[r], "");
        EXPECT_EQ(bad[r], 0u) << "slot " << slot << " size " << size << " rank " << r << ": " << where[r];
      }
    }
  }
}

TEST_F(Shm, BroadcastAllgatherAndBarrierAcrossSlots) {
  slot_bytes_ = 4096;
  run_ranks(3, [&](uint32_t rank, GlooCommunicator& c) {
    for (uint32_t root = 0; root < 3; ++root)
      for (size_t n : {size_t(1), size_t(4095), size_t(4096), size_t(4097), size_t(20000)}) {
        std::vector<uint8_t> b(n);
        for (size_t i = 0; i < n; ++i) b[i] = uint8_t(rank * 40 + i * 3);
        OK(c.broadcast(b.data(), n, root));
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(b[i], uint8_t(root * 40 + i * 3)) << root << " " << n << " " << i;
      }
    for (size_t n : {size_t(1), size_t(4096), size_t(9000)}) {
      std::vector<uint8_t> in(n), out(3 * n);
      for (size_t i = 0; i < n; ++i) in[i] = uint8_t(rank * 91 + i * 7);
      OK(c.allgather(in.data(), n, out.data()));
      for (uint32_t r = 0; r < 3; ++r)
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[r * n + i], uint8_t(r * 91 + i * 7));
      // in place: rank r's contribution already at out + r * n
      std::vector<uint8_t> all(3 * n, 0);
      std::memcpy(all.data() + rank * n, in.data(), n);
      OK(c.allgather(all.data() + rank * n, n, all.data()));
      EXPECT_EQ(all, out);
      // in == out: every rank's own data at the front, overwritten by rank 0's row first
      std::vector<uint8_t> front(3 * n, 0);
      std::memcpy(front.data(), in.data(), n);
      OK(c.allgather(front.data(), n, front.data()));
      EXPECT_EQ(front, out) << "rank " << rank << ", " << n << " bytes";
    }
    // A late rank holds everyone up.
    auto t0 = Clock::now();
    if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    OK(c.barrier());
    EXPECT_GE(std::chrono::duration<double>(Clock::now() - t0).count(), 0.25);
  });
  for (uint32_t r = 0; r < 3; ++r) EXPECT_EQ(errors_[r], "") << r;
}

TEST_F(Shm, MismatchedCallsAreReportedNotMisread) {
  timeout_ms_ = 5000;
  std::vector<std::string> msg(2);
  run_ranks(2, [&](uint32_t rank, GlooCommunicator& c) {
    float x[4] = {};
    const sf_status st = rank == 0 ? c.allreduce(x, 4, SF_DTYPE_F32, SF_REDUCE_SUM) : c.broadcast(x, 16, 1);
    msg[rank] = GlooCommunicator::last_error();
    EXPECT_EQ(st, SF_ERR);
  });
  EXPECT_NE(msg[0].find("collective mismatch: this node called allreduce(4 f32, sum) but node 1 called broadcast(16 "
                        "bytes from node 1)"),
            std::string::npos)
      << msg[0];
  EXPECT_NE(msg[1].find("collective mismatch"), std::string::npos) << msg[1];
}

TEST_F(Shm, TimeoutNamesEveryMissingNode) {
  timeout_ms_ = 1500;
  std::atomic<int> timed_out{0};
  std::vector<std::string> msg(4);
  std::vector<double> secs(4);
  run_ranks(4, [&](uint32_t rank, GlooCommunicator& c) {
    if (rank >= 2) {  // join, then never call, and stay until both callers have timed out
      while (timed_out < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    std::vector<float> x(50000, 1.0f);
    auto t0 = Clock::now();
    EXPECT_EQ(c.allreduce(x.data(), x.size(), SF_DTYPE_F32, SF_REDUCE_SUM), SF_ERR_TIMEOUT);
    secs[rank] = std::chrono::duration<double>(Clock::now() - t0).count();
    msg[rank] = GlooCommunicator::last_error();
    ++timed_out;  // (a silent node that left before the other caller timed out would be named as closed)
  });
  for (uint32_t r : {0u, 1u}) {
    EXPECT_NE(msg[r].find("allreduce failed on node " + std::to_string(r) + ": timed out waiting for nodes 2, 3"),
              std::string::npos)
        << msg[r];
    EXPECT_NE(msg[r].find("no answer from a peer within 1.5 s"), std::string::npos) << msg[r];
    EXPECT_GE(secs[r], 1.4);
    EXPECT_LT(secs[r], 5.0);
  }
}

// A failed rank marks itself broken: a peer that arrives later fails at once, not after its
// own timeout.
TEST_F(Shm, APeerThatFailedEarlierFailsTheNextCallAtOnce) {
  timeout_ms_ = 1000;
  std::atomic<bool> failed{false};
  std::string late;
  double late_s = 0;
  run_ranks(2, [&](uint32_t rank, GlooCommunicator& c) {
    float x = 1;
    if (rank == 0) {
      EXPECT_EQ(c.allreduce(&x, 1, SF_DTYPE_F32, SF_REDUCE_SUM), SF_ERR_TIMEOUT);
      failed = true;
      return;
    }
    while (!failed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    // Rank 0's data was in place before it gave up: this call may still complete here.
    (void)c.allreduce(&x, 1, SF_DTYPE_F32, SF_REDUCE_SUM);
    auto t0 = Clock::now();
    EXPECT_EQ(c.barrier(), SF_ERR);
    late_s = std::chrono::duration<double>(Clock::now() - t0).count();
    late = GlooCommunicator::last_error();
  });
  EXPECT_LT(late_s, 0.5);
  EXPECT_NE(late.find("barrier failed on node 1: node 0 failed an earlier collective"), std::string::npos) << late;
}

// The peer is another process that dies (SIGKILL, or _exit without closing anything): the
// collective fails within milliseconds, long before the 30 s timeout, naming the node.
TEST_F(Shm, APeerProcessThatDiesFailsTheCollectiveAtOnce) {
  timeout_ms_ = 30000;
  for (const bool sigkill : {true, false}) {
    prefix_ = sigkill ? "dead/kill/" : "dead/exit/";
    const uint16_t port = server_->port();
    const GlooCommunicator::Options child_options = options(1, 2);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {  // rank 1: only what it builds itself, and _exit
      int rc = 1;
      try {
        auto store = net::StoreClient::connect("127.0.0.1", port, kSecret, 1, 5000);
        GlooCommunicator comm(*store, child_options);
        float x = 2;
        if (comm.transport() == "shm" && comm.allreduce(&x, 1, SF_DTYPE_F32, SF_REDUCE_SUM) == SF_OK && x == 3) {
          if (sigkill) ::pause();  // until killed
          ::_exit(0);              // no destructor runs: the segment still says "live"
        }
      } catch (...) {
      }
      ::_exit(rc);
    }
    std::string msg;
    double seconds = 0;
    run_ranks(1, [](uint32_t, GlooCommunicator&) {});  // (keeps errors_ sized)
    {
      auto c = client(0);
      GlooCommunicator comm(*c, options(0, 2));
      EXPECT_EQ(comm.transport(), "shm");
      float x = 1;
      OK(comm.allreduce(&x, 1, SF_DTYPE_F32, SF_REDUCE_SUM));
      EXPECT_EQ(x, 3.0f);
      if (sigkill) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        ::kill(child, SIGKILL);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
      std::vector<float> v(100000, 1.0f);
      auto t0 = Clock::now();
      EXPECT_EQ(comm.allreduce(v.data(), v.size(), SF_DTYPE_F32, SF_REDUCE_SUM), SF_ERR);
      seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      msg = GlooCommunicator::last_error();
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    if (!sigkill) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    }
    EXPECT_LT(seconds, 2.0) << msg;
    EXPECT_NE(msg.find("allreduce failed on node 0: node 1 is gone: its process (pid " + std::to_string(child) +
                       ") exited"),
              std::string::npos)
        << msg;
  }
}

// A rank that dies during the setup (after saying it is on this host, before mapping the
// segment): the others fail after the timeout naming it, and the segment is gone.
TEST_F(Shm, ARankVanishingDuringTheSetupLeavesNothingBehind) {
  timeout_ms_ = 1500;
  tweak_ = [](uint32_t, GlooCommunicator::Options& o) { o.host_identity = "one-host"; };
  // Rank 1 is a fake: it publishes its record and is never heard of again.
  client(1)->set(prefix_ + "shm/host/1", "shm=1 pid=" + std::to_string(::getpid()) + " pidns=- token=- host=one-host");
  std::string error;
  bool saw_segment = false;
  std::thread watch([&] {
    for (int i = 0; i < 100 && !saw_segment; ++i) {
      saw_segment = !my_segments().empty();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  run_ranks(2, [](uint32_t, GlooCommunicator&) { ADD_FAILURE() << "built without rank 1"; }, {1});
  watch.join();
  EXPECT_TRUE(saw_segment) << "rank 0 should have created the segment while waiting";
  EXPECT_NE(errors_[0].find("node 1 did not join the communicator within 1.5 s"), std::string::npos) << errors_[0];
  EXPECT_TRUE(my_segments().empty());

  // Rank 0 vanishing the same way: rank 1 names it.
  prefix_ = "vanish0/";
  client(0)->set(prefix_ + "shm/host/0", "shm=1 pid=" + std::to_string(::getpid()) +
                                             " pidns=- token=00112233445566778899aabbccddeeff host=one-host");
  run_ranks(2, [](uint32_t, GlooCommunicator&) { ADD_FAILURE() << "built without rank 0"; }, {0});
  EXPECT_NE(errors_[1].find("node 0 did not join the communicator within 1.5 s"), std::string::npos) << errors_[1];
}

// A segment whose creator was killed during the setup together with every peer (the only way
// one can stay in /dev/shm) is removed by the next rank 0 on this host.
TEST_F(Shm, AStaleSegmentOfADeadCreatorIsSweptAway) {
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ::waitpid(gone, nullptr, 0);
  struct stat st {};
  ASSERT_EQ(::stat("/proc/self/ns/pid", &st), 0);
  const std::string name = "/skyforge-comm-" + std::to_string(st.st_ino) + "-" + std::to_string(gone) + "-test-dead";
  const std::string young = "/skyforge-comm-" + std::to_string(st.st_ino) + "-" + std::to_string(gone) + "-test-young";
  for (const auto& n : {name, young}) {
    int fd = ::shm_open(n.c_str(), O_CREAT | O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    if (n == name) {
      timespec old[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
      ASSERT_EQ(::futimens(fd, old), 0);
    }
    ::close(fd);
  }
  run_ranks(2, [](uint32_t, GlooCommunicator& c) { OK(c.barrier()); });
  EXPECT_EQ(errors_[0], "");
  EXPECT_NE(::access(("/dev/shm" + name).c_str(), F_OK), 0) << "the stale segment is still there";
  EXPECT_EQ(::access(("/dev/shm" + young).c_str(), F_OK), 0) << "a recent one (its setup may be under way) must stay";
  ::shm_unlink(name.c_str());
  ::shm_unlink(young.c_str());
}

// ---- Services: the 1.1 table -----------------------------------------------------------------

TEST(Services, TableIsVersion11AndTheClientHasNoCommunicator) {
  Services s(nullptr);
  const sf_host_services* t = s.table();
  EXPECT_EQ(t->struct_size, sizeof(sf_host_services));
  EXPECT_EQ(t->abi_minor, SKYFORGE_ABI_MINOR);
  ASSERT_NE(t->communicator, nullptr);
  ASSERT_NE(t->compute_backend, nullptr);
  EXPECT_EQ(t->communicator(t->ctx), nullptr);
  EXPECT_NE(std::string(t->last_error(t->ctx)).find("only on a pool's nodes"), std::string::npos);
  const sf_compute_hooks* h = nullptr;
  void* self = nullptr;
  EXPECT_EQ(t->compute_backend(t->ctx, nullptr, &h, &self), SF_ERR_UNSUPPORTED);
}

TEST(Services, CommunicatorIsBuiltOnceAndAFailureIsRepeated) {
  Services s(nullptr);
  const sf_host_services* t = s.table();
  int calls = 0;
  static sf_communicator fake{};
  fake.struct_size = sizeof fake;
  s.set_communicator_factory([&] {
    ++calls;
    return std::shared_ptr<const sf_communicator>(&fake, [](const sf_communicator*) {});
  });
  EXPECT_EQ(t->communicator(t->ctx), &fake);
  EXPECT_EQ(t->communicator(t->ctx), &fake);
  EXPECT_EQ(calls, 1);
  s.reset_communicator();
  EXPECT_EQ(t->communicator(t->ctx), nullptr);

  Services f(nullptr);
  calls = 0;
  f.set_communicator_factory([&]() -> std::shared_ptr<const sf_communicator> {
    ++calls;
    throw std::runtime_error("node 2 did not join");
  });
  const sf_host_services* ft = f.table();
  EXPECT_EQ(ft->communicator(ft->ctx), nullptr);
  EXPECT_STREQ(ft->last_error(ft->ctx), "node 2 did not join");
  EXPECT_EQ(ft->communicator(ft->ctx), nullptr);
  EXPECT_STREQ(ft->last_error(ft->ctx), "node 2 did not join");
  EXPECT_EQ(calls, 1);
}

TEST(Services, ComputeBackendSelection) {
  Services s(nullptr);
  msg::Job job;
  s.set_instance(job.id, "/tmp");
  const sf_host_services* t = s.table();
  const sf_compute_hooks* h = nullptr;
  void* self = nullptr;
  EXPECT_EQ(t->compute_backend(t->ctx, "", &h, &self), SF_ERR_INVALID);
  EXPECT_NE(std::string(t->last_error(t->ctx)).find("none is loaded"), std::string::npos) << t->last_error(t->ctx);

  sf_compute_hooks ha{}, hb{};
  int a = 1, b = 2;
  s.add_compute_backend("cpu", &ha, &a);
  EXPECT_EQ(t->compute_backend(t->ctx, nullptr, &h, &self), SF_OK);  // the only one
  EXPECT_EQ(h, &ha);
  EXPECT_EQ(self, &a);
  s.add_compute_backend("fast", &hb, &b);
  EXPECT_EQ(t->compute_backend(t->ctx, "", &h, &self), SF_ERR_INVALID);  // two: which?
  EXPECT_NE(std::string(t->last_error(t->ctx)).find("'cpu', 'fast'"), std::string::npos) << t->last_error(t->ctx);
  EXPECT_EQ(t->compute_backend(t->ctx, "fast", &h, &self), SF_OK);
  EXPECT_EQ(self, &b);
  EXPECT_EQ(t->compute_backend(t->ctx, "gpu", &h, &self), SF_ERR_INVALID);
  EXPECT_NE(std::string(t->last_error(t->ctx)).find("no compute backend named 'gpu' (loaded: 'cpu', 'fast')"),
            std::string::npos)
      << t->last_error(t->ctx);
  s.set_config({{"compute.backend", "fast"}});
  EXPECT_EQ(t->compute_backend(t->ctx, "", &h, &self), SF_OK);
  EXPECT_EQ(self, &b);
  s.set_config({{"compute.backend", "tpu"}});
  EXPECT_EQ(t->compute_backend(t->ctx, nullptr, &h, &self), SF_ERR_INVALID);
  EXPECT_NE(std::string(t->last_error(t->ctx)).find("'tpu' (compute.backend) is not loaded"), std::string::npos);
  EXPECT_EQ(t->compute_backend(t->ctx, "cpu", nullptr, &self), SF_ERR_INVALID);
  s.clear_compute_backends();
  EXPECT_EQ(t->compute_backend(t->ctx, "cpu", &h, &self), SF_ERR_INVALID);
}
