// GroupImpl: the state of one communicator on one rank, and the building
// blocks every algorithm uses (arrival with fingerprints, flags, scratch).
//
// Control area. Each member of a group owns an area in its heap, laid out
// identically on every member (offsets below are relative to the area):
//
//   [arrive kSlots x 128 B][done 64 B][steps kNumStreams x 64 B]
//   [signals 64 x 8 B][p2p: size x 64 B][inline slots() x kInlineBytes]
//   [scratch 2 x scratch_bytes]
//
// Flags (arrive, done, steps, p2p words) are written only by their owner and
// only increase, so waits are "peer flag >= target". A flag's value for
// operation `seq` is FlagValue(seq, step): monotonic across operations.
//
// Reuse safety. Every operation ends by publishing done = seq (once; the
// engine adds it if the body did not), and no rank writes the slots of
// operation `seq` (arrive and inline, indexed by seq % slots(), slots() <=
// kSlots) before every member's done >= seq - slots() (AwaitReuse), so a
// slot is never overwritten while still being read. Most operations start with Arrive():
// each rank publishes its fingerprint and buffer offsets in its arrive slot
// and waits for all members to do the same, which also proves every member
// finished seq - 2 (so AwaitReuse costs nothing after it). Eager
// small-message operations (collectives/eager.cc) skip that full handshake:
// a rank waits only for the peers whose data it needs, so a broadcast root
// can run up to slots() operations ahead of its receivers, as MPI's eager
// protocol lets a sender run ahead while its messages fit the buffers. User
// buffers read in place by peers (symmetric zero-copy) are protected by
// FinishReads()/WaitReadersDone() at the end of an operation.
//
// Thread safety: operations of one group are issued by one thread at a
// time; their bodies run on the rank's progress thread (or inline).
#ifndef MC2_ENGINE_GROUP_IMPL_H_
#define MC2_ENGINE_GROUP_IMPL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <span>
#include <vector>

#include "engine/heap_allocator.h"
#include "engine/p2p_engine.h"
#include "engine/progress_engine.h"
#include "engine/work_state.h"
#include "mc2/group.h"
#include "mc2/tensor.h"
#include "mc2/work.h"
#include "transport/transport.h"

namespace mc2::internal {

using transport::Clock;

// What kind of operation a rank is in; part of the fingerprint.
enum class OpKind : uint16_t {
  kInit = 1,
  kExchange,
  kBarrier,
  kAllReduce,
  kReduce,
  kBroadcast,
  kAllGather,
  kAllGatherV,
  kGather,
  kScatter,
  kReduceScatter,
  kReduceScatterV,
  kAllToAll,
  kAllToAllV,
  kFused = 64,  // fused operators add their own kinds from here on
};
const char* OpKindName(OpKind kind);

// Identifies an operation across ranks: every member must publish the same
// fingerprint for the same sequence number, or the operation fails with
// kMismatch on every rank before any data moves.
struct Fingerprint {
  uint16_t kind = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  int32_t root = -1;
  uint64_t count = 0;  // elements (or bytes for byte-oriented operations)
  uint64_t aux = 0;    // operation-specific (e.g. a hash of per-rank counts)
  uint8_t algorithm = 0;  // mc2::Algorithm that runs it (ranks must agree)
  bool operator==(const Fingerprint&) const = default;
  std::string Describe() const;
};

// Marks a buffer that is not in the symmetric heap.
inline constexpr uint64_t kPrivate = ~uint64_t{0};

struct World {
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<engine::HeapAllocator> heap;
  std::chrono::nanoseconds timeout{};
  bool deterministic = true;
  // MC2_CHECK=1: strict mismatch checking (see GroupImpl::strict_check).
  bool strict_check = false;
  // More ranks than the host has CPUs, so ranks share cores: waits poll
  // less before they yield, and eager ranks run further ahead.
  bool oversubscribed = false;
  // Operation slots every group of this world cycles through (<=
  // GroupImpl::kSlots; see there). Every rank must use the same (init).
  uint64_t slots = 0;
  // Point-to-point progress, started by the first message.
  P2PEngine& P2P();
  std::once_flag p2p_once;
  std::unique_ptr<P2PEngine> p2p;
  // Last so that it is destroyed first: its thread may still use the rest.
  std::unique_ptr<engine::ProgressEngine> engine;
  ~World();
};

// The deleter of every World's shared_ptr. The last reference may go on the
// world's own progress or point-to-point thread: a task or message that
// outlived the caller's last handle of its group.
void DestroyWorld(World* world);
// Waits until every world DestroyWorld handed to a thread of its own is
// gone. Runs at exit once there was one.
void WaitForDeferredWorlds();

// Published by each rank at the start of every operation. Eager
// operations publish no buffer offsets; a small one stages its data in
// their place (GroupImpl::StageOff), so all of it shares the flag's line.
struct alignas(64) ArrivalSlot {
  uint64_t seq;  // the flag: seq of the operation this slot describes
  uint64_t send_off;
  uint64_t recv_off;
  uint64_t pad;
  Fingerprint fp;
};
// One line: the next line of the arrive slot may hold a stage (StageOff).
static_assert(sizeof(ArrivalSlot) <= 64);

class GroupImpl;
class Channel;  // engine/channel.h

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

class GroupImpl : public std::enable_shared_from_this<GroupImpl> {
 public:
  static constexpr int kNumStreams = 8;
  static constexpr size_t kInlineBytes = 8192;
  // Operation slots in the layout: at most how far an eager rank may run
  // ahead. A world uses all of them when it has more ranks than CPUs, and
  // kDedicatedSlots otherwise (World::slots, SlotsFor). Ranks that share a
  // core switch less often the further they can run ahead: at 4 ranks on 2
  // cores an 8 B broadcast took 0.62-0.82 us per call with 32 slots,
  // 0.48-0.50 with 64, 0.37-0.52 with 128. With a core per rank the run
  // ahead gains nothing, while each slot's lines are cold at their first
  // use after the caller touched much memory: in `mc2 bench all_reduce -n 2
  // -e 256M` the rows from 8 B in place to 32 B (20 calls each, medians of
  // 6 runs) took 0.84-0.94 us a call with 128 slots, 0.55-0.57 with 32.
  static constexpr uint64_t kSlots = 128;
  static constexpr uint64_t kDedicatedSlots = 32;
  static_assert((kSlots & (kSlots - 1)) == 0 && (kDedicatedSlots & (kDedicatedSlots - 1)) == 0,
                "slots are indexed by a mask (Slot)");
  static uint64_t SlotsFor(bool oversubscribed);
  static constexpr size_t kArriveOff = 0;
  // An arrive slot: the line of the flag (ArrivalSlot) and one line of
  // stage (StageOff).
  static constexpr size_t kArriveSlotBytes = 128;
  static constexpr size_t kDoneOff = kArriveOff + kSlots * kArriveSlotBytes;
  static constexpr size_t kStepsOff = kDoneOff + 64;
  static constexpr size_t kSignalsOff = kStepsOff + kNumStreams * 64;
  static constexpr size_t kP2POff = kSignalsOff + Group::kNumSignals * 8;

  // `area_offsets[i]`: heap offset of member i's control area.
  GroupImpl(std::shared_ptr<World> world, std::vector<int> members, int rank,
            std::vector<uint64_t> area_offsets, size_t scratch_bytes);
  ~GroupImpl();

  // Bytes of heap a group of `size` members needs for its control area in a
  // world of `slots` operation slots (World::slots): the inline data of the
  // unused slots is neither allocated nor cleared nor touched.
  static size_t AreaBytes(int size, uint64_t slots, size_t scratch_bytes);
  // Bytes of the fixed part of a control area for a group of `size`
  // members (arrive slots, flags, signals, p2p lines), rounded up to whole
  // pages: the inline slots follow it.
  static size_t FixedBytes(int size);
  // Zeroes the flags and inline areas of a control area at `area` (this
  // rank's memory) for a group of `size` members; scratch needs no reset.
  static void ClearArea(char* area, int size, uint64_t slots);
  // Scratch per half used by new groups: MC2_SCRATCH_BYTES, default 2 MiB.
  static size_t DefaultScratchBytes();

  World& world() const { return *world_; }
  const std::shared_ptr<World>& world_ptr() const { return world_; }
  transport::Transport& tx() const { return *world_->transport; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int world_rank(int grank) const { return members_[grank]; }
  const std::vector<int>& members() const { return members_; }
  size_t scratch_bytes() const { return scratch_bytes_; }

  // Area-relative layout.
  // seq % slots() as a mask: a small call forms these offsets about ten
  // times, and with slots() a run-time value each was a 64-bit division.
  uint64_t Slot(uint64_t seq) const { return seq & slot_mask_; }
  uint64_t ArriveOff(uint64_t seq) const { return kArriveOff + Slot(seq) * kArriveSlotBytes; }
  static uint64_t StepOff(int stream) { return kStepsOff + stream * 64; }
  static uint64_t SignalOff(int slot) { return kSignalsOff + slot * 8; }
  uint64_t P2POff(int peer) const { return kP2POff + peer * 64; }
  uint64_t InlineOff(uint64_t seq) const { return inline_off_ + Slot(seq) * kInlineBytes; }
  // Where an eager operation whose largest stage is `stage_bytes` stages a
  // rank's data: up to kArriveStageBytes in its arrive line, beside the
  // flag, in place of the buffer offsets eager operations do not publish
  // (a reader then takes one line from the writer, not two); else, in a
  // world with more ranks than CPUs, up to kArriveSlotStageBytes in the
  // second line of the arrive slot; else the inline area. The stage size
  // follows from the fingerprint, and World::oversubscribed is the same on
  // every rank (World::slots depends on it too), so writer and readers
  // agree.
  static constexpr size_t kArriveStageBytes = 24;
  static bool StagesInArriveLine(size_t stage_bytes) { return stage_bytes <= kArriveStageBytes; }
  // The arrive slots are contiguous (16 KiB at 128 slots), the inline slots
  // kInlineBytes apart (1 MiB). With 4 ranks on 2 cores a 32-64 B reduce
  // staged in the inline slots took 0.71-0.82 us per call, 0.44-0.53 in
  // the arrive slot (`mc2 bench reduce -n 4 -b 8 -e 512 -i 1000`, 4 runs
  // each, alternating). Spacing the inline slots by a line more (other
  // cache sets) gained nothing, so it is not set conflicts; it is likely
  // the pages, which processes that take turns on a core keep losing from
  // their TLBs. With a CPU per rank (32 slots) the inline slots are better:
  // 2 ranks, 32 and 64 B all_reduce against Open MPI (`compare_mpi.sh -n 2
  // -b 8 -e 512 -r 5`, 10 runs each, alternating), medians 1.09x and 1.14x
  // in the arrive slot, 1.13x and 1.18x in the inline slots; a reader
  // polling the flag likely pulls in the line beside it before the writer
  // has filled it. Stages above 64 B stay in the inline slots: with 512 B
  // arrive slots, 128-256 B stages there took ~0.04 us more per call with
  // 2 ranks, and 8-16 B ~0.13 us more with 4.
  static constexpr size_t kArriveSlotStageBytes = kArriveSlotBytes - 64;
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

  static uint64_t FlagValue(uint64_t seq, uint64_t step) { return (seq << 24) | step; }

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
    return Work(std::move(work));
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
  // A new vector per call paid its page faults on every call (2 ranks,
  // 16 MiB in-place all_to_all, which then copied too: 0.39x Open MPI,
  // against 2.1x out of place).
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
  void Arrive(OpContext& ctx, const Fingerprint& fp, const void* send, size_t send_bytes,
              const void* recv, size_t recv_bytes);
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
  // `stage_bytes` as for StageOff: a stage in the arrive line is kept).
  void PublishArrival(OpContext& ctx, const Fingerprint& fp, size_t stage_bytes);
  // Asks for this rank's arrive line and first `staged_bytes` (up to
  // kPrepareBytes) of the stage (StageOff) of operation ctx.seq + 1 in exclusive
  // state, for eager operations once their arrival is out. A peer read
  // those lines slots() operations ago, so writing them takes them back
  // from its cache; left to the next operation, those round trips stall
  // the fence of its PublishArrival on the latency path (2 ranks, 8 B
  // all_reduce: ~0.07 us of ~0.65 per call). Requested now, they complete
  // while this operation waits for its peers.
  void PrepareNextSlot(const OpContext& ctx, size_t staged_bytes) const;
  // The whole stage, up to 2 KiB. 2 ranks, all_reduce, per call (probe,
  // alternating runs), with the first 256 B asked for against the whole
  // stage: 1 KiB 0.84-0.85 -> 0.77-0.78 us, 2 KiB 1.13 -> 1.02-1.03. At
  // 8 KiB the whole stage lost (2.12-2.40 us against 1.97-2.16 with 2 KiB):
  // the requests queue ahead of the operation's own misses.
  static constexpr size_t kPrepareBytes = 2048;
  // Waits until member `grank` published operation ctx.seq and checks its
  // fingerprint against `fp`; throws kMismatch naming both sides. `payload`
  // (`bytes`, in `grank`'s memory) is what the caller reads next: if it is
  // at most kHintBytes, its lines are requested with every check of the
  // flag, so that their misses overlap the flag's instead of following it.
  void WaitArrival(OpContext& ctx, int grank, const Fingerprint& fp, const void* payload = nullptr,
                   size_t bytes = 0);
  // The largest payload WaitArrival loads while it polls. Only a payload
  // loaded whole gains: a reader that loads the first lines of a larger
  // stage takes them from the writer while it is still filling the stage
  // behind them, and both pay more round trips. 2 ranks, all_reduce, per
  // call (probe, alternating runs): 256 B 0.49-0.52 us with the loads,
  // 0.60 without; loading the first 256 B of larger stages, 1 KiB
  // 1.03-1.04 us against 0.84-0.85 without, 2 KiB 1.29-1.30 against 1.13.
  static constexpr size_t kHintBytes = 256;
  // Flag checks of WaitArrival's first polling stretch (a few
  // microseconds); a single one with more ranks than CPUs, where a wait
  // hands its core to the peer at once (see ShmTransport::WaitGE).
  static constexpr int kHintPolls = 128;
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
  // The group's channel for the fused operators (engine/channel.h),
  // created on first use. Touched only by the thread issuing the group's
  // operations. Declared last so that it is released first, while the
  // world it allocated from is still alive.
  std::unique_ptr<Channel> channel;
};

// The stage GroupImpl::StageOff puts in the arrive line fits between the
// flag and the fingerprint.
static_assert(offsetof(ArrivalSlot, fp) - offsetof(ArrivalSlot, send_off) >=
              GroupImpl::kArriveStageBytes);

}  // namespace mc2::internal

#endif  // MC2_ENGINE_GROUP_IMPL_H_
