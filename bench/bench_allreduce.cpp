// bench_allreduce — the pool communicator's allreduce between ranks on this host: the
// shared-memory transport (with its three ways of waiting for a peer) and Gloo over loopback
// TCP, measured side by side in the same run, on the same processes.
//
//   build/bin/bench_allreduce [--ranks N] [--seconds S] [--sizes 24,4000,400000,4000000] [--waits S:Y,...]
//
// N ranks are N processes (fork) on this host, each with its own rendezvous-store client; the
// parent runs the store, as the head node does. Every figure is one float32 SUM allreduce of
// that many bytes, in place, as rank 0 sees it: the median (and mean) over as many calls as fit
// in S seconds (default 0.3) after a warm-up. Columns:
//   shm           the default wait (Options::shm_spin, shm_yield): no spinning,
//                 sched_yield() for up to 100 µs, then sleep on a futex
//   shm-spin      spin only (never gives up the CPU)
//   shm-futex     no spinning, no yielding: straight to the futex
//   shm S:Y       --waits S:Y,...: spin S µs, then yield Y µs more, then futex
//   gloo-tcp      SKYFORGE_COMM_SHM=0: Gloo's ring over loopback TCP (the multi-host path)
//
//   build/bin/bench_allreduce --nccl [--ranks N] [--sizes ...]
//
// --nccl (a build with the cuda engine's CUDA build): instead, the cuda engine's own gradient
// allreduce (Device::allreduce_sum: NCCL on its collectives stream, joined, then waited for),
// one GPU per rank, its unique id over the pool communicator as in training; with its bus
// bandwidth, nccl-tests' definition: busbw = 2 (n - 1) / n * bytes / time, to set beside
// nccl-tests' all_reduce_perf on the same machine (bench/train_vs_pytorch_cuda.py does).
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "communicator.hpp"
#include "store.hpp"
#ifdef SKYFORGE_BENCH_NCCL
#include "engine.hpp"  // backends/cuda: the device layer's CUDA build
#endif

using namespace skyforge;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kSecret = "bench-allreduce";

struct Column {
  std::string name;
  bool shm;
  std::chrono::microseconds spin, yield;
  bool nccl = false;  // the cuda engine's allreduce over NCCL (the communicator only exchanges its id)
};

struct Cell {
  double median_us = 0, mean_us = 0;
  uint64_t calls = 0;
};

// One rank: every column in turn, every size in turn. Rank 0 writes "col size median mean
// calls" lines to `out`.
int run_rank(uint32_t rank, uint32_t ranks, uint16_t port, double seconds, const std::vector<size_t>& sizes,
             const std::vector<Column>& columns, FILE* out) {
  auto store = net::StoreClient::connect("127.0.0.1", port, kSecret, rank, 10000);
  for (size_t ci = 0; ci < columns.size(); ++ci) {
    const Column& col = columns[ci];
    GlooCommunicator::Options o;
    o.rank = rank;
    o.size = ranks;
    o.prefix = "bench/" + std::to_string(ci) + "/";
    o.timeout = std::chrono::seconds(60);
    o.shm = col.shm;
    o.shm_spin = col.spin;
    o.shm_yield = col.yield;
    o.shm_tag = "bench";
    GlooCommunicator comm(*store, o);
    const std::string want = col.shm ? "shm" : "gloo";
    if (!col.nccl && comm.transport() != want) {
      std::fprintf(stderr, "rank %u: column %s runs on %s (%s)\n", rank, col.name.c_str(), comm.transport().c_str(),
                   comm.shm_fallback().c_str());
      return 1;
    }
#ifdef SKYFORGE_BENCH_NCCL
    std::unique_ptr<cuda::Device> gpu;
    if (col.nccl) gpu = std::make_unique<cuda::Device>(Communicator(comm.table()), Host{},
                                                       cuda::DeviceOptions{.collective_timeout_s = 60});
#else
    if (col.nccl) {
      std::fprintf(stderr, "--nccl: this build has no cuda engine (configure with a CUDA toolkit and NCCL)\n");
      return 2;
    }
#endif
    for (size_t bytes : sizes) {
      const size_t n = std::max<size_t>(1, bytes / sizeof(float));
      std::vector<float> v(n, 0.0f);  // zeros: sums stay zeros (no overflow, no denormals)
      std::function<void()> call = [&] {
        if (comm.allreduce(v.data(), n, SF_DTYPE_F32, SF_REDUCE_SUM) != SF_OK) {
          std::fprintf(stderr, "rank %u: %s\n", rank, GlooCommunicator::last_error());
          std::exit(1);
        }
      };
#ifdef SKYFORGE_BENCH_NCCL
      cuda::Buffer<float> on_gpu;
      if (gpu) {
        on_gpu = cuda::Buffer<float>(*gpu, n);
        gpu->zero(on_gpu.get(), n * sizeof(float));
        call = [&] {  // one bucket's allreduce as a training step makes it, waited for
          gpu->allreduce_sum(on_gpu.get(), n);
          gpu->join_collectives();
          gpu->synchronize();
        };
      }
#endif
      // Warm up, then rank 0 picks the number of calls (every rank must make as many).
      const int warm = 30;
      auto t0 = Clock::now();
      for (int i = 0; i < warm; ++i) call();
      const double per = std::chrono::duration<double>(Clock::now() - t0).count() / warm;
      uint64_t calls = std::clamp<uint64_t>(static_cast<uint64_t>(seconds / std::max(per, 1e-7)), 20, 2000000);
      if (comm.broadcast(&calls, sizeof calls, 0) != SF_OK || comm.barrier() != SF_OK) {
        std::fprintf(stderr, "rank %u: %s\n", rank, GlooCommunicator::last_error());
        return 1;
      }
      std::vector<double> us(calls);
      const auto start = Clock::now();
      for (uint64_t i = 0; i < calls; ++i) {
        const auto a = Clock::now();
        call();
        us[i] = std::chrono::duration<double, std::micro>(Clock::now() - a).count();
      }
      const double total = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      std::sort(us.begin(), us.end());
      if (rank == 0)
        std::fprintf(out, "%zu %zu %.3f %.3f %llu\n", ci, bytes, us[us.size() / 2], total / calls,
                     static_cast<unsigned long long>(calls));
      std::fflush(out);
    }
  }
  return 0;
}

std::string size_text(size_t b) {
  char buf[32];
  if (b >= (size_t{1} << 20) && b % 1000000 != 0) std::snprintf(buf, sizeof buf, "%.3g MiB", b / 1048576.0);
  else if (b >= 1000000) std::snprintf(buf, sizeof buf, "%zu MB", b / 1000000);
  else if (b >= 1000) std::snprintf(buf, sizeof buf, "%zu KB", b / 1000);
  else std::snprintf(buf, sizeof buf, "%zu B", b);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t ranks = 2;
  double seconds = 0.3;
  std::vector<size_t> sizes = {24, 4000, 400000, 4000000};
  std::vector<Column> extra;  // --waits: more shm columns, before gloo-tcp
  bool nccl = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--ranks") ranks = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--nccl") nccl = true;
    else if (a == "--seconds") seconds = std::stod(next());
    else if (a == "--sizes") {
      sizes.clear();
      std::string list = next();
      for (size_t p = 0; p < list.size();) {
        size_t q = list.find(',', p);
        sizes.push_back(std::stoull(list.substr(p, q - p)));
        p = q == std::string::npos ? list.size() : q + 1;
      }
    } else if (a == "--waits") {
      std::string list = next();
      for (size_t p = 0; p < list.size();) {
        size_t q = list.find(',', p);
        std::string w = list.substr(p, q - p);
        const size_t colon = w.find(':');
        if (colon == std::string::npos) {
          std::fprintf(stderr, "--waits takes SPIN_US:YIELD_US,...\n");
          return 2;
        }
        extra.push_back({"shm " + w, true, std::chrono::microseconds(std::stoll(w.substr(0, colon))),
                         std::chrono::microseconds(std::stoll(w.substr(colon + 1)))});
        p = q == std::string::npos ? list.size() : q + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--ranks N] [--seconds S] [--sizes B,B,...] [--waits SPIN_US:YIELD_US,...] [--nccl]\n",
                   argv[0]);
      return 2;
    }
  }
  if (ranks < 2) {
    std::fprintf(stderr, "--ranks must be at least 2\n");
    return 2;
  }
  using us = std::chrono::microseconds;
  std::vector<Column> columns = {
      {"shm", true, GlooCommunicator::Options{}.shm_spin, GlooCommunicator::Options{}.shm_yield},
      {"shm-spin", true, us(600000000), us(0)},
      {"shm-futex", true, us(0), us(0)},
  };
  columns.insert(columns.end(), extra.begin(), extra.end());
  columns.push_back({"gloo-tcp", false, us(0), us(0)});
  if (nccl) columns = {{"nccl (cuda engine)", true, GlooCommunicator::Options{}.shm_spin,
                        GlooCommunicator::Options{}.shm_yield, true}};

  // Fork the ranks before this process starts any thread; each waits for the store's port.
  std::vector<int> port_pipes;
  int result_pipe[2];
  if (::pipe(result_pipe) != 0) return 1;
  std::vector<pid_t> children;
  for (uint32_t r = 0; r < ranks; ++r) {
    int fds[2];
    if (::pipe(fds) != 0) return 1;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[1]);
      ::close(result_pipe[0]);
      uint16_t port = 0;
      if (::read(fds[0], &port, sizeof port) != sizeof port) ::_exit(1);
      FILE* out = ::fdopen(result_pipe[1], "w");
      int rc = 1;
      try {
        rc = run_rank(r, ranks, port, seconds, sizes, columns, out);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %u: %s\n", r, e.what());
      }
      std::fflush(out);
      ::_exit(rc);
    }
    ::close(fds[0]);
    port_pipes.push_back(fds[1]);
    children.push_back(pid);
  }
  ::close(result_pipe[1]);

  boost::asio::io_context io;
  auto guard = boost::asio::make_work_guard(io);
  std::thread io_thread([&] { io.run(); });
  auto server = std::make_unique<net::StoreServer>(io, "127.0.0.1", 0, kSecret);
  const uint16_t port = server->port();
  for (int fd : port_pipes) {
    if (::write(fd, &port, sizeof port) != sizeof port) return 1;
    ::close(fd);
  }
  std::map<std::pair<size_t, size_t>, Cell> cells;
  {
    FILE* in = ::fdopen(result_pipe[0], "r");
    size_t ci, bytes;
    double median, mean;
    unsigned long long calls;
    while (std::fscanf(in, "%zu %zu %lf %lf %llu", &ci, &bytes, &median, &mean, &calls) == 5)
      cells[{bytes, ci}] = Cell{median, mean, calls};
    std::fclose(in);
  }
  bool ok = true;
  for (pid_t p : children) {
    int status = 0;
    ::waitpid(p, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  server->close();
  guard.reset();
  io.stop();
  io_thread.join();

  if (!ok && cells.empty()) {  // nothing measured (--nccl without GPUs: the ranks said why)
    std::fprintf(stderr, "a rank failed before any figure\n");
    return 2;
  }
  std::printf("allreduce (float32 sum, in place), %u ranks = %u processes on this host (%u CPUs)\n", ranks, ranks,
              std::thread::hardware_concurrency());
  std::printf("µs per call as rank 0 sees it: median (mean)\n");
  std::printf("%-10s", "size");
  for (const auto& c : columns) std::printf("  %-20s", c.name.c_str());
  std::printf("  %s\n", nccl ? "busbw GB/s (median)" : "gloo/shm");
  for (size_t b : sizes) {
    std::printf("%-10s", size_text(b).c_str());
    for (size_t ci = 0; ci < columns.size(); ++ci) {
      auto it = cells.find({b, ci});
      char buf[64] = "-";
      if (it != cells.end()) std::snprintf(buf, sizeof buf, "%.1f (%.1f)", it->second.median_us, it->second.mean_us);
      std::printf("  %-20s", buf);
    }
    auto s = cells.find({b, 0}), g = cells.find({b, columns.size() - 1});
    if (nccl && s != cells.end())  // nccl-tests' bus bandwidth: 2 (n - 1) / n * bytes / time
      std::printf("  %.2f", 2.0 * (ranks - 1) / ranks * static_cast<double>(b) / (s->second.median_us * 1e3));
    else if (s != cells.end() && g != cells.end())
      std::printf("  %.1fx", g->second.median_us / s->second.median_us);
    std::printf("\n");
  }
  if (!ok) std::fprintf(stderr, "a rank failed\n");
  return ok ? 0 : 1;
}
