// An environment under construction: the worker's own, the image's, then what each framework
// plugin sets in around_app_enter. Exposed to plugins as an sf_env.
#pragma once

#include <skyforge/abi.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace skyforge {

class EnvMap {
 public:
  static EnvMap from_environ(char** envp);

  void set(const std::string& key, const std::string& value) { vars_[key] = value; }
  // Pointer stays valid until the key is set again.
  const char* get(const std::string& key) const;
  const std::map<std::string, std::string>& vars() const { return vars_; }
  std::vector<std::string> entries() const;  // "KEY=VALUE"
  sf_env c_view();
  void apply_to_process() const;  // setenv() every variable

 private:
  std::map<std::string, std::string> vars_;
};

}  // namespace skyforge
