// The manifest's keys of a job's files (docs/manifest.md, "Getting files back"): [job] outputs,
// outputs_dir and outputs_max_bytes, read into the JobSpec with every problem at its line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "manifest.hpp"
#include "toml_reader.hpp"

namespace skyforge {

// "1073741824", "500 MiB", "2GB", "1.5 GiB": bytes (B, KB/MB/GB/TB in powers of 1000, KiB/MiB/GiB/TiB
// in powers of 1024); nullopt for anything else.
std::optional<uint64_t> parse_byte_size(std::string_view text);

// The outputs keys of the [job] table `t`; `dir` is the manifest's directory.
void read_outputs(toml_in::Reader& r, const toml_in::Value& t, const std::string& dir, JobSpec& job);

}  // namespace skyforge
