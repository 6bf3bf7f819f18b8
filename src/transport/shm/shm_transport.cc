#include "transport/shm/shm_transport.h"

#include <fmt/format.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "core/copy.h"
#include "core/enforce.h"
#include "core/env.h"
#include "core/log.h"

namespace mc2::shm {
namespace {

constexpr int kSliceMs = 10;
// Default spinning phase of a wait with a core per rank, and yielding
// phase with more ranks than cores (see WaitGE; MC2_SPIN_US overrides).
constexpr int64_t kDedicatedSpinNs = 200000;
constexpr int64_t kOversubscribedYieldNs = 2000000;

long Futex(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* ts) {
  // Not FUTEX_PRIVATE: the word may live in memory shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, ts, nullptr, 0);
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             transport::Clock::now().time_since_epoch()).count();
}

std::string DescribeFailure(const JobControl* ctl) {
  int r = ctl->failed_rank.load(std::memory_order_acquire);
  int v = ctl->failure_value.load(std::memory_order_relaxed);
  int pid = r >= 0 && r < kMaxRanks ? ctl->pids[r].load(std::memory_order_relaxed) : 0;
  // A rank that died before it stored its pid (during set-up) has none.
  const std::string who =
      pid > 0 ? fmt::format("rank {} (pid {})", r, pid) : fmt::format("rank {}", r);
  switch (static_cast<FailureKind>(ctl->failure_kind.load(std::memory_order_relaxed))) {
    case FailureKind::kExit:
      return fmt::format("{} exited with status {}", who, v);
    case FailureKind::kSignal:
      return v > 0 ? fmt::format("{} was killed by signal {} ({})", who, v, strsignal(v))
                   : fmt::format("{} has exited", who);
    case FailureKind::kLauncher:
      return "the launcher was interrupted and is ending all ranks";
    case FailureKind::kAbort:
    case FailureKind::kNone:
      break;
  }
  return std::string(ctl->reason);
}

// The code every rank raises for the recorded failure: kPeerDied for a rank
// that ended, kMismatch when a rank aborted on finding that the ranks called
// different operations (the program's error is the same on every rank, and
// which rank sees it first is a race), kAborted otherwise.
ErrorCode RecordedCode(const JobControl* ctl) {
  switch (static_cast<FailureKind>(ctl->failure_kind.load(std::memory_order_relaxed))) {
    case FailureKind::kExit:
    case FailureKind::kSignal:
      return ErrorCode::kPeerDied;
    case FailureKind::kAbort:
      if (ctl->failure_value.load(std::memory_order_relaxed) ==
          static_cast<int>(ErrorCode::kMismatch))
        return ErrorCode::kMismatch;
      return ErrorCode::kAborted;
    case FailureKind::kLauncher:
    case FailureKind::kNone:
      break;
  }
  return ErrorCode::kAborted;
}

// "; rank 2 (pid 812) is stopped" for every peer process that is stopped
// (SIGSTOP, a debugger) or traced, read from /proc/PID/stat; "" if none.
// A timeout is often a chain -- rank 0 waits for rank 1, which waits in an
// earlier operation for the stopped rank 2 -- so the waiter that times out
// may not be waiting for the culprit directly: naming every stopped peer
// makes the error point at it whichever rank raises first. Read only when a
// timeout is raised, so it costs nothing in the common path.
std::string DescribeStoppedPeers(const JobControl* ctl, int self, int size) {
  std::string out;
  for (int r = 0; r < size && r < kMaxRanks; ++r) {
    if (r == self) continue;
    const int pid = ctl->pids[r].load(std::memory_order_acquire);
    if (pid <= 0) continue;
    FILE* f = std::fopen(fmt::format("/proc/{}/stat", pid).c_str(), "r");
    if (f == nullptr) continue;
    char buf[512];
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[n] = '\0';
    // "PID (COMM) STATE ...": COMM may contain ')' and spaces, so the state
    // follows the last ')'.
    const char* paren = std::strrchr(buf, ')');
    if (paren == nullptr || paren[1] != ' ') continue;
    const char state = paren[2];
    if (state == 'T' || state == 't')
      out += fmt::format("; rank {} (pid {}) is {}", r, pid,
                         state == 'T' ? "stopped (SIGSTOP?)" : "stopped by a debugger");
  }
  return out;
}

}  // namespace

WorldMemory::~WorldMemory() {
  if (anonymous) {
    for (char* h : heaps)
      if (h) munmap(h, heap_bytes);
    if (control) munmap(control, control_bytes);
  } else {
    for (char* h : heaps)
      if (h) munmap(h, heap_bytes);
    if (control) munmap(control, control_bytes);
  }
}

ShmTransport::ShmTransport(std::shared_ptr<WorldMemory> mem, int rank, int size, bool threads,
                           std::vector<int> pidfds)
    : mem_(std::move(mem)), rank_(rank), size_(size), threads_(threads),
      pidfds_(std::move(pidfds)) {
  // Ranks that are processes compete for the cores; threads of one process
  // (tests) are judged the same way.
  oversubscribed_ = size_ > core::HostCpus();
  // MC2_SPIN_US, when set, is the budget as given (0: sleep at once, to
  // save CPU); unset, budgets long enough to keep small collectives out of
  // the sleep/wake cycle (see WaitGE).
  spin_ns_ = core::GetEnv("MC2_SPIN_US")
                 ? core::EnvInt("MC2_SPIN_US", 20, 0, 1000000) * 1000
                 : (oversubscribed_ ? kOversubscribedYieldNs : kDedicatedSpinNs);
}

ShmTransport::~ShmTransport() {
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
}

void ShmTransport::Publish(uint64_t off, uint64_t value, size_t /*payload_bytes*/) {
  Flag(rank_, off).store(value, std::memory_order_release);
  Ring(rank_);
}

void ShmTransport::RemoteAdd(int owner, uint64_t off, uint64_t value, size_t /*payload_bytes*/) {
  Flag(owner, off).fetch_add(value, std::memory_order_acq_rel);
  Ring(owner);
}

void ShmTransport::SleepUntil(const std::function<bool()>& ready,
                              transport::Clock::duration max) {
  RankHeader* h = Header(rank_);
  h->sleepers.fetch_add(1, std::memory_order_seq_cst);
  uint32_t bell = h->doorbell.load(std::memory_order_acquire);
  if (!ready()) {
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(max).count();
    if (ns > 0) {
      timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      Futex(&h->doorbell, FUTEX_WAIT, bell, &ts);
    }
  }
  h->sleepers.fetch_sub(1, std::memory_order_relaxed);
}

void ShmTransport::Ring(int owner) {
  // Pairs with the waiter's sleepers increment: either it sees our store
  // before sleeping, or we see it sleeping and ring (Dekker on seq_cst).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  RankHeader* h = Header(owner);
  if (h->sleepers.load(std::memory_order_relaxed) != 0) {
    h->doorbell.fetch_add(1, std::memory_order_release);
    Futex(&h->doorbell, FUTEX_WAKE, INT32_MAX, nullptr);
  }
}

uint64_t ShmTransport::Peek(int owner, uint64_t off) {
  return Flag(owner, off).load(std::memory_order_acquire);
}

void ShmTransport::WaitGE(int owner, uint64_t off, uint64_t value,
                          const transport::WaitContext& ctx) {
  auto flag = Flag(owner, off);
  if (flag.load(std::memory_order_acquire) >= value) return;

  // Phase 1: spin, then yield, for spin_ns_ (MC2_SPIN_US, else the defaults
  // below): the common case of a peer a few microseconds behind costs no
  // system call.
  // The clock is read only once the flag has not come for 256 pauses:
  // in a VM a clock read can cost as much as a cross-core handshake.
  // With more ranks than cores the peer we wait for is likely not running:
  // give up the core at once instead of spinning.
  const int pure_spins = oversubscribed_ ? 0 : 256;
  for (int i = 0; i < pure_spins; ++i) {
    if (flag.load(std::memory_order_acquire) >= value) return;
    core::CpuRelax();
  }
  // Then keep spinning for a while before sleeping. Going to sleep makes
  // the peer's Publish pay a futex wake (a system call) and our return a
  // scheduler wake-up, each many times a small collective's cost. Once one
  // wait sleeps, the peer's next wait for us is as long, so both keep
  // sleeping; a budget of kDedicatedSpinNs keeps a loaded host's small
  // collectives out of that cycle, as Open MPI (which never sleeps) is. The
  // budget stays bounded: then the wait sleeps and checks health and the
  // deadline as before.
  //
  // Spin yielding, so that a peer sharing this core can run and publish
  // (sched_yield returns at once otherwise). Even with a core per rank the
  // yields are needed: on a loaded host the two ranks of a job can end up
  // on one core, and pure spinning then holds the peer off for the whole
  // budget. With more ranks than cores, yield at every check, for the
  // longer kOversubscribedYieldNs by default: the peer we wait for is
  // usually waiting for a core, and a yield hands it ours.
  const int64_t spin_end = NowNs() + spin_ns_;
  const int yield_mask = oversubscribed_ ? 0 : 15;
  for (int i = 0;; ++i) {
    if (flag.load(std::memory_order_acquire) >= value) return;
    if ((i & yield_mask) == yield_mask) {
      if (NowNs() >= spin_end) break;
      sched_yield();
    } else {
      core::CpuRelax();
    }
  }

  // Phase 2: sleep on the owner's doorbell in slices, checking health.
  RankHeader* h = Header(owner);
  if (*ctx.deadline == transport::Clock::time_point{})
    *ctx.deadline = transport::Clock::now() + ctx.timeout;
  const transport::Clock::time_point deadline = *ctx.deadline;
  // A long wait says what it waits for well before its timeout, so that a
  // person watching a stuck job learns who holds it up: first after
  // min(10 s, timeout / 4) of this wait, then at doubling intervals.
  const transport::Clock::time_point wait_start = transport::Clock::now();
  transport::Clock::duration note_after =
      std::min<transport::Clock::duration>(std::chrono::seconds(10), ctx.timeout / 4);
  transport::Clock::time_point next_note = wait_start + note_after;
  for (;;) {
    h->sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint32_t bell = h->doorbell.load(std::memory_order_acquire);
    if (flag.load(std::memory_order_seq_cst) >= value) {
      h->sleepers.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    auto now = transport::Clock::now();
    auto left = deadline - now;
    auto slice = std::min<transport::Clock::duration>(left, std::chrono::milliseconds(kSliceMs));
    if (slice.count() > 0) {
      auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
      timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      Futex(&h->doorbell, FUTEX_WAIT, bell, &ts);
    }
    h->sleepers.fetch_sub(1, std::memory_order_relaxed);
    if (flag.load(std::memory_order_acquire) >= value) return;
    try {
      CheckHealth();
    } catch (const Error& e) {
      // A peer may have published and then exited normally: the flag wins.
      if (flag.load(std::memory_order_acquire) >= value) return;
      // Name the operation that was waiting.
      throw Error(e.code(), e.message(), rank_, ctx.op, ctx.seq);
    }
    if (const auto now_checked = transport::Clock::now();
        now_checked >= next_note && now_checked < deadline) {
      const std::string missing = ctx.describe_missing ? ctx.describe_missing() : "a peer";
      MC2_LOG(kWarn, "{} #{} on rank {} still waiting for {} after {:.1f} s (timeout in {:.1f} s)",
              ctx.op, ctx.seq, rank_, missing,
              std::chrono::duration<double>(now_checked - wait_start).count(),
              std::chrono::duration<double>(deadline - now_checked).count());
      note_after *= 2;
      next_note = now_checked + note_after;
    }
    if (transport::Clock::now() >= deadline) {
      std::string missing = ctx.describe_missing ? ctx.describe_missing() : std::string();
      const std::string stopped =
          threads_ ? std::string() : DescribeStoppedPeers(mem_->control, rank_, size_);
      throw Error(ErrorCode::kTimeout,
                  fmt::format("timed out{}{}{}", missing.empty() ? "" : " waiting for ", missing,
                              stopped),
                  rank_, ctx.op, ctx.seq);
    }
  }
}

void ShmTransport::ThrowRecordedFailure(const transport::WaitContext* ctx) {
  const JobControl* ctl = mem_->control;
  throw Error(RecordedCode(ctl), DescribeFailure(ctl), rank_, ctx ? ctx->op : "",
              ctx ? ctx->seq : 0);
}

void ShmTransport::CheckHealth(bool thorough) {
  JobControl* ctl = mem_->control;
  if (ctl->aborted.load(std::memory_order_acquire)) ThrowRecordedFailure(nullptr);
  if (!thorough || pidfds_.empty()) return;
  std::vector<pollfd> fds;
  fds.reserve(pidfds_.size());
  for (int fd : pidfds_)
    if (fd >= 0) fds.push_back({fd, POLLIN, 0});
  if (poll(fds.data(), fds.size(), 0) <= 0) return;
  for (int r = 0, i = 0; r < size_; ++r) {
    if (pidfds_[r] < 0) continue;
    if (fds[i++].revents & POLLIN) {
      // The launcher usually records how the rank ended; give it a moment
      // so the error can say "killed by signal 9" instead of "has exited".
      for (int k = 0; k < 20 && !ctl->aborted.load(std::memory_order_acquire); ++k)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      RecordFailure(ctl, r, FailureKind::kSignal, 0, "");
      ThrowRecordedFailure(nullptr);
    }
  }
}

void ShmTransport::Abort(const Error& error) {
  RecordFailure(mem_->control, rank_, FailureKind::kAbort, static_cast<int>(error.code()),
                fmt::format("aborted by rank {}: {}", rank_, error.what()));
}

// ---------------------------------------------------------------------------
// Construction.

std::unique_ptr<transport::Transport> CreateProcessTransport() {
  auto need = [](const char* name) {
    auto v = core::GetEnv(name);
    if (!v)
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{} is not set: start the program with `mc2 run -n N PROGRAM`",
                              name));
    return *v;
  };
  int size = static_cast<int>(core::ParseInt(need("MC2_WORLD_SIZE"), "MC2_WORLD_SIZE", 1, kMaxRanks));
  int rank = static_cast<int>(core::ParseInt(need("MC2_RANK"), "MC2_RANK", 0, size - 1));
  size_t heap_bytes = core::ParseBytes(need("MC2_HEAP_BYTES"), "MC2_HEAP_BYTES");
  std::string fds_text = need("MC2_SHM_FDS");
  std::vector<int> fds;
  for (size_t pos = 0; pos <= fds_text.size();) {
    size_t comma = fds_text.find(',', pos);
    if (comma == std::string::npos) comma = fds_text.size();
    fds.push_back(static_cast<int>(
        core::ParseInt(std::string_view(fds_text).substr(pos, comma - pos), "MC2_SHM_FDS", 0, 1 << 20)));
    pos = comma + 1;
  }
  if (static_cast<int>(fds.size()) != size + 1)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("MC2_SHM_FDS='{}' is invalid: expected {} descriptors (control "
                            "segment and one heap per rank)", fds_text, size + 1));

  return MapJobTransport(rank, size, heap_bytes, fds, "MC2_SHM_FDS");
}

std::unique_ptr<transport::Transport> MapJobTransport(int rank, int size, size_t heap_bytes,
                                                      const std::vector<int>& fds,
                                                      std::string_view source) {
  MC2_CHECK_ARG(static_cast<int>(fds.size()) == size + 1,
                "{}: expected {} descriptors (control segment and one heap per rank), got {}",
                source, size + 1, fds.size());
  auto mem = std::make_shared<WorldMemory>();
  mem->heap_bytes = heap_bytes;
  mem->control_bytes = (sizeof(JobControl) + 4095) & ~size_t{4095};
  void* ctl = mmap(nullptr, mem->control_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
  if (ctl == MAP_FAILED) core::ThrowSystem(fmt::format("mapping the job control segment ({})", source), errno);
  mem->control = static_cast<JobControl*>(ctl);
  if (mem->control->magic != kJobMagic || mem->control->world_size != size)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} does not point at an mc2 job control segment for this world", source));
  mem->heaps.assign(size, nullptr);
  for (int r = 0; r < size; ++r) {
    void* p = mmap(nullptr, heap_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[r + 1], 0);
    if (p == MAP_FAILED) core::ThrowSystem(fmt::format("mapping the heap of rank {}", r), errno);
    mem->heaps[r] = static_cast<char*>(p);
  }
  // Our descriptors are no longer needed once mapped; close them so that
  // programs we exec do not inherit them.
  for (int fd : fds) close(fd);

  JobControl* jc = mem->control;
  auto* header = reinterpret_cast<RankHeader*>(mem->heaps[rank]);
  header->pid.store(getpid(), std::memory_order_relaxed);
  jc->pids[rank].store(getpid(), std::memory_order_release);

  // Bootstrap: wait until every rank has started, then watch their processes.
  auto timeout = core::EnvDuration("MC2_TIMEOUT", std::chrono::seconds(300));
  auto deadline = transport::Clock::now() + timeout;
  std::vector<int> pidfds(size, -1);
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    int pid;
    while ((pid = jc->pids[r].load(std::memory_order_acquire)) == 0) {
      if (jc->aborted.load(std::memory_order_acquire)) {
        // A peer that died during set-up is kPeerDied, as it is later on.
        throw Error(RecordedCode(jc), DescribeFailure(jc), rank, "init");
      }
      if (transport::Clock::now() > deadline)
        throw Error(ErrorCode::kTimeout,
                    fmt::format("rank {} never started{}", r, DescribeStoppedPeers(jc, rank, size)),
                    rank, "init");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    if (fd < 0) {
      if (errno == ESRCH) {
        // Gone already. A launcher that reaped it records how it ended
        // (its signal or status) a moment later: give it that moment, so
        // that the error says more than "has exited".
        const auto until = transport::Clock::now() + std::chrono::milliseconds(200);
        while (!jc->aborted.load(std::memory_order_acquire) && transport::Clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        RecordFailure(jc, r, FailureKind::kSignal, 0, "");
        throw Error(ErrorCode::kPeerDied, DescribeFailure(jc), rank, "init");
      }
      core::ThrowSystem(fmt::format("pidfd_open for rank {}", r), errno);
    }
    pidfds[r] = fd;
  }
  core::SetLogRank(rank);
  return std::make_unique<ShmTransport>(std::move(mem), rank, size, false, std::move(pidfds));
}

std::vector<std::unique_ptr<transport::Transport>> CreateThreadTransports(int size,
                                                                          size_t heap_bytes) {
  MC2_CHECK_ARG(size >= 1 && size <= kMaxRanks, "world size {} out of range [1, {}]", size,
                kMaxRanks);
  MC2_CHECK_ARG(heap_bytes >= 2 * transport::kHeapHeaderBytes, "heap of {} bytes is too small",
                heap_bytes);
  auto mem = std::make_shared<WorldMemory>();
  mem->anonymous = true;
  mem->heap_bytes = heap_bytes;
  mem->control_bytes = (sizeof(JobControl) + 4095) & ~size_t{4095};
  void* ctl = mmap(nullptr, mem->control_bytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (ctl == MAP_FAILED) core::ThrowSystem("allocating the in-process control block", errno);
  mem->control = static_cast<JobControl*>(ctl);
  mem->control->magic = kJobMagic;
  mem->control->world_size = size;
  mem->control->heap_bytes = heap_bytes;
  mem->control->failed_rank.store(-1);
  mem->heaps.assign(size, nullptr);
  for (int r = 0; r < size; ++r) {
    // MAP_NORESERVE: in-process worlds are for tests; pages appear on touch.
    void* p = mmap(nullptr, heap_bytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      throw Error(ErrorCode::kShmExhausted,
                  fmt::format("cannot allocate a {}-byte heap for in-process rank {}: {}",
                              heap_bytes, r, std::strerror(errno)));
    mem->heaps[r] = static_cast<char*>(p);
    reinterpret_cast<RankHeader*>(p)->pid.store(getpid());
    mem->control->pids[r].store(getpid());
  }
  std::vector<std::unique_ptr<transport::Transport>> out;
  for (int r = 0; r < size; ++r)
    out.push_back(std::make_unique<ShmTransport>(mem, r, size, true, std::vector<int>{}));
  return out;
}

}  // namespace mc2::shm
