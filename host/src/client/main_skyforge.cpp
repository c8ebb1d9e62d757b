// skyforge — the command-line host: run, validate, env, plugins, backend-check, sweep, offers, tls-identity.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iomanip>
#include <map>
#include <mutex>
#include <optional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "catalog.hpp"
#include "crash_context.hpp"
#include "lent.hpp"
#include "loader.hpp"
#include "manifest.hpp"
#include "plugin_checks.hpp"
#include "plugin_resolution.hpp"
#include "run.hpp"
#include "self_exe.hpp"
#include "services.hpp"
#include "tls_identity.hpp"
#include "train_graph.hpp"

namespace po = boost::program_options;
using namespace skyforge;

namespace {

const char* kMainHelp =
    "usage: skyforge <command> [options]\n"
    "\n"
    "Runs distributed jobs described by a TOML manifest on a pool of nodes.\n"
    "\n"
    "commands:\n"
    "  run <job.toml>        provision the pool, run the job, stream output, tear the pool down\n"
    "  validate <job.toml>   check the manifest and its plugins without starting anything\n"
    "  env <job.toml>        print the environment a node's command gets (debug a script by hand)\n"
    "  plugins               list installed plugins (kind, name, version, ABI, path)\n"
    "  backend-check <name>  run a compute backend through the conformance suite\n"
    "  sweep --provider NAME find and tear down what a provider left behind for pools that are gone\n"
    "  offers --provider NAME machine types that fit an accelerator, cheapest first (--accelerator A100:1)\n"
    "  tls-identity <dir>    a key and a self-signed certificate for a pinned TLS listener (the Python pool's)\n"
    "\n"
    "`skyforge <command> --help` describes a command's options. Plugins are searched in the\n"
    "manifest's job.plugin_path, then $SKYFORGE_PLUGIN_PATH, then the install directory.\n";

struct Parsed {
  po::variables_map vm;
  bool help = false;
};

Parsed parse(const std::string& cmd, int argc, char** argv, po::options_description& desc,
             const po::positional_options_description* pos) {
  desc.add_options()("help,h", "show this help");
  Parsed p;
  auto parser = po::command_line_parser(argc, argv).options(desc);
  if (pos) parser.positional(*pos);
  po::store(parser.run(), p.vm);
  po::notify(p.vm);
  p.help = p.vm.count("help") > 0;
  return p;
}

// `skyforge <cmd> [options] <arg>`: parses with `positional` (an option of desc, bound to
// `value`) as the one positional argument. Returns 0 after printing --help, kExitUsage when the
// argument is missing, nullopt when the command goes on.
std::optional<int> parse_command(const std::string& cmd, int argc, char** argv, po::options_description& desc,
                                 const char* positional, const std::string& value, const char* shown) {
  po::positional_options_description pos;
  pos.add(positional, 1);
  if (parse(cmd, argc, argv, desc, &pos).help) {
    std::cout << desc;
    return 0;
  }
  if (value.empty()) {
    std::cerr << "skyforge " << cmd << ": missing " << shown << "\n" << desc;
    return kExitUsage;
  }
  return std::nullopt;
}

void print_problems(const ManifestError& e) {
  std::cerr << e.what() << (std::string(e.what()).back() == '\n' ? "" : "\n");
}

// Loads, checks and validates a manifest against the installed plugins; prints errors. With
// `load_plugins` false, against their plugin.toml only: no plugin code is loaded.
bool load_checked(const std::string& path, Manifest& m, std::unique_ptr<Catalog>& catalog, bool load_plugins = true) {
  try {
    m = load_manifest(path);
    catalog = std::make_unique<Catalog>(Catalog::default_search_dirs(m.job.plugin_path));
    validate_against(m, *catalog);
    if (load_plugins) check_plugins_accept_their_options(m, *catalog);
    return true;
  } catch (const ManifestError& e) {
    print_problems(e);
    return false;
  }
}

// check_compute_backend_runs_here (in a child process, as the plugins' checks), its refusal
// printed as a manifest problem: false then.
bool backend_runs_here(const Manifest& m, const Catalog& catalog) {
  std::vector<std::string> problems = run_isolated({IsolatedCheck{m.path + ": the compute backend's probe", [&] {
    try {
      check_compute_backend_runs_here(m, catalog);
      return std::string();
    } catch (const ManifestError& e) {
      return std::string(e.what());
    }
  }}});
  if (problems.empty()) return true;
  print_problems(ManifestError(std::move(problems)));
  return false;
}

int cmd_run(int argc, char** argv) {
  po::options_description desc(
      "usage: skyforge run [options] <job.toml>\n\n"
      "Provisions the manifest's pool, bootstraps every node, runs the job there, streams each\n"
      "node's output prefixed with [node N], prints the results and tears the pool down on every\n"
      "exit path (Ctrl-C: graceful teardown; a second Ctrl-C forces). Exits 0 when every node\n"
      "succeeded, 1 when the job failed, 2 for a bad manifest, 130 when interrupted.\n\noptions");
  std::string manifest;
  RunOptions opt;
  std::vector<std::string> env_names;
  desc.add_options()("manifest", po::value(&manifest), "the job manifest")(
      "verbose,v", po::bool_switch(&opt.verbose), "show bootstrap output and plugins' debug-level logs (info and above always show)")(
      "quiet-results", po::bool_switch(&opt.quiet_results), "do not print per-task results of a map job")(
      "pipeline", po::value(&opt.pipeline)->default_value(2), "map: a node holds at most [pool] concurrency x this many batches (>= 1)")(
      "timings", po::bool_switch(&opt.timings), "print phase timings (ms) and map batch round trips on stderr")(
      "resume", po::bool_switch(&opt.resume),
      "go on from the job's last checkpoint (a [train] job with a checkpoint directory: after a host crash)")(
      "outputs", po::value(&opt.outputs_dir),
      "DIR: where the job's files go (node-<N>/ each; over [job] outputs_dir; default: a fresh "
      "skyforge-outputs/<date>-<time>-<pool> here)")(
      "env", po::value(&env_names)->composing(),
      "NAME: pass this environment variable of skyforge's to every node's job (repeatable; the value never "
      "appears on a command line or in a file)")(
      "join-timeout", po::value(&opt.join_timeout_ms)->default_value(60000),
      "ms to wait for every worker to join and become ready");
  if (auto done = parse_command("run", argc, argv, desc, "manifest", manifest, "<job.toml>")) return *done;
  if (opt.pipeline < 1) {
    std::cerr << "skyforge run: --pipeline must be >= 1\n";
    return kExitUsage;
  }
  for (const auto& name : env_names) {
    const char* value = std::getenv(name.c_str());
    if (name.empty() || name.find('=') != std::string::npos || !value) {
      std::cerr << "skyforge run: --env " << name << ": " << (value ? "expected a variable's NAME" : "not set in this environment")
                << "\n";
      return kExitUsage;
    }
    opt.env[name] = value;
  }
  Manifest m;
  std::unique_ptr<Catalog> catalog;
  if (!load_checked(manifest, m, catalog) || !backend_runs_here(m, *catalog)) return kExitUsage;
  return run_job(m, *catalog, opt);
}

int cmd_validate(int argc, char** argv) {
  po::options_description desc(
      "usage: skyforge validate <job.toml>\n\n"
      "Checks the manifest (syntax, keys, types, values; a [train] model's graph and shapes) and\n"
      "that every plugin it names is installed, of the right kind, with valid options. Starts\n"
      "nothing. To let plugins check their own options it loads the provider's, each [[plugins]]\n"
      "entry's and a map job's task backend's library and creates and destroys one instance of\n"
      "each, in a child process (a plugin that crashes there is a problem, named). Exits 0 when\n"
      "valid, printing a [train] model's summary, 2 otherwise, printing each problem as\n"
      "file:line:col.\n\noptions");
  std::string manifest;
  bool no_load = false;
  desc.add_options()("manifest", po::value(&manifest), "the job manifest")(
      "no-load", po::bool_switch(&no_load), "check against the plugins' plugin.toml only: load and run no plugin code");
  if (auto done = parse_command("validate", argc, argv, desc, "manifest", manifest, "<job.toml>")) return *done;
  Manifest m;
  std::unique_ptr<Catalog> catalog;
  if (!load_checked(manifest, m, catalog, !no_load)) return kExitUsage;
  std::string what = m.job.command.empty() ? "app " + m.job.app + ", mode " + mode_name(m.job.mode) : "command " + m.job.command[0];
  std::cout << m.path << ": valid (" << m.pool.nodes << " node" << (m.pool.nodes == 1 ? "" : "s") << " on '"
            << m.pool.provider << "', " << what << ", " << m.plugins.size() << " framework plugin"
            << (m.plugins.size() == 1 ? "" : "s") << ")\n";
  if (m.train.present) std::cout << train_model_summary(m.train);
  return 0;
}

int cmd_tls_identity(int argc, char** argv) {
  po::options_description desc(
      "usage: skyforge tls-identity <dir>\n\n"
      "Writes <dir>/key.pem and <dir>/cert.pem (0600): a fresh P-256 key and a self-signed\n"
      "certificate for it, for a listener whose peers pin that certificate (the Python pool's\n"
      "caller makes one per pool, docs/python.md). <dir> must be yours and 0700.\n\noptions");
  std::string dir;
  desc.add_options()("dir", po::value(&dir), "a private directory");
  if (auto done = parse_command("tls-identity", argc, argv, desc, "dir", dir, "<dir>")) return *done;
  try {
    write_tls_identity(dir);
  } catch (const std::exception& e) {
    std::cerr << "skyforge tls-identity: " << e.what() << "\n";
    return kExitUsage;
  }
  return kExitOk;
}

int cmd_env(int argc, char** argv) {
  po::options_description desc(
      "usage: skyforge env [options] <job.toml>\n\n"
      "Starts the manifest's pool as `run` would — same provider, image and plugins, so ports and\n"
      "ranks are the real ones — but runs `env` instead of the job on every node, prints the\n"
      "environment node N's command gets (sorted NAME=value lines, or a JSON object with --json)\n"
      "and tears the pool down. With several processes per node (torch nproc_per_node) it shows the\n"
      "node's first process (SKYFORGE_LOCAL_PROC=0).\n\noptions");
  std::string manifest;
  uint32_t node = 0;
  bool json = false;
  RunOptions opt;
  desc.add_options()("manifest", po::value(&manifest), "the job manifest")(
      "node,n", po::value(&node)->default_value(0), "which node's environment to print")(
      "json", po::bool_switch(&json), "print a JSON object instead of NAME=value lines")(
      "verbose,v", po::bool_switch(&opt.verbose), "show bootstrap output and plugins' debug-level logs (info and above always show)");
  if (auto done = parse_command("env", argc, argv, desc, "manifest", manifest, "<job.toml>")) return *done;
  Manifest m;
  std::unique_ptr<Catalog> catalog;
  // As `run` would: a selected compute backend that cannot run where the `local` provider
  // starts the nodes stops it here, with exit 2, before anything starts.
  if (!load_checked(manifest, m, catalog) || !backend_runs_here(m, *catalog)) return kExitUsage;
  if (node >= m.pool.nodes) {
    std::cerr << "skyforge env: --node " << node << ": the pool has " << m.pool.nodes << " node"
              << (m.pool.nodes == 1 ? "" : "s") << " (0.." << m.pool.nodes - 1 << ")\n";
    return kExitUsage;
  }
  m.job.app.clear();
  m.job.outputs.clear();  // `env` sends no files back
  m.job.mode = JobMode::broadcast;
  // NUL-separated (values may hold newlines). With nproc_per_node > 1 a launcher starts one
  // copy per process: only the node's first process (SKYFORGE_LOCAL_PROC 0) prints.
  m.job.command = {"sh", "-c", "[ \"${SKYFORGE_LOCAL_PROC:-0}\" != 0 ] || exec env -0"};
  m.job.stdout_policy = OutputPolicy::All;
  std::mutex mu;
  std::string captured;
  opt.output_filter = [&](uint32_t n, int stream, const std::string& text) {
    if (stream != 1) return false;
    if (n == node) {
      std::lock_guard<std::mutex> lock(mu);
      captured += text;
    }
    return true;
  };
  opt.quiet_results = true;
  const int rc = run_job(m, *catalog, opt);
  if (rc != kExitOk) return rc;
  // NAME=value entries, NUL-terminated.
  std::map<std::string, std::string> vars;
  for (size_t b = 0; b < captured.size();) {
    size_t e = captured.find('\0', b);
    if (e == std::string::npos) e = captured.size();
    const std::string entry = captured.substr(b, e - b);
    if (const size_t eq = entry.find('='); eq != std::string::npos && eq > 0) vars[entry.substr(0, eq)] = entry.substr(eq + 1);
    b = e + 1;
  }
  if (json) {
    // Bytes that are not UTF-8 (an environment may hold any) become U+FFFD.
    std::cout << nlohmann::ordered_json(vars).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    for (const auto& [k, v] : vars) std::cout << k << "=" << v << "\n";
  }
  return kExitOk;
}

int cmd_plugins(int argc, char** argv) {
  po::options_description desc(
      "usage: skyforge plugins [<job.toml>] [--plugin-path DIR]...\n\n"
      "Lists installed plugins from their plugin.toml files, without loading any code. With a\n"
      "manifest, also searches its job.plugin_path first, as `skyforge run` would.\n\noptions");
  std::vector<std::string> extra;
  std::string manifest;
  desc.add_options()("plugin-path,p", po::value(&extra)->composing(), "also search DIR (first)")(
      "manifest", po::value(&manifest), "a job manifest whose plugin_path to search too");
  po::positional_options_description pos;
  pos.add("manifest", 1);
  auto p = parse("plugins", argc, argv, desc, &pos);
  if (p.help) {
    std::cout << desc;
    return 0;
  }
  if (!manifest.empty()) {
    try {
      const Manifest m = load_manifest(manifest);
      extra.insert(extra.end(), m.job.plugin_path.begin(), m.job.plugin_path.end());
    } catch (const ManifestError& e) {
      print_problems(e);
      return kExitUsage;
    }
  }
  Catalog c(Catalog::default_search_dirs(extra));
  std::cout << std::left << std::setw(16) << "KIND" << std::setw(16) << "NAME" << std::setw(10) << "VERSION"
            << std::setw(6) << "ABI" << "PATH\n";
  for (const auto& pl : c.plugins())
    std::cout << std::setw(16) << pl.kind << std::setw(16) << pl.name << std::setw(10) << pl.version << std::setw(6)
              << (std::to_string(pl.abi_major) + "." + std::to_string(pl.abi_minor)) << pl.library << "\n";
  std::cout << "\nsearched:";
  for (const auto& d : c.search_dirs()) std::cout << " " << d;
  std::cout << "\n";
  for (const auto& problem : c.problems()) std::cerr << "warning: " << problem << "\n";
  return 0;
}

// `skyforge backend-check ARGS`: the conformance suite is a program of its own, built on the SDK
// (backends/check) and installed beside this one; it runs with ARGS and argv[0]
// "skyforge backend-check", which its messages and usage name.
int cmd_backend_check(int argc, char** argv) {
  const std::string tool = self_exe_dir() + "/skyforge-backend-check";
  std::vector<char*> args{const_cast<char*>("skyforge backend-check")};
  args.insert(args.end(), argv + 1, argv + argc);
  args.push_back(nullptr);
  ::execv(tool.c_str(), args.data());
  std::cerr << "skyforge backend-check: cannot run " << tool << " (" << std::strerror(errno)
            << "): skyforge-backend-check is installed beside skyforge (docs/compute-backends.md, \"Checking a backend\")\n";
  return kExitUsage;
}

// A provider plugin loaded on the client with no pool, for `sweep` and `offers`: its options
// from --option KEY=VALUE and, when a manifest whose [pool] names the same provider is given, from
// its [provider] table. Prints why not and returns kExitUsage when it cannot be had.
struct ClientProvider {
  std::unique_ptr<Services> services;
  std::unique_ptr<Loader> loader;
  std::unique_ptr<PluginInstance> instance;
  const sf_provider_hooks* hooks = nullptr;
};

int load_client_provider(const std::string& cmd, const std::string& provider, const std::string& manifest,
                         const std::vector<std::string>& kv, std::vector<std::string> plugin_path, ClientProvider& out) {
  if (provider.empty()) {
    std::cerr << "skyforge " << cmd << ": missing --provider NAME\n";
    return kExitUsage;
  }
  OptionList options;
  if (!manifest.empty()) {
    try {
      const Manifest m = load_manifest(manifest);
      plugin_path.insert(plugin_path.end(), m.job.plugin_path.begin(), m.job.plugin_path.end());
      if (m.pool.provider == provider) options = m.pool.provider_options;
    } catch (const ManifestError& e) {
      print_problems(e);
      return kExitUsage;
    }
  }
  for (const auto& item : kv) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::cerr << "skyforge " << cmd << ": --option " << item << ": expected KEY=VALUE\n";
      return kExitUsage;
    }
    options.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  Catalog catalog(Catalog::default_search_dirs(plugin_path));
  const PluginInfo* info = catalog.find(provider);
  if (!info || info->kind != "provider") {
    std::cerr << "skyforge " << cmd << ": no provider plugin named '" << provider << "' (see skyforge plugins)\n";
    return kExitUsage;
  }
  for (const auto& [key, value] : options) {
    if (!info->option(key)) {
      std::cerr << "skyforge " << cmd << ": provider '" << provider << "' has no option '" << key << "'\n";
      return kExitUsage;
    }
  }
  out.services = std::make_unique<Services>([](int32_t level, const std::string& message) {
    if (level >= SF_LOG_INFO) std::cerr << message << "\n";
  });
  out.loader = std::make_unique<Loader>(out.services->table());
  try {
    out.instance = out.loader->create(out.loader->load(info->library, info->name), options);
  } catch (const std::exception& e) {
    std::cerr << "skyforge " << cmd << ": " << e.what() << "\n";
    return kExitUsage;
  }
  out.hooks = out.instance->hooks<sf_provider_hooks>();
  return kExitOk;
}

// What sets `sweep` and `offers` apart; provider_hook_command does the rest: the command line
// (--provider, the command's own options, --option, --plugin-path, a manifest), the provider
// plugin loaded (load_client_provider), its hook called and what it wrote printed (before the
// error too, when the hook fails: what a sweep tore down before it failed).
struct ProviderHookCommand {
  const char* name;         // the command
  const char* usage;        // --help's text above the options
  const char* option_help;  // --option's
  std::function<void(po::options_description_easy_init&)> own_options;  // listed after --provider
  const char* lacks_hook;   // said after "provider 'NAME' " when the plugin has not the hook
  // Calls the hook, writing to `out` (a failure throws PluginError); false when it has not got it.
  std::function<bool(const sf_provider_hooks& hooks, PluginInstance& plugin, sf_sink out)> call;
  int failed_exit;          // the exit status when the hook fails
  const char* nothing = nullptr;  // said before the provider's name when the hook wrote nothing
};

int provider_hook_command(const ProviderHookCommand& c, int argc, char** argv) {
  po::options_description desc(c.usage);
  std::string provider, manifest;
  std::vector<std::string> kv, plugin_path;
  auto add = desc.add_options();
  add("provider", po::value(&provider), "the provider plugin (\"aws\")");
  c.own_options(add);
  add("option,o", po::value(&kv)->composing(), c.option_help)(
      "plugin-path,p", po::value(&plugin_path)->composing(), "a directory searched for plugins first (repeatable)")(
      "manifest", po::value(&manifest), "a job manifest whose [provider] options to use");
  po::positional_options_description pos;
  pos.add("manifest", 1);
  if (parse(c.name, argc, argv, desc, &pos).help) {
    std::cout << desc;
    return 0;
  }
  ClientProvider p;
  if (int rc = load_client_provider(c.name, provider, manifest, kv, plugin_path, p); rc != kExitOk) return rc;
  std::string text;
  try {
    if (!p.hooks || !c.call(*p.hooks, *p.instance, text_sink(text))) {
      std::cerr << "skyforge " << c.name << ": provider '" << provider << "' " << c.lacks_hook << "\n";
      return kExitUsage;
    }
  } catch (const PluginError& e) {
    std::cout << text;
    std::cerr << "skyforge " << c.name << ": " << e.what() << "\n";
    return c.failed_exit;
  }
  std::cout << text;
  if (text.empty() && c.nothing) std::cout << c.nothing << provider << "\n";
  return kExitOk;
}

// `skyforge sweep`: the provider's reconcile hook (ABI 1.6) finds, by its own marks, what it left
// behind for pools that are gone (a host killed before its teardown, a lost network) and tears it
// down. The aws provider: instances whose skyforge:expires tag has passed.
int cmd_sweep(int argc, char** argv) {
  bool dry_run = false;
  return provider_hook_command(
      {"sweep",
       "usage: skyforge sweep --provider NAME [options] [<job.toml>]\n\n"
       "Finds what the provider NAME left behind for pools that are gone -- by its own marks, e.g. the\n"
       "aws provider's instances whose skyforge:expires tag has passed -- and tears it down (with\n"
       "--dry-run, only lists it). The provider's options come from --option KEY=VALUE and, when a\n"
       "manifest whose [pool] names the same provider is given, from its [provider] table. Exits 0\n"
       "when nothing is left, 1 when something could not be torn down, 2 on bad input.\n\noptions",
       "KEY=VALUE: an option of the provider (repeatable)",
       [&](po::options_description_easy_init& add) {
         add("dry-run,n", po::bool_switch(&dry_run), "list, tear nothing down");
       },
       "cannot find what it left behind (it has no reconcile hook, ABI 1.6)",
       [&](const sf_provider_hooks& h, PluginInstance& plugin, sf_sink out) {
         if (!h.reconcile) return false;
         plugin.check(h.reconcile(plugin.self(), dry_run ? 0 : 1, out), "reconcile");
         return true;
       },
       kExitJobFailed, "nothing left behind by "},
      argc, argv);
}

// `skyforge offers`: the machine types a provider can make that fit an accelerator, cheapest
// first (the provider's offers hook, ABI 1.6; the aws provider reads the data file it ships).
int cmd_offers(int argc, char** argv) {
  std::string accelerator;
  return provider_hook_command(
      {"offers",
       "usage: skyforge offers --provider NAME [--accelerator SPEC] [options] [<job.toml>]\n\n"
       "Lists the machine types the provider NAME can make that fit SPEC (a [pool] accelerator, e.g.\n"
       "\"A100:1\", \"H100:8\"; all when absent), cheapest first, with on-demand and spot prices where the\n"
       "provider has them. A [pool] accelerator without an instance type picks the first line.\n\noptions",
       "KEY=VALUE: an option of the provider (region=..., spot=true)",
       [&](po::options_description_easy_init& add) {
         add("accelerator,a", po::value(&accelerator), "NAME[:COUNT] per machine");
       },
       "lists no offers (it has no offers hook, ABI 1.6)",
       [&](const sf_provider_hooks& h, PluginInstance& plugin, sf_sink out) {
         if (!h.offers) return false;
         plugin.check(h.offers(plugin.self(), accelerator.c_str(), out), "offers");
         return true;
       },
       kExitUsage},
      argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  // A plugin that crashes is named on stderr: "skyforge: plugin 'foo' (libfoo.so) crashed in
  // create() with SIGSEGV (signal 11)"; the process still dies of the signal.
  install_crash_reporter("skyforge");
  if (argc < 2) {
    std::cerr << kMainHelp;
    return kExitUsage;
  }
  std::string cmd = argv[1];
  try {
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      std::cout << kMainHelp;
      return 0;
    }
    if (cmd == "--version") {
      std::cout << "skyforge " << SKYFORGE_VERSION << " (plugin ABI " << SKYFORGE_ABI_MAJOR << "." << SKYFORGE_ABI_MINOR
                << ")\n";
      return 0;
    }
    if (cmd == "run") return cmd_run(argc - 1, argv + 1);
    if (cmd == "validate") return cmd_validate(argc - 1, argv + 1);
    if (cmd == "plugins") return cmd_plugins(argc - 1, argv + 1);
    if (cmd == "env") return cmd_env(argc - 1, argv + 1);
    if (cmd == "backend-check") return cmd_backend_check(argc - 1, argv + 1);
    if (cmd == "sweep") return cmd_sweep(argc - 1, argv + 1);
    if (cmd == "offers") return cmd_offers(argc - 1, argv + 1);
    if (cmd == "tls-identity") return cmd_tls_identity(argc - 1, argv + 1);
    std::cerr << "skyforge: unknown command '" << cmd << "'\n\n" << kMainHelp;
    return kExitUsage;
  } catch (const po::error& e) {
    std::cerr << "skyforge " << cmd << ": " << e.what() << " (see skyforge " << cmd << " --help)\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "skyforge: " << e.what() << "\n";
    return kExitJobFailed;
  }
}
