// skyforge-backend-check — the conformance suite's command line (backend_check.hpp). Run as
// itself by a backend's author, or by `skyforge backend-check`, which executes it with argv[0]
// "skyforge backend-check": messages and the usage name the command the user typed.
#include <boost/program_options.hpp>

#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "backend_check.hpp"
#include "crash_context.hpp"

namespace po = boost::program_options;

namespace {

constexpr int kExitUsage = 2;  // as `skyforge`'s, and a backend that cannot run here

// argv[0] as a command name: the file name of a path, else as given ("skyforge backend-check").
const char* program_name(const char* argv0) {
  if (!argv0 || !*argv0) return "skyforge-backend-check";
  const char* slash = std::strrchr(argv0, '/');
  return slash ? slash + 1 : argv0;
}

int check(const std::string& program, int argc, char** argv) {
  po::options_description desc(
      "usage: " + program + " [options] <name>\n\n"
      "Runs the compute backend <name> through the conformance suite (docs/compute-backends.md,\n"
      "\"Checking a backend\"): per-layer gradients against finite differences, 1 rank against 2,\n"
      "state_dict round trips, bad input, agreement with a reference backend and checkpoints moving\n"
      "to and from it. Exits 0 when no check failed, 1 when one did, 2 when the backend cannot be\n"
      "found or cannot run here.\n\noptions");
  skyforge::backend_check::Options o;
  o.program = program;
  std::vector<std::string> kv;
  desc.add_options()("name", po::value(&o.backend), "the compute backend")(
      "option,o", po::value(&kv)->composing(), "KEY=VALUE: an option of the backend (repeatable)")(
      "plugin-path,p", po::value(&o.plugin_path)->composing(), "a directory searched for plugins first (repeatable)")(
      "against", po::value(&o.against)->default_value("cpu"), "the reference backend; \"\" for none")(
      "help,h", "show this help");
  po::positional_options_description pos;
  pos.add("name", 1);
  po::variables_map vm;
  po::store(po::command_line_parser(argc, argv).options(desc).positional(pos).run(), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  if (o.backend.empty()) {
    std::cerr << program << ": missing <name>\n" << desc;
    return kExitUsage;
  }
  for (const auto& item : kv) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::cerr << program << ": --option " << item << ": expected KEY=VALUE\n";
      return kExitUsage;
    }
    o.options.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  return skyforge::backend_check::run(o, std::cout, std::cerr);
}

}  // namespace

int main(int argc, char** argv) {
  const char* program = program_name(argc > 0 ? argv[0] : nullptr);
  // A backend that crashes is named on stderr, with the hook it crashed in (crash_context.hpp).
  skyforge::install_crash_reporter(program);
  try {
    return check(program, argc, argv);
  } catch (const po::error& e) {
    std::cerr << program << ": " << e.what() << " (see " << program << " --help)\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << program << ": " << e.what() << "\n";
    return 1;
  }
}
