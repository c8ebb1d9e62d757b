// The fixture of the [train] suites: a SkyforgeRunTest skipped, saying so, where Debian's
// Fashion-MNIST (dataset-fashion-mnist) is missing.
#pragma once

#include <unistd.h>

#include <gtest/gtest.h>

#include "run_fixture.hpp"

namespace skyforge::test {

class FashionRunTest : public SkyforgeRunTest {
 protected:
  using SkyforgeRunTest::SkyforgeRunTest;
  void SetUp() override {
    const char* data = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
    if (::access(data, R_OK) != 0) GTEST_SKIP() << data << " is missing: apt-get install dataset-fashion-mnist";
    SkyforgeRunTest::SetUp();
  }
};

}  // namespace skyforge::test
