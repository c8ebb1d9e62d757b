// The job's mode, shared by the manifest, the control plane and the worker.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace skyforge {

// What a job runs on the pool ([job] mode, docs/manifest.md): the app (or command) once on
// every node, once on the head only, or a map of tasks over every slot.
enum class JobMode : uint8_t { broadcast = 0, single = 1, map = 2 };

inline const char* mode_name(JobMode m) {
  switch (m) {
    case JobMode::single: return "single";
    case JobMode::map: return "map";
    default: return "broadcast";
  }
}

inline std::optional<JobMode> parse_mode(std::string_view s) {
  for (JobMode m : {JobMode::broadcast, JobMode::single, JobMode::map})
    if (s == mode_name(m)) return m;
  return std::nullopt;
}

}  // namespace skyforge
