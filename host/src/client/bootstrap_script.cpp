#include "bootstrap_script.hpp"

#include <filesystem>

namespace skyforge {
namespace {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string bootstrap_script(const Image& image, const std::vector<std::string>& extra_lines) {
  std::string s = "# skyforge node bootstrap (generated)\nset -euo pipefail\n";
  if (!image.apt.empty()) {
    s += "missing=()\nfor p in";
    for (const auto& p : image.apt) s += " " + shell_quote(p);
    s += "; do\n  dpkg-query -W -f='${Status}' \"$p\" 2>/dev/null | grep -q 'install ok installed' || missing+=(\"$p\")\n"
         "done\n"
         "if [ ${#missing[@]} -gt 0 ]; then\n"
         "  if [ \"$(id -u)\" = 0 ]; then sudo=; elif sudo -n true 2>/dev/null; then sudo='sudo -n'; else\n"
         "    echo \"apt packages missing and no root to install them: ${missing[*]}\" >&2; exit 1; fi\n"
         "  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q \"${missing[@]}\"\n"
         "fi\n";
  }
  if (!image.pip.empty()) {
    s += "python3 -m pip install --quiet --disable-pip-version-check --target .skyforge/site";
    for (const auto& p : image.pip) s += " " + shell_quote(p);
    s += "\n";
  }
  if (!image.files.empty())  // from the staged copy where the provider staged the sources (abi.h, sf_pool_spec)
    s += "sf_copy() { if [ -n \"${SKYFORGE_STAGE_ROOT-}\" ]; then cp -RL --preserve=mode,timestamps "
         "\"$SKYFORGE_STAGE_ROOT$1\" \"$2\"; else cp -a \"$1\" \"$2\"; fi; }\n";
  for (const auto& f : image.files) {
    std::string dir = std::filesystem::path(f.target).parent_path().string();
    if (!dir.empty()) s += "mkdir -p " + shell_quote(dir) + "\n";
    s += "sf_copy " + shell_quote(f.source) + " " + shell_quote(f.target) + "\n";
  }
  for (const auto& l : extra_lines) s += l + "\n";
  return s;
}

}  // namespace skyforge
