// Where this executable lives: the catalogue looks for the installed plugins next to it
// (catalog.hpp), and `skyforge run` starts the skyforge-worker installed beside it.
#pragma once

#include <string>

namespace skyforge {

// The directory of /proc/self/exe; "" when it cannot be read.
std::string self_exe_dir();

}  // namespace skyforge
