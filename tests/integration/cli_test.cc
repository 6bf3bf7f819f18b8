// Tests of the `mc2` command line as a user meets it (tools/main.cc,
// tools/output_paths.cc and the subcommands' options): no command deletes or
// overwrites what it did not create, an unwritable output fails before any
// work with the operating system's reason, and mistakes get messages that
// say what to type instead.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/process_util.h"

namespace mc2 {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace ::mc2::testing;

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

// A demo small enough to take about a second, for the runs that must work.
std::vector<std::string> TinyDemo(const std::string& out) {
  return {"demo", "-n",    "2",   "--link",   "none", "--pipelines", "serial", "-i",
          "1",    "-w",    "1",   "--layers", "1",    "--hidden",    "64",     "--heads",
          "4",    "--ffn", "128", "--vocab",  "16",   "--seq",       "16",     "--batch",
          "2",    "--out", out};
}

class CliTest : public LeakCheckedTest {
 protected:
  void SetUp() override {
    LeakCheckedTest::SetUp();
    char dir[] = "/tmp/mc2-cli-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
    LeakCheckedTest::TearDown();
  }
  fs::path dir_;
};

// ---------------------------------------------------------------------------
// Data safety.

TEST_F(CliTest, DemoWithABadArgumentLeavesTheOutputDirectoryAlone) {
  const fs::path out = dir_ / "results";
  fs::create_directory(out);
  WriteFile(out / "user.txt", "precious");
  const Result r = RunMc2({"demo", "--out", out.string(), "--tp", "3"});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--tp 3 must divide -n 2"));
  EXPECT_EQ(ReadFile(out / "user.txt"), "precious");
  EXPECT_FALSE(fs::exists(out / ".mc2-output"));
}

TEST_F(CliTest, DemoRefusesADirectoryItDidNotCreate) {
  const fs::path out = dir_ / "mine";
  fs::create_directory(out);
  WriteFile(out / "user.txt", "precious");
  std::vector<std::string> args = TinyDemo(out.string());
  const Result r = RunMc2(args);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--out " + out.string()));
  EXPECT_THAT(r.err, HasSubstr("not created by mc2"));
  EXPECT_EQ(ReadFile(out / "user.txt"), "precious");
  EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator()), 1);
}

TEST_F(CliTest, DemoRefusesTheHomeDirectoryEvenWhenEmpty) {
  // HOME points at an empty directory: emptiness must not make it fair game.
  const fs::path home = dir_ / "home";
  fs::create_directory(home);
  for (const std::string& spelling : {home.string(), home.string() + "/.", home.string() + "/"}) {
    const Result r = RunMc2(TinyDemo(spelling), {{"HOME", home.string()}});
    EXPECT_EQ(r.status, 2) << spelling << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("home directory")) << spelling;
  }
  EXPECT_TRUE(fs::is_empty(home));
}

TEST_F(CliTest, DemoRefusesAFileAsItsOutputDirectory) {
  const fs::path file = dir_ / "file.txt";
  WriteFile(file, "precious");
  const Result r = RunMc2(TinyDemo(file.string()));
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("not a directory"));
  EXPECT_EQ(ReadFile(file), "precious");
}

TEST_F(CliTest, DemoReusesItsOwnDirectoryAndReplacesOnlyItsOwnFiles) {
  const fs::path out = dir_ / "demo";
  Result r = RunMc2(TinyDemo(out.string()), {}, 120);
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_TRUE(fs::exists(out / ".mc2-output"));
  ASSERT_TRUE(fs::exists(out / "serial" / "rank-1.trace.json"));
  // A user's files beside and among the demo's, and a stale trace file of a
  // run with more ranks, which would corrupt the next analysis if kept.
  WriteFile(out / "notes.txt", "mine");
  WriteFile(out / "serial" / "notes.txt", "mine too");
  fs::copy_file(out / "serial" / "rank-1.trace.json", out / "serial" / "rank-7.trace.json");
  r = RunMc2(TinyDemo(out.string()), {}, 120);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(ReadFile(out / "notes.txt"), "mine");
  EXPECT_EQ(ReadFile(out / "serial" / "notes.txt"), "mine too");
  EXPECT_FALSE(fs::exists(out / "serial" / "rank-7.trace.json"));
  EXPECT_TRUE(fs::exists(out / "serial" / "rank-0.trace.json"));
  EXPECT_TRUE(fs::exists(out / "timeline-serial.svg"));
}

TEST_F(CliTest, BenchFailsFastOnAnUnwritableJsonFile) {
  for (const std::string& path :
       {std::string("/nonexistent-mc2-dir/x.json"), dir_.string() /* a directory */}) {
    const auto start = Clock::now();
    const Result r =
        RunMc2({"bench", "all_reduce", "-n", "2", "-b", "8", "-e", "64M", "--json", path}, {}, 60);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("--json " + path));
    EXPECT_THAT(r.err,
                HasSubstr(path == dir_.string() ? "Is a directory" : "No such file or directory"));
    // No sweep ran: no row was printed.
    EXPECT_THAT(r.out, Not(HasSubstr("Avg bus bandwidth")));
    EXPECT_LT(SecondsSince(start), 5.0);
  }
}

TEST_F(CliTest, BenchJsonCheckLeavesAnExistingFileUntilWritten) {
  // The up-front check neither truncates a named file nor leaves one behind.
  const fs::path path = dir_ / "rows.json";
  const Result r = RunMc2({"bench", "all_reduce", "-n", "2", "-b", "8", "-e", "8", "-i", "1", "-w",
                           "0", "--json", path.string()});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(ReadFile(path), HasSubstr("\"rows\""));
  const fs::path unused = dir_ / "unused.json";
  const Result bad = RunMc2({"bench", "all_reduce", "-n", "0", "--json", unused.string()});
  EXPECT_EQ(bad.status, 2);
  EXPECT_FALSE(fs::exists(unused));
}

TEST_F(CliTest, BenchFailsFastOnAReadOnlyDirectory) {
  if (geteuid() == 0) GTEST_SKIP() << "root writes into read-only directories";
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
  const Result r = RunMc2({"bench", "all_reduce", "--json", (dir_ / "x.json").string()});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("Permission denied"));
}

TEST_F(CliTest, TraceOutputsAreCheckedBeforeTheTraceIsRead) {
  // The trace directory does not exist either: the output is checked first.
  for (const char* cmd : {"plot", "merge"}) {
    const Result r =
        RunMc2({"trace", cmd, (dir_ / "no-trace").string(), "-o", "/nonexistent-mc2-dir/t.out"});
    EXPECT_EQ(r.status, 1) << cmd << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("/nonexistent-mc2-dir/t.out"));
    EXPECT_THAT(r.err, HasSubstr("No such file or directory"));
  }
}

TEST_F(CliTest, RunRejectsAnUnwritableTraceDirectoryOnceBeforeAnyRankStarts) {
  const fs::path marker = dir_ / "started";
  const Result r = RunMc2({"run", "-n", "3", "sh", "-c", "touch " + marker.string()},
                          {{"MC2_TRACE", "/proc/mc2-no-such-dir"}});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_FALSE(fs::exists(marker));
  EXPECT_EQ(LinesWithPrefix(r.err, "mc2 run: MC2_TRACE='/proc/mc2-no-such-dir' is invalid").size(),
            1u)
      << r.err;
  EXPECT_THAT(r.err, HasSubstr("No such file or directory"));
}

}  // namespace
}  // namespace mc2
