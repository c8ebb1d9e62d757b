// contains(text, part): a gtest check that a message says what it must, for every suite;
// EXPECT_TRUE(contains(o.err, "node 1 lost")) shows the whole text and the part when it fails.
// Included by path ("../support/contains.hpp"), so a suite needs no include directory for it.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace skyforge::test {

inline ::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\"\ndoes not contain \"" << part << "\"";
}

}  // namespace skyforge::test
