// Creation of the shared-memory segments of a job (launcher side) and the
// cross-process failure record (both sides). See job.h for the layout and the
// environment protocol.
#include "transport/shm/job.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <limits>
#include <new>
#include <random>

#include "mc2/error.h"

namespace mc2::shm {

// The control block is shared between processes through a plain mapping, so
// its atomics must be address-free (lock-free) and `aborted` must be a plain
// 32-bit word that the kernel's futex calls can operate on.
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<int32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
static_assert(alignof(JobControl) >= alignof(uint32_t));

namespace {

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// Rounds up to a multiple of the page size; returns 0 on overflow.
size_t RoundUpToPage(size_t bytes) {
  const size_t page = PageSize();
  if (bytes > std::numeric_limits<size_t>::max() - (page - 1)) return 0;
  return (bytes + page - 1) / page * page;
}

size_t ControlBytes() { return RoundUpToPage(sizeof(JobControl)); }

// "268435456 bytes (256.0 MiB)": exact for scripts, readable for people.
std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024.0 && unit + 1 < static_cast<int>(std::size(kUnits))) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{} bytes ({:.1f} {})", bytes, value, kUnits[unit]);
}

// Free bytes of the file system holding `dir` for an unprivileged user, or -1
// (with errno set) if statvfs fails.
int64_t FreeBytes(const std::string& dir) {
  struct statvfs vfs;
  if (statvfs(dir.c_str(), &vfs) != 0) return -1;
  const unsigned __int128 free_bytes = static_cast<unsigned __int128>(vfs.f_bavail) * vfs.f_frsize;
  return static_cast<int64_t>(
      std::min<unsigned __int128>(free_bytes, std::numeric_limits<int64_t>::max()));
}

// Names only exist between open() and unlink(), so they just need to be
// unique among concurrent launchers: the pid plus 64 random bits.
std::string NewFileId() {
  std::random_device device;
  const uint64_t random = (static_cast<uint64_t>(device()) << 32) ^ device();
  return fmt::format("{}-{:016x}", getpid(), random);
}

[[noreturn]] void ThrowSystem(const std::string& what, int err) {
  throw Error(ErrorCode::kSystem, fmt::format("{}: {} (errno {})", what, std::strerror(err), err));
}

// What a reservation needs to produce the kShmExhausted message.
struct Request {
  const std::string& dir;
  int world_size;
  size_t heap_bytes;     // per rank, page-rounded
  size_t control_bytes;  // page-rounded
  int64_t free_before;   // bytes free in `dir` before we started, or -1
};

[[noreturn]] void ThrowExhausted(const Request& request, int err) {
  const unsigned __int128 total =
      static_cast<unsigned __int128>(request.heap_bytes) * request.world_size +
      request.control_bytes;
  const uint64_t total64 = static_cast<uint64_t>(
      std::min<unsigned __int128>(total, std::numeric_limits<uint64_t>::max()));
  std::string cause = err != 0 ? fmt::format(" ({})", std::strerror(err)) : "";
  std::string free_text = request.free_before >= 0
                              ? FormatBytes(static_cast<uint64_t>(request.free_before)) + " free"
                              : "free space unknown";
  throw Error(ErrorCode::kShmExhausted,
              fmt::format("cannot reserve shared memory in {}{}: {} ranks x {} per rank "
                          "(+ {} control) = {} wanted, {}. Lower the per-rank heap with "
                          "MC2_HEAP_BYTES (e.g. MC2_HEAP_BYTES=64M) or `mc2 run --heap`, use "
                          "fewer ranks, or point MC2_SHM_DIR at a larger tmpfs",
                          request.dir, cause, request.world_size, FormatBytes(request.heap_bytes),
                          FormatBytes(request.control_bytes), FormatBytes(total64), free_text));
}

// Creates `dir`/`name` exclusively and unlinks it at once: from then on only
// the descriptor (and later the mappings) keep the memory alive, so nothing
// can be left in the directory even if this process is SIGKILLed. The
// descriptor is deliberately NOT close-on-exec: the ranks inherit it.
int CreateUnlinked(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name;
  int fd;
  do {
    fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) ThrowSystem(fmt::format("cannot create {}", path), errno);
  if (unlink(path.c_str()) != 0) {
    const int err = errno;
    close(fd);
    ThrowSystem(fmt::format("cannot unlink {}", path), err);
  }
  return fd;
}

// Reserves the pages now, so that a full file system fails here with a clear
// message instead of with SIGBUS on first touch inside a collective.
void Reserve(int fd, size_t bytes, const Request& request) {
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    if (err == EFBIG || err == EINVAL) ThrowExhausted(request, err);
    ThrowSystem(fmt::format("cannot size a segment in {}", request.dir), err);
  }
  int err;
  // posix_fallocate returns the error instead of setting errno.
  do {
    err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  } while (err == EINTR);
  if (err == 0) return;
  if (err == ENOSPC || err == ENOMEM || err == EFBIG) {
    ThrowExhausted(request, err);
  }
  ThrowSystem(fmt::format("cannot reserve a segment in {}", request.dir), err);
}

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const struct timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word lives in memory shared by processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// Publishes `aborted` = 1 and wakes every process sleeping on it.
void PublishAborted(JobControl* ctl) {
  ctl->aborted.store(1, std::memory_order_release);
  Futex(&ctl->aborted, FUTEX_WAKE, INT_MAX, nullptr);
}

// Called by a RecordFailure that lost the claim: waits (briefly) until the
// winner publishes. If the winner died between its claim and its publish
// (e.g. SIGKILLed in that window), publish on its behalf so that nobody
// waits forever for an abort that was decided.
void AwaitPublished(JobControl* ctl) {
  // Far longer than the few stores between a winner's claim and its publish.
  constexpr long kMaxWaitNs = 100'000'000;
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  while (ctl->aborted.load(std::memory_order_acquire) == 0) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const long elapsed =
        (now.tv_sec - start.tv_sec) * 1'000'000'000L + (now.tv_nsec - start.tv_nsec);
    if (elapsed >= kMaxWaitNs) {
      PublishAborted(ctl);
      return;
    }
    const long left = kMaxWaitNs - elapsed;
    const struct timespec timeout = {left / 1'000'000'000L, left % 1'000'000'000L};
    Futex(&ctl->aborted, FUTEX_WAIT, 0, &timeout);
  }
}

}  // namespace

// Ordering protocol. `failure_kind` is the claim word: it goes 0 -> kind
// exactly once (compare-exchange), which elects one writer even when the
// launcher (rank -1) and several ranks fail at the same moment. Only the
// winner writes failed_rank, failure_value and reason, and then stores
// aborted = 1 with release semantics and futex-wakes the waiters. Readers
// must load `aborted` with acquire and read the other fields only once it is
// 1; a non-zero failure_kind alone does NOT mean the fields are complete.
// `reason` starts all-zero and at most sizeof(reason) - 1 bytes are written,
// so it is NUL-terminated even if read while being written.
bool RecordFailure(JobControl* ctl, int rank, FailureKind kind, int value,
                   const std::string& reason) {
  if (ctl == nullptr || kind == FailureKind::kNone) return false;
  int32_t expected = static_cast<int32_t>(FailureKind::kNone);
  if (!ctl->failure_kind.compare_exchange_strong(expected, static_cast<int32_t>(kind),
                                                 std::memory_order_acq_rel)) {
    AwaitPublished(ctl);
    return false;
  }
  ctl->failed_rank.store(rank, std::memory_order_relaxed);
  ctl->failure_value.store(value, std::memory_order_relaxed);
  const size_t n = std::min(reason.size(), sizeof(ctl->reason) - 1);
  std::memcpy(ctl->reason, reason.data(), n);
  ctl->reason[n] = '\0';
  PublishAborted(ctl);
  return true;
}

JobSegments CreateJobSegments(int world_size, size_t heap_bytes, const std::string& dir) {
  if (world_size < 1 || world_size > kMaxRanks) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("world size {} is out of range 1..{}", world_size, kMaxRanks));
  }
  if (heap_bytes == 0) {
    throw Error(ErrorCode::kInvalidArgument, "the per-rank heap size must be positive");
  }
  // Heaps are page-rounded so that every segment can be mapped whole and
  // starts page-aligned; JobSegments::heap_bytes reports the rounded size.
  const int64_t free_before = FreeBytes(dir);
  if (free_before < 0) {
    ThrowSystem(fmt::format("cannot use shared-memory directory {}", dir), errno);
  }
  const size_t rounded = RoundUpToPage(heap_bytes);
  Request request{dir, world_size, rounded != 0 ? rounded : heap_bytes, ControlBytes(),
                  free_before};
  // Fast path: fail before touching any memory when the request cannot fit.
  // posix_fallocate below stays the authority (the space may shrink).
  const unsigned __int128 total =
      static_cast<unsigned __int128>(request.heap_bytes) * world_size + request.control_bytes;
  if (rounded == 0 || total > static_cast<unsigned __int128>(request.free_before)) {
    ThrowExhausted(request, 0);
  }

  JobSegments segments;
  segments.heap_bytes = request.heap_bytes;
  try {
    const std::string id = NewFileId();
    segments.control_fd = CreateUnlinked(dir, fmt::format("mc2-{}-ctl", id));
    Reserve(segments.control_fd, request.control_bytes, request);
    segments.heap_fds.reserve(world_size);
    for (int r = 0; r < world_size; ++r) {
      segments.heap_fds.push_back(CreateUnlinked(dir, fmt::format("mc2-{}-heap-{}", id, r)));
      Reserve(segments.heap_fds.back(), request.heap_bytes, request);
    }
    void* base = mmap(nullptr, request.control_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                      segments.control_fd, 0);
    if (base == MAP_FAILED) {
      ThrowSystem(fmt::format("cannot map the control segment in {}", dir), errno);
    }
    // The file is fresh (all zero); construct the object properly anyway.
    // No rank exists yet, so plain stores suffice; magic goes last so a
    // reader that checks it sees a complete block.
    JobControl* ctl = new (base) JobControl();
    segments.control = ctl;
    ctl->world_size = world_size;
    ctl->heap_bytes = request.heap_bytes;
    ctl->aborted.store(0, std::memory_order_relaxed);
    ctl->failed_rank.store(-1, std::memory_order_relaxed);
    ctl->failure_kind.store(static_cast<int32_t>(FailureKind::kNone), std::memory_order_relaxed);
    ctl->failure_value.store(0, std::memory_order_relaxed);
    for (auto& pid : ctl->pids) pid.store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    ctl->magic = kJobMagic;
  } catch (...) {
    CloseJobSegments(segments);
    throw;
  }
  return segments;
}

void CloseJobSegments(JobSegments& segments) {
  if (segments.control != nullptr) {
    munmap(segments.control, ControlBytes());
    segments.control = nullptr;
  }
  if (segments.control_fd >= 0) close(segments.control_fd);
  segments.control_fd = -1;
  for (int fd : segments.heap_fds) {
    if (fd >= 0) close(fd);
  }
  segments.heap_fds.clear();
  segments.heap_bytes = 0;
}

}  // namespace mc2::shm
