// GroupImpl: the state of one communicator on one rank, and the building
// blocks every algorithm uses: the arrival protocol (arrival.h) over the
// group's control area (control_area.h), flags, staging and scratch.
//
// Thread safety: operations of one group are issued by one thread at a
// time; their bodies run on the rank's progress thread (or inline).
#ifndef MC2_ENGINE_GROUP_IMPL_H_
#define MC2_ENGINE_GROUP_IMPL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/access.h"
#include "engine/arrival.h"
#include "engine/control_area.h"
#include "engine/p2p_engine.h"
#include "engine/work_state.h"
#include "engine/world.h"
#include "mc2/group.h"
#include "mc2/tensor.h"
#include "mc2/work.h"
#include "transport/transport.h"

namespace mc2::internal {

using transport::Clock;

class GroupImpl;
class Channel;     // engine/channel.h
struct NetGroup;   // engine/net.h

// Per-operation context handed to algorithm bodies.
struct OpContext {
  GroupImpl* g = nullptr;
  uint64_t seq = 0;
  const char* name = "";
  // Operation deadline: zero until the operation first has to sleep, then
  // that moment plus `timeout` (see transport::WaitContext).
  Clock::time_point deadline{};
  Clock::duration timeout{};
  WorkState* work = nullptr;
  // Heap offsets of every member's send/recv buffers (kPrivate if private),
  // valid after Arrive() and until the operation ends.
  std::span<uint64_t> send_off, recv_off;
};

class GroupImpl : public ControlArea, public std::enable_shared_from_this<GroupImpl> {
 public:
  // `area_offsets[i]`: heap offset of member i's control area.
  GroupImpl(std::shared_ptr<World> world, std::vector<int> members, int rank,
            std::vector<uint64_t> area_offsets, size_t scratch_bytes);
  // A group whose members span hosts (engine/net.h): members are global
  // ranks, `world` is this rank's node world; it has no control area, and
  // every entry point routes it through `span`.
  GroupImpl(std::shared_ptr<World> world, std::vector<int> members, int rank,
            std::shared_ptr<NetGroup> net_group);
  ~GroupImpl();

  World& world() const { return *world_; }
  const std::shared_ptr<World>& world_ptr() const { return world_; }
  transport::Transport& tx() const { return *world_->transport; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int world_rank(int grank) const { return members_[grank]; }
  // The rank this rank's trace spans are recorded under (its world's
  // WorldOptions::trace_rank: the process's rank in the job).
  int trace_rank() const;
  const std::vector<int>& members() const { return members_; }
  size_t scratch_bytes() const { return scratch_bytes_; }

  // Area-relative layout.
  // seq % slots() as a mask: a small call forms these offsets about ten
  // times, and with slots() a run-time value each was a 64-bit division.
  uint64_t Slot(uint64_t seq) const { return seq & slot_mask_; }
  uint64_t ArriveOff(uint64_t seq) const { return kArriveOff + Slot(seq) * kArriveSlotBytes; }
  uint64_t P2POff(int peer) const { return kP2POff + peer * 64; }
  uint64_t InlineOff(uint64_t seq) const { return inline_off_ + Slot(seq) * kInlineBytes; }
  // Where an eager operation stages (the staging policy, control_area.h).
  bool StagesInArriveSlot(size_t stage_bytes) const {
    return stage_bytes <= arrive_slot_stage_bytes_;
  }
  uint64_t StageOff(uint64_t seq, size_t stage_bytes) const {
    if (StagesInArriveLine(stage_bytes)) return ArriveOff(seq) + offsetof(ArrivalSlot, send_off);
    if (StagesInArriveSlot(stage_bytes)) return ArriveOff(seq) + 64;
    return InlineOff(seq);
  }
  uint64_t slots() const { return slots_; }
  uint64_t ScratchOff(int half) const { return scratch_off_ + half * scratch_bytes_; }

  // Absolute heap offset / pointer of member `grank`'s area-relative `off`.
  uint64_t Abs(int grank, uint64_t off) const { return area_[grank] + off; }
  char* Ptr(int grank, uint64_t off) const { return bases_[grank] + area_[grank] + off; }
  // Pointer into member `grank`'s heap at absolute offset `heap_off`.
  char* HeapPtr(int grank, uint64_t heap_off) const { return bases_[grank] + heap_off; }
  // Heap offset of [p, p+bytes) if it lies in this rank's heap, else kPrivate.
  uint64_t HeapOffset(const void* p, size_t bytes) const;

  // Publishes this rank's area-relative flag.
  void Publish(uint64_t off, uint64_t value, size_t payload = 0) const {
    tx().Publish(area_[rank_] + off, value, payload);
  }
  // Waits until member `grank`'s area-relative flag >= value.
  void WaitFlag(OpContext& ctx, int grank, uint64_t off, uint64_t value) const;

  // Starts an operation: allocates its sequence number and runs `body` on
  // the progress thread (or inline when `inline_ok` and the engine is idle).
  // Point-to-point operations pass collective=false: they take no sequence
  // number (ranks issue different numbers of them).
  Work Submit(const char* name, bool inline_ok, std::function<void(OpContext&)> body,
              bool collective = true);
  // The inline half of Submit without type erasure, for latency-bound
  // calls: runs `body` on the calling thread and returns its Work if the
  // engine is idle; returns an empty optional (having done nothing, taken
  // no sequence number) otherwise.
  template <typename F>
  std::optional<Work> TryRunInline(const char* name, F&& body) {
    if (!world_->engine->Idle()) return std::nullopt;
    uint64_t seq = NextSeq();
    std::shared_ptr<WorkState> work = InlineWorkState(seq, name);
    world_->engine->TryRunInline(work, [&] {
      OpContext ctx;
      ctx.g = this;
      ctx.seq = seq;
      ctx.name = name;
      ctx.work = work.get();
      ctx.timeout = world_->timeout;
      tx().CheckHealth(/*thorough=*/false);
      body(ctx);
      PublishDone(ctx);
    });
    return Access::MakeWork(std::move(work));
  }

#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer does not model the fence below, and would report the
  // recycling of a state last dropped on another thread as a race.
  static constexpr bool kRecycleWork = false;
#else
  static constexpr bool kRecycleWork = true;
#endif
  // Whether a recycled object (`spare`) may be rewritten: nobody else
  // holds it any more. The fence pairs with the release in the last other
  // owner's reference drop, so its reads happen before our writes.
  template <typename T>
  static bool Reusable(const std::shared_ptr<T>& spare) {
    if (!kRecycleWork || !spare || spare.use_count() != 1) return false;
    std::atomic_thread_fence(std::memory_order_acquire);
    return true;
  }

  // A state for an inline operation: the one the previous inline operation
  // used if the caller has let go of every handle to it (the usual loop of
  // call-and-wait), else a new one. Saves an allocation and a free per call.
  std::shared_ptr<WorkState> InlineWorkState(uint64_t seq, const char* name) {
    if (Reusable(spare_work_)) {
      spare_work_->Reset(seq, name);
    } else {
      spare_work_ = std::make_shared<WorkState>(seq, name);
    }
    return spare_work_;
  }

  // A copy of [src, src + bytes), for an operation that must not read its
  // input in place (in-place all-to-allv, collectives.cc): the buffer the
  // previous such call used if nothing holds it any more, else a new one.
  // A new vector per call would pay its page faults on every call.
  // Copies above kMaxSpareCopy are not kept for the next call.
  static constexpr size_t kMaxSpareCopy = size_t{64} << 20;
  std::shared_ptr<std::vector<char>> CopyOfInput(const char* src, size_t bytes) {
    std::shared_ptr<std::vector<char>> copy;
    if (Reusable(spare_copy_)) {
      copy = std::move(spare_copy_);
    } else {
      copy = std::make_shared<std::vector<char>>();
    }
    copy->assign(src, src + bytes);
    if (bytes <= kMaxSpareCopy) spare_copy_ = copy;
    return copy;
  }

  // Runs an operation synchronously on the calling thread after everything
  // queued before it (used by Split, AllocSymmetric, FromEnv).
  void RunSync(const char* name, std::function<void(OpContext&)> body);

  // Publishes this rank's fingerprint and buffer offsets and waits for every
  // member's; throws kMismatch (on every rank) if fingerprints differ.
  // `payload`: the bytes the peers read from this rank (summed over the
  // readers) once it has arrived -- its staged or exposed data; under link
  // emulation the arrival is visible only when they would have come over
  // this rank's port (docs/link-emulation.md).
  void Arrive(OpContext& ctx, const Fingerprint& fp, const void* send, size_t send_bytes,
              const void* recv, size_t recv_bytes, size_t payload = 0);
  // Zero-copy reads of peers' user buffers end with FinishReads (publish
  // done=seq) and WaitReadersDone (wait for every member's done >= seq).
  void FinishReads(OpContext& ctx);
  // Publishes done = ctx.seq unless the body already did (operations run
  // one at a time per group, so a plain field tracks it).
  void PublishDone(OpContext& ctx) {
    if (ctx.seq > done_published_) FinishReads(ctx);
  }
  // Waits until every member's done >= seq - slots(), the condition for
  // writing this rank's slots of operation `seq` (see Reuse safety).
  // Free when an earlier Arrive or wait already proved it.
  void AwaitReuse(OpContext& ctx) {
    if (ctx.seq <= slots_ || peers_done_through_ >= ctx.seq - slots_) return;
    AwaitPeersDone(ctx);
  }
  // Fingerprint of operation ctx.seq published in its arrive slot with no
  // buffer offsets, for eager operations (after AwaitReuse and staging;
  // `stage_bytes` as for StageOff: a stage in the arrive line is kept;
  // `payload` as for Arrive).
  void PublishArrival(OpContext& ctx, const Fingerprint& fp, size_t stage_bytes,
                      size_t payload = 0);
  // Asks for this rank's arrive line and first `staged_bytes` (up to
  // kPrepareBytes) of the stage (StageOff) of operation ctx.seq + 1 in exclusive
  // state, for eager operations once their arrival is out. A peer read
  // those lines slots() operations ago, so writing them takes them back
  // from its cache; left to the next operation, those round trips stall
  // the fence of its PublishArrival on the latency path. Requested now,
  // they complete while this operation waits for its peers.
  void PrepareNextSlot(const OpContext& ctx, size_t staged_bytes) const;
  // Waits until member `grank` published operation ctx.seq and checks its
  // fingerprint against `fp`; throws kMismatch naming both sides. `payload`
  // (`bytes`, in `grank`'s memory) is what the caller reads next: if it is
  // at most kHintBytes, its lines are requested with every check of the
  // flag, so that their misses overlap the flag's instead of following it.
  void WaitArrival(OpContext& ctx, int grank, const Fingerprint& fp, const void* payload = nullptr,
                   size_t bytes = 0);
  // Waits until member `grank` finished operation ctx.seq (its done flag),
  // for operations released by one member. A timeout names the members that
  // have not arrived at ctx.seq (what holds the releaser up), else `grank`.
  void WaitReleased(OpContext& ctx, int grank);
  // MC2_CHECK=1: every collective compares every member's fingerprint
  // before data moves (the eager path is off).
  bool strict_check() const;
  void WaitReadersDone(OpContext& ctx) const;

  // Small all-gather through the inline areas: every member contributes
  // `bytes` (<= kInlineBytes / size); `out` receives size * bytes. Must be
  // called inside an operation body after Arrive.
  void ExchangeInline(OpContext& ctx, const void* mine, size_t bytes, void* out) const;

  // Operation counters.
  uint64_t last_seq() const { return seq_.load(); }
  // Takes the next sequence number. Only the thread issuing the group's
  // operations advances it (see Thread safety above), so a plain
  // load-and-store does: a locked add sits on the latency path of every
  // small collective. Atomic only for last_seq() readers on other threads.
  uint64_t NextSeq() {
    uint64_t seq = seq_.load(std::memory_order_relaxed) + 1;
    seq_.store(seq, std::memory_order_relaxed);
    return seq;
  }

  // The last operation member `grank` arrived at (its highest arrive slot).
  uint64_t LastArrived(int grank) const;
  // A string naming the members whose arrive flag is below `seq`.
  std::string DescribeNotArrived(uint64_t seq) const;

  // p2p bookkeeping (only touched on the progress thread).
  struct PeerChannel {
    uint64_t chan_off = kPrivate;  // our channel buffer towards the peer
    uint64_t sent_chunks = 0;
    uint64_t recv_chunks = 0;
  };
  std::vector<PeerChannel>& channels() { return channels_; }

 private:
  // AwaitReuse when the flags already seen do not prove it: waits for the
  // peers' done flags.
  void AwaitPeersDone(OpContext& ctx);
  std::shared_ptr<World> world_;
  std::vector<int> members_;
  int rank_;
  int size_;
  std::vector<uint64_t> area_;
  // Each member's heap as mapped here (fixed for the world's life): saves
  // a virtual call on every pointer an algorithm forms.
  std::vector<char*> bases_;
  size_t heap_bytes_;
  size_t scratch_bytes_;
  uint64_t inline_off_;
  uint64_t scratch_off_;
  int hint_polls_;
  // kArriveSlotStageBytes in an oversubscribed world, else
  // kArriveStageBytes (StageOff).
  size_t arrive_slot_stage_bytes_;
  uint64_t slots_;      // World::slots, a power of two
  uint64_t slot_mask_;  // slots_ - 1
  std::atomic<uint64_t> seq_{0};
  // Highest seq that every member is known to have finished, and the last
  // done value this rank published (both touched only by the operation
  // running on this group).
  uint64_t peers_done_through_ = 0;
  uint64_t done_published_ = 0;
  std::vector<PeerChannel> channels_;
  // The state InlineWorkState recycles (touched only by the thread issuing
  // the group's operations).
  std::shared_ptr<WorkState> spare_work_;
  // The buffer CopyOfInput recycles (same thread).
  std::shared_ptr<std::vector<char>> spare_copy_;
  // Storage behind OpContext::send_off/recv_off: operations of a group run
  // one at a time, so one set is enough.
  std::vector<uint64_t> arrival_offsets_;

 public:
  // Set for a group whose members span hosts (see the constructor above).
  const std::shared_ptr<NetGroup> net_group;
  // The group's channel for the fused operators (engine/channel.h),
  // created on first use. Touched only by the thread issuing the group's
  // operations. Declared last so that it is released first, while the
  // world it allocated from is still alive.
  std::unique_ptr<Channel> channel;
};

}  // namespace mc2::internal

#endif  // MC2_ENGINE_GROUP_IMPL_H_
