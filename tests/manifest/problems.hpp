// What a manifest or plugin.toml is refused with, for the manifest suite's files: the problems
// of the ManifestError thrown, the test failing when none is.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "manifest.hpp"

namespace skyforge::test {

// The problems `f` is refused with; when f() throws no ManifestError the test fails, saying
// `accepted`.
inline std::vector<std::string> problems_refusing(const std::function<void()>& f, const std::string& accepted) {
  try {
    f();
  } catch (const ManifestError& e) {
    return e.problems();
  }
  ADD_FAILURE() << accepted;
  return {};
}

// The problems a manifest text is refused with (fails the test when it is accepted).
inline std::vector<std::string> problems_of(const std::string& text, const std::string& name = "job.toml") {
  return problems_refusing([&] { parse_manifest(text, name); }, "manifest was accepted:\n" + text);
}

}  // namespace skyforge::test
