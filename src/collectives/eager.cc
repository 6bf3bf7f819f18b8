// Eager small-message path of the direct algorithm.
//
// Why: a collective that starts with the full arrival handshake is a barrier,
// and a barrier needs every rank on a core at the same moment. With more
// ranks than cores (4 ranks on this 2-core host) that costs several context
// switches per call, while MPI's eager protocols let a broadcast root or a
// reduce contributor return as soon as its data is posted. Here each rank
// stages its input (GroupImpl::StageOff), publishes its fingerprint, and waits
// only for the ranks whose data it needs: a broadcast root or a reduce
// contributor waits for nobody, and runs ahead of the others by up to
// GroupImpl::slots() operations (AwaitReuse bounds the skew; group_impl.h).
//
// Mismatch checking: a rank compares the fingerprint of every rank it reads
// from (for all-to-all patterns that is every rank, so all of them raise, as
// on the full path). A rank that reads from nobody (a broadcast root, a
// reduce contributor) cannot see a mismatch in that call; the rank that does
// raises kMismatch, which aborts the world, so the others fail at their next
// wait. MC2_CHECK=1 turns this path off, for strict checking on every rank.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/algorithm.h"
#include "core/copy.h"
#include "core/reduce.h"

namespace mc2::collectives {

size_t EagerStagedBytes(const CollArgs& a, int n) {
  size_t maxc = 0;
  for (size_t c : a.counts) maxc = std::max(maxc, c);
  size_t total = a.counts.empty() ? 0 : a.displs.back() + a.counts.back();
  switch (a.kind) {
    case OpKind::kBarrier: return 0;
    case OpKind::kAllReduce:
    case OpKind::kReduce:
    case OpKind::kBroadcast: return a.count * a.esize;
    case OpKind::kAllGather:
    case OpKind::kAllGatherV:
    case OpKind::kGather: return maxc * a.esize;
    case OpKind::kScatter:
    case OpKind::kAllToAll: return a.count * a.esize * static_cast<size_t>(n);
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterV: return total * a.esize;
    // Per-rank counts differ in all_to_allv: ranks could disagree.
    default: return ~size_t{0};
  }
}

namespace {

// Stages `mine_bytes` from `src` where the peers read this rank's data of an
// eager call whose largest stage is `stage_bytes`, and publishes the arrival,
// which carries `peer_bytes` (DirectPeerBytes) under link emulation.
void StageAndPublish(OpContext& ctx, const internal::Fingerprint& fp, size_t stage_bytes,
                     const void* src, size_t mine_bytes, size_t peer_bytes) {
  GroupImpl* g = ctx.g;
  g->AwaitReuse(ctx);
  // memcpy with a null pointer is undefined even for 0 bytes (empty calls).
  if (mine_bytes)
    std::memcpy(g->Ptr(g->rank(), g->StageOff(ctx.seq, stage_bytes)), src, mine_bytes);
  // The flag orders the data.
  g->PublishArrival(ctx, fp, stage_bytes, peer_bytes);
  // The next call is most likely this one again: its lines, as staged now.
  g->PrepareNextSlot(ctx, GroupImpl::StagesInArriveLine(stage_bytes) ? 0 : mine_bytes);
  if (g->StagesInArriveSlot(stage_bytes)) {
    // Nothing is staged in the inline slots, but the next larger call
    // will be: keep their pages in this process's TLB and their first
    // lines cached (one load per member, a cache hit once warm). Without
    // this, after the program touched much memory, the first larger calls
    // would pay a page walk per slot.
    for (int r = 0; r < g->size(); ++r) core::TouchForRead(g->Ptr(r, g->InlineOff(ctx.seq)), 1);
  }
}

// Waits for every member's stage and reduces `count` elements at byte
// `offset` of each into `recv`, in rank order (deterministic).
void ReduceStages(OpContext& ctx, const internal::Fingerprint& fp, size_t stage_bytes,
                  size_t offset, void* recv, size_t count, DType dtype, ReduceOp op) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  // Reduction sources: on the stack for the group sizes of one host, so
  // that a small call allocates nothing.
  constexpr int kStackSrcs = 64;
  const void* stack_srcs[kStackSrcs];
  std::vector<const void*> heap_srcs;
  const void** srcs = stack_srcs;
  if (n > kStackSrcs) {
    heap_srcs.resize(n);
    srcs = heap_srcs.data();
  }
  const uint64_t stage_off = g->StageOff(ctx.seq, stage_bytes);
  const size_t bytes = count * DTypeSize(dtype);
  for (int r = 0; r < n; ++r) {
    srcs[r] = g->Ptr(r, stage_off) + offset;
    g->WaitArrival(ctx, r, fp, srcs[r], bytes);
  }
  if (count) core::ReduceTree(dtype, op, recv, srcs, n, count, n);
}

}  // namespace

void RunEager(OpContext& ctx, const CollArgs& a, const internal::Fingerprint& fp,
              size_t stage_bytes) {
  GroupImpl* g = ctx.g;
  const int me = g->rank();
  const int n = g->size();
  const size_t e = a.esize;
  auto staged = [&](int r) { return g->Ptr(r, g->StageOff(ctx.seq, stage_bytes)); };
  // `r`'s staged data this rank reads next, if any (see WaitArrival).
  auto wait = [&](int r, const void* reads = nullptr, size_t bytes = 0) {
    g->WaitArrival(ctx, r, fp, reads, bytes);
  };
  // memcpy with a null pointer is undefined even for 0 bytes (empty calls).
  auto copy = [](void* dst, const void* src, size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  };

  // Stage what others read, then publish.
  size_t mine_bytes = 0;
  switch (a.kind) {
    case OpKind::kAllReduce:
    case OpKind::kReduce:
      mine_bytes = a.count * e;
      break;
    case OpKind::kBroadcast:
      if (me == a.root) mine_bytes = a.count * e;
      break;
    case OpKind::kScatter:
      if (me == a.root) mine_bytes = a.count * e * n;
      break;
    case OpKind::kAllGather:
    case OpKind::kAllGatherV:
    case OpKind::kGather:
      mine_bytes = a.counts[me] * e;
      break;
    case OpKind::kAllToAll:
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterV:
      // In place (all-to-all), this copy is taken before any output is
      // written, so the input needs no private copy (see Launch).
      mine_bytes = stage_bytes;
      break;
    default: break;
  }
  const bool gathers =
      a.kind == OpKind::kAllGather || a.kind == OpKind::kAllGatherV || a.kind == OpKind::kGather;
  StageAndPublish(ctx, fp, stage_bytes, gathers && a.in_place ? a.recv + a.displs[me] * e : a.send,
                  mine_bytes, DirectPeerBytes(a, n, me));

  switch (a.kind) {
    case OpKind::kBarrier:
      // With a CPU per rank, every rank waits for every arrival: one hop,
      // and the ranks leave together, where a release by rank 0 would add
      // a second hop.
      //
      // With more ranks than CPUs: fan-in to rank 0, release by its done
      // flag (published below, once it has seen every arrival). There the
      // ranks leave in the order the scheduler runs them, and a rank that
      // leaves first and then waits for a peer that is not running pays a
      // round of context switches. Released by rank 0,
      // rank 0 leaves first -- the root of rooted collectives by default,
      // which then runs ahead as MPI's eager protocols let it (see the top
      // of this file). Either way no rank leaves before all arrived.
      if (me == 0 || !g->world().oversubscribed) {
        for (int r = 0; r < n; ++r) wait(r);
      } else {
        wait(0);
        g->WaitReleased(ctx, 0);
      }
      break;
    case OpKind::kAllReduce:
    case OpKind::kReduce:
      if (a.kind == OpKind::kReduce && me != a.root) break;
      ReduceStages(ctx, fp, stage_bytes, 0, a.recv, a.count, a.dtype, a.op);
      break;
    case OpKind::kBroadcast:
      if (me == a.root) {
        if (!a.in_place) copy(a.recv, a.send, a.count * e);
      } else {
        wait(a.root, staged(a.root), a.count * e);
        copy(a.recv, staged(a.root), a.count * e);
      }
      break;
    case OpKind::kScatter:
      if (me != a.root) wait(a.root, staged(a.root) + me * a.count * e, a.count * e);
      if (me != a.root || !a.in_place)
        copy(a.recv, staged(a.root) + me * a.count * e, a.count * e);
      break;
    case OpKind::kAllGather:
    case OpKind::kAllGatherV:
    case OpKind::kGather:
      if (a.kind == OpKind::kGather && me != a.root) break;
      for (int r = 0; r < n; ++r) {
        if (r == me && a.in_place) continue;
        wait(r, staged(r), a.counts[r] * e);
        copy(a.recv + a.displs[r] * e, staged(r), a.counts[r] * e);
      }
      break;
    case OpKind::kAllToAll:
      for (int r = 0; r < n; ++r) {
        wait(r, staged(r) + me * a.count * e, a.count * e);
        copy(a.recv + r * a.count * e, staged(r) + me * a.count * e, a.count * e);
      }
      break;
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterV:
      ReduceStages(ctx, fp, stage_bytes, a.displs[me] * e, a.recv, a.counts[me], a.dtype, a.op);
      break;
    default: break;
  }
  g->FinishReads(ctx);
}

void RunEagerAllReduce(OpContext& ctx, const void* send, void* recv, size_t count, DType dtype,
                       ReduceOp op, const internal::Fingerprint& fp) {
  const size_t bytes = count * DTypeSize(dtype);
  StageAndPublish(ctx, fp, bytes, send, bytes,
                  static_cast<size_t>(ctx.g->size() - 1) * bytes);
  ReduceStages(ctx, fp, bytes, 0, recv, count, dtype, op);
  ctx.g->FinishReads(ctx);
}

}  // namespace mc2::collectives
