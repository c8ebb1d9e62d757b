// libFuzzer target for the manifest parser (docs/manifest.md): arbitrary bytes as a job.toml
// must parse or be refused with ManifestError (file:line:col and what was expected) — never a
// crash, a hang, a sanitizer report or any other exception. The pre-parse limits (1 MiB, lines
// of 4096 bytes, nesting of 64) are what keep toml11 linear and its recursion bounded here.
#include <cstddef>
#include <cstdint>
#include <string>

#include "manifest.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)skyforge::parse_manifest(text, "fuzz.toml");
  } catch (const skyforge::ManifestError&) {
  }
  return 0;
}
