// `skyforge backend-check` (docs/compute-backends.md, "Checking a backend"), run for real: the
// cpu backend and the cuda engine's host build pass it; a backend with one deliberate defect
// fails exactly the check that covers it; a backend that cannot run here is refused with exit 2,
// and so is the command of a `skyforge` that has no skyforge-backend-check beside it.
#include <gtest/gtest.h>

#include <skyforge/layer_schema.hpp>
#include <skyforge/optimizer_schema.hpp>

#include <unistd.h>

#include <filesystem>
#include <regex>

#include "process.hpp"

using skyforge::test::Child;
using skyforge::test::Output;

namespace {

Output check(std::vector<std::string> args) {
  args.insert(args.begin(), {SKYFORGE_BIN, "backend-check"});
  return Child(args, {}).wait(120);
}
Output check_fixture(std::vector<std::string> args) {
  args.insert(args.begin(), {"--plugin-path", FIXTURES});
  return check(std::move(args));
}
int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}
// The lines of the harnesses' checks (a layer type's, the graph blocks') that begin with `verdict`.
int harness_lines(const std::string& text, const std::string& verdict) {
  return count(text, verdict + "  layer ") + count(text, verdict + "  model ");
}
// The suite's harnesses (backends/check/models.cpp): 29 around the 21 layer types, 2 graph blocks.
constexpr int kHarnesses = 31;
constexpr const char* kBlocks[] = {"residual block", "transformer block"};

}  // namespace

TEST(BackendCheck, CpuPassesEveryCheckAndEveryLayerOfTheSchemaIsChecked) {
  Output o = check({"cpu"});
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  // Every harness passes every part: gradients, 1 rank vs 2 (but batch_normalization's, whose
  // replicas keep their own statistics), state.
  for (const auto& def : skyforge::schema::catalogue())
    EXPECT_NE(o.out.find("PASS  layer " + std::string(def.type) + ": "), std::string::npos) << def.type << "\n" << o.out;
  for (const char* block : kBlocks)
    EXPECT_NE(o.out.find("PASS  model " + std::string(block) + ": "), std::string::npos) << block << "\n" << o.out;
  EXPECT_EQ(harness_lines(o.out, "PASS"), kHarnesses) << o.out;
  EXPECT_EQ(count(o.out, "; 1 rank vs 2: replicas bit-identical, 2 ranks follow 1 rank"), kHarnesses - 1) << o.out;
  EXPECT_EQ(count(o.out, "; state: resumes bit for bit"), kHarnesses) << o.out;
  EXPECT_NE(o.out.find("PASS  layer dropout: 40 of 53 parameters' gradients agree with finite differences "
                       "(max error "),
            std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("; dropout: the identity at inference, a mask in training; "), std::string::npos) << o.out;
  for (const auto& def : skyforge::schema::optimizers())  // every optimizer too, its state resuming bit for bit
    EXPECT_NE(o.out.find("PASS  optimizer " + std::string(def.name) + ": resumes bit for bit"), std::string::npos)
        << def.name << "\n" << o.out;
  for (const char* c : {"PASS  data parallel: replicas bit-identical", "PASS  state: mlp: resumes bit for bit",
                        "PASS  synchronized batch_normalization: states bit-identical across the replicas; 2 ranks "
                        "follow 1 rank",
                        "PASS  bad input: refused"})
    EXPECT_NE(o.out.find(c), std::string::npos) << c << "\n" << o.out;
  // The cpu engine keeps no bound data (abi.h, ABI 1.8): keras copies each batch; that check
  // does not apply, and says so.
  EXPECT_NE(o.out.find("SKIP  bound data: the backend keeps no bound data"), std::string::npos) << o.out;
  EXPECT_EQ(count(o.out, "FAIL"), 0) << o.out;
  EXPECT_NE(o.out.find(" passed, 1 skipped, 0 failed\n"), std::string::npos) << o.out;
}

TEST(BackendCheck, TheCudaEnginesHostBuildPassesAndAgreesWithCpu) {
  Output o = check_fixture({"cuda_host"});
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  // Every harness: the same initial weights as cpu, 10 steps within 1e-4, checkpoints both ways.
  for (const auto& def : skyforge::schema::catalogue())
    EXPECT_TRUE(std::regex_search(o.out, std::regex("PASS  layer " + std::string(def.type) +
                                                    ": [^\n]*; with cpu: same initial weights, loss \\S+, "
                                                    "weights \\S+, checkpoint resumes to cpu \\S+, from cpu \\S+\n")))
        << def.type << "\n" << o.out;
  EXPECT_EQ(harness_lines(o.out, "PASS"), kHarnesses) << o.out;
  EXPECT_EQ(count(o.out, "; with cpu: same initial weights"), kHarnesses) << o.out;
  EXPECT_TRUE(std::regex_search(o.out, std::regex("PASS  agrees with cpu: after 10 steps, mlp: same initial weights, "
                                                  "loss \\S+, weights \\S+; convnet: same initial weights, loss \\S+, "
                                                  "weights \\S+\n")))
      << o.out;
  EXPECT_NE(o.out.find("PASS  bound data: mlp: bit for bit the plain steps (4 steps, deferred and not); refused an "
                       "index past the set"),
            std::string::npos)
      << o.out;
  EXPECT_TRUE(std::regex_search(o.out, std::regex("PASS  checkpoint with cpu: mlp: resumes to cpu \\S+, from cpu \\S+; "
                                                  "convnet: resumes to cpu \\S+, from cpu \\S+\n")))
      << o.out;
  for (const auto& def : skyforge::schema::optimizers())  // each agrees with cpu's and its slots travel
    EXPECT_TRUE(std::regex_search(o.out, std::regex("PASS  optimizer " + std::string(def.name) +
                                                    ": resumes bit for bit[^\n]*; same initial weights, loss \\S+, "
                                                    "weights \\S+; resumes to cpu \\S+, from cpu \\S+\n")))
        << def.name << "\n" << o.out;
  EXPECT_EQ(count(o.out, "FAIL"), 0) << o.out;
}

TEST(BackendCheck, EachDefectFailsTheCheckThatCoversIt) {
  Output o = check_fixture({"defective", "--option", "defect=gradient"});
  EXPECT_EQ(o.exit_code, 1) << o.out << o.err;
  EXPECT_TRUE(std::regex_search(o.out, std::regex("FAIL  layer dense: parameter [0-9]+ of 53: the step applied gradient "
                                                  "\\S+, finite differences give \\S+\n")))
      << o.out;
  EXPECT_NE(o.out.find("FAIL  agrees with cpu: mlp: loss "), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("PASS  data parallel"), std::string::npos) << o.out;  // the defect is the same on every rank

  o = check_fixture({"defective", "-o", "defect=state"});
  EXPECT_EQ(o.exit_code, 1) << o.out << o.err;
  EXPECT_NE(o.out.find("FAIL  state: "), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("FAIL  checkpoint with cpu: mlp: the weights differ after a load from cpu"), std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("FAIL  optimizer rmsprop: a resumed engine's loss differs"), std::string::npos) << o.out;
  for (const auto& def : skyforge::schema::catalogue())  // every harness's state round trip
    EXPECT_NE(o.out.find("FAIL  layer " + std::string(def.type) + ": state: a resumed engine's loss differs\n"),
              std::string::npos)
        << def.type << "\n" << o.out;
  EXPECT_EQ(harness_lines(o.out, "FAIL"), kHarnesses) << o.out;
  EXPECT_EQ(count(o.out, "FAIL"), 2 + static_cast<int>(skyforge::schema::optimizers().size()) + kHarnesses) << o.out;

  // Rank 1 throws while rank 0 waits for it in the engine's first broadcast: the suite reports
  // it instead of hanging (the ThreadGroup's collectives fail once a rank has left).
  o = check_fixture({"defective", "-o", "defect=rank"});
  EXPECT_EQ(o.exit_code, 1) << o.out << o.err;
  EXPECT_NE(o.out.find("FAIL  data parallel: rank 0: "), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("FAIL  synchronized batch_normalization: rank 0: "), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("FAIL  layer dense: 1 rank vs 2: rank 0: "), std::string::npos) << o.out;
  // Every harness's 2 ranks but batch_normalization's, which has no such part.
  EXPECT_EQ(harness_lines(o.out, "FAIL"), kHarnesses - 1) << o.out;
  EXPECT_NE(o.out.find("PASS  layer batch_normalization: "), std::string::npos) << o.out;
  EXPECT_EQ(count(o.out, "rank 1: keras: engine_create failed: defective: rank 1 makes no engine"), 2 + kHarnesses - 1)
      << o.out;
  EXPECT_EQ(count(o.out, "FAIL"), 2 + kHarnesses - 1) << o.out;

  o = check_fixture({"defective", "-o", "defect=unsynchronized"});
  EXPECT_EQ(o.exit_code, 1) << o.out << o.err;
  EXPECT_NE(o.out.find("FAIL  synchronized batch_normalization: the replicas' states differ"), std::string::npos)
      << o.out;
  // The residual block's batch_normalization is synchronized too: its 2 ranks drift from 1.
  EXPECT_NE(o.out.find("FAIL  model residual block: 1 rank vs 2: 2 ranks drift from 1 rank"), std::string::npos) << o.out;
  EXPECT_EQ(count(o.out, "FAIL"), 2) << o.out;

  o = check_fixture({"defective", "-o", "defect=labels"});
  EXPECT_EQ(o.exit_code, 1) << o.out << o.err;
  EXPECT_NE(o.out.find("FAIL  bad input: train_step accepted label 4 for 4 classes\n"), std::string::npos) << o.out;
  EXPECT_EQ(count(o.out, "FAIL"), 1) << o.out;
}

TEST(BackendCheck, ABackendThatIsMissingOrCannotRunHereExits2) {
  Output o = check({"no_such_backend"});
  EXPECT_EQ(o.exit_code, 2) << o.out << o.err;
  EXPECT_EQ(o.err, "skyforge backend-check: no compute backend named 'no_such_backend' (see `skyforge plugins`)\n");
#ifdef HAVE_CUDA_PLUGIN
  o = check({"cuda"});
  if (o.exit_code == 0) GTEST_SKIP() << "this machine has a usable CUDA device: the cuda backend passed\n" << o.out;
  EXPECT_EQ(o.exit_code, 2) << o.out << o.err;
  EXPECT_NE(o.err.find("skyforge backend-check: compute backend 'cuda' cannot run here: plugin 'cuda' probe: cuda: "),
            std::string::npos)
      << o.err;
#endif
}

// The suite is a program of its own (backends/check) that `skyforge backend-check` finds beside
// itself: a `skyforge` without it says so, and where it looked.
TEST(BackendCheck, ASkyforgeWithoutTheProgramBesideItSaysWhereItLooked) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("skyforge-bc-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(SKYFORGE_BIN, dir / "skyforge", fs::copy_options::overwrite_existing);
  Output o = Child({(dir / "skyforge").string(), "backend-check", "cpu"}, {}).wait(60);
  fs::remove_all(dir);
  EXPECT_EQ(o.exit_code, 2) << o.out << o.err;
  EXPECT_EQ(o.out, "");
  EXPECT_EQ(o.err, "skyforge backend-check: cannot run " + (dir / "skyforge-backend-check").string() +
                       " (No such file or directory): skyforge-backend-check is installed beside skyforge "
                       "(docs/compute-backends.md, \"Checking a backend\")\n");
}
