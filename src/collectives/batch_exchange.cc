// The exchange of a batch of collectives on shared memory (batch_plan.h).
//
// Works as follows. Every rank packs its contribution to every entry into
// one stream (the all-reduce's input, its all-gather block, its whole
// reduce-scatter input, the broadcast root's input), each entry at the
// same 64-byte aligned offset on every rank. After one arrival every rank
// computes every entry's result by reading the peers' streams in place:
// an all-reduce reduces the N contributions with core::ReduceTree (the
// canonical order, so the result is bitwise the single all_reduce's), a
// reduce-scatter reduces only this rank's block, an all-gather copies each
// peer's block, a broadcast copies the root's data. Where the stream goes:
// - at most kInlineBytes: the inline slot of the operation, packed before
//   the arrival (one handshake; the slot is protected by AwaitReuse);
// - at most both scratch halves: the scratch, packed before the arrival
//   once every peer has finished the previous operation (done flags; the
//   previous operation may have read this rank's scratch), so the arrival
//   is again the only synchronisation;
// - larger: after the arrival, in windows of one scratch half
//   (RunStagedRounds: one more handshake per window).
// Under link emulation the flag that makes a part of the stream readable (the
// arrival, or a window's step) carries the bytes the peers read of it.
// Every reader publishes done at the end; a rank never exposes its user
// buffers, so it does not wait for readers (its stream is rewritten only
// after the peers' done, or after their next arrival).
//
// Cost (N ranks, S bytes packed per rank): one copy of S, one handshake
// (plus one per scratch half beyond 2 x MC2_SCRATCH_BYTES), and the reads
// of the single direct collectives: (N-1) S for the all-reduces.
#include <algorithm>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/batch_plan.h"
#include "core/copy.h"
#include "core/reduce.h"

namespace mc2::collectives {
namespace {

// Copies the part [w0, w1) of this rank's stream into `dst` (the window's
// start).
void Pack(const BatchPlan& p, size_t w0, size_t w1, char* dst) {
  for (const BatchItem& it : p.items) {
    if (it.send == nullptr || it.contrib == 0) continue;
    const size_t a = std::max(w0, it.offset), b = std::min(w1, it.offset + it.contrib);
    if (a >= b) continue;
    core::CopyBytes(dst + (a - w0), it.send + (a - it.offset), b - a);
  }
}

// Results of the entries' parts that lie in [w0, w1): `peer(r)` is member
// r's stream at w0.
template <typename PeerFn>
void Consume(GroupImpl* g, const BatchPlan& p, size_t w0, size_t w1, PeerFn&& peer) {
  const int n = g->size(), me = g->rank();
  std::vector<const void*> srcs(n);
  for (const BatchItem& it : p.items) {
    if (it.contrib == 0) continue;
    const size_t a = std::max(w0, it.offset), b = std::min(w1, it.offset + it.contrib);
    if (a >= b) continue;
    const size_t x = a - it.offset, y = b - it.offset;  // bytes of the contribution
    switch (it.kind) {
      case BatchKind::kAllReduce:
        for (int r = 0; r < n; ++r) srcs[r] = peer(r) + (a - w0);
        core::ReduceTree(it.dtype, it.op, it.recv + x, srcs.data(), n, (y - x) / it.esize, n);
        break;
      case BatchKind::kReduceScatter: {
        const size_t block = it.count * it.esize;
        const size_t lo = std::max(x, me * block), hi = std::min(y, (me + 1) * block);
        if (lo >= hi) break;
        for (int r = 0; r < n; ++r) srcs[r] = peer(r) + (a - w0) + (lo - x);
        core::ReduceTree(it.dtype, it.op, it.recv + (lo - me * block), srcs.data(), n,
                         (hi - lo) / it.esize, n);
        break;
      }
      case BatchKind::kAllGather:
        for (int r = 0; r < n; ++r)
          if (r != me) core::CopyBytes(it.recv + r * it.contrib + x, peer(r) + (a - w0), y - x);
        break;
      case BatchKind::kBroadcast:
        if (me != it.root) core::CopyBytes(it.recv + x, peer(it.root) + (a - w0), y - x);
        break;
    }
  }
}

// The bytes of [w0, w1) of this rank's stream that its peers read, summed
// over the readers: what link emulation charges for the window (each reader
// gets its own copy on a network).
size_t PeerBytes(const BatchPlan& p, size_t w0, size_t w1, int me, int n) {
  size_t sum = 0;
  const size_t peers = static_cast<size_t>(n - 1);
  for (const BatchItem& it : p.items) {
    if (it.send == nullptr || it.contrib == 0) continue;
    const size_t a = std::max(w0, it.offset), b = std::min(w1, it.offset + it.contrib);
    if (a >= b) continue;
    if (it.kind != BatchKind::kReduceScatter) {
      sum += peers * (b - a);  // all-reduce, all-gather, the broadcast root
      continue;
    }
    // Reduce-scatter: peer r reads block r; this rank's own block stays.
    const size_t block = it.count * it.esize;
    const size_t own_lo = it.offset + static_cast<size_t>(me) * block;
    const size_t own = std::min(b, own_lo + block) > std::max(a, own_lo)
                           ? std::min(b, own_lo + block) - std::max(a, own_lo)
                           : 0;
    sum += (b - a) - own;
  }
  return sum;
}

// This rank's own part of the outputs that no peer supplies: its
// all-gather block and a broadcast root's copy (not in place).
void CopyOwn(const GroupImpl* g, const BatchPlan& p) {
  const int me = g->rank();
  for (const BatchItem& it : p.items) {
    if (it.in_place || it.contrib == 0) continue;
    if (it.kind == BatchKind::kAllGather)
      core::CopyBytes(it.recv + me * it.contrib, it.send, it.contrib);
    if (it.kind == BatchKind::kBroadcast && me == it.root)
      core::CopyBytes(it.recv, it.send, it.contrib);
  }
}

}  // namespace

void RunBatchExchange(OpContext& ctx, const BatchPlan& p, const internal::Fingerprint& fp) {
  GroupImpl* g = ctx.g;
  const int me = g->rank();
  const size_t both_halves = 2 * g->scratch_bytes();
  if (p.total <= GroupImpl::kInlineBytes) {
    const uint64_t off = g->InlineOff(ctx.seq);
    Pack(p, 0, p.total, g->Ptr(me, off));
    g->Arrive(ctx, fp, nullptr, 0, nullptr, 0, PeerBytes(p, 0, p.total, me, g->size()));
    CopyOwn(g, p);
    Consume(g, p, 0, p.total, [&](int r) { return static_cast<const char*>(g->Ptr(r, off)); });
    return FinishOperation(ctx, false);
  }
  const uint64_t scratch = g->ScratchOff(0);  // the halves are contiguous
  if (p.total <= both_halves) {
    // The previous operation may still read this rank's scratch.
    if (ctx.seq > 1)
      for (int r = 0; r < g->size(); ++r)
        if (r != me) g->WaitFlag(ctx, r, GroupImpl::kDoneOff, ctx.seq - 1);
    Pack(p, 0, p.total, g->Ptr(me, scratch));
    g->Arrive(ctx, fp, nullptr, 0, nullptr, 0, PeerBytes(p, 0, p.total, me, g->size()));
    CopyOwn(g, p);
    Consume(g, p, 0, p.total, [&](int r) { return static_cast<const char*>(g->Ptr(r, scratch)); });
    return FinishOperation(ctx, false);
  }
  g->Arrive(ctx, fp, nullptr, 0, nullptr, 0);
  CopyOwn(g, p);
  const size_t w = g->scratch_bytes() / kBatchAlign * kBatchAlign;
  const size_t rounds = CeilDiv(p.total, w);
  CheckSteps(ctx, rounds, 1, "batch");
  RunStagedRounds(
      ctx, 0, rounds,
      [&](size_t k, char* half) {
        const size_t w0 = k * w, w1 = std::min(p.total, (k + 1) * w);
        Pack(p, w0, w1, half);
        return PeerBytes(p, w0, w1, me, g->size());
      },
      [&](size_t k, uint64_t half_off) {
        Consume(g, p, k * w, std::min(p.total, (k + 1) * w),
                [&](int r) { return static_cast<const char*>(g->Ptr(r, half_off)); });
      });
  FinishOperation(ctx, false);
}

}  // namespace mc2::collectives
