// Tests of the `mc2` command line as a user meets it (tools/main.cc,
// tools/output_paths.cc and the subcommands' options): no command deletes or
// overwrites what it did not create, an unwritable output fails before any
// work with the operating system's reason, and mistakes get messages that
// say what to type instead.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "common/process_util.h"
#include "common/temp_dir.h"

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
  return {"demo", "-n",       "2",   "--link",   "none", "--pipelines", "serial", "-i",
          "1",    "-w",       "1",   "--layers", "1",    "--hidden",    "64",     "--heads",
          "4",    "--ffn",    "128", "--vocab",  "16",   "--seq-len",   "16",     "--batch",
          "2",    "--output", out};
}

class CliTest : public TempDirTest {
 protected:
  void TearDown() override {
    // A test may have made the directory unwritable.
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    TempDirTest::TearDown();
  }
};

// ---------------------------------------------------------------------------
// Data safety.

TEST_F(CliTest, DemoWithABadArgumentLeavesTheOutputDirectoryAlone) {
  const fs::path out = dir_ / "results";
  fs::create_directory(out);
  WriteFile(out / "user.txt", "precious");
  const Result r = RunMc2({"demo", "--output", out.string(), "--tp", "3"});
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
  EXPECT_THAT(r.err, HasSubstr("--output " + out.string()));
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

TEST_F(CliTest, DemoDpReportsTheGradientAllReducesAndTheirOverlap) {
  // --dp 2 on 2 ranks: TP 1, every collective of backward a gradient
  // all-reduce of GradSync (a bucket per sublayer, the replicated tensors
  // at the end).
  const fs::path json = dir_ / "demo.json";
  std::vector<std::string> args = TinyDemo((dir_ / "demo").string());
  args.insert(args.end(), {"--dp", "2", "--json", json.string()});
  const Result r = RunMc2(args, {}, 120);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("(tp 1, dp 2)"));
  EXPECT_THAT(r.out, HasSubstr("gradient all-reduce (ms)"));
  EXPECT_THAT(r.out, HasSubstr("hidden under compute (%)"));
  const auto j = nlohmann::json::parse(ReadFile(json));
  EXPECT_EQ(j["dp"], 2);
  const auto& run = j["runs"][0];
  // At least one bucket per rank and timed step: 2 ranks x 1 step.
  EXPECT_GE(run["grad_all_reduces"].get<int>(), 2);
  EXPECT_GT(run["grad_all_reduce_ms"].get<double>(), 0);
  EXPECT_GE(run["grad_hidden_pct"].get<double>(), 0);
  EXPECT_LE(run["grad_hidden_pct"].get<double>(), 100);
  // --dp and --tp that do not multiply to -n are refused before anything runs.
  const fs::path out = dir_ / "refused";
  const Result bad =
      RunMc2({"demo", "-n", "2", "--tp", "2", "--dp", "2", "--output", out.string()});
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.err, HasSubstr("--tp 2 x --dp 2 must be -n 2"));
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(CliTest, BenchRefusesAnUnwritableJsonFileBeforeRunning) {
  for (const std::string& path :
       {std::string("/nonexistent-mc2-dir/x.json"), dir_.string() /* a directory */}) {
    const Result r =
        RunMc2({"bench", "all_reduce", "-n", "2", "-b", "8", "-e", "64M", "--json", path}, {}, 60);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("--json " + path));
    EXPECT_THAT(r.err,
                HasSubstr(path == dir_.string() ? "Is a directory" : "No such file or directory"));
    // No sweep ran: no row was printed.
    EXPECT_THAT(r.out, Not(HasSubstr("Avg bus bandwidth")));
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

TEST_F(CliTest, JsonToADashGoesToStandardOutput) {
  // "-" is standard output, as for every other output option, which then
  // carries the JSON alone (the table goes to standard error); no file of
  // that name appears in the working directory.
  ASSERT_FALSE(fs::exists("-"));
  const Result r = RunMc2({"bench", "all_reduce", "-n", "2", "-b", "8", "-e", "8", "-i", "1", "-w",
                           "0", "--json", "-"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["wrong_total"], 0);
  EXPECT_THAT(r.err, HasSubstr("# Avg bus bandwidth"));
  EXPECT_FALSE(fs::exists("-"));
}

TEST_F(CliTest, BenchChecksUnlessToldNotTo) {
  const Result off = RunMc2(
      {"bench", "all_reduce", "-n", "2", "-b", "8", "-e", "8", "-i", "1", "-w", "0", "--no-check"});
  ASSERT_EQ(off.status, 0) << off.err;
  EXPECT_THAT(off.out, HasSubstr("not checked, --no-check"));
  // -o is the output everywhere: as the reduction it is refused, naming --op.
  const Result o = RunMc2({"bench", "all_reduce", "-o", "sum"});
  EXPECT_EQ(o.status, 2);
  EXPECT_THAT(o.err, HasSubstr("the reduction: --op"));
}

TEST_F(CliTest, HelpShowsFlagsWithoutValues) {
  const Result r = RunMc2({"run", "--help"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("--no-prefix"));
  EXPECT_THAT(r.out, Not(HasSubstr("{false}")));
}

TEST_F(CliTest, OtherToolsSpellingsGetMc2sName) {
  const Result r = RunMc2({"demo", "--seq", "64"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("hint: mc2 spells --seq as --seq-len"));
}

TEST_F(CliTest, BenchRefusesAReadOnlyDirectoryBeforeRunning) {
  if (geteuid() == 0) GTEST_SKIP() << "root writes into read-only directories";
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
  const Result r = RunMc2({"bench", "all_reduce", "--json", (dir_ / "x.json").string()});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("Permission denied"));
  EXPECT_THAT(r.out, Not(HasSubstr("Avg bus bandwidth"))) << "a sweep ran";
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

// ---------------------------------------------------------------------------
// The command line as a user meets it.

TEST_F(CliTest, UnknownCommandsSuggestTheNearest) {
  Result r = RunMc2({"runn", "-n", "2", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("mc2: unknown command 'runn' (did you mean 'run'?)"));
  r = RunMc2({"trace", "reprot", "x"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("mc2 trace: unknown command 'reprot' (did you mean 'report'?)"));
  // Nothing near: no guess, but the list of commands.
  r = RunMc2({"xyzzy"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown command 'xyzzy'; the commands are run, bench"));
  EXPECT_THAT(r.err, Not(HasSubstr("did you mean")));
}

TEST_F(CliTest, MpirunsNpGetsAHint) {
  const Result r = RunMc2({"run", "-np", "2", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("-n N (or --nranks N) for the number of ranks, not mpirun's -np"));
}

TEST_F(CliTest, VersionPrintsTheProjectVersion) {
  const Result r = RunMc2({"--version"});
  EXPECT_EQ(r.status, 0) << r.err;
  // The version the build was configured with (project(mc2 VERSION ...)).
  std::ifstream cmake(std::string(MC2_SOURCE_DIR) + "/CMakeLists.txt");
  std::stringstream text;
  text << cmake.rdbuf();
  std::smatch m;
  const std::string all = text.str();
  ASSERT_TRUE(std::regex_search(all, m, std::regex("project\\(mc2 VERSION ([0-9.]+)")));
  EXPECT_EQ(r.out, "mc2 " + m[1].str() + "\n");
}

TEST_F(CliTest, BenchRanksAndSizesUseTheCommonGrammar) {
  // -n 0 is refused, not run as some other count.
  Result r = RunMc2({"bench", "all_reduce", "-n", "0"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--nranks: Value 0 not in range 1 to 256"));
  // Fractional sizes as for --heap and MC2_HEAP_BYTES: 1.5K = 1536 bytes.
  r = RunMc2({"bench", "all_reduce", "-n", "2", "-b", "1.5K", "-e", "1.5K", "-i", "1", "-w", "0",
              "-d", "f32"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("minBytes 1536 maxBytes 1536"));
  r = RunMc2({"bench", "all_reduce", "-n", "2", "-e", "12Q"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("'12Q' is not a byte count"));
  r = RunMc2({"bench", "all_reduz", "-n", "2"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown collective 'all_reduz' (did you mean 'all_reduce'?)"));
  // The old spelling of the dtype option is gone.
  r = RunMc2({"bench", "all_reduce", "-n", "2", "--datatype", "f32"});
  EXPECT_EQ(r.status, 2);
}

TEST_F(CliTest, DemoNamesTheOptionsAsTyped) {
  Result r = RunMc2({"demo", "--heads", "5"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--heads 5 must divide --hidden 1024"));
  r = RunMc2({"demo", "--link", "bw=fast"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--link='bw=fast' is invalid"));
  EXPECT_THAT(r.err, Not(HasSubstr("MC2_LINK")));
  r = RunMc2({"demo", "--nranks", "4", "--tp", "2", "--batch", "3"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("-n 4 / --tp 2 = 2 must divide --batch 3"));
  r = RunMc2({"demo", "-d", "f16"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--dtype"));
}

TEST_F(CliTest, RunChecksTheEnvironmentOnceBeforeAnyRankStarts) {
  const fs::path marker = dir_ / "started";
  const Result r =
      RunMc2({"run", "-n", "4", "sh", "-c", "touch " + marker.string()}, {{"MC2_TIMEOUT", "soon"}});
  EXPECT_EQ(r.status, 2);
  EXPECT_FALSE(fs::exists(marker));
  size_t count = 0;
  for (size_t at = r.err.find("MC2_TIMEOUT='soon'"); at != std::string::npos;
       at = r.err.find("MC2_TIMEOUT='soon'", at + 1))
    ++count;
  EXPECT_EQ(count, 1u) << r.err;
  // An unknown variable is warned of once, by the launcher, not by each rank.
  const Result w = RunMc2({"run", "-n", "3", "true"}, {{"MC2_TIMEOUTT", "5"}});
  EXPECT_EQ(w.status, 0) << w.err;
  EXPECT_EQ(
      LinesWithPrefix(w.err, "[mc2 W] ignoring unknown environment variable MC2_TIMEOUTT").size(),
      1u)
      << w.err;
  EXPECT_THAT(w.err, Not(HasSubstr("] [mc2 W")));
}

TEST_F(CliTest, TraceWindowsReadDurationsAsEverywhereElse) {
  // Write a small real trace: a 2-rank job of the trace demo program.
  const fs::path trace = dir_ / "trace";
  Result r = RunMc2({"run", "-n", "2", "--heap", "64M", TestProgram("trace_demo")},
                    {{"MC2_TRACE", trace.string()}}, 60);
  ASSERT_EQ(r.status, 0) << r.err;
  const fs::path svg = dir_ / "t.svg";
  // A bare number is seconds (as MC2_TIMEOUT): 250 s is past the end of
  // this trace, so the window is empty; 250us is inside it.
  r = RunMc2({"trace", "plot", trace.string(), "-o", svg.string(), "--from", "250"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("window of the trace is empty"));
  r = RunMc2({"trace", "plot", trace.string(), "-o", svg.string(), "--from", "0", "--to", "250ms"});
  EXPECT_EQ(r.status, 0) << r.err;
  r = RunMc2({"trace", "plot", trace.string(), "-o", svg.string(), "--from", "soon"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--from='soon' is invalid"));
}

}  // namespace
}  // namespace mc2
