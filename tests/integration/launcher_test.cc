// Tests of `mc2 run` (tools/launcher.cc) and of the shm job segments it
// creates (src/transport/shm/job.cc). The ranks are plain shell scripts, so
// these tests exercise the launcher alone: environment, output relaying,
// failure propagation, teardown on signals, and that no process and no
// /dev/shm file outlives a job.
#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/process_util.h"
#include "mc2/error.h"
#include "transport/shm/job.h"

extern char** environ;

namespace mc2 {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;
using namespace ::mc2::testing;

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    shm_before_ = ShmEntries();
    char dir[] = "/tmp/mc2-launcher-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    pid_file_ = dir_ + "/pids";
  }

  void TearDown() override {
    // Whatever happened, leave nothing running.
    if (launch_.pid > 0) {
      kill(launch_.pid, SIGKILL);
      waitpid(launch_.pid, nullptr, 0);
      if (launch_.out_fd >= 0) close(launch_.out_fd);
      if (launch_.err_fd >= 0) close(launch_.err_fd);
    }
    for (pid_t pid : RankPids()) {
      if (!ProcessGone(pid)) {
        ADD_FAILURE() << "rank process " << pid << " outlived its test";
        kill(pid, SIGKILL);
      }
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
    // Names exist for microseconds while a (concurrent) launcher creates a
    // job; only a name that stays is a leak.
    std::set<std::string> leaked;
    for (const auto& name : ShmEntries()) {
      if (shm_before_.count(name) == 0) leaked.insert(name);
    }
    if (!leaked.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const std::set<std::string> now = ShmEntries();
      std::erase_if(leaked, [&](const std::string& name) { return now.count(name) == 0; });
    }
    EXPECT_THAT(leaked, ::testing::IsEmpty()) << "files left in /dev/shm";
  }

  // A shell snippet that records "RANK PID" of the shell in the pid file.
  std::string RecordPid() const { return "echo \"$MC2_RANK $$\" >> " + pid_file_ + "; "; }

  std::map<int, pid_t> RankPidMap() const {
    std::map<int, pid_t> pids;
    std::ifstream in(pid_file_);
    int rank;
    pid_t pid;
    while (in >> rank >> pid) pids[rank] = pid;
    return pids;
  }

  std::vector<pid_t> RankPids() const {
    std::vector<pid_t> pids;
    for (auto [rank, pid] : RankPidMap()) pids.push_back(pid);
    return pids;
  }

  // Waits until `n` ranks have recorded their pids.
  bool WaitForRanks(size_t n, double seconds = 5) {
    const auto start = Clock::now();
    while (RankPidMap().size() < n) {
      if (SecondsSince(start) > seconds) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }

  std::set<std::string> shm_before_;
  std::string dir_;
  std::string pid_file_;
  Launch launch_;  // for tests that signal the launcher themselves
};

TEST_F(LauncherTest, SetsTorchrunsVariablesForEachRank) {
  // Programs written for torchrun read these (torch's env:// rendezvous
  // needs MASTER_ADDR and MASTER_PORT); stale values must be replaced.
  const Result r = RunMc2(
      {"run", "-n", "3", "sh", "-c",
       "echo \"R=$RANK W=$WORLD_SIZE LR=$LOCAL_RANK LW=$LOCAL_WORLD_SIZE A=$MASTER_ADDR "
       "P=$MASTER_PORT\""},
      {{"RANK", "99"},
       {"WORLD_SIZE", "99"},
       {"LOCAL_RANK", "99"},
       {"LOCAL_WORLD_SIZE", "99"},
       {"MASTER_ADDR", "example.invalid"},
       {"MASTER_PORT", "1"}});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 0) << r.err;
  std::set<std::string> ports;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string prefix = "[" + std::to_string(rank) + "] ";
    const auto lines = LinesWithPrefix(r.out, prefix);
    ASSERT_EQ(lines.size(), 1u) << r.out;
    const std::string expected = prefix + "R=" + std::to_string(rank) +
                                 " W=3 LR=" + std::to_string(rank) + " LW=3 A=127.0.0.1 P=";
    ASSERT_EQ(lines[0].substr(0, expected.size()), expected) << lines[0];
    ports.insert(lines[0].substr(expected.size()));
  }
  // One port for the job, a real one, not the stale value.
  ASSERT_EQ(ports.size(), 1u);
  const int port = std::stoi(*ports.begin());
  EXPECT_GT(port, 1);
  EXPECT_LT(port, 65536);
}

TEST_F(LauncherTest, HostsLaunchSetsTorchrunsVariablesFromOpenMpis) {
  // --dry-run prints the mpirun line without running it.
  const Result r = RunMc2({"run", "--hosts", "h0:2,h1:2", "--dry-run", "./prog", "arg"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("mpirun -np 4 -H h0:2,h1:2 ")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE "))
      << r.out;
  EXPECT_THAT(r.out, HasSubstr("MASTER_ADDR=h0 MASTER_PORT=29500 exec")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("' ./prog arg")) << r.out;
}

// A fake `python3` on PATH, first, that fails as an interpreter without
// torch does; `mc2 run python3 ...` must say which interpreter ran.
TEST_F(LauncherTest, NamesTheInterpreterThatCouldNotImportTorch) {
  const std::string bin = dir_ + "/bin";
  ASSERT_TRUE(std::filesystem::create_directory(bin));
  const std::string fake = bin + "/python3";
  {
    std::ofstream script(fake);
    script << "#!/bin/sh\n"
              "echo 'Traceback (most recent call last):' >&2\n"
              "echo '  File \"prog.py\", line 1, in <module>' >&2\n"
              "echo \"ModuleNotFoundError: No module named '$FAKE_MODULE'\" >&2\n"
              "exit \"$FAKE_STATUS\"\n";
  }
  ASSERT_EQ(chmod(fake.c_str(), 0755), 0);
  const std::string path = bin + ":" + std::getenv("PATH");
  Result r = RunMc2({"run", "-n", "2", "python3", "prog.py"},
                    {{"PATH", path}, {"FAKE_MODULE", "torch"}, {"FAKE_STATUS", "1"}});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("could not import torch; it ran 'python3', which is " + fake))
      << r.err;
  EXPECT_THAT(r.err, HasSubstr("mc2 run -n 2 /usr/bin/python3")) << r.err;

  r = RunMc2({"run", "-n", "1", "python3", "prog.py"},
             {{"PATH", path}, {"FAKE_MODULE", "mc2"}, {"FAKE_STATUS", "1"}});
  EXPECT_THAT(r.err, HasSubstr("could not import mc2")) << r.err;

  // Another module, or a job that succeeds: no hint.
  r = RunMc2({"run", "-n", "1", "python3", "prog.py"},
             {{"PATH", path}, {"FAKE_MODULE", "numpyx"}, {"FAKE_STATUS", "1"}});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, Not(HasSubstr("could not import"))) << r.err;
  r = RunMc2({"run", "-n", "1", "python3", "prog.py"},
             {{"PATH", path}, {"FAKE_MODULE", "torch"}, {"FAKE_STATUS", "0"}});
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.err, Not(HasSubstr("could not import"))) << r.err;
}

TEST_F(LauncherTest, SetsTheEnvironmentOfEachRank) {
  // Stale values in the launcher's environment must be replaced.
  const Result r = RunMc2({"run", "-n", "3", "sh", "-c",
                           "echo \"R=$MC2_RANK W=$MC2_WORLD_SIZE LR=$MC2_LOCAL_RANK "
                           "LS=$MC2_LOCAL_SIZE H=$MC2_HEAP_BYTES J=$MC2_JOB_ID F=$MC2_SHM_FDS\"; "
                           "IFS=,; for fd in $MC2_SHM_FDS; do "
                           "  echo \"fd $fd $(readlink /proc/$$/fd/$fd) "
                           "$(stat -L -c %s /proc/$$/fd/$fd)\"; done"},
                          {{"MC2_RANK", "99"}, {"MC2_SHM_FDS", "1,2"}});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  std::set<std::string> job_ids;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string prefix = "[" + std::to_string(rank) + "] ";
    const auto lines = LinesWithPrefix(r.out, prefix);
    ASSERT_EQ(lines.size(), 5u) << r.out;
    const std::string expected = prefix + "R=" + std::to_string(rank) +
                                 " W=3 LR=" + std::to_string(rank) +
                                 " LS=3 H=" + std::to_string(kTestHeapBytes) + " J=";
    ASSERT_EQ(lines[0].substr(0, expected.size()), expected) << lines[0];
    const std::string rest = lines[0].substr(expected.size());
    const size_t fds_at = rest.find(" F=");
    ASSERT_NE(fds_at, std::string::npos);
    const std::string job_id = rest.substr(0, fds_at);
    EXPECT_FALSE(job_id.empty());
    job_ids.insert(job_id);
    // F= lists 4 descriptors: control, then heaps 0..2; each is open in the
    // rank, refers to an unlinked mc2 file in /dev/shm and has the right size.
    for (int i = 0; i < 4; ++i) {
      const std::string& line = lines[1 + i];
      EXPECT_THAT(line, HasSubstr(" /dev/shm/mc2-")) << line;
      EXPECT_THAT(line, HasSubstr("(deleted)")) << line;
      if (i == 0) {
        EXPECT_THAT(line, HasSubstr("-ctl (deleted)"));
      } else {
        EXPECT_THAT(line, HasSubstr("-heap-" + std::to_string(i - 1) + " (deleted) " +
                                    std::to_string(kTestHeapBytes)));
      }
    }
  }
  EXPECT_EQ(job_ids.size(), 1u) << "all ranks must share one job id";
}

TEST_F(LauncherTest, HeapSizeComesFromEnvironmentOptionOrDefault) {
  const std::string script = "echo $MC2_HEAP_BYTES";
  Result r = RunMc2({"run", "-n", "1", "sh", "-c", script}, {{"MC2_HEAP_BYTES", std::nullopt}});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[0] 268435456\n");
  r = RunMc2({"run", "-n", "1", "sh", "-c", script}, {{"MC2_HEAP_BYTES", "1M"}});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[0] 1048576\n");
  // --heap wins over the environment.
  r = RunMc2({"run", "-n", "1", "--heap", "2M", "sh", "-c", script}, {{"MC2_HEAP_BYTES", "1M"}});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[0] 2097152\n");
}

// Binding (--bind, MC2_BIND): tests/integration/placement_test.cc.

TEST_F(LauncherTest, PrefixesEachLineWithTheRankOnTheSameStream) {
  const Result r = RunMc2(
      {"run", "-n", "2", "sh", "-c", "printf 'a\\nb\\n'; printf 'e1\\n' >&2; printf 'tail'"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(LinesWithPrefix(r.out, "[0] "), ElementsAre("[0] a", "[0] b", "[0] tail"));
  EXPECT_THAT(LinesWithPrefix(r.out, "[1] "), ElementsAre("[1] a", "[1] b", "[1] tail"));
  EXPECT_EQ(Lines(r.out).size(), 6u) << r.out;
  EXPECT_THAT(Lines(r.err), UnorderedElementsAre("[0] e1", "[1] e1"));
  EXPECT_EQ(r.out.back(), '\n') << "a partial last line is terminated";
}

TEST_F(LauncherTest, NoPrefixPassesOutputThroughUnchanged) {
  const Result r = RunMc2(
      {"run", "-n", "2", "--no-prefix", "sh", "-c", "printf \"x$MC2_RANK\\n\"; printf 'y\\n' >&2"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(Lines(r.out), UnorderedElementsAre("x0", "x1"));
  EXPECT_THAT(Lines(r.err), UnorderedElementsAre("y", "y"));
}

TEST_F(LauncherTest, ProgramArgumentsArePassedUnparsed) {
  Result r = RunMc2({"run", "-n", "1", "sh", "-c", "echo \"args: $*\"", "sh", "-n", "5",
                     "--no-prefix", "--", "-x"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[0] args: -n 5 --no-prefix -- -x\n");
  r = RunMc2({"run", "-n", "1", "--", "sh", "-c", "echo ok"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[0] ok\n");
}

TEST_F(LauncherTest, AllRanksSucceedingIsSilent) {
  const Result r = RunMc2({"run", "-n", "4", "true"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
}

TEST_F(LauncherTest, PropagatesTheExitStatusOfTheFailingRank) {
  const Result r = RunMc2({"run", "-n", "3", "sh", "-c",
                           RecordPid() + "if [ $MC2_RANK = 1 ]; then exit 3; fi; "
                                         "exec sleep 30"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 3) << r.err;
  const pid_t pid = RankPidMap()[1];
  EXPECT_THAT(r.err, HasSubstr("mc2 run: rank 1 (pid " + std::to_string(pid) +
                               ") exited with status 3; terminating the "
                               "other ranks\n"));
  // The others end by the launcher's SIGKILL, not by their `sleep 30`: the
  // launcher returned within RunMc2's 10 s, and no rank outlives it. (How
  // soon is not asserted: a loaded machine may delay any step.)
  EXPECT_TRUE(WaitUntilGone(RankPids(), 0)) << "the launcher reaps its ranks";
  EXPECT_THAT(r.err, HasSubstr("ranks 0,2: terminated by mc2 run (SIGKILL)"));
  EXPECT_THAT(r.err, HasSubstr("rank 1: exited with status 3 (first failure)"));
}

TEST_F(LauncherTest, ReportsTheFirstFailureOnly) {
  const Result r = RunMc2({"run", "-n", "2", "sh", "-c",
                           "if [ $MC2_RANK = 0 ]; then sleep 0.3; exit 4; fi; "
                           "exit 5"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 5) << r.err;
  EXPECT_THAT(r.err, HasSubstr("rank 1 (pid "));
  EXPECT_THAT(r.err, Not(HasSubstr("rank 0 (pid ")));
  EXPECT_THAT(r.err, HasSubstr("rank 0: exited with status 4\n"));
}

// What ranks blocked in mc2 waits rely on: the launcher records the failure
// in the control block. A surviving shell rank reads it through its
// inherited descriptor.
TEST_F(LauncherTest, RecordsTheFailureInTheControlBlock) {
  const std::string read_ctl =
      "F=/proc/$$/fd/${MC2_SHM_FDS%%,*}; "
      "while [ \"$(od -An -td4 -j" +
      std::to_string(offsetof(shm::JobControl, aborted)) +
      " -N4 $F | tr -d ' ')\" = 0 ]; do sleep 0.01; done; "
      "echo ctl $(od -An -td4 -j" +
      std::to_string(offsetof(shm::JobControl, failed_rank)) +
      " -N12 $F); "
      "echo \"reason $(dd if=$F bs=1 skip=" +
      std::to_string(offsetof(shm::JobControl, reason)) + " count=100 2>/dev/null | tr -d '\\0')\"";
  static_assert(offsetof(shm::JobControl, failure_kind) ==
                offsetof(shm::JobControl, failed_rank) + 4);
  static_assert(offsetof(shm::JobControl, failure_value) ==
                offsetof(shm::JobControl, failed_rank) + 8);
  Result r = RunMc2({"run", "-n", "2", "sh", "-c",
                     "if [ $MC2_RANK = 1 ]; then sleep 0.1; exit 3; fi; " + read_ctl});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 3) << r.err;
  // failed_rank 1, FailureKind::kExit, status 3.
  EXPECT_THAT(Lines(r.out),
              ElementsAre("[0] ctl 1 1 3", ::testing::StartsWith("[0] reason rank 1 (pid ")));
  r = RunMc2({"run", "-n", "2", "sh", "-c",
              "if [ $MC2_RANK = 1 ]; then sleep 0.1; kill -9 $$; fi; " + read_ctl});
  EXPECT_EQ(r.status, 128 + SIGKILL) << r.err;
  // FailureKind::kSignal, signal 9.
  EXPECT_THAT(Lines(r.out), ::testing::Contains("[0] ctl 1 2 9"));
}

TEST_F(LauncherTest, KilledRankEndsTheOthers) {
  const std::string killed_at = dir_ + "/killed_at";
  const Result r = RunMc2({"run", "-n", "4", "sh", "-c",
                           RecordPid() +
                               "if [ $MC2_RANK = 2 ]; then sleep 0.2; "
                               "date +%s%N > " +
                               killed_at +
                               "; kill -9 $$; "
                               "fi; exec sleep 30"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 128 + SIGKILL) << r.err;
  const pid_t pid = RankPidMap()[2];
  EXPECT_THAT(r.err, HasSubstr("mc2 run: rank 2 (pid " + std::to_string(pid) +
                               ") was killed by signal 9 (Killed); "
                               "terminating the other ranks\n"));
  // Every rank is gone when the launcher exits (it reaps them first): the
  // others were ended by the launcher, not by their `sleep 30`, which had
  // not run out when the launcher returned within RunMc2's 10 s.
  int64_t killed_ns = 0;
  std::ifstream(killed_at) >> killed_ns;
  ASSERT_GT(killed_ns, 0) << "rank 2 never reached its kill";
  EXPECT_EQ(RankPidMap().size(), 4u);
  EXPECT_TRUE(WaitUntilGone(RankPids(), 0));
}

TEST_F(LauncherTest, SigkilledLauncherTakesItsRanksAlong) {
  launch_ = Spawn({"run", "-n", "3", "sh", "-c", RecordPid() + "exec sleep 30"});
  ASSERT_TRUE(WaitForRanks(3));
  ASSERT_EQ(kill(launch_.pid, SIGKILL), 0);
  const Result r = Wait(launch_);
  EXPECT_EQ(r.status, 128 + SIGKILL);
  // A polling deadline for the kernel's death signal to land, not a speed
  // check: the ranks' `sleep 30` would outlast it.
  EXPECT_TRUE(WaitUntilGone(RankPids(), 20.0)) << "ranks survived the launcher";
}

TEST_F(LauncherTest, SigtermEndsAllRanksEvenThoseIgnoringIt) {
  launch_ =
      Spawn({"run", "-n", "3", "sh", "-c",
             "if [ $MC2_RANK = 1 ]; then trap '' TERM; fi; " + RecordPid() + "exec sleep 30"});
  ASSERT_TRUE(WaitForRanks(3));
  const auto signalled = Clock::now();
  ASSERT_EQ(kill(launch_.pid, SIGTERM), 0);
  const Result r = Wait(launch_);
  EXPECT_EQ(r.status, 143) << r.err;
  // A lower bound the launcher guarantees: rank 1 ignores SIGTERM, so it
  // ends only by the SIGKILL sent once the 1.5 s grace period is over.
  EXPECT_GE(SecondsSince(signalled), 1.5);
  EXPECT_TRUE(WaitUntilGone(RankPids(), 0)) << "the launcher reaps its ranks";
  EXPECT_THAT(r.err, HasSubstr("mc2 run: received SIGTERM; terminating the "
                               "ranks\n"));
  EXPECT_THAT(r.err, HasSubstr("rank 1: terminated by mc2 run (SIGKILL)"));
  EXPECT_THAT(r.err, HasSubstr("ranks 0,2: terminated by mc2 run (SIGTERM)"));
}

TEST_F(LauncherTest, SigintExitsWith130) {
  launch_ = Spawn({"run", "-n", "2", "sh", "-c", RecordPid() + "exec sleep 30"});
  ASSERT_TRUE(WaitForRanks(2));
  ASSERT_EQ(kill(launch_.pid, SIGINT), 0);
  const Result r = Wait(launch_);
  EXPECT_EQ(r.status, 130) << r.err;
  // Ended by the launcher's signal, not by their `sleep 30`: every rank is
  // gone when the launcher exits.
  EXPECT_TRUE(WaitUntilGone(RankPids(), 0));
}

TEST_F(LauncherTest, KillsWhatAFailedRankLeftInItsProcessGroup) {
  // The shell's child `sleep` holds the output pipe; the launcher must not
  // wait for it.
  const Result r = RunMc2(
      {"run", "-n", "1", "sh", "-c", "sleep 30 & echo \"0 $!\" >> " + pid_file_ + "; exit 7"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 7);
  // Not waiting for it is an ordering of events: the launcher returned
  // within RunMc2's 10 s (not timed out), before the `sleep 30` could end.
  // The wait below is a polling deadline for the kill to land, not a speed
  // check.
  EXPECT_TRUE(WaitUntilGone(RankPids(), 20.0));
}

TEST_F(LauncherTest, HugeHeapFailsBeforeAnyRankStartsNamingTheDirectory) {
  const Result r = RunMc2({"run", "-n", "2", "sh", "-c", "touch " + dir_ + "/ran"},
                          {{"MC2_HEAP_BYTES", "100G"}});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("[shm_exhausted]"), HasSubstr("/dev/shm"),
                           HasSubstr("2 ranks x 107374182400 bytes"), HasSubstr("free"),
                           HasSubstr("MC2_HEAP_BYTES"), HasSubstr("--heap")));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/ran")) << "no rank may start";
}

TEST_F(LauncherTest, InvalidSettingsAreUsageErrors) {
  Result r = RunMc2({"run", "-n", "2", "true"}, {{"MC2_HEAP_BYTES", "lots"}});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("MC2_HEAP_BYTES='lots'"), HasSubstr("256M")));
  r = RunMc2({"run", "-n", "2", "true"}, {{"MC2_HEAP_BYTES", "0"}});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("MC2_HEAP_BYTES='0'"));
  r = RunMc2({"run", "-n", "2", "--heap", "12Q", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("--heap"), HasSubstr("'12Q' is not a byte count")));
  r = RunMc2({"run", "-n", "2", "--heap", "0", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("--heap"), HasSubstr("'0' is 0 bytes")));
  r = RunMc2({"run", "-n", "1", "true"}, {{"MC2_SHM_DIR", dir_ + "/missing"}});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("MC2_SHM_DIR='" + dir_ + "/missing'"));
  r = RunMc2({"run", "-n", "0", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("--nranks"), HasSubstr("0 not in range 1 to 256")));
  r = RunMc2({"run", "true"});
  EXPECT_EQ(r.status, 2);
  r = RunMc2({"run", "-n", "2"});
  EXPECT_EQ(r.status, 2);
}

TEST_F(LauncherTest, UsesMc2ShmDir) {
  const Result r = RunMc2({"run", "-n", "1", "sh", "-c", "readlink /proc/$$/fd/${MC2_SHM_FDS%%,*}"},
                          {{"MC2_SHM_DIR", dir_}});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(dir_ + "/mc2-"));
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

TEST_F(LauncherTest, MissingProgramExits127) {
  const Result r = RunMc2({"run", "-n", "2", "no-such-program-mc2-test"});
  EXPECT_EQ(r.status, 127);
  EXPECT_EQ(r.err,
            "mc2 run: cannot execute 'no-such-program-mc2-test': No such "
            "file or directory\n");
}

TEST_F(LauncherTest, ExecFailureInTheRankExits127) {
  // Passes the launcher's PATH check but exec fails: missing interpreter.
  const std::string script = dir_ + "/bad-interpreter";
  {
    std::ofstream out(script);
    out << "#!/nonexistent/interpreter\n";
  }
  ASSERT_EQ(chmod(script.c_str(), 0755), 0);
  const Result r = RunMc2({"run", "-n", "1", script});
  EXPECT_EQ(r.status, 127) << r.err;
  EXPECT_THAT(r.err,
              HasSubstr("mc2 run: cannot execute '" + script + "': No such file or directory"));
}

TEST_F(LauncherTest, PrintsItsVersion) {
  const Result r = RunMc2({"--version"});
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.out, ::testing::StartsWith("mc2 "));
}

// ---------------------------------------------------------------------------
// The job segments themselves.

class JobSegmentsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/dev/shm/mc2test-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  std::string dir_;
};

TEST_F(JobSegmentsTest, CreatesUnlinkedInheritableInitialisedSegments) {
  shm::JobSegments s = shm::CreateJobSegments(3, 5000, dir_);
  EXPECT_TRUE(std::filesystem::is_empty(dir_)) << "names are unlinked";
  const long page = sysconf(_SC_PAGESIZE);
  EXPECT_EQ(s.heap_bytes % page, 0u);
  EXPECT_GE(s.heap_bytes, 5000u);
  ASSERT_EQ(s.heap_fds.size(), 3u);
  std::vector<int> fds = s.heap_fds;
  fds.push_back(s.control_fd);
  for (int fd : fds) {
    ASSERT_GE(fd, 0);
    EXPECT_EQ(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0) << "ranks inherit it";
    struct stat st;
    ASSERT_EQ(fstat(fd, &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(st.st_nlink, 0u);
    if (fd != s.control_fd) {
      EXPECT_EQ(static_cast<size_t>(st.st_size), s.heap_bytes);
      // Reserved up front: the blocks exist before anyone touches them.
      EXPECT_GE(static_cast<size_t>(st.st_blocks) * 512, s.heap_bytes);
    } else {
      EXPECT_GE(static_cast<size_t>(st.st_size), sizeof(shm::JobControl));
    }
  }
  const shm::JobControl* ctl = s.control;
  ASSERT_NE(ctl, nullptr);
  EXPECT_EQ(ctl->magic, shm::kJobMagic);
  EXPECT_EQ(ctl->world_size, 3);
  EXPECT_EQ(ctl->heap_bytes, s.heap_bytes);
  EXPECT_EQ(ctl->aborted.load(), 0u);
  EXPECT_EQ(ctl->failed_rank.load(), -1);
  EXPECT_EQ(ctl->failure_kind.load(), 0);
  for (const auto& pid : ctl->pids) EXPECT_EQ(pid.load(), 0);

  shm::CloseJobSegments(s);
  EXPECT_EQ(s.control, nullptr);
  EXPECT_EQ(s.control_fd, -1);
  EXPECT_TRUE(s.heap_fds.empty());
  for (int fd : fds) EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "closed";
}

TEST_F(JobSegmentsTest, RejectsBadRequests) {
  try {
    shm::CreateJobSegments(2, size_t{100} << 30, dir_);
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kShmExhausted);
    EXPECT_THAT(e.message(),
                AllOf(HasSubstr(dir_), HasSubstr("free"), HasSubstr("MC2_HEAP_BYTES")));
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
  try {
    shm::CreateJobSegments(1, 4096, dir_ + "/missing");
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kSystem);
    EXPECT_THAT(e.message(), HasSubstr(dir_ + "/missing"));
  }
  for (int n : {0, shm::kMaxRanks + 1}) {
    try {
      shm::CreateJobSegments(n, 4096, dir_);
      ADD_FAILURE() << "no exception";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
  }
}

TEST_F(JobSegmentsTest, FirstRecordedFailureWinsAndIsComplete) {
  shm::JobSegments s = shm::CreateJobSegments(2, 4096, dir_);
  shm::JobControl* ctl = s.control;
  // The launcher's own failure (rank -1) must be able to claim it too.
  EXPECT_TRUE(shm::RecordFailure(ctl, -1, shm::FailureKind::kLauncher, 15, std::string(1000, 'x')));
  EXPECT_FALSE(shm::RecordFailure(ctl, 1, shm::FailureKind::kExit, 3, "late"));
  EXPECT_EQ(ctl->aborted.load(), 1u);
  EXPECT_EQ(ctl->failed_rank.load(), -1);
  EXPECT_EQ(ctl->failure_kind.load(), static_cast<int>(shm::FailureKind::kLauncher));
  EXPECT_EQ(ctl->failure_value.load(), 15);
  EXPECT_EQ(std::string(ctl->reason), std::string(sizeof(ctl->reason) - 1, 'x'));
  shm::CloseJobSegments(s);
}

TEST_F(JobSegmentsTest, ConcurrentRecordersAgreeOnOneWinner) {
  for (int round = 0; round < 20; ++round) {
    shm::JobSegments s = shm::CreateJobSegments(8, 4096, dir_);
    shm::JobControl* ctl = s.control;
    std::atomic<int> winners{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int r = 0; r < 8; ++r) {
      threads.emplace_back([&, r] {
        while (!go.load()) {
        }
        if (shm::RecordFailure(ctl, r, shm::FailureKind::kExit, 100 + r,
                               "rank " + std::to_string(r))) {
          ++winners;
        }
        // Every caller returns only once the record is published.
        EXPECT_EQ(ctl->aborted.load(std::memory_order_acquire), 1u);
      });
    }
    go = true;
    for (auto& t : threads) t.join();
    EXPECT_EQ(winners.load(), 1);
    const int r = ctl->failed_rank.load();
    EXPECT_EQ(ctl->failure_value.load(), 100 + r);
    EXPECT_EQ(std::string(ctl->reason), "rank " + std::to_string(r));
    shm::CloseJobSegments(s);
  }
}

TEST_F(JobSegmentsTest, RecordingWakesFutexWaiters) {
  shm::JobSegments s = shm::CreateJobSegments(1, 4096, dir_);
  shm::JobControl* ctl = s.control;
  // Woken, not timed out: no wait of the waiter may end by its timeout (a
  // wait that starts after the record returns EAGAIN, the value changed).
  int timeouts = 0;
  std::thread waiter([&] {
    const struct timespec timeout = {30, 0};
    while (ctl->aborted.load(std::memory_order_acquire) == 0) {
      // Shared (non-private) futex, as ranks in other processes would use.
      if (syscall(SYS_futex, reinterpret_cast<uint32_t*>(&ctl->aborted), FUTEX_WAIT, 0, &timeout,
                  nullptr, 0) != 0 &&
          errno == ETIMEDOUT)
        ++timeouts;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  shm::RecordFailure(ctl, 0, shm::FailureKind::kAbort, 0, "boom");
  waiter.join();
  EXPECT_EQ(timeouts, 0) << "the record did not wake the futex waiter";
  shm::CloseJobSegments(s);
}

TEST_F(JobSegmentsTest, ALostClaimIsPublishedEvenIfItsWinnerDied) {
  shm::JobSegments s = shm::CreateJobSegments(1, 4096, dir_);
  shm::JobControl* ctl = s.control;
  // As if a rank had claimed the record and been killed before publishing.
  ctl->failure_kind.store(static_cast<int>(shm::FailureKind::kAbort));
  // RecordFailure returns (a wait for the dead winner would hang here) and
  // publishes the abort itself.
  EXPECT_FALSE(shm::RecordFailure(ctl, -1, shm::FailureKind::kLauncher, 2, ""));
  EXPECT_EQ(ctl->aborted.load(), 1u) << "waiters must not hang";
  shm::CloseJobSegments(s);
}

}  // namespace
}  // namespace mc2
