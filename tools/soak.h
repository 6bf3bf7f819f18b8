// `mc2 soak`: a long randomized run of collectives and fused operators whose
// every result is checked, optionally with injected faults.
//
// Two halves, like `mc2 bench`: the command run by the user (the driver,
// soak_command.cc) starts jobs of N ranks through `mc2 run`, each rank
// re-executing `mc2 soak` with internal options (RankArgs) and running the
// random operations (soak_rank.cc). Ranks report to the driver through
// files in a per-job directory, not through their output, so the driver
// learns each rank's outcome even when the launcher ends the job:
//
//   rank-R.pid    "PID" of rank R, written at start (the leak check)
//   rank-R.out    written when the rank stops, one item per line:
//                   ops N          operations this rank issued
//                   checked N      elements compared with the reference
//                   wrong N        of which differed (or canaries touched)
//                   error CODE T_NS WHAT
//                                  the mc2::Error that ended the rank
//                                  (T_NS: CLOCK_MONOTONIC when caught; CODE
//                                  is ErrorCodeName or "exception")
//                   noerror        faults mode: no error came within the bound
//                   bad TEXT       up to 8 descriptions of wrong results
//                 and last "end" (a file without it is a rank that died)
//   victim        faults mode: "KIND PID T_NS" written by the victim just
//                 before it signals itself (KIND: kill or stop)
#ifndef MC2_TOOLS_SOAK_H_
#define MC2_TOOLS_SOAK_H_

#include <cstdint>
#include <string>

namespace mc2::tools::soak {

// What a rank of a soak job does (the internal options of `mc2 soak`).
struct RankArgs {
  std::string dir;        // the job directory (files above)
  uint64_t seed = 1;      // the operation sequence; the same on every rank
  double seconds = 10;    // run time when no fault is injected
  // Faults mode: rank `victim` SIGKILLs ("kill") or SIGSTOPs ("stop") itself
  // `delay_ms` after it starts (0: before it creates the world); the others
  // run until an error (at most `max_seconds`).
  int victim = -1;
  std::string fault;
  double delay_ms = 0;
  double max_seconds = 60;
  // Self-test of the checking (tests only): rank 0 flips a bit of the
  // output of every N-th collective after it completes, so the run must
  // report wrong results. 0 = off.
  int corrupt_every = 0;
};

// Runs one rank of a soak job (inside `mc2 run`). Returns the exit status:
// 0 when every result was right and no error happened, 1 otherwise (in
// faults mode 0 once the expected error was caught and written down).
int RunSoakRank(const RankArgs& args);

}  // namespace mc2::tools::soak

#endif  // MC2_TOOLS_SOAK_H_
