// The shared-memory transport.
//
// Invariants: heaps_[r] maps rank r's heap (heap_bytes_ bytes) for the whole
// life of the object; the first kHeapHeaderBytes of each heap hold a
// RankHeader. Flags are 8-byte aligned words inside heaps; only their owner
// stores to them (Publish).
//
// Blocking: a waiter spins for spin_ (MC2_SPIN_US if set, else 200 us, or
// 2 ms yielding with more ranks than cores), then sleeps
// on the owner's futex doorbell in slices of kSliceMs, checking the world's
// health (abort flag, peer processes) after every slice. A publisher rings
// the doorbell only when someone sleeps on it, so the fast path is a store.
#ifndef MC2_TRANSPORT_SHM_SHM_TRANSPORT_H_
#define MC2_TRANSPORT_SHM_SHM_TRANSPORT_H_

#include <atomic>
#include <memory>
#include <string_view>
#include <vector>

#include "transport/shm/job.h"
#include "transport/transport.h"

namespace mc2::shm {

struct RankHeader {
  std::atomic<uint32_t> doorbell;  // futex word: bumped to wake sleepers
  std::atomic<uint32_t> sleepers;  // waiters currently blocked on doorbell
  std::atomic<int32_t> pid;
};

// Memory shared by all ranks of a world, owned jointly by the transports
// (an in-process world) or mapped from the launcher's descriptors.
struct WorldMemory {
  JobControl* control = nullptr;
  std::vector<char*> heaps;
  size_t heap_bytes = 0;
  size_t control_bytes = 0;
  bool anonymous = false;  // in-process: we allocated everything
  ~WorldMemory();
};

class ShmTransport final : public transport::Transport {
 public:
  ShmTransport(std::shared_ptr<WorldMemory> mem, int rank, int size, bool threads,
               std::vector<int> pidfds);
  ~ShmTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return threads_ ? "threads" : "shm"; }
  bool ranks_are_threads() const override { return threads_; }
  char* HeapBase(int r) override { return mem_->heaps[r]; }
  size_t HeapBytes() const override { return mem_->heap_bytes; }
  void Publish(uint64_t off, uint64_t value, size_t payload_bytes) override;
  void WaitGE(int owner, uint64_t off, uint64_t value,
              const transport::WaitContext& ctx) override;
  void RemoteAdd(int owner, uint64_t off, uint64_t value, size_t payload_bytes) override;
  uint64_t Peek(int owner, uint64_t off) override;
  void Wake(int peer) override { Ring(peer); }
  void SleepUntil(const std::function<bool()>& ready, transport::Clock::duration max) override;
  void CheckHealth(bool thorough = true) override;
  void Abort(const Error& error) override;

 private:
  RankHeader* Header(int r) { return reinterpret_cast<RankHeader*>(mem_->heaps[r]); }
  std::atomic_ref<uint64_t> Flag(int owner, uint64_t off) {
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(mem_->heaps[owner] + off));
  }
  void Ring(int owner);
  [[noreturn]] void ThrowRecordedFailure(const transport::WaitContext* ctx);

  std::shared_ptr<WorldMemory> mem_;
  const int rank_;
  const int size_;
  const bool threads_;
  std::vector<int> pidfds_;  // one per rank (-1 for self); empty for threads
  int64_t spin_ns_;
  bool oversubscribed_ = false;  // more ranks than hardware threads
};

// Builds rank `rank`'s transport from the launcher's environment.
std::unique_ptr<transport::Transport> CreateProcessTransport();
// Maps a job's segments from open descriptors (the control segment, then one
// heap per rank; each is closed once mapped) and starts rank `rank` as
// CreateProcessTransport does: records its pid, waits until every rank has
// (so every rank has mapped everything), then watches their processes.
// `source` says where the descriptors came from, for errors.
std::unique_ptr<transport::Transport> MapJobTransport(int rank, int size, size_t heap_bytes,
                                                      const std::vector<int>& fds,
                                                      std::string_view source);
std::vector<std::unique_ptr<transport::Transport>> CreateThreadTransports(int size,
                                                                          size_t heap_bytes);

}  // namespace mc2::shm

#endif  // MC2_TRANSPORT_SHM_SHM_TRANSPORT_H_
