// The backend-neutral engine state (docs/compute-backends.md, "Checkpoints move between
// backends"): what an engine's state_dict writes and load_state reads, the same bytes on every
// backend that uses it, so a checkpoint written on `cuda` resumes on `cpu` and the other way
// round. Header-only.
//
// Layout (little-endian):
//   char[8] "SFENGST1" | u32 version (1) | u32 reserved (0)
//   u64 n + architecture text      schema::architecture_text: layers and optimizer
//   u64 seed | u64 step             the run's seed (dropout masks) and the optimizer steps taken
//   u64 n + f32[n] parameters       the flat layout of initial_weights.hpp
//   u64 n + f32[n] optimizer slots  adam: m then v; sgd: the velocity when momentum > 0, else none
//   u32 k, then k times u64 n + f32[n]   per batch_normalization layer in order: moving mean,
//                                         then moving variance (k = 2 x such layers)
#pragma once

#include <skyforge/layer_schema.hpp>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace skyforge {

struct EngineState {
  std::string architecture;
  uint64_t seed = 0;
  uint64_t step = 0;
  std::vector<float> params;
  std::vector<float> slots;
  std::vector<std::vector<float>> moving;  // mean, variance, per batch_normalization layer
};

inline constexpr char kEngineStateMagic[8] = {'S', 'F', 'E', 'N', 'G', 'S', 'T', '1'};
inline constexpr uint32_t kEngineStateVersion = 1;

inline bool is_engine_state(std::string_view bytes) {
  return bytes.size() >= 8 && std::memcmp(bytes.data(), kEngineStateMagic, 8) == 0;
}

inline std::string write_engine_state(const EngineState& s) {
  std::string o;
  auto raw = [&](const void* p, size_t n) { o.append(static_cast<const char*>(p), n); };
  auto u32 = [&](uint32_t v) { raw(&v, 4); };
  auto u64 = [&](uint64_t v) { raw(&v, 8); };
  auto floats = [&](const std::vector<float>& v) {
    u64(v.size());
    raw(v.data(), v.size() * sizeof(float));
  };
  raw(kEngineStateMagic, 8);
  u32(kEngineStateVersion);
  u32(0);
  u64(s.architecture.size());
  raw(s.architecture.data(), s.architecture.size());
  u64(s.seed);
  u64(s.step);
  floats(s.params);
  floats(s.slots);
  u32(static_cast<uint32_t>(s.moving.size()));
  for (const auto& m : s.moving) floats(m);
  return o;
}

namespace engine_state_detail {
// "item 3: saved conv2d(...)..., this engine conv2d(...)..." for two architecture texts.
inline std::string first_difference(std::string_view saved, std::string_view mine) {
  const auto d = schema::first_difference(saved, mine);
  return d ? "item " + std::to_string(d->index) + ": saved " + d->first + ", this engine " + d->second : "";
}
}  // namespace engine_state_detail

// Reads `bytes` for an engine whose own state has the shape of `like` (its architecture and the
// sizes of its parameters, slots and moving statistics): anything else — another format or
// version, another model or optimizer, damaged or truncated data — throws std::invalid_argument
// saying what differs, so a failed load changes nothing.
inline EngineState read_engine_state(std::string_view b, const EngineState& like) {
  size_t pos = 0;
  auto fail = [](const std::string& m) { throw std::invalid_argument("engine state: " + m); };
  auto raw = [&](void* p, size_t n, const char* what) {
    if (b.size() - pos < n) fail(std::string("truncated at ") + what);
    std::memcpy(p, b.data() + pos, n);
    pos += n;
  };
  auto u32 = [&](const char* what) {
    uint32_t v;
    raw(&v, 4, what);
    return v;
  };
  auto u64 = [&](const char* what) {
    uint64_t v;
    raw(&v, 8, what);
    return v;
  };
  auto floats = [&](size_t n, const char* what) {
    const uint64_t m = u64(what);
    if (m != n) fail(std::string(what) + ": " + std::to_string(m) + " values saved, this engine has " + std::to_string(n));
    std::vector<float> v(n);
    raw(v.data(), n * sizeof(float), what);
    return v;
  };
  char magic[8];
  raw(magic, 8, "magic");
  if (std::memcmp(magic, kEngineStateMagic, 8) != 0) fail("not an engine state (bad magic)");
  const uint32_t version = u32("version");
  if (version != kEngineStateVersion)
    fail("version " + std::to_string(version) + " is not supported (this SDK reads version " +
         std::to_string(kEngineStateVersion) + ")");
  u32("reserved");
  const uint64_t alen = u64("architecture");
  if (alen > b.size() - pos) fail("truncated at architecture");
  EngineState s;
  s.architecture.assign(b.substr(pos, alen));
  pos += alen;
  if (s.architecture != like.architecture)
    fail("saved from a different model or optimizer (" +
         engine_state_detail::first_difference(s.architecture, like.architecture) + ")");
  s.seed = u64("seed");
  s.step = u64("step");
  s.params = floats(like.params.size(), "parameters");
  s.slots = floats(like.slots.size(), "optimizer slots");
  const uint32_t k = u32("moving statistics");
  if (k != like.moving.size())
    fail(std::to_string(k) + " moving statistics saved, this engine has " + std::to_string(like.moving.size()));
  for (const auto& m : like.moving) s.moving.push_back(floats(m.size(), "moving statistics"));
  if (pos != b.size()) fail(std::to_string(b.size() - pos) + " unexpected trailing bytes");
  return s;
}

}  // namespace skyforge
