#include "engine/group_impl.h"

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/copy.h"
#include "core/enforce.h"
#include "core/env.h"
#include "core/log.h"
#include "engine/channel.h"
#include "engine/net.h"
#include "mc2/collectives.h"
#include "trace/recorder.h"

namespace mc2::internal {

namespace {

// What every wait of an operation reports on a timeout or a failure: the
// operation, its sequence number, its deadline.
transport::WaitContext WaitContextOf(OpContext& ctx) {
  transport::WaitContext wc;
  wc.op = ctx.name;
  wc.seq = ctx.seq;
  wc.deadline = &ctx.deadline;
  wc.timeout = ctx.timeout;
  return wc;
}

}  // namespace

const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kInit: return "init";
    case OpKind::kExchange: return "exchange";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kReduce: return "reduce";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kAllGatherV: return "all_gatherv";
    case OpKind::kGather: return "gather";
    case OpKind::kScatter: return "scatter";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kReduceScatterV: return "reduce_scatterv";
    case OpKind::kAllToAll: return "all_to_all";
    case OpKind::kAllToAllV: return "all_to_allv";
    case OpKind::kBatch: return "batch";
    case OpKind::kFused: return "fused";
  }
  return "op";
}

std::string Fingerprint::Describe() const {
  std::string s = OpKindName(static_cast<OpKind>(kind));
  if (kind == static_cast<uint16_t>(OpKind::kBatch)) {
    s += fmt::format("(entries={}, entries hash={:#x})", count, aux);
  } else if (kind >= static_cast<uint16_t>(OpKind::kAllReduce) &&
      kind < static_cast<uint16_t>(OpKind::kFused)) {
    s += fmt::format("(count={}, dtype={}", count, DTypeName(static_cast<DType>(dtype)));
    if (kind == static_cast<uint16_t>(OpKind::kAllReduce) ||
        kind == static_cast<uint16_t>(OpKind::kReduce) ||
        kind == static_cast<uint16_t>(OpKind::kReduceScatter) ||
        kind == static_cast<uint16_t>(OpKind::kReduceScatterV))
      s += fmt::format(", op={}", ReduceOpName(static_cast<ReduceOp>(op)));
    if (root >= 0) s += fmt::format(", root={}", root);
    if (aux) s += fmt::format(", layout={:#x}", aux);
    s += fmt::format(", algo={})", AlgorithmName(static_cast<Algorithm>(algorithm)));
  } else if (kind == static_cast<uint16_t>(OpKind::kInit)) {
    s += fmt::format(
        "(ranks={}, MC2_SCRATCH_BYTES={}, MC2_CHECK={}, MC2_DETERMINISTIC={}, slots={})", count,
        aux >> 2, (aux >> 1) & 1, aux & 1, root);
  } else {
    s += fmt::format("(count={}, root={}, aux={:#x})", count, root, aux);
  }
  return s;
}

namespace {

// The worlds being destroyed on threads of their own (see DestroyWorld).
struct DeferredWorlds {
  std::mutex mu;
  std::condition_variable cv;
  int count = 0;            // guarded by mu
  bool exit_waits = false;  // guarded by mu
};

DeferredWorlds& Deferred() {
  // Never destroyed: the exit handler uses it after statics may be gone.
  static auto* d = new DeferredWorlds;
  return *d;
}

}  // namespace

void DestroyWorld(World* world) {
  auto self = std::this_thread::get_id();
  bool own_thread = (world->engine && world->engine->thread_id() == self) ||
                    (world->p2p && world->p2p->thread_id() == self) ||
                    (world->net && world->net->engine && world->net->engine->thread_id() == self);
  if (!own_thread) {
    delete world;
    return;
  }
  // ~World joins these threads, so it cannot run on one of them. Their
  // loops touch only their engine's state once a task or message is done,
  // and each engine lives until ~World joins its thread.
  DeferredWorlds& d = Deferred();
  {
    std::lock_guard<std::mutex> lock(d.mu);
    ++d.count;
    // A process that ends meanwhile waits for the world's trace to be
    // written (~World flushes it) and its threads to stop. Registered
    // here, after the recorder's statics, so that it runs before them.
    if (!d.exit_waits) {
      d.exit_waits = true;
      std::atexit(WaitForDeferredWorlds);
    }
  }
  std::thread([world, &d] {
    delete world;
    std::lock_guard<std::mutex> lock(d.mu);
    if (--d.count == 0) d.cv.notify_all();
  }).detach();
}

void WaitForDeferredWorlds() {
  DeferredWorlds& d = Deferred();
  std::unique_lock<std::mutex> lock(d.mu);
  d.cv.wait(lock, [&] { return d.count == 0; });
}

int GroupImpl::trace_rank() const { return world_->trace_rank; }

World::~World() {
  net.reset();
  engine.reset();
  p2p.reset();
  // Every thread of the world has stopped: its spans are final.
  trace::OnWorldEnd(trace_rank);
}

P2PEngine& World::P2P() {
  std::call_once(p2p_once, [this] { p2p = std::make_unique<P2PEngine>(this); });
  return *p2p;
}

size_t ControlArea::DefaultScratchBytes() {
  static const size_t bytes = CheckScratchBytes(
      core::EnvBytes("MC2_SCRATCH_BYTES", size_t{2} << 20), "MC2_SCRATCH_BYTES");
  return bytes;
}

size_t ControlArea::CheckScratchBytes(size_t bytes, const char* source) {
  MC2_CHECK_ARG(bytes >= 4096 && bytes % 64 == 0,
                "{}={} is invalid: expected a multiple of 64 bytes, at least 4K", source, bytes);
  return bytes;
}

uint64_t ControlArea::SlotsFor(bool oversubscribed) {
  return oversubscribed ? kSlots : kDedicatedSlots;
}

size_t ControlArea::FixedBytes(int size) {
  return (kP2POff + static_cast<size_t>(size) * 64 + 4095) / 4096 * 4096;
}

size_t ControlArea::AreaBytes(int size, uint64_t slots, size_t scratch_bytes) {
  return FixedBytes(size) + slots * kInlineBytes + 2 * scratch_bytes;
}

void ControlArea::ClearArea(char* area, int size, uint64_t slots) {
  const size_t fixed = FixedBytes(size);
  // The fixed part holds flags that peers may already be polling (the world
  // group's area has a known offset, so a fast peer's Arrive reads ours
  // while we clear it): clear them with atomic stores, never memset, or the
  // clearing is a data race (ThreadSanitizer reports it on every in-process
  // world). The inline data is read only after our arrival is published.
  for (size_t off = 0; off < fixed; off += sizeof(uint64_t))
    std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(area + off))
        .store(0, std::memory_order_relaxed);
  std::memset(area + fixed, 0, slots * kInlineBytes);
}

GroupImpl::GroupImpl(std::shared_ptr<World> world, std::vector<int> members, int rank,
                     std::vector<uint64_t> area_offsets, size_t scratch_bytes)
    : world_(std::move(world)), members_(std::move(members)), rank_(rank),
      size_(static_cast<int>(members_.size())), area_(std::move(area_offsets)),
      scratch_bytes_(scratch_bytes), channels_(members_.size()),
      arrival_offsets_(2 * members_.size(), kPrivate) {
  for (int m : members_) bases_.push_back(world_->transport->HeapBase(m));
  heap_bytes_ = world_->transport->HeapBytes();
  const size_t fixed = FixedBytes(size_);
  slots_ = world_->slots;
  MC2_ENFORCE(slots_ > 0 && slots_ <= kSlots && (slots_ & (slots_ - 1)) == 0,
              "world with {} operation slots (a power of two up to {} expected)", slots_, kSlots);
  slot_mask_ = slots_ - 1;
  inline_off_ = fixed;
  scratch_off_ = fixed + slots_ * kInlineBytes;
  hint_polls_ = world_->oversubscribed ? 1 : kHintPolls;
  arrive_slot_stage_bytes_ = world_->oversubscribed ? kArriveSlotStageBytes : kArriveStageBytes;
  // Touch every page of every member's flags and inline slots now, once.
  // Otherwise each page is touched first inside an operation, and on a VM
  // such a first access costs many times a small operation: the first
  // slots() small operations of every group would be slow.
  // madvise(MADV_POPULATE_READ / _WRITE) did not remove that cost here; a
  // read of one byte per page does. The read is atomic (relaxed), since a
  // peer may be writing the same line. Only where ranks are processes: the
  // cost is this process mapping a peer's page, and threads share the
  // mappings of the rank that cleared its area (there a peer's memset of
  // its inline area may still run, which ThreadSanitizer rightly reports
  // against the read).
  if (!tx().ranks_are_threads()) {
    for (int i = 0; i < size_; ++i) {
      for (uint64_t off = 0; off < scratch_off_; off += 4096)
        (void)__atomic_load_n(Ptr(i, off), __ATOMIC_RELAXED);
    }
  }
}

GroupImpl::GroupImpl(std::shared_ptr<World> world, std::vector<int> members, int rank,
                     std::shared_ptr<NetGroup> net_group)
    : world_(std::move(world)),
      members_(std::move(members)),
      rank_(rank),
      size_(static_cast<int>(members_.size())),
      heap_bytes_(0),
      scratch_bytes_(0),
      inline_off_(0),
      scratch_off_(0),
      hint_polls_(0),
      arrive_slot_stage_bytes_(0),
      slots_(world_->slots),
      slot_mask_(world_->slots - 1),
      net_group(std::move(net_group)) {}

GroupImpl::~GroupImpl() {
  if (net_group) return;  // no control area, no channel buffers of its own
  // Channel buffers and the control area are returned to the heap. Peers
  // may not use them any more: a group is destroyed only when its last
  // handle goes, after its last operation completed on this rank; any peer
  // still inside an operation of this group is past reading our memory
  // (operations end with every member's reads done) or is failing anyway.
  // Under link emulation a flag of this area may still be on its way:
  // let it land before the memory can be reused.
  tx().Drain();
  for (auto& c : channels_)
    if (c.chan_off != kPrivate) world_->heap->Free(c.chan_off);
  world_->heap->Free(area_[rank_]);
}

uint64_t GroupImpl::HeapOffset(const void* p, size_t bytes) const {
  const char* base = bases_[rank_];
  const char* c = static_cast<const char*>(p);
  if (c >= base + transport::kHeapHeaderBytes && c + bytes <= base + heap_bytes_)
    return static_cast<uint64_t>(c - base);
  return kPrivate;
}

void GroupImpl::WaitFlag(OpContext& ctx, int grank, uint64_t off, uint64_t value) const {
  transport::WaitContext wc = WaitContextOf(ctx);
  wc.describe_missing = [&] {
    return fmt::format("rank {} (world rank {}; it is at operation #{} of this group)", grank,
                       members_[grank], LastArrived(grank));
  };
  tx().WaitGE(members_[grank], area_[grank] + off, value, wc);
}

uint64_t GroupImpl::LastArrived(int grank) const {
  uint64_t last = 0;
  for (uint64_t s = 0; s < slots_; ++s)
    last = std::max(last, tx().Peek(members_[grank], area_[grank] + ArriveOff(s)));
  return last;
}

std::string GroupImpl::DescribeNotArrived(uint64_t seq) const {
  std::string out;
  int n = 0;
  for (int r = 0; r < size_; ++r) {
    uint64_t a = tx().Peek(members_[r], area_[r] + ArriveOff(seq));
    if (a >= seq) continue;
    // In a group made by Split the world rank is what finds the process
    // (and what the launcher's messages use).
    out += fmt::format("{}rank {} ({}last at #{})", n++ ? ", " : "", r,
                       members_[r] != r ? fmt::format("world rank {}; ", members_[r]) : "",
                       LastArrived(r));
  }
  return out.empty() ? out : fmt::format("{} to arrive at #{}", out, seq);
}

Work GroupImpl::Submit(const char* name, bool inline_ok, std::function<void(OpContext&)> body,
                       bool collective) {
  uint64_t seq = collective ? NextSeq() : 0;
  auto work = std::make_shared<WorkState>(seq, name);
  auto run = [this, seq, name, w = work.get()](const std::function<void(OpContext&)>& fn) {
    OpContext ctx;
    ctx.g = this;
    ctx.seq = seq;
    ctx.name = name;
    ctx.work = w;
    ctx.timeout = world_->timeout;
    tx().CheckHealth(/*thorough=*/false);
    fn(ctx);
    if (ctx.seq) PublishDone(ctx);
  };
  if (inline_ok && world_->engine->TryRunInline(work, [&] { run(body); }))
    return Access::MakeWork(work);
  world_->engine->Submit(work, [self = shared_from_this(), run, body = std::move(body)]() mutable {
    // Drop our reference when the body ends, before the work completes:
    // a caller that waits and then lets go then holds the last one, and the
    // group goes on its thread. Ours is the last only if the caller let go
    // of every handle meanwhile; the world then goes on a thread of its own
    // (see DestroyWorld).
    std::shared_ptr<GroupImpl> keep = std::move(self);
    run(body);
  });
  return Access::MakeWork(work);
}

void GroupImpl::RunSync(const char* name, std::function<void(OpContext&)> body) {
  Submit(name, true, std::move(body)).Wait();
}

void GroupImpl::Arrive(OpContext& ctx, const Fingerprint& fp, const void* send,
                       size_t send_bytes, const void* recv, size_t recv_bytes,
                       size_t payload) {
  AwaitReuse(ctx);
  auto* slot = reinterpret_cast<ArrivalSlot*>(Ptr(rank_, ArriveOff(ctx.seq)));
  slot->fp = fp;
  slot->send_off = send ? HeapOffset(send, send_bytes) : kPrivate;
  slot->recv_off = recv ? HeapOffset(recv, recv_bytes) : kPrivate;
  Publish(ArriveOff(ctx.seq), ctx.seq, payload);

  arrival_offsets_.assign(2 * size_, kPrivate);
  ctx.send_off = std::span<uint64_t>(arrival_offsets_.data(), size_);
  ctx.recv_off = std::span<uint64_t>(arrival_offsets_.data() + size_, size_);
  transport::WaitContext wc = WaitContextOf(ctx);
  wc.describe_missing = [&] { return DescribeNotArrived(ctx.seq); };
  std::string mismatch;
  for (int r = 0; r < size_; ++r) {
    tx().WaitGE(members_[r], area_[r] + ArriveOff(ctx.seq), ctx.seq, wc);
    const auto* peer = reinterpret_cast<const ArrivalSlot*>(Ptr(r, ArriveOff(ctx.seq)));
    if (!(peer->fp == fp) && mismatch.empty())
      mismatch = fmt::format("rank {} called {} but rank {} called {}", rank_, fp.Describe(), r,
                             peer->fp.Describe());
    ctx.send_off[r] = peer->send_off;
    ctx.recv_off[r] = peer->recv_off;
  }
  // A member that arrived at seq has finished seq - 1.
  peers_done_through_ = std::max(peers_done_through_, ctx.seq - 1);
  // Every rank compares against every other, so all of them raise.
  if (!mismatch.empty())
    throw Error(ErrorCode::kMismatch, "mismatched operations across ranks: " + mismatch, rank_,
                ctx.name, ctx.seq);
}

void GroupImpl::FinishReads(OpContext& ctx) {
  Publish(kDoneOff, ctx.seq);
  done_published_ = ctx.seq;
}

void GroupImpl::AwaitPeersDone(OpContext& ctx) {
  // Learn as much as the flags tell at once: a receiver that is already
  // past seq - 1 saves the next operation this wait.
  uint64_t through = ~uint64_t{0};
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    WaitFlag(ctx, r, kDoneOff, ctx.seq - slots_);
    through = std::min(through, tx().Peek(members_[r], area_[r] + kDoneOff));
  }
  peers_done_through_ = std::max(peers_done_through_, std::min(through, ctx.seq - 1));
}

void GroupImpl::PublishArrival(OpContext& ctx, const Fingerprint& fp, size_t stage_bytes,
                               size_t payload) {
  auto* slot = reinterpret_cast<ArrivalSlot*>(Ptr(rank_, ArriveOff(ctx.seq)));
  slot->fp = fp;
  if (!StagesInArriveLine(stage_bytes)) {
    slot->send_off = kPrivate;
    slot->recv_off = kPrivate;
  }
  Publish(ArriveOff(ctx.seq), ctx.seq, payload);
}

void GroupImpl::PrepareNextSlot(const OpContext& ctx, size_t staged_bytes) const {
  core::PrefetchForWrite(Ptr(rank_, ArriveOff(ctx.seq + 1)), 1);
  if (staged_bytes)
    core::PrefetchForWrite(Ptr(rank_, StageOff(ctx.seq + 1, staged_bytes)),
                           std::min(staged_bytes, kPrepareBytes));
}

void GroupImpl::WaitArrival(OpContext& ctx, int grank, const Fingerprint& fp, const void* payload,
                            size_t bytes) {
  if (grank == rank_) return;
  // The flag is read here directly, as Peek would (the flags are words of
  // the mapped heap; the virtual call is a measurable part of a small call).
  // A flag already set needs no wait context: the common case of a small
  // call skips building one (its std::function) and the virtual WaitGE.
  const auto* flag = reinterpret_cast<const uint64_t*>(Ptr(grank, ArriveOff(ctx.seq)));
  bool arrived = false;
  if (payload && bytes && bytes <= kHintBytes) {
    // A first stretch of polling that also loads the payload's lines
    // (WaitGE below then spins, yields and sleeps as usual). Each flag read
    // is followed by those loads, so the one that sees the flag is followed
    // by loads of lines written before it, in flight together.
    for (int i = 0; i < hint_polls_; ++i) {
      arrived = __atomic_load_n(flag, __ATOMIC_ACQUIRE) >= ctx.seq;
      core::TouchForRead(payload, bytes);
      if (arrived) break;
      core::CpuRelax();
    }
  } else {
    arrived = __atomic_load_n(flag, __ATOMIC_ACQUIRE) >= ctx.seq;
  }
  if (!arrived) {
    transport::WaitContext wc = WaitContextOf(ctx);
    wc.describe_missing = [&] { return DescribeNotArrived(ctx.seq); };
    tx().WaitGE(members_[grank], area_[grank] + ArriveOff(ctx.seq), ctx.seq, wc);
  }
  const auto* peer = reinterpret_cast<const ArrivalSlot*>(flag);
  if (!(peer->fp == fp)) [[unlikely]]
    throw Error(ErrorCode::kMismatch,
                fmt::format("mismatched operations across ranks: rank {} called {} but rank {} "
                            "called {}",
                            rank_, fp.Describe(), grank, peer->fp.Describe()),
                rank_, ctx.name, ctx.seq);
}

void GroupImpl::WaitReleased(OpContext& ctx, int grank) {
  transport::WaitContext wc = WaitContextOf(ctx);
  wc.describe_missing = [&] {
    std::string missing = DescribeNotArrived(ctx.seq);
    if (!missing.empty()) return missing;
    return fmt::format("rank {} (world rank {}) to finish operation #{}", grank,
                       members_[grank], ctx.seq);
  };
  tx().WaitGE(members_[grank], area_[grank] + kDoneOff, ctx.seq, wc);
}

bool GroupImpl::strict_check() const { return world_->strict_check; }

void GroupImpl::WaitReadersDone(OpContext& ctx) const {
  for (int r = 0; r < size_; ++r)
    if (r != rank_) WaitFlag(ctx, r, kDoneOff, ctx.seq);
}

void GroupImpl::ExchangeInline(OpContext& ctx, const void* mine, size_t bytes, void* out) const {
  MC2_ENFORCE(bytes * size_ <= kInlineBytes, "inline exchange of {} x {} bytes", bytes, size_);
  // Each member writes its part at its own rank's position in its own
  // inline area; the Arrive that follows tells readers it is there.
  std::memcpy(Ptr(rank_, InlineOff(ctx.seq)) + rank_ * bytes, mine, bytes);
  Publish(StepOff(0), FlagValue(ctx.seq, 1));
  for (int r = 0; r < size_; ++r) {
    WaitFlag(ctx, r, StepOff(0), FlagValue(ctx.seq, 1));
    std::memcpy(static_cast<char*>(out) + r * bytes, Ptr(r, InlineOff(ctx.seq)) + r * bytes,
                bytes);
  }
}

}  // namespace mc2::internal
