// bench_control_plane — what one host can drive: N simulated workers' control-plane connections
// and heartbeats held by one server, through the real classes of host/src/shared/protocol.hpp
// (net::Server, net::connect(), net::Connection, the sealed channel's handshake: X25519 key
// shares and HMAC proofs, then ChaCha20-Poly1305 records), with the host's settings (heartbeat
// every 400 ms both ways, lease 4 s, one io thread polling for 50 us after each burst of
// work, as `skyforge run` does: run_io_with_spin).
//
//   build/bin/bench_control_plane [--workers 1000] [--seconds 10] [--warmup 2]
//                                 [--progress-ms 400] [--spin-us 50] [--client-threads 1]
//
// The server runs in this process, alone; the N workers run in a child process (this program
// again, `--clients`), so that every figure of the server is its own. The pool secret reaches the
// child through its stdin, never its command line. Each simulated worker is one net::connect()
// (the real handshake), a started Connection sending its own Heartbeat frames, and, every
// --progress-ms, a Progress frame — what a training node's worker sends beside its heartbeats
// (0: heartbeats only; then nothing is timed).
//
// Figures, over --seconds of steady state after every worker connected and --warmup passed:
//   connect      N handshakes, one after another from the child: wall time, and the server's RSS
//                before and after (per connection)
//   server RSS   VmRSS of the server process holding N connections (and VmHWM)
//   server CPU   getrusage(RUSAGE_SELF) of the server process, user + sys seconds per wall second
//                (1.0 = one core busy), with the io thread's spin counted (it is part of the host)
//   heartbeat -> lease renewed
//                per Progress frame: from the worker's clock read (CLOCK_MONOTONIC, carried in the
//                frame's `bytes` field) taken just before Connection::send() writes it, to the
//                server's frame handler for it. The handler runs in the same read completion
//                (Connection::on_read) that renewed the connection's lease — any bytes renew it,
//                and a Heartbeat frame takes the same path up to there — so this is the time from
//                a heartbeat's send to its lease renewal, plus the decoding of one small frame.
//                p50 / p99 / max; the client's delays (its own io thread, the scheduler) count.
//   leases lost  connections either side closed during the run (must be 0)
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "io_loop.hpp"
#include "protocol.hpp"

extern char** environ;

namespace {

namespace asio = boost::asio;
namespace net = skyforge::net;
namespace msg = skyforge::msg;
using Clock = std::chrono::steady_clock;

constexpr int kHeartbeatMs = 400;  // the host's (host/src/client/run.hpp)
constexpr int kLeaseMs = 4000;

net::ConnectionOptions host_options() {
  net::ConnectionOptions o;
  o.heartbeat_ms = kHeartbeatMs;
  o.lease_ms = kLeaseMs;
  o.handshake_timeout_ms = 5000;
  return o;
}

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

// Enough descriptors for `n` connections and some to spare; says so if the hard limit is lower.
void raise_nofile(long n) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  rlim_t want = static_cast<rlim_t>(n + 256);
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
    rl.rlim_cur = (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want) ? want : rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want)
    throw std::runtime_error("RLIMIT_NOFILE is " + std::to_string(rl.rlim_cur) + " (hard limit " +
                             std::to_string(rl.rlim_max) + "), " + std::to_string(want) + " needed");
}

long proc_status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t k = std::strlen(key);
  while (std::getline(f, line))
    if (line.compare(0, k, key) == 0 && line.size() > k && line[k] == ':') return std::atol(line.c_str() + k + 1);
  return -1;
}

double cpu_seconds(const rusage& r) {
  return double(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + double(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto c = line.find(':');
      return c == std::string::npos ? line : line.substr(c + 2);
    }
  return "unknown CPU";
}

double pct(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * double(v.size())))];
}

// The pool secret's size: it crosses to the child as raw bytes on its stdin, after the port line.
constexpr size_t kSecretBytes = 32;

// ---- the simulated workers (child process) ----------------------------------------------------

struct SimWorker {
  std::shared_ptr<net::Connection> conn;
  std::unique_ptr<asio::steady_timer> timer;
};

int run_clients(int workers, int progress_ms, int threads) {
  std::string port_line, secret(kSecretBytes, '\0');
  if (!std::getline(std::cin, port_line) || !std::cin.read(secret.data(), std::streamsize(secret.size()))) return 2;
  const auto port = static_cast<uint16_t>(std::stoi(port_line));
  raise_nofile(workers);

  asio::io_context io;
  auto guard = asio::make_work_guard(io);
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back([&] { io.run(); });

  std::atomic<int> lost{0};
  std::atomic<bool> stopping{false};
  std::mutex lost_mu;
  std::string first_loss;
  std::vector<SimWorker> sims(static_cast<size_t>(workers));
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> offset(0, std::max(1, progress_ms) - 1);
  const auto t0 = Clock::now();
  for (int i = 0; i < workers; ++i) {
    auto c = net::connect(io, "127.0.0.1", port, secret, static_cast<uint32_t>(i), host_options(), 15000);
    c->start([](msg::Type, std::string&&) {},
             [&, i](const std::string& why) {
               if (stopping) return;
               ++lost;
               std::lock_guard<std::mutex> l(lost_mu);
               if (first_loss.empty()) first_loss = "worker " + std::to_string(i) + ": " + why;
             });
    sims[size_t(i)].conn = c;
  }
  const double connect_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // Progress frames on the heartbeat cadence, each worker at its own phase.
  std::function<void(size_t)> arm = [&](size_t i) {
    sims[i].timer->async_wait([&, i](const boost::system::error_code& ec) {
      if (ec || stopping) return;
      msg::Progress p;
      p.op = "allreduce";
      p.status = "epoch 3/6, step 412/900";
      p.bytes = uint64_t(now_ns());  // the send time, read just before the send
      sims[i].conn->send_msg(msg::Type::Progress, p);
      sims[i].timer->expires_at(sims[i].timer->expiry() + std::chrono::milliseconds(progress_ms));
      arm(i);
    });
  };
  if (progress_ms > 0)
    for (size_t i = 0; i < sims.size(); ++i) {
      sims[i].timer = std::make_unique<asio::steady_timer>(io);
      sims[i].timer->expires_after(std::chrono::milliseconds(offset(rng)));
      asio::post(io, [&, i] { arm(i); });
    }
  std::printf("connected %d %.6f\n", workers, connect_s);
  std::fflush(stdout);

  std::string line;
  while (std::getline(std::cin, line)) {
  }  // the server closes our stdin when it is done
  stopping = true;
  for (auto& s : sims) {
    if (s.timer) asio::post(io, [t = s.timer.get()] { t->cancel(); });
    s.conn->abort();
  }
  for (auto& s : sims) s.conn->wait_closed(5000);
  guard.reset();
  io.stop();
  for (auto& t : pool) t.join();
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  std::printf("done lost=%d cpu=%.3f first=%s\n", lost.load(), cpu_seconds(ru), first_loss.c_str());
  std::fflush(stdout);
  return 0;
}

// ---- the server (this process) ----------------------------------------------------------------

struct Child {
  pid_t pid = -1;
  FILE* to = nullptr;    // its stdin
  FILE* from = nullptr;  // its stdout
};

Child spawn_clients(const std::vector<std::string>& args) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  std::vector<std::string> a = args;
  std::vector<char*> argv;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  Child c;
  int rc = posix_spawn(&c.pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(in[0]);
  ::close(out[1]);
  if (rc != 0) throw std::runtime_error(std::string("cannot start the clients: ") + std::strerror(rc));
  c.to = ::fdopen(in[1], "w");
  c.from = ::fdopen(out[0], "r");
  return c;
}

std::string read_line(FILE* f) {
  std::string s;
  for (int ch; (ch = std::fgetc(f)) != EOF && ch != '\n';) s.push_back(char(ch));
  return s;
}

struct Args {
  int workers = 1000, seconds = 10, warmup = 2, progress_ms = kHeartbeatMs, spin_us = 50, client_threads = 1;
};

int run_server(const Args& a) {
  raise_nofile(a.workers);
  const std::string secret = net::random_bytes(kSecretBytes);
  // The clients first: the child must not inherit the listening socket. It waits for the port
  // and the secret on its stdin.
  Child child = spawn_clients({"bench_control_plane", "--clients", std::to_string(a.workers),
                               std::to_string(a.progress_ms), std::to_string(a.client_threads)});

  asio::io_context io;
  std::mutex mu;
  std::vector<std::shared_ptr<net::Connection>> conns;
  std::vector<double> lat_us;
  lat_us.reserve(size_t(a.workers) * size_t(a.seconds + 1) * 1000 / size_t(std::max(1, a.progress_ms)) + 1024);
  std::atomic<bool> measuring{false}, stopping{false};
  std::atomic<long> lost{0}, rejected{0};
  std::string first_loss;

  const long rss_empty = proc_status_kib("VmRSS");
  net::Server server(
      io, "127.0.0.1", 0, secret, host_options(),
      [&](std::shared_ptr<net::Connection> c) {
        c->start(
            [&](msg::Type type, std::string&& payload) {
              if (type != msg::Type::Progress) return;
              auto p = net::deserialize<msg::Progress>(payload);  // as the host's watchdog does
              const int64_t now = now_ns();
              if (!measuring) return;
              std::lock_guard<std::mutex> l(mu);
              lat_us.push_back(double(now - int64_t(p.bytes)) / 1000.0);
            },
            [&, node = c->node()](const std::string& why) {
              if (stopping) return;
              ++lost;
              std::lock_guard<std::mutex> l(mu);
              if (first_loss.empty()) first_loss = "node " + std::to_string(node) + ": " + why;
            });
        std::lock_guard<std::mutex> l(mu);
        conns.push_back(std::move(c));
      },
      [&](const std::string& peer, const std::string& why) {
        ++rejected;
        std::fprintf(stderr, "bench_control_plane: rejected %s: %s\n", peer.c_str(), why.c_str());
      });
  std::thread io_thread([&] { skyforge::run_io_with_spin(io, std::chrono::microseconds(a.spin_us)); });
  int status = 0;
  try {
    std::fprintf(child.to, "%u\n", unsigned(server.port()));
    std::fwrite(secret.data(), 1, secret.size(), child.to);
    std::fflush(child.to);
    const std::string hello = read_line(child.from);  // "connected N seconds"
    double connect_s = 0;
    int n = 0;
    if (std::sscanf(hello.c_str(), "connected %d %lf", &n, &connect_s) != 2 || n != a.workers)
      throw std::runtime_error("the simulated workers did not connect (they said '" + hello + "')");
    for (int i = 0; i < 500; ++i) {  // the last handshakes complete on the io thread
      {
        std::lock_guard<std::mutex> l(mu);
        if (conns.size() == size_t(a.workers)) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const long rss_connected = proc_status_kib("VmRSS");
    std::this_thread::sleep_for(std::chrono::seconds(a.warmup));

    rusage r0{}, r1{};
    ::getrusage(RUSAGE_SELF, &r0);
    const auto w0 = Clock::now();
    measuring = true;
    std::this_thread::sleep_for(std::chrono::seconds(a.seconds));
    measuring = false;
    ::getrusage(RUSAGE_SELF, &r1);
    const double wall = std::chrono::duration<double>(Clock::now() - w0).count();
    const long rss = proc_status_kib("VmRSS"), hwm = proc_status_kib("VmHWM");
    size_t held = 0;
    {
      std::lock_guard<std::mutex> l(mu);
      for (auto& c : conns) held += c->is_closed() ? 0 : 1;
    }

    stopping = true;
    std::fclose(child.to);
    child.to = nullptr;
    const std::string done = read_line(child.from);  // "done lost=N cpu=S first=..."
    int client_lost = -1;
    double client_cpu = 0;
    std::sscanf(done.c_str(), "done lost=%d cpu=%lf", &client_lost, &client_cpu);

    std::vector<double> lat;
    {
      std::lock_guard<std::mutex> l(mu);
      lat = lat_us;
    }
    const double cpu = cpu_seconds(r1) - cpu_seconds(r0);
    const double user = double(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) + double(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) / 1e6;
    std::printf("machine: %s, %ld CPUs online\n", cpu_model().c_str(), ::sysconf(_SC_NPROCESSORS_ONLN));
    std::printf("control plane, %d simulated workers on one host (heartbeat %d ms both ways, lease %d ms, Progress every %d ms; "
                "server: 1 io thread, spin %d us; clients: 1 process, %d io thread(s))\n",
                a.workers, kHeartbeatMs, kLeaseMs, a.progress_ms, a.spin_us, a.client_threads);
    std::printf("connect: %d handshakes (X25519 + HMAC) one after another in %.2f s (%.0f/s); server RSS %.1f MiB before, "
                "%.1f MiB with them (%.1f KiB per connection)\n",
                a.workers, connect_s, a.workers / connect_s, rss_empty / 1024.0, rss_connected / 1024.0,
                double(rss_connected - rss_empty) / a.workers);
    std::printf("steady state, %.1f s: server RSS %.1f MiB (peak %.1f MiB); server CPU %.3f s/s (user %.3f, sys %.3f), "
                "%.1f us per worker-second; connections held %zu/%d\n",
                wall, rss / 1024.0, hwm / 1024.0, cpu / wall, user / wall, (cpu - user) / wall, cpu / wall / a.workers * 1e6,
                held, a.workers);
    if (a.progress_ms > 0) {
      const size_t count = lat.size();
      double p50 = pct(lat, 0.5), p99 = pct(lat, 0.99), mx = lat.empty() ? 0 : lat.back();
      std::printf("heartbeat sent -> lease renewed (worker's clock just before send -> server's handler, same read "
                  "as the lease renewal), %zu frames (%.0f/s): p50 %.1f us, p99 %.1f us, max %.1f us\n",
                  count, double(count) / wall, p50, p99, mx);
    }
    std::printf("leases lost: server side %ld, worker side %d; handshakes rejected %ld; the clients used %.2f s of CPU "
                "in all\n",
                lost.load(), client_lost, rejected.load(), client_cpu);
    if (lost != 0 || client_lost != 0 || held != size_t(a.workers)) {
      std::fprintf(stderr, "bench_control_plane: connections were lost (%s)\n", first_loss.c_str());
      status = 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_control_plane: %s\n", e.what());
    status = 1;
  }
  stopping = true;
  if (child.to) std::fclose(child.to);
  int st = 0;
  ::waitpid(child.pid, &st, 0);
  std::fclose(child.from);
  {
    std::lock_guard<std::mutex> l(mu);
    for (auto& c : conns) c->abort();
  }
  server.close();
  for (auto& c : conns) c->wait_closed(5000);
  io.stop();
  io_thread.join();
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 5 && std::string(argv[1]) == "--clients")
      return run_clients(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]));
    Args a;
    for (int i = 1; i < argc; i += 2) {
      std::string k = argv[i];
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_control_plane: %s needs a value\n", k.c_str());
        return 2;
      }
      int v = std::atoi(argv[i + 1]);
      if (k == "--workers") a.workers = v;
      else if (k == "--seconds") a.seconds = v;
      else if (k == "--warmup") a.warmup = v;
      else if (k == "--progress-ms") a.progress_ms = v;
      else if (k == "--spin-us") a.spin_us = v;
      else if (k == "--client-threads") a.client_threads = v;
      else {
        std::fprintf(stderr, "bench_control_plane: unknown option %s\n", k.c_str());
        return 2;
      }
    }
    if (a.workers < 1 || a.seconds < 1 || a.warmup < 0 || a.progress_ms < 0 || a.spin_us < 0 || a.client_threads < 1) {
      std::fprintf(stderr, "bench_control_plane: --workers, --seconds and --client-threads must be >= 1, the rest >= 0\n");
      return 2;
    }
    return run_server(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_control_plane: %s\n", e.what());
    return 1;
  }
}
