// The environments the framework plugins produce, for their tests: as_map(vars) turns an
// environment list (torch_env, jax_env, hf_env, mig_env) into a map, failing the test when a
// variable is set twice; expect_vars(env, {{name, value}, ...}) checks variables of such a map
// (a variable that is not set reads as "").
// Included by path ("../support/env_map.hpp"), so a suite needs no include directory for it.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace skyforge::test {

inline std::map<std::string, std::string> as_map(const std::vector<std::pair<std::string, std::string>>& vars) {
  std::map<std::string, std::string> m;
  for (const auto& [k, v] : vars) EXPECT_TRUE(m.emplace(k, v).second) << "set twice: " << k;
  return m;
}

// Each (name, value) of `expected` is in `env` (an absent name counts as ""); a failure names it.
inline void expect_vars(const std::map<std::string, std::string>& env,
                        const std::vector<std::pair<std::string, std::string>>& expected) {
  for (const auto& [name, value] : expected) {
    const auto it = env.find(name);
    EXPECT_EQ(it == env.end() ? std::string() : it->second, value) << name;
  }
}

}  // namespace skyforge::test
