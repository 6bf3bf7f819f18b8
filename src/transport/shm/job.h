// Shared-memory job layout: what `mc2 run` creates before forking the ranks
// and what every rank maps at start-up.
//
// The launcher creates one small control segment and one heap segment per
// rank (files in MC2_SHM_DIR, default /dev/shm), reserves their memory up
// front with posix_fallocate (so a full /dev/shm fails here, with a clear
// message, never later with SIGBUS), unlinks the names at once and passes the
// open descriptors to the ranks. Nothing is left behind in /dev/shm whatever
// happens to the launcher or the ranks afterwards: the memory is freed when
// the last process holding a descriptor or mapping exits.
//
// Environment passed to each rank (all set by the launcher):
//   MC2_RANK, MC2_WORLD_SIZE, MC2_LOCAL_RANK, MC2_LOCAL_SIZE
//   MC2_JOB_ID      unique id of this job (launcher pid + random)
//   MC2_SHM_FDS     "CTL,H0,H1,...,H{N-1}": inherited descriptors of the
//                   control segment and of each rank's heap segment
//   MC2_HEAP_BYTES  size of each heap segment in bytes
#ifndef MC2_TRANSPORT_SHM_JOB_H_
#define MC2_TRANSPORT_SHM_JOB_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mc2::shm {

inline constexpr int kMaxRanks = 256;
inline constexpr uint64_t kJobMagic = 0x6d63324a6f623031ull;  // "mc2Job01"

// How a job ended abnormally; stored in JobControl::failure_kind.
enum class FailureKind : int32_t {
  kNone = 0,
  kExit = 1,    // failure_value = exit status (non-zero)
  kSignal = 2,  // failure_value = signal number
  kAbort = 3,   // a rank called Abort (e.g. after an mc2::Error); failure_value =
                //   its ErrorCode, see reason
  kLauncher = 4 // the launcher was interrupted (SIGINT/SIGTERM)
};

// Lives at offset 0 of the control segment. Plain-old-data with atomics so
// that it can be shared across processes (lock-free atomics only).
struct JobControl {
  uint64_t magic;
  int32_t world_size;
  int32_t pad0;
  uint64_t heap_bytes;
  // 0 while the job runs; set to 1 (once, by compare-exchange) by whoever
  // first records a failure. Ranks poll it while they wait.
  std::atomic<uint32_t> aborted;
  std::atomic<int32_t> failed_rank;     // -1 if not a rank
  std::atomic<int32_t> failure_kind;    // FailureKind
  std::atomic<int32_t> failure_value;   // exit status, signal number or ErrorCode
  char reason[512];                     // NUL-terminated, written before `aborted`
  std::atomic<int32_t> pids[kMaxRanks]; // each rank stores getpid() at start-up
};

// Records a failure if none is recorded yet; returns true if this call
// recorded it. Safe to call from any process that maps the control segment.
bool RecordFailure(JobControl* ctl, int rank, FailureKind kind, int value,
                   const std::string& reason);

// The descriptors of a job. Owned by the launcher; the ranks inherit them.
struct JobSegments {
  int control_fd = -1;
  std::vector<int> heap_fds;
  JobControl* control = nullptr;  // the launcher's own mapping
  size_t heap_bytes = 0;
};

// Creates and reserves the segments of a job with `world_size` ranks and
// `heap_bytes` per rank in directory `dir` (usually MC2_SHM_DIR or /dev/shm).
// Throws mc2::Error(kShmExhausted) naming the directory, the bytes wanted and
// the bytes free when the reservation fails, kSystem for other errors.
JobSegments CreateJobSegments(int world_size, size_t heap_bytes,
                              const std::string& dir);
// Closes the descriptors and unmaps the control block (launcher side).
void CloseJobSegments(JobSegments& segments);

}  // namespace mc2::shm

#endif  // MC2_TRANSPORT_SHM_JOB_H_
