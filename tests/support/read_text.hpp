// read_text(path): the whole of a file, for every suite ("" when it cannot be read).
// Included by path ("../support/read_text.hpp"), so a suite needs no include directory for it.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace skyforge::test {

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace skyforge::test
