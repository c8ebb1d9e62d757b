#include "self_exe.hpp"

#include <filesystem>
#include <system_error>

namespace skyforge {

std::string self_exe_dir() {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return exe.parent_path().string();
}

}  // namespace skyforge
