// Binomial-tree algorithms: reduce, all_reduce, broadcast, gather, scatter,
// barrier.
//
// Works as follows. The binomial tree over positions v = 0..N-1: the parent
// of v > 0 is v - lowbit(v), its children are v + 2^j for 2^j < lowbit(v)
// (every 2^j < N for v = 0) while below N, and its subtree is
// [v, min(v + lowbit(v), N)). Rooted collectives use v = (rank - root) mod
// N; reductions always use the group ranks themselves (the tree rooted at
// rank 0), because only then do the partial results follow the canonical
// order of core/reduce.h: rank v combines its input with its children's
// results in increasing order of j, acc = acc (+) R(v + 2^j); before that
// step acc = T(v, v + 2^j) and R(v + 2^j) = T(v + 2^j, min(v + 2^(j+1),
// N)), and 2^j is the largest power of two strictly below the combined size,
// so acc becomes T(v, min(v + 2^(j+1), N)) -- the canonical split. Rank 0
// ends with T(0, N) (core::Combine rounds 16-bit types at every node like
// ReduceTree; avg divides once at the end), bitwise the canonical result in
// either determinism mode. reduce with root != 0 adds a final hop from rank 0
// to the root; all_reduce is the reduction followed by a broadcast from 0.
//
// Pull model, per round k of a long vector (one scratch half each): a rank
// publishes FlagValue(seq, k+1) on its stream once its part of round k is
// readable -- its subtree's result or blocks (upwards, stream 0) or the
// data it received (downwards, stream 1) -- and its neighbours in the tree
// wait for exactly that. Data is read in place from symmetric user buffers
// (raw inputs from send_off, received data from recv_off), else from the
// owner's scratch half k % 2. Before a rank rewrites a half for round k it
// waits until its readers (parent upwards, children downwards, the root
// for the final hop on stream 2) published round k-2, i.e. finished reading
// it. Gather and scatter keep one slot per block in a half, so a subtree's
// blocks travel together.
//
// Cost (N ranks, S bytes per rank, W bytes per round): ceil(log2 N) hops per
// round, pipelined: ~ (log2 N + S/W) hop latencies. reduce: each rank reads
// and combines S per child; broadcast: S per rank; gather/scatter: a rank
// moves its subtree's blocks (the root N-1 blocks in total); barrier: 2
// log2 N flag hops. Latency-friendly, not bandwidth-optimal.
#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "collectives/algorithm.h"
#include "core/copy.h"
#include "core/reduce.h"

namespace mc2::collectives {
namespace {

using internal::kPrivate;

constexpr int kUp = 0;    // towards the root: subtree results, gathered blocks
constexpr int kDown = 1;  // away from the root: broadcast data, scattered blocks
constexpr int kHop = 2;   // reduce: the root has copied rank 0's result

void CheckRounds(OpContext& ctx, size_t rounds) {
  if (rounds > kMaxSteps)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("tree: {} rounds exceed the flag range (raise MC2_SCRATCH_BYTES)",
                            rounds),
                ctx.g->rank(), ctx.name, ctx.seq);
}

// The binomial tree over positions 0..n-1.
struct Binomial {
  int n;
  static int LowBit(int v) { return v & -v; }
  int Parent(int v) const { return v - LowBit(v); }
  // Children in increasing distance (the canonical combination order).
  std::vector<int> Children(int v) const {
    std::vector<int> c;
    for (int m = 1; m < n && (v == 0 || m < LowBit(v)) && v + m < n; m <<= 1) c.push_back(v + m);
    return c;
  }
  int SubtreeEnd(int v) const { return v == 0 ? n : std::min(v + LowBit(v), n); }
};

void Wait(OpContext& ctx, int peer, int stream, uint64_t step) {
  ctx.g->WaitFlag(ctx, peer, GroupImpl::StepOff(stream), GroupImpl::FlagValue(ctx.seq, step));
}

// One round of the reduction to rank 0 (tree over group ranks) on stream
// kUp: elements [base, base+len) of every input. A rank's result goes to its
// buffer at area offset `buf` (a leaf with a symmetric input publishes that
// instead); rank 0's goes to `top` (or its buffer if null), avg finished.
void UpRound(OpContext& ctx, const CollArgs& a, size_t k, size_t base, size_t len, uint64_t buf,
             char* top) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  const int me = g->rank();
  const size_t e = a.esize;
  const Binomial t{n};
  const char* raw = a.send + base * e;
  auto result_of = [&](int c) -> const char* {
    if (t.Children(c).empty() && ctx.send_off[c] != kPrivate)
      return g->HeapPtr(c, ctx.send_off[c]) + base * e;
    return g->Ptr(c, buf);
  };
  const std::vector<int> children = t.Children(me);
  char* res = me == 0 && top ? top : g->Ptr(me, buf);
  // The parent finished reading round k-2 from this half.
  if (me != 0 && k >= 2) Wait(ctx, t.Parent(me), kUp, k - 1);
  bool first = true;
  for (int c : children) {
    Wait(ctx, c, kUp, k + 1);
    if (len) core::Combine(a.dtype, a.op, res, first ? raw : res, result_of(c), len);
    first = false;
  }
  if (first && ctx.send_off[me] == kPrivate && len) core::CopyBytes(res, raw, len * e);
  if (me == 0) core::FinishAvg(a.dtype, a.op, res, len, n);
  PublishStep(ctx, kUp, k + 1, len * e);
}

// One round of a broadcast down the binomial tree rooted at `root` on
// stream kDown: `dst` (this rank's output, len elements) receives the
// parent's data; src_of(x) says where rank x's data can be read; a rank
// whose own data is not readable in place (`copies`) keeps a scratch copy
// at area offset `buf` for its children.
template <class SrcFn>
void DownRound(OpContext& ctx, int root, size_t k, char* dst, size_t len, size_t e,
               uint64_t buf, bool copies, SrcFn src_of) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  const int me = g->rank();
  const Binomial t{n};
  const int v = Mod(me - root, n);
  if (v != 0) {
    const int parent = Mod(t.Parent(v) + root, n);
    Wait(ctx, parent, kDown, k + 1);
    if (len) core::CopyBytes(dst, src_of(parent), len * e);
  }
  const std::vector<int> children = t.Children(v);
  if (copies && !children.empty()) {
    if (k >= 2)
      for (int c : children) Wait(ctx, Mod(c + root, n), kDown, k - 1);
    if (len) core::CopyBytes(g->Ptr(me, buf), dst, len * e);
  }
  PublishStep(ctx, kDown, k + 1, len * e);
}

void ReduceAlone(OpContext& ctx, const CollArgs& a) {
  const void* src = a.send;
  if (a.count) core::ReduceTree(a.dtype, a.op, a.recv, &src, 1, a.count, 1);
  FinishOperation(ctx, false);
}

}  // namespace

void TreeReduce(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  const int me = g->rank();
  const size_t e = a.esize;
  if (a.count == 0) return FinishOperation(ctx, false);
  if (n == 1) return ReduceAlone(ctx, a);
  const size_t w = PartElems(ctx, e, 1, "tree");
  const size_t rounds = CeilDiv(a.count, w);
  CheckRounds(ctx, rounds);
  for (size_t k = 0; k < rounds; ++k) {
    const size_t base = k * w;
    const size_t len = std::min(w, a.count - base);
    const uint64_t buf = g->ScratchOff(static_cast<int>(k % 2));
    // The root finished copying round k-2 out of rank 0's half.
    if (me == 0 && a.root != 0 && k >= 2) Wait(ctx, a.root, kHop, k - 1);
    UpRound(ctx, a, k, base, len, buf, me == 0 && a.root == 0 ? a.recv + base * e : nullptr);
    if (me == a.root && a.root != 0) {
      Wait(ctx, 0, kUp, k + 1);
      core::CopyBytes(a.recv + base * e, g->Ptr(0, buf), len * e);
      PublishStep(ctx, kHop, k + 1);
    }
  }
  FinishOperation(ctx, ctx.send_off[me] != kPrivate);
}

void TreeAllReduce(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  const int me = g->rank();
  const size_t e = a.esize;
  if (a.count == 0) return FinishOperation(ctx, false);
  if (n == 1) return ReduceAlone(ctx, a);
  const bool send_sym = ctx.send_off[me] != kPrivate;
  const bool recv_sym = ctx.recv_off[me] != kPrivate;
  // A half holds the upward result, then the downward copy.
  const size_t w = PartElems(ctx, e, 2, "tree");
  const size_t rounds = CeilDiv(a.count, w);
  CheckRounds(ctx, rounds);
  for (size_t k = 0; k < rounds; ++k) {
    const size_t base = k * w;
    const size_t len = std::min(w, a.count - base);
    const uint64_t up = g->ScratchOff(static_cast<int>(k % 2));
    const uint64_t down = up + w * e;
    char* dst = a.recv + base * e;
    UpRound(ctx, a, k, base, len, up, me == 0 ? dst : nullptr);
    // In place the send buffer is never exposed, so a symmetric recv is
    // read only after it holds the result.
    auto src_of = [&](int x) -> const char* {
      return ctx.recv_off[x] != kPrivate ? g->HeapPtr(x, ctx.recv_off[x]) + base * e
                                         : g->Ptr(x, down);
    };
    DownRound(ctx, 0, k, dst, len, e, down, !recv_sym, src_of);
  }
  FinishOperation(ctx, send_sym || recv_sym);
}

void TreeBroadcast(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  const int me = g->rank();
  const size_t e = a.esize;
  const bool root = me == a.root;
  if (root && !a.in_place && a.count) core::CopyBytes(a.recv, a.send, a.count * e);
  if (a.count == 0 || n == 1) return FinishOperation(ctx, false);
  const bool send_sym = ctx.send_off[me] != kPrivate;  // the root's only
  const bool recv_sym = ctx.recv_off[me] != kPrivate;
  const size_t w = PartElems(ctx, e, 1, "tree");
  const size_t rounds = CeilDiv(a.count, w);
  CheckRounds(ctx, rounds);
  for (size_t k = 0; k < rounds; ++k) {
    const size_t base = k * w;
    const uint64_t buf = g->ScratchOff(static_cast<int>(k % 2));
    auto src_of = [&](int x) -> const char* {
      if (ctx.send_off[x] != kPrivate) return g->HeapPtr(x, ctx.send_off[x]) + base * e;
      if (ctx.recv_off[x] != kPrivate) return g->HeapPtr(x, ctx.recv_off[x]) + base * e;
      return g->Ptr(x, buf);
    };
    DownRound(ctx, a.root, k, a.recv + base * e, std::min(w, a.count - base), e, buf,
              !send_sym && !recv_sym, src_of);
  }
  FinishOperation(ctx, send_sym || recv_sym);
}

void TreeGather(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  const int me = g->rank();
  const size_t e = a.esize;
  const bool root = me == a.root;
  if (root && !a.in_place && a.counts[me])
    core::CopyBytes(a.recv + a.displs[me] * e, a.send, a.counts[me] * e);
  const size_t maxc = *std::max_element(a.counts.begin(), a.counts.end());
  if (maxc == 0 || n == 1) return FinishOperation(ctx, false);
  const bool send_sym = ctx.send_off[me] != kPrivate;
  const Binomial t{n};
  const int v = Mod(me - a.root, n);
  const std::vector<int> children = t.Children(v);
  // A half holds one slot per block (indexed by group rank).
  const size_t w = PartElems(ctx, e, n, "tree");
  const size_t rounds = CeilDiv(maxc, w);
  CheckRounds(ctx, rounds);
  auto piece = [&](size_t k, int b) -> size_t {
    const size_t from = k * w;
    return from >= a.counts[b] ? 0 : std::min(w, a.counts[b] - from);
  };
  for (size_t k = 0; k < rounds; ++k) {
    const uint64_t half = g->ScratchOff(static_cast<int>(k % 2));
    auto block_src = [&](int x, int b) -> const char* {
      if (b == x && ctx.send_off[x] != kPrivate) return g->HeapPtr(x, ctx.send_off[x]) + k * w * e;
      return g->Ptr(x, half) + b * w * e;
    };
    if (!root) {
      // The parent finished reading round k-2 from this half.
      if (k >= 2) Wait(ctx, Mod(t.Parent(v) + a.root, n), kUp, k - 1);
      if (!send_sym && piece(k, me))
        core::CopyBytes(g->Ptr(me, half) + me * w * e, a.send + k * w * e, piece(k, me) * e);
    }
    size_t bytes = 0;
    for (int cv : children) {
      const int c = Mod(cv + a.root, n);
      Wait(ctx, c, kUp, k + 1);
      for (int bv = cv; bv < t.SubtreeEnd(cv); ++bv) {
        const int b = Mod(bv + a.root, n);
        const size_t len = piece(k, b);
        if (len == 0) continue;
        char* dst = root ? a.recv + (a.displs[b] + k * w) * e : g->Ptr(me, half) + b * w * e;
        core::CopyBytes(dst, block_src(c, b), len * e);
        bytes += len * e;
      }
    }
    PublishStep(ctx, kUp, k + 1, bytes);
  }
  FinishOperation(ctx, send_sym);
}

void TreeScatter(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  const int me = g->rank();
  const size_t e = a.esize;
  const bool root = me == a.root;
  const size_t bytes = a.count * e;
  if (root && !a.in_place && bytes) core::CopyBytes(a.recv, a.send + me * bytes, bytes);
  if (bytes == 0 || n == 1) return FinishOperation(ctx, false);
  const bool send_sym = ctx.send_off[me] != kPrivate;  // the root's only
  const Binomial t{n};
  const int v = Mod(me - a.root, n);
  const std::vector<int> children = t.Children(v);
  const size_t w = PartElems(ctx, e, n, "tree");
  const size_t rounds = CeilDiv(a.count, w);
  CheckRounds(ctx, rounds);
  const bool writes = !children.empty() && !(root && send_sym);
  for (size_t k = 0; k < rounds; ++k) {
    const uint64_t half = g->ScratchOff(static_cast<int>(k % 2));
    const size_t len = std::min(w, a.count - k * w);
    auto block_src = [&](int x, int b) -> const char* {
      if (ctx.send_off[x] != kPrivate)  // the root's symmetric send
        return g->HeapPtr(x, ctx.send_off[x]) + (b * a.count + k * w) * e;
      return g->Ptr(x, half) + b * w * e;
    };
    // The children finished reading round k-2 from this half.
    if (writes && k >= 2)
      for (int cv : children) Wait(ctx, Mod(cv + a.root, n), kDown, k - 1);
    if (root) {
      if (writes)
        for (int b = 0; b < n; ++b)
          if (b != me)
            core::CopyBytes(g->Ptr(me, half) + b * w * e, a.send + (b * a.count + k * w) * e,
                        len * e);
    } else {
      const int parent = Mod(t.Parent(v) + a.root, n);
      Wait(ctx, parent, kDown, k + 1);
      for (int bv = v; bv < t.SubtreeEnd(v); ++bv) {
        const int b = Mod(bv + a.root, n);
        core::CopyBytes(b == me ? a.recv + k * w * e : g->Ptr(me, half) + b * w * e,
                    block_src(parent, b), len * e);
      }
    }
    PublishStep(ctx, kDown, k + 1, len * e);
  }
  FinishOperation(ctx, send_sym);
}

void TreeBarrier(OpContext& ctx, const CollArgs&) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  const int me = g->rank();
  if (n > 1) {
    const Binomial t{n};
    for (int c : t.Children(me)) Wait(ctx, c, kUp, 1);
    PublishStep(ctx, kUp, 1);
    if (me != 0) Wait(ctx, t.Parent(me), kDown, 1);
    PublishStep(ctx, kDown, 1);
  }
  FinishOperation(ctx, false);
}

}  // namespace mc2::collectives
