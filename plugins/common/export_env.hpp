// Writing a framework plugin's variables into the node's environment (header-only, over the
// SDK's Env), for every plugin that sets ranks (torch, huggingface, jax).
#pragma once

#include <skyforge/sdk.hpp>

#include <string>
#include <utility>
#include <vector>

#include "fanout.hpp"

namespace skyforge::fw {

// Sets every (key, value) of `vars`. SKYFORGE_FANOUT_ADD is added to what a plugin listed
// earlier put there instead of replacing it, so that every plugin's per-copy ranks are counted.
inline void export_environment(const Env& env, const std::vector<std::pair<std::string, std::string>>& vars) {
  for (auto [key, value] : vars) {
    if (key == kFanoutAdd) value = add_words(env.get(key).value_or(""), split_words(value));
    env.set(key, value);
  }
}

}  // namespace skyforge::fw
