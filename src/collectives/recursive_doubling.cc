// Recursive doubling: all_reduce and all_gather(v) in ceil(log2 N) steps.
//
// Works as follows. The schedule follows the canonical tree of
// core/reduce.h, T(lo, hi) = T(lo, lo+p) (+) T(lo+p, hi) with p the largest
// power of two strictly below hi - lo:
//  * a power-of-two range [lo, lo+2^m) runs plain recursive doubling: in
//    step k rank r combines with partner lo + ((r-lo) xor 2^k). Before step
//    k both hold T of their aligned blocks of 2^k ranks, adjacent, so
//    "lower block (+) upper block" is T of the aligned block of 2^(k+1)
//    ranks -- exactly the canonical split (p = 2^k for a range of 2^(k+1));
//  * any other range computes T(lo, lo+p) on [lo, lo+p) and T(lo+p, hi) on
//    [lo+p, hi) concurrently (recursively), then in step log2(p) every rank
//    fetches the other half's result: r < lo+p from lo+p + (r-lo) mod
//    (hi-lo-p), r >= lo+p from r-p, and combines lower (+) upper.
//  The upper range is smaller than p, so its recursion ends by step log2(p)
//  and the whole schedule takes ceil(log2 N) steps on every rank (ranks
//  with nothing to do in a step still publish it). The schedule is
//  simulated once per call and checked to realise T node by node.
//  all_reduce combines with core::Combine (16-bit types round at every node,
//  as ReduceTree does), so the result is bitwise the canonical one in either
//  determinism mode; avg sums and divides once at the end (FinishAvg).
//  all_gather(v) runs the same schedule with "combine" meaning "copy the
//  peer's range of blocks".
//
// Pull model: in step k a rank reads its partner's result of the steps
// before k (flag FlagValue(seq, round*(L+1) + k + 1) on stream 0; L = number
// of steps, step numbers per round: 1 = input staged, k+2 = step k done).
// Raw inputs are read in place from symmetric send buffers, else from the
// owner's scratch; intermediate results live in scratch (one buffer per
// step, so nothing is overwritten within a round); all_gather reads blocks
// from symmetric recv buffers in place, else from a scratch copy holding
// one slot per block. Long vectors go in rounds of one scratch half; a rank
// rewrites a half (round k+2) only after every rank finished round k.
//
// Cost (N ranks, S bytes per rank): ceil(log2 N) flag hops per round;
// all_reduce reads and combines S per step, log2(N) S in total
// (latency-optimal, for small messages); all_gather receives (N-1) blocks.
#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "collectives/algorithm.h"
#include "core/copy.h"
#include "core/enforce.h"
#include "core/reduce.h"

namespace mc2::collectives {
namespace {

using internal::kPrivate;

constexpr int kStream = 0;

// The schedule for N ranks: who combines with whom in which step, and what
// each rank holds before each step.
class Schedule {
 public:
  explicit Schedule(int n) : n_(n), steps_(n > 1 ? std::bit_width(unsigned(n - 1)) : 0) {
    peer_.assign(static_cast<size_t>(steps_) * n, -1);
    lower_.assign(peer_.size(), 0);
    Build(0, n);
    // Simulate: before step k rank r holds T(lo, hi) (loc = the step whose
    // output holds it, -1 = its raw input). Check every combination is a
    // canonical node: adjacent ranges, split at the largest power of two
    // strictly below the combined size.
    loc_.assign(static_cast<size_t>(steps_ + 1) * n, -1);
    lo_.resize(loc_.size());
    hi_.resize(loc_.size());
    for (int r = 0; r < n; ++r) lo_[r] = r, hi_[r] = r + 1;
    for (int k = 0; k < steps_; ++k)
      for (int r = 0; r < n; ++r) {
        size_t cur = Idx(k, r), next = Idx(k + 1, r);
        loc_[next] = loc_[cur];
        lo_[next] = lo_[cur];
        hi_[next] = hi_[cur];
        int y = peer(k, r);
        if (y < 0) continue;
        size_t other = Idx(k, y);
        int a = lower(k, r) ? lo_[cur] : lo_[other];
        int b = lower(k, r) ? hi_[cur] : hi_[other];
        int c = lower(k, r) ? hi_[other] : hi_[cur];
        MC2_ENFORCE((lower(k, r) ? lo_[other] : lo_[cur]) == b && a < b && b < c &&
                        b - a == static_cast<int>(std::bit_floor(unsigned(c - a - 1))),
                    "recursive doubling schedule for {} ranks is not canonical at step {}, "
                    "rank {}",
                    n, k, r);
        loc_[next] = k;
        lo_[next] = a;
        hi_[next] = c;
      }
    for (int r = 0; r < n; ++r)
      MC2_ENFORCE(lo_[Idx(steps_, r)] == 0 && hi_[Idx(steps_, r)] == n &&
                      peer(steps_ - 1, r) >= 0,
                  "recursive doubling schedule for {} ranks is incomplete", n);
  }
  int steps() const { return steps_; }
  int peer(int k, int r) const { return peer_[Idx(k, r)]; }
  bool lower(int k, int r) const { return lower_[Idx(k, r)] != 0; }
  // Before step k: the step whose output holds r's partial result (-1: raw
  // input), and the ranks [lo, hi) it covers.
  int loc(int k, int r) const { return loc_[Idx(k, r)]; }
  int lo(int k, int r) const { return lo_[Idx(k, r)]; }
  int hi(int k, int r) const { return hi_[Idx(k, r)]; }

 private:
  size_t Idx(int k, int r) const { return static_cast<size_t>(k) * n_ + r; }
  void Set(int k, int r, int peer, bool lower) {
    peer_[Idx(k, r)] = peer;
    lower_[Idx(k, r)] = lower;
  }
  void Build(int lo, int hi) {
    const int m = hi - lo;
    if (m <= 1) return;
    if (std::has_single_bit(unsigned(m))) {
      for (int k = 0; (1 << k) < m; ++k)
        for (int r = lo; r < hi; ++r) {
          int y = lo + ((r - lo) ^ (1 << k));
          Set(k, r, y, r < y);
        }
      return;
    }
    const int p = static_cast<int>(std::bit_floor(unsigned(m - 1)));
    Build(lo, lo + p);
    Build(lo + p, hi);
    const int k = std::countr_zero(unsigned(p));
    for (int r = lo; r < lo + p; ++r) Set(k, r, lo + p + (r - lo) % (m - p), true);
    for (int r = lo + p; r < hi; ++r) Set(k, r, r - p, false);
  }

  int n_, steps_;
  std::vector<int> peer_;
  std::vector<char> lower_;
  std::vector<int> loc_, lo_, hi_;
};

void WaitPeer(OpContext& ctx, int peer, uint64_t step) {
  ctx.g->WaitFlag(ctx, peer, GroupImpl::StepOff(kStream), GroupImpl::FlagValue(ctx.seq, step));
}

}  // namespace

void RecursiveDoublingAllReduce(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  const int me = g->rank();
  const size_t e = a.esize;
  const bool send_sym = ctx.send_off[me] != kPrivate;
  if (a.count == 0) return FinishOperation(ctx, false);
  if (n == 1) {
    const void* src = a.send;
    core::ReduceTree(a.dtype, a.op, a.recv, &src, 1, a.count, 1);
    return FinishOperation(ctx, false);
  }
  const Schedule sch(n);
  const int L = sch.steps();
  // A half holds L buffers: [0] the staged input, [k+1] the output of step
  // k < L-1; the last step writes the user's output.
  const size_t w = PartElems(ctx, e, L, "recursive_doubling");
  const size_t rounds = CeilDiv(a.count, w);
  const uint64_t per_round = L + 1;
  CheckSteps(ctx, rounds, per_round, "recursive_doubling");

  for (size_t k = 0; k < rounds; ++k) {
    const size_t base = k * w;
    const size_t len = std::min(w, a.count - base);
    const uint64_t half = g->ScratchOff(static_cast<int>(k % 2));
    const uint64_t s0 = k * per_round;
    // Where rank x's partial result before step j is.
    auto partial = [&](int x, int j) -> const char* {
      int at = sch.loc(j, x);
      if (at >= 0) return g->Ptr(x, half) + (at + 1) * w * e;
      if (x == me) return a.send + base * e;
      if (ctx.send_off[x] != kPrivate) return g->HeapPtr(x, ctx.send_off[x]) + base * e;
      return g->Ptr(x, half);
    };
    // Every rank finished round k-2, the previous user of this half.
    if (k >= 2) WaitAll(ctx, kStream, s0 - per_round);
    if (!send_sym) core::CopyBytes(g->Ptr(me, half), a.send + base * e, len * e);
    PublishStep(ctx, kStream, s0 + 1, len * e);
    for (int j = 0; j < L; ++j) {
      const int y = sch.peer(j, me);
      if (y >= 0) {
        WaitPeer(ctx, y, s0 + j + 1);
        const char* mine = partial(me, j);
        const char* theirs = partial(y, j);
        char* dst = j == L - 1 ? a.recv + base * e : g->Ptr(me, half) + (j + 1) * w * e;
        const bool lower = sch.lower(j, me);
        core::Combine(a.dtype, a.op, dst, lower ? mine : theirs, lower ? theirs : mine, len);
      }
      PublishStep(ctx, kStream, s0 + j + 2, len * e);
    }
    core::FinishAvg(a.dtype, a.op, a.recv + base * e, len, n);
  }
  FinishOperation(ctx, send_sym);
}

void RecursiveDoublingAllGatherV(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  const int me = g->rank();
  const size_t e = a.esize;
  const char* mine = a.in_place ? a.recv + a.displs[me] * e : a.send;
  if (!a.in_place && a.counts[me])
    core::CopyBytes(a.recv + a.displs[me] * e, a.send, a.counts[me] * e);
  const size_t maxc = *std::max_element(a.counts.begin(), a.counts.end());
  if (maxc == 0 || n == 1) return FinishOperation(ctx, false);
  const bool send_sym = ctx.send_off[me] != kPrivate;
  const bool recv_sym = ctx.recv_off[me] != kPrivate;
  const bool all_recv = std::all_of(ctx.recv_off.begin(), ctx.recv_off.end(),
                                    [](uint64_t o) { return o != kPrivate; });
  const Schedule sch(n);
  const int L = sch.steps();
  // Scratch copy of a private recv: slot b holds this round's part of block b.
  const size_t w = all_recv ? maxc : PartElems(ctx, e, n, "recursive_doubling");
  const size_t rounds = CeilDiv(maxc, w);
  const uint64_t per_round = L + 1;
  CheckSteps(ctx, rounds, per_round, "recursive_doubling");
  auto piece = [&](size_t k, int b) -> size_t {
    const size_t from = k * w;
    return from >= a.counts[b] ? 0 : std::min(w, a.counts[b] - from);
  };

  for (size_t k = 0; k < rounds; ++k) {
    const uint64_t half = g->ScratchOff(static_cast<int>(k % 2));
    const uint64_t s0 = k * per_round;
    auto block_src = [&](int x, int b) -> const char* {
      if (b == x && ctx.send_off[x] != kPrivate) return g->HeapPtr(x, ctx.send_off[x]) + k * w * e;
      if (ctx.recv_off[x] != kPrivate)
        return g->HeapPtr(x, ctx.recv_off[x]) + (a.displs[b] + k * w) * e;
      return g->Ptr(x, half) + b * w * e;
    };
    if (!recv_sym) {
      // Every rank finished round k-2, the previous user of this half.
      if (k >= 2) WaitAll(ctx, kStream, s0 - per_round);
      if (!send_sym && piece(k, me))
        core::CopyBytes(g->Ptr(me, half) + me * w * e, mine + k * w * e, piece(k, me) * e);
    }
    PublishStep(ctx, kStream, s0 + 1);
    for (int j = 0; j < L; ++j) {
      const int y = sch.peer(j, me);
      size_t bytes = 0;
      if (y >= 0) {
        WaitPeer(ctx, y, s0 + j + 1);
        for (int b = sch.lo(j, y); b < sch.hi(j, y); ++b) {
          const size_t len = piece(k, b);
          if (len == 0) continue;
          char* dst = a.recv + (a.displs[b] + k * w) * e;
          core::CopyBytes(dst, block_src(y, b), len * e);
          // Keep the scratch copy for later readers (none after the last step).
          if (!recv_sym && j < L - 1) core::CopyBytes(g->Ptr(me, half) + b * w * e, dst, len * e);
          bytes += len * e;
        }
      }
      PublishStep(ctx, kStream, s0 + j + 2, bytes);
    }
  }
  FinishOperation(ctx, send_sym || recv_sym);
}

}  // namespace mc2::collectives
