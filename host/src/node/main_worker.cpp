// skyforge-worker — started by a provider on every node; see worker.hpp.
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "worker.hpp"

namespace {
const char* kUsage =
    "usage: skyforge-worker --connect HOST:PORT --node N --address ADDR [--work-dir DIR]\n"
    "                       [--lease-ms MS] [--heartbeat-ms MS] [--remove-work-dir]\n"
    "The pool secret is read from $SKYFORGE_POOL_SECRET (never from the command line).\n"
    "Started by skyforge's providers; not meant to be run by hand.\n";

int usage_error(const std::string& what) {
  std::cerr << "skyforge-worker: " << what << "\n" << kUsage;
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  skyforge::WorkerArgs a;
  std::string connect;
  bool have_node = false;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
        return argv[++i];
      };
      if (arg == "--connect") connect = value();
      else if (arg == "--node") a.node = static_cast<uint32_t>(std::stoul(value())), have_node = true;
      else if (arg == "--address") a.address = value();
      else if (arg == "--work-dir") a.work_dir = value();
      else if (arg == "--lease-ms") a.lease_ms = std::stoi(value());
      else if (arg == "--heartbeat-ms") a.heartbeat_ms = std::stoi(value());
      else if (arg == "--remove-work-dir") a.remove_work_dir = true;
      else if (arg == "--help" || arg == "-h") {
        std::cout << kUsage;
        return 0;
      } else
        return usage_error("unknown argument '" + arg + "'");
    }
  } catch (const std::exception& e) {
    return usage_error(e.what());
  }
  auto colon = connect.rfind(':');
  if (connect.empty() || colon == std::string::npos) return usage_error("--connect HOST:PORT is required");
  if (!have_node) return usage_error("--node is required");
  a.host = connect.substr(0, colon);
  a.port = static_cast<uint16_t>(std::stoul(connect.substr(colon + 1)));
  if (a.address.empty()) a.address = "127.0.0.1";
  const char* secret = std::getenv("SKYFORGE_POOL_SECRET");
  if (!secret || !*secret) return usage_error("$SKYFORGE_POOL_SECRET is not set");
  a.secret = secret;
  // Scrub the value in place before dropping the variable: /proc/<pid>/environ reads the
  // original environment block, which unsetenv() alone leaves intact. Apps, commands and
  // other local users never see the secret.
  std::memset(const_cast<char*>(secret), 0, std::strlen(secret));
  unsetenv("SKYFORGE_POOL_SECRET");
  return skyforge::worker_main(a);
}
