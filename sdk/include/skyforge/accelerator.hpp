// The manifest's `[pool] accelerator` spec, as the host's manifest check, providers and
// framework plugins read it (docs/manifest.md). Header-only; pure.
//
//   ""                      no accelerator
//   "A100"                  one A100 per node
//   "H100:8"                eight per node
//   "A100(mig=3g.40gb)"     one A100, used through its MIG devices of profile 3g.40gb
//   "A100:2(mig=1g.10gb)"   (the count may also follow the parenthesis: "A100(mig=1g.10gb):2")
#pragma once

#include <charconv>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace skyforge {

struct AcceleratorSpec {
  std::string name;         // "A100"; empty: none
  uint32_t count = 0;       // per node; 1 when a name is given without a count
  std::string mig_profile;  // "3g.40gb"; empty: whole GPUs
};

// parse_accelerator(spec): throws std::invalid_argument on a malformed spec (bad count, unknown
// key in parentheses), with a message that quotes the spec.
namespace accelerator_detail {
inline std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

inline uint32_t parse_count(std::string_view text, std::string_view spec) {
  text = trim(text);
  uint32_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || n == 0)
    throw std::invalid_argument("accelerator '" + std::string(spec) + "': count '" + std::string(text) +
                                "' is not a positive integer");
  return n;
}
}  // namespace accelerator_detail

inline AcceleratorSpec parse_accelerator(std::string_view spec) {
  using accelerator_detail::parse_count;
  using accelerator_detail::trim;
  AcceleratorSpec a;
  std::string_view s = trim(spec);
  if (s.empty()) return a;
  std::string_view params;
  if (auto open = s.find('('); open != std::string_view::npos) {
    auto close = s.find(')', open);
    if (close == std::string_view::npos)
      throw std::invalid_argument("accelerator '" + std::string(spec) + "': missing ')'");
    params = s.substr(open + 1, close - open - 1);
    std::string_view after = trim(s.substr(close + 1));
    std::string_view before = s.substr(0, open);
    if (!after.empty()) {
      if (after.front() != ':' || before.find(':') != std::string_view::npos)
        throw std::invalid_argument("accelerator '" + std::string(spec) + "': unexpected '" + std::string(after) + "'");
      a.count = parse_count(after.substr(1), spec);
    }
    s = before;
  }
  if (auto colon = s.find(':'); colon != std::string_view::npos) {
    a.count = parse_count(s.substr(colon + 1), spec);
    s = s.substr(0, colon);
  }
  a.name = std::string(trim(s));
  if (a.name.empty()) throw std::invalid_argument("accelerator '" + std::string(spec) + "': no accelerator name");
  if (a.count == 0) a.count = 1;
  while (!params.empty()) {
    auto comma = params.find(',');
    std::string_view item = trim(params.substr(0, comma));
    params = comma == std::string_view::npos ? std::string_view() : params.substr(comma + 1);
    if (item.empty()) continue;
    auto eq = item.find('=');
    std::string_view key = trim(item.substr(0, eq));
    std::string_view value = eq == std::string_view::npos ? std::string_view() : trim(item.substr(eq + 1));
    if (key == "mig") {
      if (value.empty())
        throw std::invalid_argument("accelerator '" + std::string(spec) + "': mig= needs a profile, e.g. mig=3g.40gb");
      a.mig_profile = std::string(value);
    } else {
      throw std::invalid_argument("accelerator '" + std::string(spec) + "': unknown parameter '" + std::string(key) +
                                  "' (known: mig)");
    }
  }
  return a;
}

}  // namespace skyforge
