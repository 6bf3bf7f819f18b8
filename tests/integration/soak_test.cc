// `mc2 soak` (tools/soak_command.cc, tools/soak_rank.cc) in the test suite:
// a short run must check its results and find none wrong, a short fault run
// must see every injected fault reported, and a run whose results are
// corrupted on purpose must say so and fail (the checking can fail). The
// long runs (10 minutes at 4 ranks) are done by hand: see docs/testing.md.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "common/process_util.h"

namespace mc2::testing {
namespace {

using ::testing::HasSubstr;

class SoakTest : public LeakCheckedTest {};

struct Summary {
  long ops = -1, wrong = -1, hangs = -1, errors = -1, injected = -1, reported = -1;
};

Summary ParseSummary(const std::string& out) {
  Summary s;
  std::smatch m;
  const std::regex line(
      "soak: (\\d+) ops, (\\d+) wrong, (\\d+) hangs, (\\d+) errors; faults injected (\\d+), "
      "reported (\\d+)\\n");
  if (std::regex_search(out, m, line)) {
    s.ops = std::stol(m[1]);
    s.wrong = std::stol(m[2]);
    s.hangs = std::stol(m[3]);
    s.errors = std::stol(m[4]);
    s.injected = std::stol(m[5]);
    s.reported = std::stol(m[6]);
  }
  return s;
}

TEST_F(SoakTest, ShortRunChecksEveryResult) {
  // The duration takes core::ParseDuration's forms, as MC2_TIMEOUT does.
  const Result r = RunMc2({"soak", "-n", "3", "-t", "20s", "--seed", "20261129"}, {}, 300);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  // Progress about every 4 s (a fifth of the run) while the job runs.
  const std::regex progress("soak: (\\d+) s of 20 s");
  std::vector<int> marks;
  for (const auto& line : Lines(r.out)) {
    std::smatch pm;
    if (std::regex_search(line, pm, progress)) marks.push_back(std::stoi(pm[1]));
  }
  ASSERT_GE(marks.size(), 4u) << r.out;
  EXPECT_EQ(marks[0], 4) << r.out;
  EXPECT_TRUE(std::is_sorted(marks.begin(), marks.end())) << r.out;
  const Summary s = ParseSummary(r.out);
  ASSERT_GE(s.ops, 0) << "no summary line:\n" << r.out << r.err;
  EXPECT_GT(s.ops, 100) << r.out;
  EXPECT_EQ(s.wrong, 0) << r.out;
  EXPECT_EQ(s.hangs, 0) << r.out;
  EXPECT_EQ(s.errors, 0) << r.out;
  EXPECT_EQ(s.injected, 0);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("(\\d+) elements checked"))) << r.out;
  EXPECT_GT(std::stol(m[1]), 100000);
}

TEST_F(SoakTest, ShortFaultRunReportsEveryFault) {
  const Result r =
      RunMc2({"soak", "-n", "3", "--duration", "15", "--faults", "--seed", "42"}, {}, 400);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  const Summary s = ParseSummary(r.out);
  ASSERT_GE(s.ops, 0) << "no summary line:\n" << r.out << r.err;
  EXPECT_GE(s.injected, 3) << r.out;
  EXPECT_EQ(s.reported, s.injected) << r.out;
  EXPECT_EQ(s.wrong, 0) << r.out;
  EXPECT_EQ(s.hangs, 0) << r.out;
  EXPECT_EQ(s.errors, 0) << r.out;
  // Both kinds were injected (seed 42) and each job says how it went.
  EXPECT_THAT(r.out, HasSubstr(": kill rank "));
  EXPECT_THAT(r.out, HasSubstr(": stop rank "));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("NOT REPORTED")));
}

TEST_F(SoakTest, CorruptedResultsAreCaughtAndFailTheRun) {
  const Result r = RunMc2(
      {"soak", "-n", "2", "--duration", "4", "--seed", "7", "--test-corrupt-every", "5"}, {}, 200);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  const Summary s = ParseSummary(r.out);
  ASSERT_GE(s.ops, 0) << r.out << r.err;
  EXPECT_GT(s.wrong, 0) << r.out;
  // Each wrong result is described (kind, dtype, sizes, algorithm).
  EXPECT_THAT(r.out, HasSubstr(" wrong: ")) << r.out;
  // A failed run keeps its files for inspection; this one was on purpose.
  std::smatch m;
  if (std::regex_search(r.out, m, std::regex("files are in (/tmp/mc2-soak-[^/\\s]+)/")))
    std::filesystem::remove_all(m[1].str());
}

TEST_F(SoakTest, BadOptionsAreUsageErrors) {
  Result r = RunMc2({"soak", "-n", "0", "--duration", "1"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--nranks: Value 0 not in range 1 to 64"));
  r = RunMc2({"soak", "-n", "2", "--duration", "5x"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("'5x' is not a duration"));
  r = RunMc2({"soak", "-n", "2", "--duration", "1s", "--heap", "1Q"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("'1Q' is not a byte count"));
  // A bad variable fails the driver at once, not each of its jobs: it ends
  // within RunMc2's 10 s, before its 30 s of jobs could have run out.
  r = RunMc2({"soak", "-n", "2", "--duration", "30s"}, {{"MC2_TRACE", "/proc/mc2-no-dir"}});
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("MC2_TRACE='/proc/mc2-no-dir' is invalid"));
  r = RunMc2({"soak", "-n", "1", "--faults", "--duration", "1"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--faults needs at least 2 ranks"));
  r = RunMc2({"soak", "-n", "2", "--faults", "--fault-timeout", "soon"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--fault-timeout"));
  EXPECT_THAT(r.err, HasSubstr("'soon' is not a duration"));
}

}  // namespace
}  // namespace mc2::testing
