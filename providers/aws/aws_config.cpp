#include "aws_config.hpp"

#include <boost/property_tree/ini_parser.hpp>
#include <boost/property_tree/ptree.hpp>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>

namespace skyforge::aws {
namespace {

namespace pt = boost::property_tree;
namespace fs = std::filesystem;

// The file's sections, or nothing when it does not exist. A malformed file is an error naming
// its path and line (Boost.PropertyTree's INI parser says both).
std::optional<pt::ptree> read_ini(const std::string& path) {
  std::error_code ec;
  if (path.empty() || !fs::exists(path, ec)) return std::nullopt;
  pt::ptree tree;
  try {
    pt::read_ini(path, tree);
  } catch (const pt::ini_parser_error& e) {
    throw std::runtime_error("aws: cannot read " + e.filename() + " line " + std::to_string(e.line()) + ": " +
                             e.message() + " (expected INI: [section] lines and key = value lines)");
  }
  return tree;
}

std::string get(const pt::ptree& tree, const std::string& section, const std::string& key) {
  auto sec = tree.get_child_optional(pt::ptree::path_type(section, '\0'));
  if (!sec) return "";
  return sec->get<std::string>(pt::ptree::path_type(key, '\0'), "");
}

std::string home_file(const EnvLookup& env, const char* var, const char* relative) {
  std::string p = env(var);
  if (!p.empty()) return p;
  std::string home = env("HOME");
  return home.empty() ? "" : home + "/" + relative;
}

}  // namespace

EnvLookup process_env() {
  return [](const std::string& name) {
    const char* v = std::getenv(name.c_str());
    return std::string(v ? v : "");
  };
}

ResolvedAws resolve_aws(const EnvLookup& env, const std::string& profile_option, const std::string& region_option) {
  ResolvedAws out;
  out.profile = !profile_option.empty() ? profile_option : !env("AWS_PROFILE").empty() ? env("AWS_PROFILE") : "default";
  const std::string credentials_path = home_file(env, "AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
  const std::string config_path = home_file(env, "AWS_CONFIG_FILE", ".aws/config");
  const auto credentials_file = read_ini(credentials_path);
  const auto config_file = read_ini(config_path);
  const std::string config_section = out.profile == "default" ? "default" : "profile " + out.profile;
  auto from_config = [&](const std::string& key) { return config_file ? get(*config_file, config_section, key) : ""; };

  // Credentials: the first place that has an access key wins, as a whole (key, secret, token).
  Credentials& c = out.credentials;
  if (!env("AWS_ACCESS_KEY_ID").empty()) {
    c.access_key_id = env("AWS_ACCESS_KEY_ID");
    c.secret_access_key = env("AWS_SECRET_ACCESS_KEY");
    c.session_token = env("AWS_SESSION_TOKEN");
    c.source = "the environment (AWS_ACCESS_KEY_ID)";
    if (c.secret_access_key.empty())
      throw std::runtime_error("aws: AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not");
  } else if (credentials_file && !get(*credentials_file, out.profile, "aws_access_key_id").empty()) {
    c.access_key_id = get(*credentials_file, out.profile, "aws_access_key_id");
    c.secret_access_key = get(*credentials_file, out.profile, "aws_secret_access_key");
    c.session_token = get(*credentials_file, out.profile, "aws_session_token");
    c.source = "profile '" + out.profile + "' in " + credentials_path;
  } else if (!from_config("aws_access_key_id").empty()) {
    c.access_key_id = from_config("aws_access_key_id");
    c.secret_access_key = from_config("aws_secret_access_key");
    c.session_token = from_config("aws_session_token");
    c.source = "profile '" + out.profile + "' in " + config_path;
  } else {
    throw std::runtime_error("aws: no credentials for profile '" + out.profile +
                             "': looked at AWS_ACCESS_KEY_ID, " +
                             (credentials_path.empty() ? "no credentials file (no HOME)" : credentials_path) + " [" +
                             out.profile + "] and " + (config_path.empty() ? "no config file" : config_path) + " [" +
                             config_section + "] (set the variables, or run `aws configure`)");
  }
  if (c.secret_access_key.empty())
    throw std::runtime_error("aws: " + c.source + " has aws_access_key_id but no aws_secret_access_key");

  for (const std::string& r : {region_option, env("AWS_REGION"), env("AWS_DEFAULT_REGION"), from_config("region")}) {
    if (!r.empty()) {
      out.region = r;
      break;
    }
  }
  if (out.region.empty())
    throw std::runtime_error("aws: no region: set [provider] region, AWS_REGION or AWS_DEFAULT_REGION, or `region` in " +
                             config_path + " [" + config_section + "]");

  for (const std::string& e : {env("AWS_ENDPOINT_URL_EC2"), env("AWS_ENDPOINT_URL"), from_config("endpoint_url")}) {
    if (!e.empty()) {
      out.endpoint = e;
      break;
    }
  }
  if (out.endpoint.empty()) out.endpoint = "https://ec2." + out.region + ".amazonaws.com";
  while (!out.endpoint.empty() && out.endpoint.back() == '/') out.endpoint.pop_back();
  if (out.endpoint.rfind("http://", 0) != 0 && out.endpoint.rfind("https://", 0) != 0)
    throw std::runtime_error("aws: endpoint '" + out.endpoint + "' is not an http:// or https:// URL");
  return out;
}

}  // namespace skyforge::aws
