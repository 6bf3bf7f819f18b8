// Collectives on real processes under `mc2 run`: a sample of the sweep's
// cases, and the failure cases (a rank killed in the middle of a large
// all_reduce, a rank that never calls, exits early, throws, or calls with a
// different count). Every surviving rank must raise the right mc2::Error (a
// death as peer_died, never as a timeout), the job must end non-zero, and
// nothing may leak.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>

#include "common/process_util.h"

namespace mc2::testing {
namespace {

using ::testing::HasSubstr;

class ProcessesTest : public LeakCheckedTest {};

class CasesOnProcesses : public ProcessesTest, public ::testing::WithParamInterface<int> {};

TEST_P(CasesOnProcesses, SampleOfSweepMatchesReference) {
  const int n = GetParam();
  // A different thin sample per rank count; 1 MiB + 5 elements included.
  const std::string stride = n >= 5 ? "97" : "41";
  Result r = RunMc2({"run", "-n", std::to_string(n), TestProgram("run_cases"), stride},
                    {{"MC2_HEAP_BYTES", "96M"}, {"MC2_SCRATCH_BYTES", "65536"}}, 300);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr(" 0 failed")) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("cases: (\\d+) passed"))) << r.out;
  EXPECT_GT(std::stoi(m[1]), 50);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CasesOnProcesses, ::testing::Values(2, 3, 4, 5, 8));

struct FaultRun {
  Result result;
  std::map<int, std::string> lines;  // rank -> its report line
};

FaultRun RunFault(const std::string& mode, int n, EnvOverrides env = {}) {
  env["MC2_HEAP_BYTES"] = "64M";
  FaultRun f;
  f.result = RunMc2({"run", "-n", std::to_string(n), TestProgram("fault_probe"), mode,
                     std::to_string(32 << 20)},
                    env, 30);
  std::regex line("\\[(\\d+)\\] rank (\\d+): (.*)");
  for (auto& l : Lines(f.result.out)) {
    std::smatch m;
    if (std::regex_match(l, m, line)) f.lines[std::stoi(m[2])] = m[3];
  }
  return f;
}

// Milliseconds a report line says the error took to arrive.
double ReportedMs(const std::string& line) {
  std::smatch m;
  if (!std::regex_search(line, m, std::regex("after (\\d+) ms"))) return 1e9;
  return std::stod(m[1]);
}

TEST_F(ProcessesTest, RankKilledMidAllReduceFailsEveryone) {
  FaultRun f = RunFault("kill_mid", 3);
  EXPECT_NE(f.result.status, 0);
  EXPECT_THAT(f.result.err, HasSubstr("rank 1"));
  for (int r : {0, 2}) {
    ASSERT_TRUE(f.lines.count(r)) << f.result.out << f.result.err;
    EXPECT_THAT(f.lines[r], HasSubstr("peer_died")) << f.lines[r];
    EXPECT_THAT(f.lines[r], HasSubstr("rank 1")) << f.lines[r];
    EXPECT_THAT(f.lines[r], HasSubstr("all_reduce")) << f.lines[r];
  }
}

TEST_F(ProcessesTest, RankThatNeverCallsTimesOutNamingIt) {
  FaultRun f = RunFault("never", 3, {{"MC2_TIMEOUT", "2s"}});
  EXPECT_NE(f.result.status, 0);
  for (int r : {0, 2}) {
    ASSERT_TRUE(f.lines.count(r)) << f.result.out << f.result.err;
    // The first to time out aborts the world; the other may see that abort.
    EXPECT_THAT(f.lines[r], ::testing::AnyOf(HasSubstr("timeout"), HasSubstr("aborted")));
    EXPECT_THAT(f.lines[r], HasSubstr("rank 1")) << f.lines[r];
    // A lower bound the timeout guarantees: no rank times out before 2 s
    // (the margin is for the probe's clock starting before the call).
    EXPECT_GT(ReportedMs(f.lines[r]), 1500) << f.lines[r];
  }
}

TEST_F(ProcessesTest, RankThatExitsEarlyIsReportedDead) {
  FaultRun f = RunFault("exit", 3);
  EXPECT_NE(f.result.status, 0);
  for (int r : {0, 2}) {
    ASSERT_TRUE(f.lines.count(r)) << f.result.out << f.result.err;
    EXPECT_THAT(f.lines[r], HasSubstr("peer_died")) << f.lines[r];
  }
}

TEST_F(ProcessesTest, UncaughtExceptionIsReportedDead) {
  FaultRun f = RunFault("throw", 3);
  EXPECT_NE(f.result.status, 0);
  EXPECT_THAT(f.result.err, HasSubstr("rank 1"));
  for (int r : {0, 2}) {
    ASSERT_TRUE(f.lines.count(r)) << f.result.out << f.result.err;
    EXPECT_THAT(f.lines[r], HasSubstr("peer_died")) << f.lines[r];
  }
}

TEST_F(ProcessesTest, DifferentCountRaisesMismatchOnEveryRank) {
  FaultRun f = RunFault("count", 3);
  EXPECT_NE(f.result.status, 0);
  for (int r : {0, 1, 2}) {
    ASSERT_TRUE(f.lines.count(r)) << f.result.out << f.result.err;
    EXPECT_THAT(f.lines[r], HasSubstr("mismatch")) << f.lines[r];
    EXPECT_THAT(f.lines[r], HasSubstr("count=")) << f.lines[r];
  }
}

TEST_F(ProcessesTest, HealthyRunSucceeds) {
  FaultRun f = RunFault("none", 4);
  EXPECT_EQ(f.result.status, 0) << f.result.out << f.result.err;
  for (int r = 0; r < 4; ++r) EXPECT_EQ(f.lines[r], "ok");
}

}  // namespace
}  // namespace mc2::testing

namespace mc2::testing {
namespace {

TEST_F(ProcessesTest, IdleRankUsesUnderOnePercentOfACore) {
  Result r = RunMc2({"run", "-n", "2", TestProgram("idle_probe"), "5"},
                    {{"MC2_HEAP_BYTES", "64M"}}, 60);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  std::regex line("rank (\\d+): idle cpu ([0-9.]+) s over ([0-9.]+) s");
  int seen = 0;
  for (auto& l : Lines(r.out)) {
    std::smatch m;
    if (!std::regex_search(l, m, line)) continue;
    ++seen;
    double cpu = std::stod(m[2]), wall = std::stod(m[3]);
    EXPECT_GT(wall, 4.9);
    EXPECT_LT(cpu / wall, 0.01) << l;
  }
  EXPECT_EQ(seen, 2) << r.out;
}

}  // namespace
}  // namespace mc2::testing
