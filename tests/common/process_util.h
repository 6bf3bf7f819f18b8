// Helpers for tests that launch `mc2` (and the programs it runs) as real
// processes: spawn with a clean MC2_* environment, collect output and exit
// status with a timeout, and inspect /dev/shm and the process table.
#ifndef MC2_TESTS_COMMON_PROCESS_UTIL_H_
#define MC2_TESTS_COMMON_PROCESS_UTIL_H_

#include <gtest/gtest.h>
#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace mc2::testing {

using Clock = std::chrono::steady_clock;

// Path of the built `mc2` command and of the test programs.
extern const std::string kMc2;
std::string TestProgram(const std::string& name);  // e.g. "fault_probe"
constexpr size_t kTestHeapBytes = 4 << 20;  // keeps every job cheap

double SecondsSince(Clock::time_point start);
std::vector<std::string> Lines(const std::string& text);
// Lines of `text` that start with `prefix`, in order.
std::vector<std::string> LinesWithPrefix(const std::string& text, const std::string& prefix);
// Names of the mc2-* entries in /dev/shm.
std::set<std::string> ShmEntries();
// True if `pid` has ended (a zombie counts as gone).
bool ProcessGone(pid_t pid);
bool WaitUntilGone(const std::vector<pid_t>& pids, double seconds);
// Every job Spawn starts carries kJobTagVariable=JobTag() (unique to this
// test process) in its environment, inherited by its ranks and anything
// they start; TaggedProcesses finds those still running. Other jobs on the
// machine (another test binary, a developer's run) are never matched.
inline constexpr const char* kJobTagVariable = "MC2TEST_JOB_TAG";
const std::string& JobTag();
std::vector<pid_t> TaggedProcesses();

struct Result {
  int status = -1;  // exit status, or 128 + signal
  bool timed_out = false;
  double seconds = 0;
  std::string out;
  std::string err;
};

// `mc2` started by Spawn and collected by Wait.
struct Launch {
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
  Clock::time_point start;
};

// Environment overrides: a value sets the variable, nullopt unsets it.
using EnvOverrides = std::map<std::string, std::optional<std::string>>;

// Starts `mc2 ARGS...` with MC2_HEAP_BYTES=kTestHeapBytes, no MC2_* variable
// from the caller's environment, and `env` applied on top.
Launch Spawn(const std::vector<std::string>& args, EnvOverrides env = {});
// `env` plus leak detection off for MPI ranks built with ASan:
// Open MPI 4.1 leaves allocations of its plug-ins (unloaded at
// MPI_Finalize, so their stacks name no module) at exit, which
// LeakSanitizer cannot tell from a leak of ours. Every other check of
// ASan stays on.
EnvOverrides MpiRankEnv(EnvOverrides env);
// mpirun's path, and its options for `ranks` processes on this host over
// loopback TCP (root allowed, more ranks than cores allowed), followed by
// `program` and its arguments.
inline constexpr char kMpirun[] = "/usr/bin/mpirun";
std::vector<std::string> MpirunOnThisHost(int ranks, std::vector<std::string> program);
// The same for another program (an absolute path), e.g. mpirun.
Launch SpawnProgram(const std::string& program, const std::vector<std::string>& args,
                    EnvOverrides env = {});
// Collects the output and the exit status; kills the launcher if it is still
// running after `timeout` seconds (then timed_out is set).
Result Wait(Launch& launch, double timeout = 10);
Result RunMc2(const std::vector<std::string>& args, EnvOverrides env = {}, double timeout = 10);

// A fixture that fails a test which leaves an mc2-* entry in /dev/shm or a
// process of its jobs running (and kills such processes).
class LeakCheckedTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

 private:
  std::set<std::string> shm_before_;
};

}  // namespace mc2::testing

#endif  // MC2_TESTS_COMMON_PROCESS_UTIL_H_
