// `mc2 run`: starts the ranks of a single-host job and supervises them.
//
// The launcher creates the job's shared-memory segments (transport/shm/job.h),
// forks and execs N copies of the program with the MC2_* environment and
// torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR=127.0.0.1 and a free MASTER_PORT), relays their output
// (prefixed "[rank] " per line by default; a Python rank's failed import of
// torch or mc2 makes it name the interpreter that ran), and tears the whole
// job down as soon as any rank fails or the launcher is interrupted. It never
// leaves processes or /dev/shm files behind: the segments are unlinked at
// creation, every rank has PR_SET_PDEATHSIG(SIGKILL) so that it dies with the
// launcher, and the launcher reaps every rank (and kills any processes a rank
// left in its process group when it exits).
#ifndef MC2_TOOLS_LAUNCHER_H_
#define MC2_TOOLS_LAUNCHER_H_

#include <cstddef>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace mc2::tools {

inline constexpr size_t kDefaultHeapBytes = transport::kDefaultJobHeapBytes;
inline constexpr const char* kDefaultShmDir = transport::kDefaultShmDir;

// Exit statuses of RunLaunch besides the ranks' own.
inline constexpr int kExitLaunchFailed = 1;  // e.g. /dev/shm too small
inline constexpr int kExitUsage = 2;         // bad option or env variable
inline constexpr int kExitCannotExecute = 127;


struct LaunchOptions {
  int nranks = 0;
  // The ranks' binding policy (core/placement.h), passed as MC2_BIND:
  // auto, none, core, socket or numa; empty leaves MC2_BIND as it is.
  std::string bind;
  // PROGRAM followed by its arguments; PROGRAM is searched in PATH.
  std::vector<std::string> argv;
  // Prefix every line of a rank's stdout/stderr with "[rank] ". When false
  // the bytes are passed through unchanged.
  bool prefix_output = true;
  // The ranks write to the launcher's own stdout and stderr, not through
  // it (prefix_output is then ignored). For benchmarks: relaying a line
  // wakes the launcher, which on a host with a CPU per rank takes a CPU
  // from a rank in the middle of the next measurement, and small
  // collectives measured while a line is relayed come out slower. Not when
  // stdout or stderr is a terminal that stops background
  // process groups writing to it (TOSTOP), since every rank runs in a
  // process group of its own: the launcher then relays.
  bool direct_output = false;
  // Heap segment bytes per rank; 0 means MC2_HEAP_BYTES, else 256 MiB. Both
  // that variable and `mc2 run --heap` take core::ParseBytes' forms ("512M").
  size_t heap_bytes = 0;
  // Directory for the segments; empty means MC2_SHM_DIR, else /dev/shm.
  std::string shm_dir;
  // After a rank fails (or on SIGINT/SIGTERM) the other ranks get this long
  // to exit by themselves before they are SIGKILLed.
  double grace_seconds = 1.5;
};

// Runs the job and returns the launcher's exit status: 0 if every rank exited
// 0; the first failing rank's exit status, or 128 + signal if it was killed;
// 130/143 (128 + signal) if the launcher got SIGINT/SIGTERM (129 for SIGHUP);
// kExitUsage for invalid options or environment, kExitCannotExecute if the
// program cannot be executed, kExitLaunchFailed if the job cannot be set up.
// Diagnostics go to stderr, prefixed "mc2 run: ".
//
// Call it from the main thread while no other thread runs: the ranks'
// PR_SET_PDEATHSIG fires when the forking *thread* exits, and SIGCHLD/SIGINT/
// SIGTERM are blocked only in the calling thread, so another thread with them
// unblocked could swallow them. It restores the signal mask and the SIGPIPE
// disposition before returning, so it may be called repeatedly.
int RunLaunch(const LaunchOptions& options);

// The path of the running executable (/proc/self/exe resolved), for the
// tools that re-execute themselves as the ranks of a job.
std::string SelfExe();

}  // namespace mc2::tools

#endif  // MC2_TOOLS_LAUNCHER_H_
