// mc2/group.h: communicators, symmetric memory and point-to-point messages.
#ifndef MC2_GROUP_H_
#define MC2_GROUP_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mc2/work.h"

namespace mc2 {

namespace internal {
class GroupImpl;
struct SymmetricAllocation;
struct Access;
}  // namespace internal

class Group;

// Settings of a world. Zero / empty fields take their value from the
// environment (named beside each field), then from the default.
struct WorldOptions {
  // Per-operation timeout. MC2_TIMEOUT, default 300 s.
  std::chrono::nanoseconds timeout{0};
  // Bytes of symmetric heap per rank (in-process and rendezvous worlds:
  // under `mc2 run` the launcher's --heap / MC2_HEAP_BYTES sets it).
  // Default 64 MiB in process, 256 MiB (or MC2_HEAP_BYTES) by rendezvous.
  size_t heap_bytes = 0;
  // Deterministic reductions (bitwise identical for every algorithm):
  // -1 = MC2_DETERMINISTIC (default on), 0 = off, 1 = on.
  int deterministic = -1;
  // Link emulation (docs/link-emulation.md): empty = MC2_LINK, "none" =
  // off, else e.g. "bw=10GB/s,lat=5us": every payload a rank publishes
  // becomes visible to its peers after the modeled transfer time on the
  // rank's egress port. An invalid value throws kInvalidArgument.
  std::string link = {};
  // The rank and world size this process's trace spans are recorded under
  // (mc2/trace.h): -1 = this world's own. A world made for a subgroup of a
  // larger job (torch.distributed.new_group makes one per group) names the
  // process's rank and size in the job, so that every world of a process
  // records into the process's one timeline. Both or neither; an invalid
  // pair throws kInvalidArgument.
  int trace_rank = -1;
  int trace_world_size = -1;
  // Scratch per half of every group of this world, in bytes per rank (each
  // group takes two halves from the heap; algorithms that stage through
  // scratch cut their data into windows of this size): 0 = MC2_SCRATCH_BYTES
  // (default 2 MiB). A multiple of 64, at least 4096, else kInvalidArgument.
  // Every rank must give the same: the world's first operation fails with
  // kMismatch otherwise.
  size_t scratch_bytes = 0;
};

// Memory in the symmetric heap: allocated by every rank of a group with the same size, and
// addressable by the group's ranks on the same host only (every rank of a one-host group; on a
// group that spans hosts, each host's ranks). Collectives on it run zero-copy inside each host;
// one-sided Put/Get and signals work on it on a one-host group only. Freeing is local and
// immediate: the caller must make sure no peer still accesses the buffer (e.g. a Barrier after
// the last use). Move-only.
class SymmetricBuffer {
 public:
  SymmetricBuffer() = default;
  SymmetricBuffer(SymmetricBuffer&&) noexcept;
  SymmetricBuffer& operator=(SymmetricBuffer&&) noexcept;
  ~SymmetricBuffer();

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }

 private:
  friend class Group;
  std::shared_ptr<internal::SymmetricAllocation> alloc_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A communicator: an ordered set of ranks that run collectives together.
//
// Every collective on a group must be called by all its ranks in the same
// order with matching arguments. Calls on one group must come from one thread
// at a time. Groups are cheap handles: copies refer to the same group.
class Group {
 public:
  Group() = default;

  // The world of this process. Started by `mc2 run`: its ranks, over shared
  // memory (MC2_* environment). Started by mpirun or srun instead (no
  // `mc2 run`; OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_RANK set): mc2
  // initialises MPI (MPI_THREAD_SERIALIZED; MPI_Finalize runs at exit), and
  // the world is MPI_COMM_WORLD's ranks: those on one host (by hostname,
  // MC2_HOSTNAME overrides it) share memory, hosts talk over MPI
  // (docs/multi-host.md). A program that uses MPI itself calls
  // mc2::FromMPI (<mc2/mpi.h>) instead. Collective over the job.
  // Throws mc2::Error(kInvalidArgument) when launched by neither, kMpi when
  // MPI cannot start, and the error of a failed set-up (kShmExhausted,
  // kTimeout, kPeerDied) otherwise.
  static Group FromEnv(const WorldOptions& options = {});
  // True when this process was started by `mc2 run`.
  static bool LaunchedByMc2();
  // True when it was started by mpirun or srun instead (and not by `mc2 run`):
  // FromEnv then builds the job's world over MPI.
  static bool LaunchedByMpi();

  // Gathers one short string (under 4 KiB, no NUL) from every process that
  // calls FromRendezvous, in rank order, over whatever channel the launcher
  // provides (a key-value store, MPI). Collective over those processes.
  using AllGatherStrings = std::function<std::vector<std::string>(const std::string& mine)>;
  // The world of `size` processes on one host that call this together as
  // ranks 0..size-1, for launchers other than `mc2 run` (torchrun, a c10d
  // store): they make its shared memory among themselves through
  // `all_gather` and leave nothing behind in the shared-memory directory
  // whatever happens. Heap per rank: options.heap_bytes, else
  // MC2_HEAP_BYTES, else 256 MiB; directory: MC2_SHM_DIR, else /dev/shm.
  // Throws mc2::Error on every rank that can learn of a failure:
  // kInvalidArgument when the ranks disagree on `size` or are not on one
  // machine, kShmExhausted when the directory cannot hold the heaps, and
  // the errors of FromEnv's start-up.
  static Group FromRendezvous(int rank, int size, const AllGatherStrings& all_gather,
                              const WorldOptions& options = {});

  // Runs `body(group)` on `size` threads, each a rank of a fresh in-process
  // world, and returns when all have returned. If any throws, the world is
  // aborted (the others' pending operations fail) and the first exception is
  // rethrown here. For tests and single-process experiments.
  static void RunInProcess(int size, const std::function<void(Group&)>& body,
                           const WorldOptions& options = {});

  bool valid() const { return impl_ != nullptr; }
  int rank() const;
  int size() const;
  // The rank of this process in the world the group belongs to.
  int world_rank() const;
  // The number of hosts the group's ranks live on: 1 for a group within
  // one host; more for a group of a job across hosts whose collectives
  // then choose an algorithm per level (docs/multi-host.md).
  int num_hosts() const;
  // Per-operation timeout used by this group's operations.
  std::chrono::nanoseconds timeout() const;
  bool deterministic() const;

  // Collective: splits this group into one group per `color`; ranks within
  // a new group are ordered by (key, old rank). A negative color returns an
  // invalid Group (the rank joins no new group).
  Group Split(int color, int key) const;

  // Collective: allocates `bytes` of symmetric memory on every rank (sizes
  // must match). Throws kShmExhausted when the heap is full, and
  // kInvalidArgument for more than PTRDIFF_MAX bytes.
  SymmetricBuffer AllocSymmetric(size_t bytes) const;
  // Whether [ptr, ptr+bytes) lies in this rank's symmetric heap.
  bool IsSymmetric(const void* ptr, size_t bytes) const;

  // One-sided access to `peer`'s instance of `buffer` at byte `offset`. Synchronous: the copy is
  // complete when the call returns. Throws kInvalidArgument for a range past the buffer's end
  // (offset + bytes, however large) and on a group that spans hosts (use Send/Recv there).
  void Put(const SymmetricBuffer& buffer, int peer, size_t offset, const void* src,
           size_t bytes) const;
  void Get(const SymmetricBuffer& buffer, int peer, size_t offset, void* dst,
           size_t bytes) const;
  // Signals: kNumSignals monotonically increasing 64-bit counters per rank. SignalAdd increments
  // `peer`'s counter `slot` by `value` after all earlier Puts from this rank to `peer` are visible;
  // WaitSignal blocks until this rank's counter `slot` reaches at least `value` (or the timeout or
  // a failure). All three throw kInvalidArgument on a group that spans hosts, as Put and Get do.
  static constexpr int kNumSignals = 64;
  void SignalAdd(int peer, int slot, uint64_t value) const;
  void WaitSignal(int slot, uint64_t value) const;
  uint64_t ReadSignal(int slot) const;

  // Tagged point-to-point messages. A Send matches the Recv with the same
  // (source, tag) posted in the same order; sizes must match exactly. A
  // size above PTRDIFF_MAX, or a buffer whose end wraps around the address
  // space, throws kInvalidArgument.
  Work Send(const void* data, size_t bytes, int peer, int tag = 0) const;
  Work Recv(void* data, size_t bytes, int peer, int tag = 0) const;
  // Tags are >= 0 (a negative tag throws kInvalidArgument): the library's
  // own messages (the fused operators') use a tag space of their own, so
  // they never match a user's Send or Recv.

 private:
  friend struct internal::Access;
  explicit Group(std::shared_ptr<internal::GroupImpl> impl) : impl_(std::move(impl)) {}

  std::shared_ptr<internal::GroupImpl> impl_;
};

}  // namespace mc2

#endif  // MC2_GROUP_H_
