// What a node sends back when its job ends (docs/manifest.md, "Getting files back"): the files
// of its output directory (SKYFORGE_OUTPUT_DIR) and those of its working directory that
// [job] outputs' globs match — regular files only, never through a symlink, up to the node's
// cap — streamed in chunks over its control connection (msg::OutputsBegin, OutputChunk,
// OutputsEnd).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "messages.hpp"
#include "output_pump.hpp"

namespace skyforge {

// Whether `path` (relative, '/'-separated) matches `glob`: within a part, '*', '?' and '[...]'
// as the shell has them (fnmatch), a leading '.' matched only by a '.'; a part "**" matches any
// number of parts, hidden ones excepted. With `prefix`: whether something under the directory
// `path` may match (to skip a directory no glob can reach).
bool glob_matches(std::string_view glob, std::string_view path, bool prefix = false);

struct OutputFile {
  std::string base;  // the directory it is found under on this node
  std::string name;  // its path under `base`, and under node-<N>/ on the client
  uint64_t size = 0;
};

struct OutputsPlan {
  std::vector<OutputFile> files;
  uint64_t bytes = 0;    // of `files`
  msg::OutputsEnd left;  // what is not sent, and why
};

// A node sends at most this many files; the rest are left behind, counted.
constexpr size_t kMaxOutputFiles = 100000;

// The files to send, in order: `output_dir`'s (named by their path under it), then each file
// under `work_dir` that a glob matches (named by its path under work_dir; a directory matched
// takes every file under it), each name once, the work directory's .skyforge/ never. A file that
// would take the node past `cap` bytes is left behind, as is anything but a regular file (a
// symlink, a socket, a device) and a name the client would refuse.
OutputsPlan plan_outputs(const std::string& output_dir, const std::string& work_dir,
                         const std::vector<std::string>& globs, uint64_t cap);

// Sends `plan`: OutputsBegin, each file's chunks, OutputsEnd, through `send`, at most
// msg::kOutputsWindow bytes ahead of the client's acknowledgements (`window`). A file opened
// through a symlink, or no longer a regular file, is not sent; one that cannot be read to its
// end is ended with its error; both are said in OutputsEnd. Stops early when `gone()` (the
// connection closed).
void send_outputs(OutputsPlan plan, const std::function<void(msg::Type, std::string)>& send, OutputWindow& window,
                  const std::function<bool()>& gone);

}  // namespace skyforge
