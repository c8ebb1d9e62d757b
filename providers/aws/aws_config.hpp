// Where the aws provider's credentials, region and EC2 endpoint come from: the standard places,
// in the standard order (docs/providers.md, "aws: credentials"):
//
//   credentials  1. AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN)
//                2. the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, else
//                   ~/.aws/credentials), section [<profile>]
//                3. the config file (AWS_CONFIG_FILE, else ~/.aws/config), section
//                   [profile <profile>] ([default] for the default profile)
//                with <profile> = the `profile` option, else AWS_PROFILE, else "default".
//   region       the `region` option, else AWS_REGION, else AWS_DEFAULT_REGION, else the
//                profile's `region` in the config file.
//   endpoint     AWS_ENDPOINT_URL_EC2, else AWS_ENDPOINT_URL, else the profile's
//                `endpoint_url`, else https://ec2.<region>.amazonaws.com.
//
// No secret is ever part of an error message or a log line: `Credentials::source` says where
// the keys came from instead.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "sigv4.hpp"

namespace skyforge::aws {

// The environment, as a lookup (tests pass their own; the provider passes getenv).
using EnvLookup = std::function<std::string(const std::string&)>;
EnvLookup process_env();

struct ResolvedAws {
  Credentials credentials;
  std::string profile;
  std::string region;
  std::string endpoint;  // scheme://host[:port][/path], no trailing slash
};

// Throws std::runtime_error naming what is missing and every place that was looked at, or the
// file and line of a malformed credentials/config file.
ResolvedAws resolve_aws(const EnvLookup& env, const std::string& profile_option, const std::string& region_option);

}  // namespace skyforge::aws
