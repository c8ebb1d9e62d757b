// GlooCommunicator over a real rendezvous store (StoreServer on loopback), one thread per rank,
// with tiny chunks so that every chunked path (remainders included) runs on small buffers. Also
// the failure paths (a rank that never joins, a stalled peer, a dead peer) and the Services
// wiring (communicator() caching, compute_backend() selection).
#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "communicator.hpp"
#include "services.hpp"
#include "store.hpp"

using namespace skyforge;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kSecret = "comm-secret";

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

  GlooCommunicator::Options options(uint32_t rank, uint32_t size) const {
    GlooCommunicator::Options o;
    o.rank = rank;
    o.size = size;
    o.prefix = "gloo/test/";
    o.timeout = std::chrono::milliseconds(timeout_ms_);
    o.chunk_bytes = chunk_bytes_;
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
    std::vector<std::string> errors(size);
    for (uint32_t r = 0; r < size; ++r) {
      if (std::find(absent.begin(), absent.end(), r) != absent.end()) continue;
      threads.emplace_back([&, r] {
        try {
          auto c = client(r);
          GlooCommunicator comm(*c, options(r, size));
          body(r, comm);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    errors_ = errors;
  }

  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_;
  std::thread thread_;
  std::unique_ptr<net::StoreServer> server_;
  int timeout_ms_ = 10000;
  size_t chunk_bytes_ = 256;  // tiny: every operation below is chunked
  std::vector<std::string> errors_;
};

float noisy(uint32_t r, size_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t(r + 1) * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 29;
  return float(double(x % 1000003) / 777.0 - 600.0);
}

#define OK(call) ASSERT_EQ((call), SF_OK) << GlooCommunicator::last_error()

}  // namespace

TEST_F(Pool, EveryOperationWithChunksAndRemainders) {
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

TEST_F(Pool, InvalidArgumentsAreRefusedWithoutBreakingTheGroup) {
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

TEST_F(Pool, SizeOneIsLocal) {
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

TEST_F(Pool, ARankThatNeverJoinsIsNamedAfterTheTimeout) {
  timeout_ms_ = 1500;
  auto t0 = Clock::now();
  run_ranks(3, [&](uint32_t, GlooCommunicator&) { ADD_FAILURE() << "joined without rank 2"; }, {2});
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(s, 10);
  for (uint32_t r : {0u, 1u}) {
    EXPECT_NE(errors_[r].find("node 2 did not join the communicator within 1.5 s"), std::string::npos) << errors_[r];
  }
}

TEST_F(Pool, AStalledPeerTimesOutAndTheGroupStaysBroken) {
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

TEST_F(Pool, ADeadPeerFailsTheCollectiveWithoutWaitingForTheTimeout) {
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
  s.set_instance(job, "/tmp");
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
