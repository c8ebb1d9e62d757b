#include "ec2_pool.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "spawn.hpp"

namespace skyforge::aws {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

Error invalid(const std::string& what) { return Error("aws provider: " + what, SF_ERR_INVALID); }

// The integer option `key` (default `def`), refused outside [lo, hi]: "expected LO to HI<unit>".
int64_t int_option(const Options& o, const std::string& key, int64_t def, int64_t lo, int64_t hi, const char* unit = "") {
  const int64_t v = o.get_int(key, def);
  if (v < lo || v > hi)
    throw invalid("option '" + key + "': expected " + std::to_string(lo) + " to " + std::to_string(hi) + unit);
  return v;
}

std::string base64(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()), int(in.size()));
  out.resize(size_t(n));
  return out;
}

std::string iso8601(std::chrono::system_clock::time_point t) { return utc_text(t, "%Y-%m-%dT%H:%M:%SZ"); }

std::string whoami() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const char* user = std::getenv("USER");
  return std::string(user && *user ? user : "uid" + std::to_string(::getuid())) + "@" + host;
}

std::string seconds_text(Clock::duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(d).count()) + " s";
}

bool gone_state(const std::string& s) { return s == "shutting-down" || s == "terminated"; }

}  // namespace

// Teardown's calls outlast an API that is down: transient failures (no answer, 5xx, throttling)
// are retried, a few seconds apart, until teardown_timeout; other errors are thrown at once.
pugi::xml_document Ec2Pool::persist(const std::string& action, const QueryParams& params) {
  const auto start = Clock::now();
  for (int i = 0;; ++i) {
    try {
      return ec2_->call(action, params);
    } catch (const ApiError& e) {
      const bool transient =
          e.code != "ResponseTooLarge" && (e.http_status == 0 || e.http_status >= 500 || retryable_code(e.code));
      if (!transient || Clock::now() - start > opt_.teardown_timeout) throw;
      if (i == 0) log_("aws: " + action + " failed (" + (e.code.empty() ? e.aws_message : e.code) +
                       "); retrying until it answers (teardown_timeout " +
                       std::to_string(opt_.teardown_timeout.count()) + " s)");
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
  }
}

pugi::xml_document Ec2Pool::persist_until(const std::string& action, const QueryParams& params,
                                          Clock::time_point started, Clock::time_point give_up) {
  for (int attempt = 1;; ++attempt) {
    try {
      // One HTTP request a try: the client's own retries would outlast the budget.
      return ec2_->call(action, params, 1);
    } catch (const ApiError& e) {
      const bool transient =
          e.code != "ResponseTooLarge" && (e.http_status == 0 || e.http_status >= 500 || retryable_code(e.code));
      if (!transient) throw;
      const auto now = Clock::now();
      const auto wait = std::min<Clock::duration>(std::chrono::milliseconds(500 << std::min(attempt - 1, 4)),
                                                  give_up > now ? give_up - now : Clock::duration::zero());
      if (now >= give_up) {
        throw Error("aws provider: sweep gave up: " + action + " at " + ec2_->aws().endpoint + " (" +
                        ec2_->aws().region + ") failed " + std::to_string(attempt) + " time" +
                        (attempt == 1 ? "" : "s") + " (the sweep ran " + seconds_text(now - started) + ", sweep_timeout " +
                        std::to_string(opt_.sweep_timeout.count()) + " s); the last time: " + e.what() +
                        ". What the sweep had not reached is left; run it again when the API answers",
                    SF_ERR);
      }
      log_("aws: sweep: " + action + " failed (" + (e.code.empty() ? e.aws_message : e.code) + "); try " +
           std::to_string(attempt + 1) + " in " +
           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(wait).count()) +
           " ms (sweep_timeout " + std::to_string(opt_.sweep_timeout.count()) + " s)");
      std::this_thread::sleep_for(wait);
    }
  }
}

bool is_pool_id(const std::string& id) {
  return id.size() == kPoolIdLength &&
         std::all_of(id.begin(), id.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string shown_tag(const std::string& value) {
  std::string out = "\"";
  for (size_t i = 0; i < value.size(); ++i) {
    if (i == 80) {
      out += "...";
      break;
    }
    const unsigned char c = static_cast<unsigned char>(value[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

fs::path pool_state_dir(const fs::path& state_root, const std::string& pool_id) {
  return state_root / ("skyforge-aws-" + pool_id);
}

namespace {

std::string user_of(uid_t uid) {
  passwd pw{}, *found = nullptr;
  char buf[1024];
  std::string out = "uid " + std::to_string(uid);
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found) out += " (" + std::string(pw.pw_name) + ")";
  return out;
}

std::string mode_of(mode_t m) {
  char s[8];
  std::snprintf(s, sizeof s, "%04o", unsigned(m & 07777));
  return s;
}

}  // namespace

std::vector<fs::path> state_roots(const std::function<std::string(const std::string&)>& env) {
  std::vector<fs::path> roots;
  auto absolute = [&](const char* name) {
    const std::string v = env(name);
    return !v.empty() && v[0] == '/' ? fs::path(v) : fs::path();
  };
  if (fs::path rt = absolute("XDG_RUNTIME_DIR"); !rt.empty()) roots.push_back(rt);
  if (fs::path st = absolute("XDG_STATE_HOME"); !st.empty())
    roots.push_back(st / "skyforge");
  else if (fs::path home = absolute("HOME"); !home.empty())
    roots.push_back(home / ".local" / "state" / "skyforge");
  if (roots.empty())
    throw Error("aws provider: no place for a pool's local state (its private key): none of XDG_RUNTIME_DIR, "
                "XDG_STATE_HOME, HOME is set to an absolute path (/tmp is never used: another local user could "
                "make the pool's directory there first)",
                SF_ERR_INVALID);
  return roots;
}

fs::path make_state_root(const std::function<std::string(const std::string&)>& env) {
  const auto roots = state_roots(env);
  const std::string rt = env("XDG_RUNTIME_DIR");
  if (!rt.empty() && roots.front() == fs::path(rt)) return roots.front();  // the user's own, 0700, by its spec
  std::error_code ec;
  fs::create_directories(roots.front().parent_path(), ec);
  if (ec)
    throw Error("aws provider: cannot make " + roots.front().parent_path().string() + " for the pools' local state: " +
                    ec.message(),
                SF_ERR);
  make_private_dir(roots.front());
  return roots.front();
}

void make_private_dir(const fs::path& dir) {
  auto refuse = [&](const std::string& what) {
    return Error("aws provider: the local state directory " + dir.string() + " " + what +
                     ": refused, nothing in it or where it leads touched (expected a real directory owned by this "
                     "user, " + user_of(::geteuid()) + ", mode 0700, as skyforge makes it; another local user may "
                     "have made it first; if it is yours, remove it)",
                 SF_ERR);
  };
  if (dir.empty() || !dir.is_absolute()) throw Error("aws provider: local state directory \"" + dir.string() + "\": expected an absolute path", SF_ERR_INVALID);
  // The parent first: where others may rename or replace entries, no check below would hold.
  const fs::path parent = dir.parent_path();
  struct stat pst{};
  if (::stat(parent.c_str(), &pst) != 0)
    throw Error("aws provider: the local state root " + parent.string() + ": " + std::strerror(errno), SF_ERR);
  if ((pst.st_mode & (S_IWGRP | S_IWOTH)) && !(pst.st_mode & S_ISVTX))
    throw Error("aws provider: the local state root " + parent.string() + " (owner " + user_of(pst.st_uid) +
                    ", mode " + mode_of(pst.st_mode) + ") is writable by other users and not sticky: refused "
                    "(expected a directory only its owner can write to, or a sticky one like /tmp)",
                SF_ERR);
  const bool made = ::mkdir(dir.c_str(), 0700) == 0;
  if (!made && errno != EEXIST)
    throw Error("aws provider: cannot make the local state directory " + dir.string() + ": " + std::strerror(errno), SF_ERR);
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0)
    throw Error("aws provider: the local state directory " + dir.string() + ": " + std::strerror(errno), SF_ERR);
  if (S_ISLNK(st.st_mode)) {
    std::error_code ec;
    const fs::path to = fs::read_symlink(dir, ec);
    throw refuse("is a symlink (to " + (ec ? std::string("?") : to.string()) + ", owner " + user_of(st.st_uid) + ")");
  }
  if (!S_ISDIR(st.st_mode)) throw refuse("is not a directory (owner " + user_of(st.st_uid) + ")");
  if (st.st_uid != ::geteuid())
    throw refuse("is owned by " + user_of(st.st_uid) + ", not by this user (mode " + mode_of(st.st_mode) + ")");
  if (made) {
    // Ours, just made: 0700 exactly, whatever the umask took away (through the directory itself,
    // never a name that could have been swapped since).
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat fst{};
    const bool same = fd >= 0 && ::fstat(fd, &fst) == 0 && fst.st_dev == st.st_dev && fst.st_ino == st.st_ino;
    const bool ok = same && ::fchmod(fd, 0700) == 0;
    if (fd >= 0) ::close(fd);
    if (!ok) throw refuse("changed while it was made");
  } else if ((st.st_mode & 07777) != 0700) {
    throw refuse("has mode " + mode_of(st.st_mode) + ", not 0700 (owner " + user_of(st.st_uid) + ")");
  }
}

std::string remove_pool_state(const fs::path& state_root, const std::string& pool_id, std::string* refused) {
  auto refuse = [&](const std::string& why) {
    if (refused) *refused = why;
    return std::string();
  };
  if (refused) refused->clear();
  if (!is_pool_id(pool_id))
    return refuse("the pool id " + shown_tag(pool_id) + " is not one skyforge makes (" +
                  std::to_string(kPoolIdLength) + " lowercase hex digits): no local state looked for");
  std::error_code ec;
  const fs::path dir = pool_state_dir(state_root, pool_id);
  const fs::file_status st = fs::symlink_status(dir, ec);
  if (ec || st.type() == fs::file_type::not_found) return "";
  if (fs::is_symlink(st)) {
    std::error_code ec2;
    const fs::path to = fs::read_symlink(dir, ec2);
    return refuse(dir.string() + " is a symlink (to " + (ec2 ? std::string("?") : to.string()) +
                  "), not the pool's directory: left alone, and what it leads to too");
  }
  if (!fs::is_directory(st)) return refuse(dir.string() + " is not a directory: left alone");
  const fs::path root = fs::canonical(state_root, ec);
  if (ec) return refuse("the state root " + state_root.string() + " cannot be resolved (" + ec.message() + ")");
  const fs::path real = fs::weakly_canonical(dir, ec);
  if (ec || real.parent_path() != root)
    return refuse(dir.string() + " resolves to " + (ec ? std::string("?") : real.string()) +
                  ", outside the state root " + root.string() + ": left alone");
  if (fs::remove_all(real, ec) == 0 || ec)
    return ec ? refuse(dir.string() + ": " + ec.message()) : std::string();
  return "local state " + dir.string() + ": removed";
}

bool is_login_name(const std::string& name) {
  if (name.empty() || name.size() > 32 || name[0] == '-' || name[0] == '.') return false;
  for (unsigned char c : name)
    if (!std::isalnum(c) && c != '_' && c != '.' && c != '-') return false;
  return true;
}

std::chrono::seconds parse_duration(const std::string& text) {
  if (text.empty()) throw std::invalid_argument("empty duration");
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    throw std::invalid_argument("expected a duration such as \"2h\", \"90m\" or \"3600\" (seconds), got \"" + text + "\"");
  }
  std::string unit = text.substr(used);
  long long mult = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : unit == "d" ? 86400 : 0;
  if (mult == 0 || v <= 0)
    throw std::invalid_argument("expected a positive duration such as \"2h\", \"90m\" or \"3600\" (seconds), got \"" +
                                text + "\"");
  return std::chrono::seconds(v * mult);
}

AwsOptions AwsOptions::from(const Options& o) {
  AwsOptions a;
  a.region = o.get("region", "");
  a.profile = o.get("profile", "");
  a.image = o.get("image", a.image);
  if (a.image.empty()) throw invalid("option 'image': expected an AMI id (\"ami-...\") or a named image");
  if (a.image.rfind("ami-", 0) != 0) {
    bool known = false;
    std::string names;
    for (const auto& n : named_images()) {
      known |= a.image == n.name;
      names += (names.empty() ? "" : ", ") + std::string(n.name);
    }
    if (!known) throw invalid("option 'image': \"" + a.image + "\" is neither an AMI id (\"ami-...\") nor one of: " + names);
  }
  if (std::string t = o.get("instance_type", ""); !t.empty()) a.instance_types.push_back(t);
  for (const auto& t : o.get_list("fallback_instance_types")) a.instance_types.push_back(t);
  a.spot = o.get_bool("spot", false);
  a.max_price = o.get("max_price", "");
  if (!a.max_price.empty()) {
    char* end = nullptr;
    double p = std::strtod(a.max_price.c_str(), &end);
    if (*end != '\0' || p <= 0) throw invalid("option 'max_price': expected a price in USD per hour (\"0.45\"), got \"" + a.max_price + "\"");
    if (!a.spot) throw invalid("option 'max_price' applies to spot instances only: add spot = true");
  }
  if (std::string s = o.get("subnet", ""); !s.empty()) a.subnets.push_back(s);
  for (const auto& s : o.get_list("fallback_subnets")) a.subnets.push_back(s);
  a.security_group = o.get("security_group", "");
  a.key_name = o.get("key_name", "");
  a.identity_file = o.get("identity_file", "");
  if (!a.key_name.empty() && a.identity_file.empty())
    throw invalid("option 'key_name' needs 'identity_file' (the key pair's private key) to log in with");
  try {
    a.ttl = parse_duration(o.get("ttl", "1h"));
  } catch (const std::invalid_argument& e) {
    throw invalid(std::string("option 'ttl': ") + e.what());
  }
  if (a.ttl < std::chrono::minutes(1))
    throw invalid("option 'ttl': at least 1 minute (\"1m\"): a machine must boot and start its worker within it");
  for (const auto& kv : o.get_list("tags")) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw invalid("option 'tags': expected \"key=value\" entries, got \"" + kv + "\"");
    std::string key = kv.substr(0, eq);
    if (key.rfind("skyforge:", 0) == 0 || key.rfind("aws:", 0) == 0)
      throw invalid("option 'tags': the keys skyforge:* and aws:* are reserved, got \"" + key + "\"");
    a.tags.emplace_back(key, kv.substr(eq + 1));
  }
  a.use_private_ip = o.get_bool("use_private_ip", false);
  a.ssh_user = o.get("ssh_user", "");
  if (!a.ssh_user.empty() && !is_login_name(a.ssh_user))
    throw invalid("option 'ssh_user': expected a login name (letters, digits, '_', '.', '-'; at most 32, not "
                  "starting with '.' or '-'), got " + shown_tag(a.ssh_user));
  a.ssh_cidr = o.get("ssh_cidr", a.ssh_cidr);
  a.root_volume_gb = int(int_option(o, "root_volume_gb", 0, 0, 16384));
  a.provision_timeout = std::chrono::seconds(int_option(o, "provision_timeout", 600, 10, 86400, " seconds"));
  a.poll_interval = std::chrono::milliseconds(int_option(o, "poll_interval_ms", 2000, 10, 60000));
  a.teardown_timeout = std::chrono::seconds(int_option(o, "teardown_timeout", 900, 10, 86400, " seconds"));
  a.sweep_timeout = std::chrono::seconds(int_option(o, "sweep_timeout", 30, 1, 3600, " seconds"));
  return a;
}

const std::vector<NamedImage>& named_images() {
  // Publishers' accounts as AWS documents them; the newest matching image is used.
  static const std::vector<NamedImage> images = {
      {"ubuntu-24.04", "099720109477", "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*", "ubuntu"},
      {"ubuntu-22.04", "099720109477", "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*", "ubuntu"},
      {"debian-12", "136693071363", "debian-12-amd64-*", "admin"},
  };
  return images;
}

std::string newest_image(Ec2Client& ec2, const std::string& owner, const std::string& pattern) {
  auto doc = ec2.call("DescribeImages", {{"Owner.1", owner},
                                         {"Filter.1.Name", "name"},
                                         {"Filter.1.Value.1", pattern},
                                         {"Filter.2.Name", "architecture"},
                                         {"Filter.2.Value.1", "x86_64"},
                                         {"Filter.3.Name", "state"},
                                         {"Filter.3.Value.1", "available"}});
  std::string best, best_date;
  for (auto item : doc.select_nodes("//imagesSet/item")) {
    std::string date = item.node().child_value("creationDate");
    if (best.empty() || date > best_date) {
      best = item.node().child_value("imageId");
      best_date = date;
    }
  }
  if (best.empty())
    throw Error("aws provider: no available x86_64 image of owner " + owner + " named like \"" + pattern + "\" in " +
                    ec2.aws().region,
                SF_ERR_INVALID);
  return best;
}

std::vector<InstanceView> instances_of(const pugi::xml_document& doc) {
  std::vector<InstanceView> out;
  for (auto x : doc.select_nodes("//instancesSet/item[instanceId]")) {
    pugi::xml_node n = x.node();
    InstanceView v;
    v.id = n.child_value("instanceId");
    v.state = n.child("instanceState").child_value("name");
    v.private_ip = n.child_value("privateIpAddress");
    v.public_ip = n.child_value("ipAddress");
    v.zone = n.child("placement").child_value("availabilityZone");
    v.reason = n.child("stateReason").child_value("message");
    v.launch_index = n.child_value("amiLaunchIndex");
    for (auto tag : n.child("tagSet").children("item")) {
      std::string key = tag.child_value("key");
      if (key == "skyforge:pool") v.pool = tag.child_value("value");
      if (key == "skyforge:expires") v.expires = tag.child_value("value");
    }
    out.push_back(std::move(v));
  }
  return out;
}

std::string dead_man_user_data(std::chrono::seconds ttl, const std::string& user, const std::string& lease_file,
                               int check_every_s) {
  // Runs once, as root, at first boot (cloud-init). Powers the machine off -- terminated, by
  // InstanceInitiatedShutdownBehavior -- when the lease file has not been touched for ttl
  // seconds: the worker touches it while it holds the host's lease and ages it to the epoch
  // the moment it loses it, so a lost host costs at most one check interval more.
  //
  // The lease is the login user's alone (the workers run as it): its directory 0700 and the file
  // 0600, both owned by that user, so no other local user can keep a lost machine billing (touch)
  // or power it off mid-job (age it). The file is made, chowned and chmodded while the directory
  // is still root's 0700, and chown -h never follows a link: the user never gets a moment to plant
  // a symlink that root would then chown. The check trusts the lease only as a regular file (not
  // a symlink; lstat), owned by the user, neither group- nor world-writable, in a directory of the
  // same kind; a lease it cannot trust counts as stale (powered off): an untrusted lease must
  // never keep a machine alive, while powering off at worst ends a job the host sees as lost.
  std::ostringstream s;
  s << "#!/bin/sh\n"
       "# skyforge dead-man switch (docs/providers.md, \"aws: when the host dies\")\n"
       "umask 077\n"
       "nohup sh -c '\n"
       "  ttl=$1 user=$2 lease=$3 every=$4 dir=$(dirname \"$3\") start=$(date +%s)\n"
       "  off() { logger -t skyforge \"$1: powering off\" 2>/dev/null; exec poweroff; }\n"
       "  # The login user: cloud-init makes it before user scripts run; an image of its own may later.\n"
       "  until uid=$(id -u -- \"$user\" 2>/dev/null) && gid=$(id -g -- \"$user\" 2>/dev/null); do\n"
       "    [ $(($(date +%s) - start)) -gt \"$ttl\" ] && off \"no user $user after $ttl s\"\n"
       "    sleep \"$every\"\n"
       "  done\n"
       "  { [ -L \"$dir\" ] && rm -f -- \"$dir\"; mkdir -p -- \"$dir\" && chown -h 0:0 -- \"$dir\" && chmod 700 -- \"$dir\" &&\n"
       "    rm -rf -- \"$lease\" && : > \"$lease\" && chown -h \"$uid:$gid\" -- \"$lease\" && chmod 600 -- \"$lease\" &&\n"
       "    chown -h \"$uid:$gid\" -- \"$dir\"; } || off \"cannot make the lease $lease\"\n"
       "  # Trusted: of this type (lstat: a symlink is not), owned by the user, not group/world-writable.\n"
       "  ours() { want=$2; set -- $(stat -c \"%f %u\" -- \"$1\" 2>/dev/null) && [ \"$2\" = \"$uid\" ] &&\n"
       "           [ $((0x$1 & 0xF000)) -eq $((want)) ] && [ $((0x$1 & 0022)) -eq 0 ]; }\n"
       "  while sleep \"$every\"; do\n"
       "    ours \"$dir\" 0x4000 || off \"lease directory $dir is not a directory of $user, writable by it alone\"\n"
       "    ours \"$lease\" 0x8000 || off \"lease $lease is not a regular file of $user, writable by it alone\"\n"
       "    now=$(date +%s); last=$(stat -c %Y -- \"$lease\" 2>/dev/null || echo 0)\n"
       "    [ $((now - last)) -gt \"$ttl\" ] && off \"lease $lease untouched for more than $ttl s\"\n"
       "  done' skyforge-dead-man "
    << ttl.count() << ' ' << providers::shell_quote(user) << ' ' << providers::shell_quote(lease_file) << ' ' << check_every_s
    << " >/dev/null 2>&1 &\n";
  return s.str();
}

Ec2Pool::Ec2Pool(AwsOptions options, std::unique_ptr<Ec2Client> client, fs::path state_dir, Log log)
    : opt_(std::move(options)), ec2_(std::move(client)), state_dir_(std::move(state_dir)), log_(std::move(log)),
      owner_(whoami()) {
  if (!log_) log_ = [](const std::string&) {};
}

Ec2Pool::~Ec2Pool() {
  try {
    teardown({});
  } catch (...) {
  }
}

void Ec2Pool::cancel() { cancelled_ = true; }

void Ec2Pool::check_cancelled() const {
  if (cancelled_) throw Error("aws provider: provisioning cancelled", SF_ERR);
}

std::string Ec2Pool::identity_file() const {
  std::lock_guard<std::mutex> lock(mu_);
  return made_key_name_.empty() ? opt_.identity_file : (state_dir_ / "id_ed25519").string();
}

std::string Ec2Pool::ssh_user() const { return ssh_user_; }

std::string Ec2Pool::address_of(const InstanceView& i) const {
  return opt_.use_private_ip ? i.private_ip : i.public_ip;
}

std::vector<std::string> Ec2Pool::instance_ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  return instances_;
}

QueryParams Ec2Pool::tag_spec(int index, const std::string& resource_type, bool with_expiry) const {
  const std::string p = "TagSpecification." + std::to_string(index) + ".";
  QueryParams q = {{p + "ResourceType", resource_type}};
  std::vector<std::pair<std::string, std::string>> tags = {
      {"skyforge:pool", pool_id_}, {"skyforge:owner", owner_}, {"Name", "skyforge-" + pool_id_}};
  if (with_expiry) tags.emplace_back("skyforge:expires", iso8601(std::chrono::system_clock::now() + opt_.ttl));
  tags.insert(tags.end(), opt_.tags.begin(), opt_.tags.end());
  for (size_t i = 0; i < tags.size(); ++i) {
    q.emplace_back(p + "Tag." + std::to_string(i + 1) + ".Key", tags[i].first);
    q.emplace_back(p + "Tag." + std::to_string(i + 1) + ".Value", tags[i].second);
  }
  return q;
}

std::string Ec2Pool::resolve_image() {
  if (opt_.image.rfind("ami-", 0) == 0) {
    ssh_user_ = opt_.ssh_user.empty() ? "ubuntu" : opt_.ssh_user;
    return opt_.image;
  }
  for (const auto& n : named_images()) {
    if (opt_.image != n.name) continue;
    ssh_user_ = opt_.ssh_user.empty() ? n.ssh_user : opt_.ssh_user;
    std::string id = newest_image(*ec2_, n.owner, n.pattern);
    log_("aws: image " + opt_.image + " is " + id + " in " + ec2_->aws().region);
    return id;
  }
  throw invalid("option 'image': unknown named image \"" + opt_.image + "\"");
}

void Ec2Pool::make_key_pair() {
  if (!opt_.key_name.empty()) return;
  if (!state_dir_ours_) throw Error("aws provider: no local state directory for the pool's key pair", SF_ERR);
  const fs::path key = state_dir_ / "id_ed25519";
  std::error_code ec;
  fs::remove(key, ec);
  fs::remove(key.string() + ".pub", ec);
  auto r = providers::run_command({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "skyforge-" + pool_id_, "-f",
                                   key.string()},
                                  providers::CommandOptions{});
  if (r.status != 0) throw Error("aws provider: ssh-keygen failed: " + r.err, SF_ERR);
  std::ifstream in(key.string() + ".pub");
  std::string pub((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string name = "skyforge-" + pool_id_;
  QueryParams q = {{"KeyName", name}, {"PublicKeyMaterial", base64(pub)}};
  auto tags = tag_spec(1, "key-pair", true);
  q.insert(q.end(), tags.begin(), tags.end());
  {
    std::lock_guard<std::mutex> lock(mu_);
    made_key_name_ = name;  // before the call: a lost response still leaves it found by name
  }
  ec2_->call("ImportKeyPair", q);
  log_("aws: key pair " + name + " imported");
}

void Ec2Pool::make_security_group() {
  if (!opt_.security_group.empty()) return;
  if (!opt_.subnets.empty()) {
    auto doc = ec2_->call("DescribeSubnets", {{"SubnetId.1", opt_.subnets.front()}});
    vpc_id_ = doc.select_node("//subnetSet/item/vpcId").node().child_value();
  } else {
    auto doc = ec2_->call("DescribeVpcs", {{"Filter.1.Name", "is-default"}, {"Filter.1.Value.1", "true"}});
    vpc_id_ = doc.select_node("//vpcSet/item/vpcId").node().child_value();
    if (vpc_id_.empty())
      throw Error("aws provider: the region " + ec2_->aws().region +
                      " has no default VPC: name a subnet in [provider] subnet", SF_ERR_INVALID);
  }
  const std::string name = "skyforge-" + pool_id_;
  QueryParams q = {{"GroupName", name}, {"GroupDescription", "skyforge pool " + pool_id_ + " (deleted at teardown)"}};
  if (!vpc_id_.empty()) q.emplace_back("VpcId", vpc_id_);
  auto tags = tag_spec(1, "security-group", true);
  q.insert(q.end(), tags.begin(), tags.end());
  auto doc = ec2_->call("CreateSecurityGroup", q);
  std::string id = doc.select_node("//groupId").node().child_value();
  {
    std::lock_guard<std::mutex> lock(mu_);
    made_group_id_ = id;
  }
  // SSH from ssh_cidr; everything between the pool's members (collectives, the control plane).
  ec2_->call("AuthorizeSecurityGroupIngress",
             {{"GroupId", id},
              {"IpPermissions.1.IpProtocol", "tcp"},
              {"IpPermissions.1.FromPort", "22"},
              {"IpPermissions.1.ToPort", "22"},
              {"IpPermissions.1.IpRanges.1.CidrIp", opt_.ssh_cidr},
              {"IpPermissions.2.IpProtocol", "-1"},
              {"IpPermissions.2.Groups.1.GroupId", id}});
  log_("aws: security group " + id + " (" + name + ") made");
}

std::vector<InstanceView> Ec2Pool::describe_pool_instances(bool persistent) {
  QueryParams q = {{"Filter.1.Name", "tag:skyforge:pool"},
                                              {"Filter.1.Value.1", pool_id_},
                                              {"Filter.2.Name", "instance-state-name"},
                                              {"Filter.2.Value.1", "pending"},
                                              {"Filter.2.Value.2", "running"},
                                              {"Filter.2.Value.3", "stopping"},
                                              {"Filter.2.Value.4", "stopped"},
                                              {"Filter.2.Value.5", "shutting-down"}};
  return instances_of(persistent ? persist("DescribeInstances", q) : ec2_->call("DescribeInstances", q));
}

// One RunInstances per (instance type, subnet) until one has capacity. A response lost on the
// way (no answer, 5xx) may hide instances that exist: before sending again, look them up by the
// pool's tag -- the tags come with RunInstances itself -- and adopt them; the ClientToken makes a
// resend idempotent on AWS, the lookup makes it so on endpoints that ignore the token.
std::vector<InstanceView> Ec2Pool::run_instances(uint32_t n) {
  std::vector<std::string> types = opt_.instance_types;
  if (types.empty()) types.push_back("m6i.large");
  std::vector<std::string> subnets = opt_.subnets;
  if (subnets.empty()) subnets.push_back("");
  const std::string user_data = base64(dead_man_user_data(opt_.ttl, ssh_user_));
  std::string last_error;
  int attempt_no = 0;
  for (const auto& type : types) {
    for (const auto& subnet : subnets) {
      check_cancelled();
      ++attempt_no;
      QueryParams q = {{"ImageId", image_id_},
                       {"InstanceType", type},
                       {"MinCount", std::to_string(n)},
                       {"MaxCount", std::to_string(n)},
                       {"ClientToken", "skyforge-" + pool_id_ + "-" + (launches_ ? std::to_string(launches_) + "-" : "") +
                                           std::to_string(attempt_no)},
                       {"InstanceInitiatedShutdownBehavior", "terminate"},
                       {"UserData", user_data},
                       {"KeyName", opt_.key_name.empty() ? "skyforge-" + pool_id_ : opt_.key_name}};
      std::string group;
      {
        std::lock_guard<std::mutex> lock(mu_);
        group = opt_.security_group.empty() ? made_group_id_ : opt_.security_group;
      }
      if (!subnet.empty()) {
        // A subnet and a group: through a network interface, so a public address can be asked for.
        q.insert(q.end(), {{"NetworkInterface.1.DeviceIndex", "0"},
                           {"NetworkInterface.1.SubnetId", subnet},
                           {"NetworkInterface.1.SecurityGroupId.1", group},
                           {"NetworkInterface.1.AssociatePublicIpAddress", opt_.use_private_ip ? "false" : "true"}});
      } else {
        q.emplace_back("SecurityGroupId.1", group);
      }
      if (opt_.spot) {
        q.insert(q.end(), {{"InstanceMarketOptions.MarketType", "spot"},
                           {"InstanceMarketOptions.SpotOptions.SpotInstanceType", "one-time"},
                           {"InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior", "terminate"}});
        if (!opt_.max_price.empty()) q.emplace_back("InstanceMarketOptions.SpotOptions.MaxPrice", opt_.max_price);
      }
      if (opt_.root_volume_gb > 0) {
        q.insert(q.end(), {{"BlockDeviceMapping.1.DeviceName", "/dev/sda1"},
                           {"BlockDeviceMapping.1.Ebs.VolumeSize", std::to_string(opt_.root_volume_gb)},
                           {"BlockDeviceMapping.1.Ebs.DeleteOnTermination", "true"}});
      }
      auto t1 = tag_spec(1, "instance", true);
      auto t2 = tag_spec(2, "volume", false);
      q.insert(q.end(), t1.begin(), t1.end());
      q.insert(q.end(), t2.begin(), t2.end());

      const std::string where = type + (subnet.empty() ? "" : " in " + subnet);
      log_("aws: requesting " + std::to_string(n) + " x " + where + (opt_.spot ? " (spot)" : ""));
      const int tries = std::max(1, ec2_->options().max_attempts);
      for (int i = 1;; ++i) {
        check_cancelled();
        try {
          std::unique_lock<std::timed_mutex> in_flight(run_mu_);  // teardown waits for the answer
          {
            std::lock_guard<std::mutex> lock(mu_);
            run_sent_ = true;
          }
          auto doc = ec2_->call("RunInstances", q, 1);  // retried here, with the lookup in between
          auto made = instances_of(doc);
          std::lock_guard<std::mutex> lock(mu_);
          for (const auto& m : made) instances_.push_back(m.id);
          return made;
        } catch (const ApiError& e) {
          const bool lost = e.http_status == 0 || e.http_status >= 500 || retryable_code(e.code);
          if (!lost) {
            if (e.code == "InsufficientInstanceCapacity" || e.code == "InsufficientCapacity" ||
                e.code == "InsufficientFreeAddressesInSubnet" || e.code == "SpotMaxPriceTooLow" ||
                e.code == "Unsupported") {
              last_error = e.what();
              log_("aws: no capacity for " + where + " (" + e.code + "); trying the next subnet or type listed");
              break;  // next (type, subnet)
            }
            throw Error(e.what(), SF_ERR);
          }
          // The request may have made the instances: look before sending it again. Only
          // instances the pool does not hold yet and that are starting or up count: add() runs
          // beside the pool's live ones and after a lost one's termination.
          auto found = describe_pool_instances();
          {
            std::lock_guard<std::mutex> lock(mu_);
            std::erase_if(found, [&](const InstanceView& m) {
              return (m.state != "pending" && m.state != "running") ||
                     std::find(instances_.begin(), instances_.end(), m.id) != instances_.end();
            });
          }
          if (!found.empty()) {
            log_("aws: RunInstances answered " + (e.code.empty() ? std::string("nothing") : e.code) + ", but " +
                 std::to_string(found.size()) + " instance(s) of the pool exist: adopting them");
            std::lock_guard<std::mutex> lock(mu_);
            for (const auto& m : found) instances_.push_back(m.id);
            return found;
          }
          if (i >= tries) throw Error(e.what(), SF_ERR);
          log_("aws: RunInstances: " + std::string(e.code.empty() ? e.aws_message : e.code) + "; sending it again (" +
               std::to_string(i) + "/" + std::to_string(tries - 1) + ")");
          std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(
              ec2_->options().backoff_base * (1 << std::min(i, 10)), ec2_->options().backoff_cap));
        }
      }
    }
  }
  throw Error("aws provider: no capacity for " + std::to_string(n) + " instance(s) in any subnet or type listed; last: " +
                  last_error,
              SF_ERR);
}

std::vector<InstanceView> Ec2Pool::wait_running(const std::vector<std::string>& ids, uint32_t first_node) {
  const auto start = Clock::now();
  std::map<std::string, std::string> shown;  // id -> last state shown
  for (;;) {
    check_cancelled();
    QueryParams q;
    for (size_t i = 0; i < ids.size(); ++i) q.emplace_back("InstanceId." + std::to_string(i + 1), ids[i]);
    std::vector<InstanceView> now;
    try {
      now = instances_of(ec2_->call("DescribeInstances", q));
    } catch (const ApiError& e) {
      // Just made: AWS's read side may not know them yet (eventual consistency).
      if (e.code != "InvalidInstanceID.NotFound") throw Error(e.what(), SF_ERR);
    }
    std::map<std::string, InstanceView> by_id;
    for (auto& v : now) by_id[v.id] = v;
    bool all = by_id.size() == ids.size();
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = by_id.find(ids[i]);
      if (it == by_id.end()) continue;
      const InstanceView& v = it->second;
      if (shown[v.id] != v.state) {
        shown[v.id] = v.state;
        log_("aws: node " + std::to_string(first_node + i) + " " + v.id + ": " + v.state + " (" + seconds_text(Clock::now() - start) +
             ")");
      }
      if (gone_state(v.state) || v.state == "stopped" || v.state == "stopping")
        throw Error("aws provider: node " + std::to_string(first_node + i) + " (" + v.id + ") is " + v.state +
                        " before it ever ran" + (v.reason.empty() ? "" : ": " + v.reason),
                    SF_ERR);
      if (v.state != "running" || address_of(v).empty()) all = false;
    }
    if (status_) {
      std::string line = "aws [" + seconds_text(Clock::now() - start) + "]:";
      for (size_t i = 0; i < ids.size(); ++i) {
        auto it = by_id.find(ids[i]);
        line += (i ? ", node " : " node ") + std::to_string(first_node + i) + " " + (it == by_id.end() ? "requested" : it->second.state);
      }
      status_(line);
    }
    check_cancelled();  // a teardown while that answer was on its way
    if (all) {
      std::vector<InstanceView> ordered;
      for (const auto& id : ids) ordered.push_back(by_id[id]);
      return ordered;
    }
    if (Clock::now() - start > opt_.provision_timeout)
      throw Error("aws provider: the instances were not all running with " +
                      std::string(opt_.use_private_ip ? "a private" : "a public") + " address within " +
                      std::to_string(opt_.provision_timeout.count()) + " s (provision_timeout)",
                  SF_ERR);
    std::this_thread::sleep_for(opt_.poll_interval);
  }
}

std::vector<InstanceView> Ec2Pool::create(const std::string& pool_id, uint32_t n) {
  // sweep() trusts no other skyforge:pool tag: a pool made under another id could never be swept.
  if (!is_pool_id(pool_id))
    throw invalid("pool id " + shown_tag(pool_id) + ": expected " + std::to_string(kPoolIdLength) +
                  " lowercase hex digits, as skyforge makes them");
  pool_id_ = pool_id;
  // The pool's own directory (its private key, known_hosts) before anything is made in the cloud.
  if (!state_dir_.empty()) {
    make_private_dir(state_dir_);
    state_dir_ours_ = true;
  }
  image_id_ = resolve_image();
  check_cancelled();
  make_key_pair();
  check_cancelled();
  make_security_group();
  check_cancelled();
  auto made = run_instances(n);
  // RunInstances lists them in launch order; keep node i = launch index i.
  std::sort(made.begin(), made.end(), [](const InstanceView& a, const InstanceView& b) {
    return std::atoi(a.launch_index.c_str()) < std::atoi(b.launch_index.c_str());
  });
  std::vector<std::string> ids;
  for (const auto& m : made) ids.push_back(m.id);
  ++launches_;
  return wait_running(ids);
}

std::vector<InstanceView> Ec2Pool::add(uint32_t n, uint32_t first_node) {
  if (image_id_.empty()) throw Error("aws provider: add() before create()", SF_ERR_INVALID);
  auto made = run_instances(n);
  std::vector<std::string> ids;
  for (const auto& m : made) ids.push_back(m.id);
  ++launches_;
  return wait_running(ids, first_node);
}

void Ec2Pool::wait_terminated(const std::vector<std::string>& ids) {
  if (ids.empty()) return;
  const auto start = Clock::now();
  for (;;) {
    QueryParams q;
    for (size_t i = 0; i < ids.size(); ++i) q.emplace_back("InstanceId." + std::to_string(i + 1), ids[i]);
    auto now = instances_of(persist("DescribeInstances", q));
    bool all = std::all_of(now.begin(), now.end(), [](const InstanceView& v) { return v.state == "terminated"; });
    if (all) {
      log_("aws: " + std::to_string(ids.size()) + " instance(s) terminated (" + seconds_text(Clock::now() - start) + ")");
      return;
    }
    if (Clock::now() - start > opt_.teardown_timeout)
      throw Error("aws provider: instances still not terminated after " + std::to_string(opt_.teardown_timeout.count()) +
                      " s (teardown_timeout)", SF_ERR);
    std::this_thread::sleep_for(opt_.poll_interval);
  }
}

void Ec2Pool::teardown(const std::vector<std::string>& only) {
  std::lock_guard<std::mutex> one(teardown_mu_);
  if (only.empty()) cancelled_ = true;  // a create() still running stops at its next step
  if (only.empty()) {
    // A RunInstances in flight: wait for its answer (bounded by the request timeout), so the
    // instances it makes are in instances_ below.
    std::unique_lock<std::timed_mutex> in_flight(run_mu_, std::defer_lock);
    (void)in_flight.try_lock_for(ec2_->options().timeout + std::chrono::seconds(5));
  }
  std::vector<std::string> ids;
  bool sent;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ids = only.empty() ? instances_ : only;
    sent = run_sent_;
  }
  std::string errors;
  auto note = [&](const std::string& what) { errors += (errors.empty() ? "" : "; ") + what; };
  if (only.empty() && sent && !pool_id_.empty()) {
    // A RunInstances whose answer never came may have made instances: find them by tag.
    try {
      for (const auto& v : describe_pool_instances(true))
        if (std::find(ids.begin(), ids.end(), v.id) == ids.end()) ids.push_back(v.id);
    } catch (const std::exception& e) {
      note(e.what());
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  if (!ids.empty()) {
    QueryParams q;
    for (size_t i = 0; i < ids.size(); ++i) q.emplace_back("InstanceId." + std::to_string(i + 1), ids[i]);
    try {
      persist("TerminateInstances", q);
      wait_terminated(ids);
    } catch (const std::exception& e) {
      note(e.what());
    }
  }
  if (only.empty() && errors.empty()) {
    std::string group, key;
    {
      std::lock_guard<std::mutex> lock(mu_);
      group = made_group_id_;
      key = made_key_name_;
    }
    if (!group.empty()) {
      // A group still attached to an instance's interface is DependencyViolation for a while
      // after the instance is terminated.
      for (int i = 0;; ++i) {
        try {
          persist("DeleteSecurityGroup", {{"GroupId", group}});
          log_("aws: security group " + group + " deleted");
          break;
        } catch (const ApiError& e) {
          if (e.code == "InvalidGroup.NotFound") break;
          if (e.code != "DependencyViolation" || i >= 60) {
            note(e.what());
            break;
          }
          std::this_thread::sleep_for(std::chrono::seconds(2));
        }
      }
    }
    if (!key.empty()) {
      try {
        persist("DeleteKeyPair", {{"KeyName", key}});
        log_("aws: key pair " + key + " deleted");
      } catch (const std::exception& e) {
        note(e.what());
      }
    }
    std::error_code ec;
    if (state_dir_ours_) fs::remove_all(state_dir_, ec);
    std::lock_guard<std::mutex> lock(mu_);
    if (errors.empty()) {
      made_group_id_.clear();
      made_key_name_.clear();
      instances_.clear();
      run_sent_ = false;
    }
  } else if (errors.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& id : ids) instances_.erase(std::remove(instances_.begin(), instances_.end(), id), instances_.end());
  }
  if (!errors.empty())
    throw Error("aws provider: teardown incomplete (" + errors + "); `skyforge sweep --provider aws` finds what is left by "
                "its skyforge:pool tag",
                SF_ERR);
}

std::vector<std::string> Ec2Pool::sweep(bool terminate, std::chrono::system_clock::time_point now,
                                        std::set<std::string>* swept_pools, std::vector<std::string>* warnings) {
  const auto started = Clock::now(), give_up = started + opt_.sweep_timeout;
  auto call = [&](const std::string& action, const QueryParams& params) {
    return persist_until(action, params, started, give_up);
  };
  // A tag that is not a pool id skyforge makes: the resource is not one of skyforge's pools.
  auto foreign = [&](const std::string& what, const std::string& pool) {
    if (is_pool_id(pool)) return false;
    const std::string line = what + " (" + ec2_->aws().region + ") skipped: its skyforge:pool tag " + shown_tag(pool) +
                             " is not a pool id skyforge makes (" + std::to_string(kPoolIdLength) +
                             " lowercase hex digits); left alone, and no local state looked for";
    if (warnings) warnings->push_back(line);
    else log_("aws: sweep: " + line);
    return true;
  };
  const std::string cutoff = iso8601(now);
  const std::string region = ec2_->aws().region;
  std::vector<std::string> report;
  auto tag_of = [](pugi::xml_node item, const char* key) {
    for (auto t : item.child("tagSet").children("item"))
      if (std::string(t.child_value("key")) == key) return std::string(t.child_value("value"));
    return std::string();
  };
  auto expired = [&](const std::string& expires) { return !expires.empty() && expires < cutoff; };

  auto doc = call("DescribeInstances", {{"Filter.1.Name", "tag-key"},
                                           {"Filter.1.Value.1", "skyforge:pool"},
                                           {"Filter.2.Name", "instance-state-name"},
                                           {"Filter.2.Value.1", "pending"},
                                           {"Filter.2.Value.2", "running"},
                                           {"Filter.2.Value.3", "stopping"},
                                           {"Filter.2.Value.4", "stopped"}});
  std::vector<std::string> doomed;
  std::set<std::string> live_pools;
  for (const auto& v : instances_of(doc)) {
    if (foreign("instance " + v.id, v.pool)) continue;
    if (!expired(v.expires)) {
      live_pools.insert(v.pool);
      continue;
    }
    doomed.push_back(v.id);
    report.push_back(v.id + " (" + region + ", pool " + v.pool + ", " + v.state + ", expired " + v.expires + "): " +
                     (terminate ? "terminated" : "would be terminated"));
  }
  if (terminate && !doomed.empty()) {
    QueryParams q;
    for (size_t i = 0; i < doomed.size(); ++i) q.emplace_back("InstanceId." + std::to_string(i + 1), doomed[i]);
    call("TerminateInstances", q);
    wait_terminated(doomed);
  }
  // Groups and key pairs of expired pools with no live instance left.
  auto sweep_resources = [&](const char* describe, const char* xpath, const char* id_field, const char* kind,
                             const char* remove, const char* remove_param) {
    auto d = call(describe, {{"Filter.1.Name", "tag-key"}, {"Filter.1.Value.1", "skyforge:pool"}});
    for (auto it : d.select_nodes(xpath)) {
      pugi::xml_node item = it.node();
      const std::string pool = tag_of(item, "skyforge:pool"), expires = tag_of(item, "skyforge:expires");
      const std::string id = item.child_value(id_field);
      if (foreign(std::string(kind) + " " + id, pool)) continue;
      if (!expired(expires) || live_pools.count(pool)) continue;
      std::string what = terminate ? "deleted" : "would be deleted";
      if (terminate) {
        for (int i = 0;; ++i) {
          try {
            call(remove, {{remove_param, id}});
            if (swept_pools && std::string(kind) == "key pair") swept_pools->insert(pool);
            break;
          } catch (const ApiError& e) {
            if (e.code != "DependencyViolation" || i >= 30) {
              what = "not deleted: " + std::string(e.what());
              break;
            }
            std::this_thread::sleep_for(std::chrono::seconds(2));
          }
        }
      }
      report.push_back(std::string(kind) + " " + id + " (" + region + ", pool " + pool + ", expired " + expires +
                       "): " + what);
    }
  };
  sweep_resources("DescribeSecurityGroups", "//securityGroupInfo/item", "groupId", "security group",
                  "DeleteSecurityGroup", "GroupId");
  sweep_resources("DescribeKeyPairs", "//keySet/item", "keyName", "key pair", "DeleteKeyPair", "KeyName");
  return report;
}

}  // namespace skyforge::aws
