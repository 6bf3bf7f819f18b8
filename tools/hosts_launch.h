// `mc2 run --hosts a:2,b:2 PROGRAM`: a job across hosts, started by mpirun.
//
// mc2 does not start processes on other machines itself: it builds the
// Open MPI command line that does (docs/multi-host.md) and replaces itself
// with it. The ranks then find their world with Group::FromEnv, as under
// mpirun directly, and get the rank variables `mc2 run` gives on one host
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) from Open MPI's, with
// MASTER_ADDR the first host and MASTER_PORT 29500 (torch's default).
#ifndef MC2_TOOLS_HOSTS_LAUNCH_H_
#define MC2_TOOLS_HOSTS_LAUNCH_H_

#include <cstddef>
#include <string>
#include <vector>

namespace mc2::tools {

struct HostsLaunch {
  std::string hosts;        // "a:2,b:2": host names and rank counts
  std::string mpirun_args;  // more mpirun options, split at white space
  int nranks = 0;           // 0, or the sum of the counts (checked)
  size_t heap_bytes = 0;    // 0: MC2_HEAP_BYTES of the environment, if set
  std::vector<std::string> argv;  // PROGRAM [ARGS...]
  bool dry_run = false;     // print the line instead of running it
};

// The mpirun command line for `h`, or throws mc2::Error(kInvalidArgument)
// naming what is wrong with the host list.
std::vector<std::string> MpirunLine(const HostsLaunch& h);
// Execs the line (or prints it, dry_run, and returns 0). Returns
// kExitUsage for a bad host list and kExitCannotExecute when mpirun cannot
// be run; diagnostics on stderr, prefixed "mc2 run: ".
int RunOnHosts(const HostsLaunch& h);

}  // namespace mc2::tools

#endif  // MC2_TOOLS_HOSTS_LAUNCH_H_
