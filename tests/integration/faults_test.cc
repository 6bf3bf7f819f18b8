// Failures on real processes under `mc2 run` (tests/programs/fault_probe.cc
// injects them on rank 1): a rank stopped with SIGSTOP mid-collective or
// before set-up, killed or aborted mid-collective, killed before it creates
// the world, between two calls, or inside a fused operator. Every other rank
// must raise an mc2::Error that names rank 1 -- peer_died for a death (never
// the 300 s default timeout), timeout for a stop, no sooner than the timeout
// or the victim's own delay allows -- the launcher must exit non-zero naming
// the first failure, and no process or /dev/shm file may outlive the job (a
// stopped rank included). processes_test.cc has more cases (kill_mid, never,
// exit, throw, count) with the same probe.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "common/process_util.h"

namespace mc2::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

class FaultsTest : public LeakCheckedTest {};

struct FaultRun {
  Result result;
  std::map<int, std::string> lines;  // rank -> its report line
};

// Runs the probe on `n` ranks; `bytes` is the all_reduce's size.
FaultRun RunProbe(const std::string& mode, int n, EnvOverrides env = {},
                  size_t bytes = size_t{32} << 20) {
  env["MC2_HEAP_BYTES"] = "64M";
  FaultRun f;
  f.result = RunMc2({"run", "-n", std::to_string(n), TestProgram("fault_probe"), mode,
                     std::to_string(bytes)},
                    env, 60);
  std::regex line("\\[(\\d+)\\] rank (\\d+): (.*)");
  for (auto& l : Lines(f.result.out)) {
    std::smatch m;
    if (std::regex_match(l, m, line)) f.lines[std::stoi(m[2])] = m[3];
  }
  return f;
}

double ReportedMs(const std::string& line) {
  std::smatch m;
  if (!std::regex_search(line, m, std::regex("after (\\d+) ms"))) return 1e9;
  return std::stod(m[1]);
}

// Every rank but 1 reported an error of one of `codes` naming rank 1 (as a
// whole word: "rank 1 " or "rank 1)" etc., not "rank 10"), no sooner than
// `min_ms` after the operation's start: a lower bound the fault guarantees
// (a timeout cannot expire early; a victim is not dead before it is killed).
// How late is not asserted: a loaded machine delays any step; the error's
// code says whether it came from detection or from the timeout.
void ExpectSurvivorsReport(const FaultRun& f, int n, std::set<std::string> codes,
                           double min_ms) {
  EXPECT_NE(f.result.status, 0) << f.result.out << f.result.err;
  EXPECT_FALSE(f.result.timed_out);
  const std::regex names_rank1("\\brank 1\\b");
  for (int r = 0; r < n; ++r) {
    if (r == 1) continue;
    ASSERT_TRUE(f.lines.count(r)) << "rank " << r << " reported nothing\n"
                                  << f.result.out << f.result.err;
    const std::string& l = f.lines.at(r);
    const std::string code = l.substr(0, l.find(' '));
    EXPECT_TRUE(codes.count(code)) << l;
    EXPECT_TRUE(std::regex_search(l, names_rank1)) << l;
    EXPECT_GE(ReportedMs(l), min_ms) << l;
  }
  // The launcher names the first failure (a survivor's exit for a stop, the
  // dead rank otherwise) and the exit status is that rank's.
  EXPECT_THAT(f.result.err, HasSubstr("mc2 run: rank ")) << f.result.err;
  EXPECT_THAT(f.result.err, HasSubstr("(first failure)")) << f.result.err;
}

TEST_F(FaultsTest, RankStoppedMidAllReduceIsNamedWhenTheTimeoutExpires) {
  FaultRun f = RunProbe("stop_mid", 3, {{"MC2_TIMEOUT", "1s"}});
  // The first survivor to time out aborts the world; the other may raise
  // that abort, whose message carries the first one's (naming rank 1).
  ExpectSurvivorsReport(f, 3, {"timeout", "aborted"}, 900);
  for (int r : {0, 2}) EXPECT_THAT(f.lines[r], HasSubstr("is stopped")) << f.lines[r];
  // The stopped rank cannot exit by itself: the launcher SIGKILLs it (the
  // fixture checks that nothing is left).
  EXPECT_THAT(f.result.err, HasSubstr("rank 1: terminated by mc2 run (SIGKILL)"));
  EXPECT_EQ(f.result.status, 3) << "the first failure is a survivor's exit";
}

TEST_F(FaultsTest, ALongWaitNamesTheMissingRankBeforeItsTimeout) {
  // Rank 1 never calls: rank 0 times out after 2 s, and says whom it waits
  // for after a quarter of that, then again at a doubled interval.
  FaultRun f = RunProbe("never", 2, {{"MC2_TIMEOUT", "2s"}});
  ExpectSurvivorsReport(f, 2, {"timeout"}, 1900);
  const std::vector<std::string> notes =
      LinesWithPrefix(f.result.err, "[0] [mc2 W r0] all_reduce #");
  ASSERT_GE(notes.size(), 1u) << f.result.err;
  const std::regex note(
      "all_reduce #\\d+ on rank 0 still waiting for .*\\brank 1\\b.* after ([0-9.]+) s "
      "\\(timeout in ([0-9.]+) s\\)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(notes[0], m, note)) << notes[0];
  // Not before a quarter of the timeout, and before the timeout expired
  // (time was left on it when the note was written).
  EXPECT_GE(std::stod(m[1]), 0.5) << notes[0];
  EXPECT_GT(std::stod(m[2]), 0.0) << notes[0];
}

TEST_F(FaultsTest, RankStoppedAtFourRanksIsNamedByEveryone) {
  // A small all_reduce (inline, direct): the others wait at its arrival.
  FaultRun f = RunProbe("stop_mid", 4, {{"MC2_TIMEOUT", "1s"}}, 4096);
  ExpectSurvivorsReport(f, 4, {"timeout", "aborted"}, 900);
  for (int r : {0, 2, 3}) EXPECT_THAT(f.lines[r], HasSubstr("is stopped")) << f.lines[r];
}

TEST_F(FaultsTest, RankStoppedBeforeSetUpIsNamed) {
  FaultRun f = RunProbe("stop_setup", 3, {{"MC2_TIMEOUT", "1s"}});
  ExpectSurvivorsReport(f, 3, {"timeout", "aborted"}, 900);
  // The launcher registers every rank's pid, so the others pass the
  // start-up wait and time out at the world group's first arrival ("init").
  for (int r : {0, 2}) {
    EXPECT_THAT(f.lines[r], HasSubstr("init")) << f.lines[r];
    EXPECT_THAT(f.lines[r], AnyOf(HasSubstr("rank 1 never started"), HasSubstr("is stopped")))
        << f.lines[r];
  }
}

TEST_F(FaultsTest, RankKilledBeforeSetUpFailsEveryone) {
  FaultRun f = RunProbe("kill_setup", 3);
  ExpectSurvivorsReport(f, 3, {"peer_died"}, 0);
  for (int r : {0, 2})
    EXPECT_THAT(f.lines[r], HasSubstr("was killed by signal 9")) << f.lines[r];
  EXPECT_EQ(f.result.status, 128 + SIGKILL);
}

TEST_F(FaultsTest, RankAbortingMidAllReduceIsReportedDead) {
  FaultRun f = RunProbe("abort_mid", 3);
  ExpectSurvivorsReport(f, 3, {"peer_died"}, 0);
  for (int r : {0, 2})
    EXPECT_THAT(f.lines[r], HasSubstr("was killed by signal 6")) << f.lines[r];
  EXPECT_EQ(f.result.status, 128 + SIGABRT);
}

TEST_F(FaultsTest, RankKilledBetweenCallsIsReportedDead) {
  FaultRun f = RunProbe("kill_between", 3, {}, 1 << 20);
  // The 200 ms the victim "computes" are part of the others' wait.
  ExpectSurvivorsReport(f, 3, {"peer_died"}, 150);
  for (int r : {0, 2}) EXPECT_THAT(f.lines[r], HasSubstr("all_reduce #")) << f.lines[r];
  EXPECT_EQ(f.result.status, 128 + SIGKILL);
}

TEST_F(FaultsTest, RankKilledInsideAFusedOperatorIsReportedDead) {
  FaultRun f = RunProbe("kill_fused", 3);
  // Killed 300 ms into the loop.
  ExpectSurvivorsReport(f, 3, {"peer_died"}, 250);
  EXPECT_EQ(f.result.status, 128 + SIGKILL);
}

}  // namespace
}  // namespace mc2::testing
