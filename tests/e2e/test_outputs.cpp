// The job's files, piece by piece (docs/manifest.md, "Getting files back"): the names the host
// accepts, the globs, the sizes a manifest may write, which files a node offers, and a node's
// real sending into the host's real receiver, in one process, with hostile names and cut-short
// transfers. The end-to-end runs are in test_outputs_e2e.cpp.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "../support/contains.hpp"
#include "../support/read_text.hpp"
#include "bounded_archive.hpp"
#include "manifest.hpp"
#include "outputs_keys.hpp"
#include "outputs_receive.hpp"
#include "outputs_send.hpp"

namespace fs = std::filesystem;
using namespace skyforge;
using skyforge::test::contains;

namespace {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "skyforge-outputs-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path file(const std::string& rel, const std::string& text) const {
    fs::path p = path_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
  }

 private:
  fs::path path_;
};

std::set<std::string> files_under(const fs::path& dir) {
  std::set<std::string> out;
  for (auto& e : fs::recursive_directory_iterator(dir))
    if (!e.is_directory()) out.insert(fs::relative(e.path(), dir).string());
  return out;
}

std::set<std::string> names(const OutputsPlan& p) {
  std::set<std::string> out;
  for (const auto& f : p.files) out.insert(f.name);
  return out;
}

// A node's sending straight into a receiver: frames through their real encoding, the receiver's
// acknowledgements into the node's window.
struct Transfer {
  TempDir out;
  std::vector<std::string> said;
  OutputWindow window{msg::kOutputsWindow};
  OutputsReceiver receiver;
  explicit Transfer(uint64_t cap = uint64_t{1} << 30, uint32_t nodes = 1,
                    OutputsReceiver::Clock::duration progress_every = OutputsReceiver::kProgressEvery)
      : receiver(out.path().string(), cap, nodes, [this](const std::string& l) { said.push_back(l); }, progress_every) {}
  void frame(uint32_t node, msg::Type t, const std::string& payload) {
    receiver.on_frame(node, t, payload, [this](uint64_t total) { window.ack(total); });
  }
  template <class M>
  void send(uint32_t node, msg::Type t, const M& m) {
    frame(node, t, net::serialize(m));
  }
  void send_plan(OutputsPlan plan, uint32_t node = 0) {
    send_outputs(std::move(plan), [&](msg::Type t, std::string p) { frame(node, t, p); }, window, [] { return false; });
  }
  std::string all_said() const {
    std::string s;
    for (const auto& l : said) s += l + "\n";
    return s;
  }
};

TEST(OutputName, RelativePathsInsideTheirDirectoryOnly) {
  for (const char* ok : {"a.txt", "dir/sub/x.bin", "a b", "*.csv", "results/**", ".hidden", "a..b"})
    EXPECT_EQ(msg::output_name_problem(ok), nullptr) << ok;
  const std::string nul("a\0b", 3), long_part(256, 'x'), long_path = std::string(4000, 'a') + "/" + std::string(200, 'b');
  for (const std::string& bad : {std::string(), std::string("/etc/passwd"), std::string("../x"), std::string("a/../b"),
                                 std::string(".."), std::string("a//b"), std::string("a/"), std::string("./a"),
                                 std::string("x\ny"), std::string("x\x1b[2J"), std::string("del\x7f"), nul, long_part,
                                 long_path})
    EXPECT_NE(msg::output_name_problem(bad), nullptr) << bad;
  EXPECT_TRUE(contains(msg::output_name_problem("/abs"), "absolute"));
  EXPECT_TRUE(contains(msg::output_name_problem("a/../b"), ".."));
}

TEST(OutputGlob, PartsMatchAsTheShellsDoAndDoubleStarSpansDirectories) {
  EXPECT_TRUE(glob_matches("*.csv", "a.csv"));
  EXPECT_FALSE(glob_matches("*.csv", "d/a.csv")) << "'*' stays within a part";
  EXPECT_TRUE(glob_matches("**/*.csv", "a.csv"));
  EXPECT_TRUE(glob_matches("**/*.csv", "d/e/a.csv"));
  EXPECT_TRUE(glob_matches("results/**", "results/a/b.bin"));
  EXPECT_TRUE(glob_matches("run-?.[lt]og", "run-1.log"));
  EXPECT_FALSE(glob_matches("*", ".hidden")) << "a leading '.' is matched only by a '.'";
  EXPECT_FALSE(glob_matches("**/x", ".git/x")) << "'**' skips no hidden directory";
  EXPECT_TRUE(glob_matches(".*", ".hidden"));
  EXPECT_TRUE(glob_matches("logs/*.log", "logs", true)) << "something under logs/ may match";
  EXPECT_FALSE(glob_matches("logs/*.log", "other", true));
  EXPECT_TRUE(glob_matches("**/*.log", "any/depth", true));
}

TEST(OutputSizes, BytesOrAUnit) {
  EXPECT_EQ(parse_byte_size("1073741824"), uint64_t{1} << 30);
  EXPECT_EQ(parse_byte_size("500 MiB"), uint64_t{500} << 20);
  EXPECT_EQ(parse_byte_size("1.5 GiB"), uint64_t{3} << 29);
  EXPECT_EQ(parse_byte_size("2GB"), uint64_t{2000000000});
  EXPECT_EQ(parse_byte_size("0"), uint64_t{0});
  for (const char* bad : {"", "-1", "1.5", "10 XB", "MiB", "1e30 TiB", "nan"}) EXPECT_FALSE(parse_byte_size(bad)) << bad;
  EXPECT_EQ(byte_text(512), "512 B");
  EXPECT_EQ(byte_text(uint64_t{3} << 29), "1.5 GiB");
}

TEST(OutputManifest, TheJobKeysAndTheirRefusalsAtTheirLines) {
  Manifest m = parse_manifest("[job]\ncommand = [\"true\"]\noutputs = [\"*.csv\", \"logs/**\"]\noutputs_dir = \"out\"\n"
                              "outputs_max_bytes = \"2 MiB\"\n",
                              "/some/where/job.toml");
  EXPECT_EQ(m.job.outputs, (std::vector<std::string>{"*.csv", "logs/**"}));
  EXPECT_EQ(m.job.outputs_dir, "/some/where/out") << "relative to the manifest's directory";
  EXPECT_EQ(m.job.outputs_max_bytes, uint64_t{2} << 20);
  EXPECT_EQ(parse_manifest("[job]\ncommand = [\"true\"]\n", "j.toml").job.outputs_max_bytes, uint64_t{1} << 30)
      << "the default cap: 1 GiB";
  try {
    parse_manifest("[job]\ncommand = [\"true\"]\noutputs = [\"ok.txt\",\n  \"/etc/*\", \"../up/*\"]\n"
                   "outputs_max_bytes = \"lots\"\n",
                   "j.toml");
    FAIL() << "refused globs were taken";
  } catch (const ManifestError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(contains(what, "j.toml:4:3: [job] outputs[1]: \"/etc/*\" is absolute")) << what;
    EXPECT_TRUE(contains(what, "j.toml:4:13: [job] outputs[2]: \"../up/*\" has a '..' part")) << what;
    EXPECT_TRUE(contains(what, "j.toml:5:21: [job] outputs_max_bytes: expected a size in bytes")) << what;
  }
}

TEST(OutputPlan, RegularFilesOnlyNoSymlinkFollowedWithinTheCap) {
  TempDir work, elsewhere;
  const fs::path out = work.path() / ".skyforge/outputs";
  work.file(".skyforge/outputs/a.txt", "aaaa");
  work.file(".skyforge/outputs/sub/b.txt", "bb");
  work.file(".skyforge/outputs/big.bin", std::string(5000, 'x'));
  work.file(".skyforge/site/pkg.py", "not an output");
  work.file("logs/1.log", "one");
  work.file("logs/deep/2.log", "two");
  work.file("a.txt", "the output directory's a.txt goes, not this one");
  elsewhere.file("secret.log", "outside the work directory");
  fs::create_symlink("/etc/passwd", out / "passwd");
  fs::create_symlink(elsewhere.path(), work.path() / "linked");
  ASSERT_EQ(::mkfifo((out / "fifo").c_str(), 0600), 0);

  OutputsPlan p = plan_outputs(out.string(), work.path().string(), {"logs/**", "linked/*.log", "*.txt", "**/*.py"}, 4096);
  EXPECT_EQ(names(p), (std::set<std::string>{"a.txt", "sub/b.txt", "logs/1.log", "logs/deep/2.log"}));
  EXPECT_EQ(p.bytes, 4u + 2 + 3 + 3);
  std::set<std::string> left;
  for (const auto& l : p.left.left) left.insert(l.path + ":" + std::to_string(l.why));
  EXPECT_EQ(left, (std::set<std::string>{"big.bin:1", "passwd:2", "fifo:2"})) << "linked/ is a symlink: not entered";
  EXPECT_EQ(p.left.left_files, 3u);
  EXPECT_EQ(p.left.left_bytes, 5000u);
}

TEST(OutputTransfer, ANodesFilesArriveUnderTheirNamesWithPrivateModes) {
  TempDir work;
  work.file("o/r.txt", "result");
  work.file("o/d/e/f.bin", std::string(3 << 20, 'z'));  // chunks: 1 MiB at most each
  work.file("o/empty", "");
  Transfer t;
  t.send_plan(plan_outputs((work.path() / "o").string(), work.path().string(), {}, uint64_t{1} << 30));
  t.receiver.finish();
  const fs::path node0 = t.out.path() / "node-0";
  EXPECT_EQ(files_under(node0), (std::set<std::string>{"r.txt", "d/e/f.bin", "empty"}));
  EXPECT_EQ(test::read_text(node0 / "r.txt"), "result");
  EXPECT_EQ(fs::file_size(node0 / "d/e/f.bin"), size_t{3} << 20);
  struct stat st {};
  ASSERT_EQ(::stat((node0 / "r.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0002, 0u) << "never world-writable";
  ASSERT_EQ(::stat((node0 / "d").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0002, 0u);
  EXPECT_TRUE(contains(t.all_said(), "the job's files: 3 files (3.0 MiB) from 1 node in " + t.out.path().string()))
      << t.all_said();
}

TEST(OutputTransfer, ALongCopySaysHowFarItIsPerNode) {
  TempDir work;
  work.file("o/a.bin", std::string(3 << 20, 'a'));
  work.file("o/b.bin", std::string(1 << 20, 'b'));
  Transfer t(uint64_t{1} << 30, 2, std::chrono::milliseconds(0));  // every chunk counts as "a while"
  t.send_plan(plan_outputs((work.path() / "o").string(), work.path().string(), {}, uint64_t{1} << 30), 1);
  const std::string said = t.all_said();
  EXPECT_TRUE(contains(said, "node 1: receiving its files: 1.0 MiB of 4.0 MiB (0 of 2 files)")) << said;
  EXPECT_TRUE(contains(said, "node 1: receiving its files: 3.0 MiB of 4.0 MiB (1 of 2 files)")) << said;
  EXPECT_TRUE(contains(said, "node 1: receiving its files: 4.0 MiB of 4.0 MiB (2 of 2 files)")) << said;
  Transfer quiet;  // the default: a copy shorter than 5 s says nothing until the end
  quiet.send_plan(plan_outputs((work.path() / "o").string(), work.path().string(), {}, uint64_t{1} << 30));
  EXPECT_FALSE(contains(quiet.all_said(), "receiving")) << quiet.all_said();
}

TEST(OutputTransfer, HostileNamesAndAPlantedSymlinkNeverBecomeAPathOutside) {
  TempDir outside;
  Transfer t;
  fs::create_directories(t.out.path() / "node-0");
  fs::create_symlink(outside.path(), t.out.path() / "node-0" / "sub");
  t.send(0, msg::Type::OutputsBegin, msg::OutputsBegin{5, 10});
  for (const char* name : {"../escape.txt", "/tmp/abs.txt", "a/../../b.txt", "sub/through-link.txt", "ok.txt"})
    t.send(0, msg::Type::OutputChunk, msg::OutputChunk{name, "data", true, ""});
  t.send(0, msg::Type::OutputsEnd, msg::OutputsEnd{});
  t.receiver.finish();
  EXPECT_TRUE(fs::is_empty(outside.path())) << "nothing through node-0/sub, a symlink";
  EXPECT_FALSE(fs::exists(t.out.path() / "escape.txt"));
  EXPECT_EQ(files_under(t.out.path() / "node-0"), (std::set<std::string>{"ok.txt"}));
  const std::string said = t.all_said();
  EXPECT_TRUE(contains(said, "\"../escape.txt\" not written: its name has a '..' part")) << said;
  EXPECT_TRUE(contains(said, "\"/tmp/abs.txt\" not written: its name is absolute")) << said;
  EXPECT_TRUE(contains(said, "\"sub/through-link.txt\" not written")) << said;
}

TEST(OutputTransfer, TheHostHoldsTheCapAndACutShortFileNeverGetsItsName) {
  Transfer t(10, 2);
  t.send(0, msg::Type::OutputsBegin, msg::OutputsBegin{2, 12});
  t.send(0, msg::Type::OutputChunk, msg::OutputChunk{"small", "12345", true, ""});
  t.send(0, msg::Type::OutputChunk, msg::OutputChunk{"lies", "1234567", true, ""});  // 12 > the cap of 10
  t.send(0, msg::Type::OutputsEnd, msg::OutputsEnd{});
  t.send(1, msg::Type::OutputsBegin, msg::OutputsBegin{2, 8});
  t.send(1, msg::Type::OutputChunk, msg::OutputChunk{"whole", "abc", true, ""});
  t.send(1, msg::Type::OutputChunk, msg::OutputChunk{"half", "abc", false, ""});
  EXPECT_TRUE(t.receiver.busy(std::chrono::seconds(10))) << "node 1 is sending";
  t.receiver.on_closed(1);  // its worker killed mid-file
  EXPECT_FALSE(t.receiver.busy(std::chrono::seconds(10)));
  t.receiver.finish();
  EXPECT_EQ(files_under(t.out.path()), (std::set<std::string>{"node-0/small", "node-1/whole"}))
      << "no half file, under its name or a temporary one";
  const std::string said = t.all_said();
  EXPECT_TRUE(contains(said, "node 0: \"lies\" not written: it goes past [job] outputs_max_bytes = 10 B")) << said;
  EXPECT_TRUE(contains(said, "node 1: its files stopped coming during \"half\" (1 of 2 came): what it had not sent is lost"))
      << said;
}

TEST(OutputTransfer, WhatANodeLeftBehindIsSaidWithItsReason) {
  Transfer t(1000);
  msg::OutputsEnd end;
  end.left = {{"big.bin", 5000, msg::OutputLeft::over_cap}, {"link\x1b[2J", 0, msg::OutputLeft::not_regular}};
  end.left_files = 30;
  end.left_bytes = 9000;
  t.send(0, msg::Type::OutputsBegin, msg::OutputsBegin{});
  t.send(0, msg::Type::OutputsEnd, end);
  const std::string said = t.all_said();
  EXPECT_TRUE(contains(said, "node 0: left on the node: \"big.bin\" (4.9 KiB): over [job] outputs_max_bytes = 1000 B")) << said;
  EXPECT_TRUE(contains(said, "node 0: left on the node: \"link\\x1b[2J\": not a regular file")) << "escaped: " << said;
  EXPECT_TRUE(contains(said, "node 0: and 28 more files left on the node (8.8 KiB in all left behind)")) << said;
}

TEST(OutputTransfer, FramesOutOfOrderStopTheNodesFiles) {
  Transfer t;
  t.send(0, msg::Type::OutputChunk, msg::OutputChunk{"early", "x", true, ""});
  t.send(0, msg::Type::OutputsBegin, msg::OutputsBegin{1, 1});
  t.receiver.finish();
  EXPECT_FALSE(fs::exists(t.out.path() / "node-0"));
  EXPECT_TRUE(contains(t.all_said(), "node 0: its files are refused from here on: a file outside OutputsBegin")) << t.all_said();
}

TEST(OutputsDir, AFreshDirectoryPerRunUnlessOneIsGiven) {
  Manifest m = parse_manifest("[job]\ncommand = [\"true\"]\n", "/m/job.toml");
  const std::string a = outputs_dir(m, RunOptions{}, "aaaa"), b = outputs_dir(m, RunOptions{}, "bbbb");
  EXPECT_NE(a, b);
  EXPECT_EQ(fs::path(a).parent_path(), fs::current_path() / "skyforge-outputs");
  m.job.outputs_dir = "/m/out";
  EXPECT_EQ(outputs_dir(m, RunOptions{}, "aaaa"), "/m/out");
  RunOptions flag;
  flag.outputs_dir = "rel";
  EXPECT_EQ(outputs_dir(m, flag, "aaaa"), (fs::current_path() / "rel").string()) << "--outputs wins";
}

}  // namespace
