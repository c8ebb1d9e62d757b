// What the providers' configuration tests share: a plugin's options as the host hands them over
// (sf_kv pairs), and the message of the Error a call throws.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <skyforge/sdk.hpp>

namespace skyforge::test {

inline Options options(const std::map<std::string, std::string>& kv) {
  std::vector<sf_kv> v;
  for (const auto& [k, val] : kv) v.push_back({k.c_str(), val.c_str()});
  return Options(v.data(), v.size());
}

// What `f` threw as skyforge::Error; "" when it threw nothing.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace skyforge::test
