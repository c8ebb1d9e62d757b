#include "env.hpp"
#include "lent.hpp"

#include <cstdlib>
#include <cstring>

namespace skyforge {

EnvMap EnvMap::from_environ(char** envp) {
  EnvMap m;
  for (char** e = envp; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (!eq) continue;
    m.vars_[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
  }
  return m;
}

const char* EnvMap::get(const std::string& key) const {
  auto it = vars_.find(key);
  return it == vars_.end() ? nullptr : it->second.c_str();
}

std::vector<std::string> EnvMap::entries() const {
  std::vector<std::string> out;
  out.reserve(vars_.size());
  for (const auto& [k, v] : vars_) out.push_back(k + "=" + v);
  return out;
}

sf_env EnvMap::c_view() {
  sf_env e{};
  e.ctx = this;
  e.set = [](void* ctx, const char* k, const char* v) {
    lent([&] {
      if (k && *k) static_cast<EnvMap*>(ctx)->set(k, v ? v : "");
    });
  };
  e.get = [](void* ctx, const char* k) -> const char* {
    return lent<const char*>(nullptr, [&] { return static_cast<EnvMap*>(ctx)->get(k ? k : ""); });
  };
  return e;
}

void EnvMap::apply_to_process() const {
  for (const auto& [k, v] : vars_) ::setenv(k.c_str(), v.c_str(), 1);
}

}  // namespace skyforge
