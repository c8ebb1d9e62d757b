// The fixture of every test that runs the real `skyforge` binary: each test gets its own root
// directory (manifests, outputs) with a TMPDIR inside it, and fails when a run leaves anything
// behind there: a process under the root, a file in the TMPDIR.
#pragma once

#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "../support/contains.hpp"
#include "process.hpp"

namespace skyforge::test {

class SkyforgeRunTest : public ::testing::Test {
 protected:
  // `name`: the root's name, /tmp/<name>-XXXXXX.
  explicit SkyforgeRunTest(std::string name) : name_(std::move(name)) {}

  void SetUp() override {
    std::string tmpl = "/tmp/" + name_ + "-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    tmp_ = root_ / "tmp";
    fs::create_directories(tmp_);
  }
  void TearDown() override {
    if (root_.empty()) return;  // skipped before SetUp made it
    for (pid_t p : wait_no_processes_under(root_, 10)) {
      ADD_FAILURE() << "process left behind: " << p << " (" << comm_of(p) << ")";
      ::kill(p, SIGKILL);
    }
    EXPECT_TRUE(entries_of(tmp_).empty()) << "the run left files in its TMPDIR: " << entries_of(tmp_)[0];
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  fs::path write(const std::string& name, const std::string& text) {
    fs::path p = root_ / name;
    std::ofstream(p) << text;
    return p;
  }
  // The environment `skyforge` runs in, beside this process's: TMPDIR and what a test puts in
  // extra_env_.
  std::map<std::string, std::string> env() const {
    std::map<std::string, std::string> e = extra_env_;
    e["TMPDIR"] = tmp_.string();
    return e;
  }
  // `skyforge <args>` under this test's TMPDIR: started, or run to the end.
  std::unique_ptr<Child> start_skyforge(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {SKYFORGE_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<Child>(argv, env());
  }
  Output skyforge(const std::vector<std::string>& args, double timeout_s) const {
    return start_skyforge(args)->wait(timeout_s);
  }

  fs::path root_, tmp_;
  std::map<std::string, std::string> extra_env_;

 private:
  std::string name_;
};

}  // namespace skyforge::test
