// Ring algorithms: all_reduce, all_gather(v), reduce_scatter(v), broadcast.
//
// Works as follows. Rank r talks only to its neighbours: it reads what its
// left neighbour l = r-1 published and publishes what its right neighbour
// r+1 reads (pull model). Messages are numbered q = 0, 1, ... over the whole
// operation; message q sits in scratch half q % 2 of its sender, or is read
// in place from the sender's user buffer when that is symmetric (raw inputs
// from send_off, finished results from recv_off). A rank publishes
// FlagValue(seq, q + 1) on stream 0 once message q is readable; before it
// writes message q into a half it waits until its right neighbour has
// published q, i.e. has written message q - 1, which it does only after it
// finished reading message q - 2 (the previous user of that half). So at
// most two messages per link are in flight and each half has one writer and
// one reader at a time. Long vectors are cut into rounds ("windows") that
// fill a scratch half; rounds follow each other without a global barrier,
// so the ring stays pipelined across them.
//
// all_reduce / reduce_scatter(v): each round is cut into N chunks, chunk c
// owned by rank c (for reduce_scatterv chunk c is rank c's block).
//  * Non-deterministic mode: the classic ring. In step s = 0..N-2 rank r
//    sends the partial result of chunk r-1-s (its raw chunk r-1 in step 0);
//    the receiver combines it with its own raw chunk (core::Combine) and
//    passes it on; in step N-2 the owner receives the sum of the other N-1
//    contributions and adds its own. avg divides once at the end
//    (core::FinishAvg). Each rank sends (N-1) S/N bytes.
//  * Deterministic mode (default): partial sums in ring order cannot give
//    the canonical tree order of core/reduce.h, so raw contributions travel
//    instead. In step s rank r forwards the raw chunks r+1 .. r+N-1-s of
//    origin r-s (its own in step 0, then what it received in step s-1 minus
//    the chunk it owns); every rank thus receives the raw chunk it owns from
//    each origin once and reduces the N of them with core::ReduceTree. A
//    rank sends sum_{s=0}^{N-2} (N-1-s) S/N = (N-1) S/2 bytes instead of
//    (N-1) S/N: N/2 times the traffic, for bitwise reproducibility.
//  then (all_reduce only) the all-gather ring below passes the N owned,
//  reduced chunks around.
// all_gather(v): in step t = 0..N-2 rank r passes on block r-t (its own in
// step 0, then the block it received in step t-1). With every recv buffer
// symmetric all blocks are read in place and one round covers the call.
// broadcast: a pipelined chain root -> root+1 -> ... -> root-1; round k of
// rank v is published as FlagValue(seq, k+1) once it is in its recv buffer
// (read in place when symmetric) or its scratch copy.
//
// Cost (N ranks, S bytes per rank, W bytes per round): all_reduce takes
// 2(N-1) flag hops per round, pipelined, ~ (2(N-1) + S/W) hop latencies in
// total; bytes sent per rank 2(N-1)S/N (non-deterministic) or (N-1)S/2 +
// (N-1)S/N (deterministic). reduce_scatter: half of that. all_gather: N-1
// hops per round, (N-1) S per rank received (S = one block). broadcast:
// (N - 1 + S/W) hops, S per rank.
#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "collectives/algorithm.h"
#include "core/copy.h"
#include "core/reduce.h"
#include "core/scratch.h"

namespace mc2::collectives {
namespace {

using internal::kPrivate;

constexpr int kStream = 0;

struct Piece {
  size_t off = 0;  // elements
  size_t len = 0;
};

// The link from the left neighbour and to the right one (see the header).
class Pipe {
 public:
  explicit Pipe(OpContext& ctx)
      : ctx_(ctx), g_(ctx.g), me_(g_->rank()), left_(Mod(me_ - 1, g_->size())),
        right_(Mod(me_ + 1, g_->size())) {}
  int left() const { return left_; }
  // Before writing message q: the right neighbour is done with q - 2.
  void Begin(uint64_t q) const {
    if (q >= 2)
      g_->WaitFlag(ctx_, right_, GroupImpl::StepOff(kStream), GroupImpl::FlagValue(ctx_.seq, q));
  }
  // Message q is readable; then wait for the left neighbour's message q.
  void End(uint64_t q, size_t bytes) const {
    PublishStep(ctx_, kStream, q + 1, bytes);
    g_->WaitFlag(ctx_, left_, GroupImpl::StepOff(kStream), GroupImpl::FlagValue(ctx_.seq, q + 1));
  }
  char* Mine(uint64_t q) const { return g_->Ptr(me_, g_->ScratchOff(static_cast<int>(q % 2))); }
  const char* Left(uint64_t q) const {
    return g_->Ptr(left_, g_->ScratchOff(static_cast<int>(q % 2)));
  }

 private:
  OpContext& ctx_;
  GroupImpl* g_;
  int me_, left_, right_;
};

// Reduce-scatter ring (and, with `all_gather`, the all-gather ring after
// it). chunk(k, c): elements of chunk c of round k in every rank's input
// (and, for all_reduce, in the output). out(k): where this rank's reduced
// chunk of round k goes. `ch` >= every chunk's length: the stride of the
// parts of a message in scratch.
template <class ChunkFn, class OutFn>
void RingReduce(OpContext& ctx, const CollArgs& a, size_t rounds, size_t ch, bool all_gather,
                ChunkFn chunk, OutFn out) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  const int me = g->rank();
  const size_t e = a.esize;
  const bool det = a.deterministic;
  const Pipe pipe(ctx);
  const int left = pipe.left();
  const bool send_sym = ctx.send_off[me] != kPrivate;
  const bool recv_sym = ctx.recv_off[me] != kPrivate;
  const bool left_send_sym = ctx.send_off[left] != kPrivate;
  const bool left_recv_sym = ctx.recv_off[left] != kPrivate;
  const uint64_t per_round = static_cast<uint64_t>(n - 1) * (all_gather ? 2 : 1);
  CheckSteps(ctx, rounds, per_round, "ring");
  // Deterministic mode: the raw contributions to my chunk, by origin.
  core::Scratch<char> coll(det ? static_cast<size_t>(n) * ch * e : 0);
  std::vector<const void*> srcs(n);

  for (size_t k = 0; k < rounds; ++k) {
    const uint64_t q0 = k * per_round;
    auto raw = [&](int c) { return a.send + chunk(k, c).off * e; };
    // Part j (chunk c) of the left neighbour's reduce-scatter message s.
    auto left_part = [&](int s, int j, int c) -> const char* {
      if (s == 0 && left_send_sym) return g->HeapPtr(left, ctx.send_off[left]) + chunk(k, c).off * e;
      return pipe.Left(q0 + s) + j * ch * e;
    };
    const Piece mine = chunk(k, me);

    for (int s = 0; s < n - 1; ++s) {
      const uint64_t q = q0 + s;
      pipe.Begin(q);
      char* slot = pipe.Mine(q);
      size_t bytes = 0;
      if (det) {
        // Origin me-s's raw chunks me+1 .. me+n-1-s.
        for (int j = 0; j < n - 1 - s; ++j) {
          const int c = Mod(me + 1 + j, n);
          const size_t len = chunk(k, c).len;
          bytes += len * e;
          if (len == 0 || (s == 0 && send_sym)) continue;
          core::CopyBytes(slot + j * ch * e, s == 0 ? raw(c) : left_part(s - 1, j + 1, c), len * e);
        }
      } else {
        // The partial result of chunk me-1-s (my raw chunk in step 0).
        const int c = Mod(me - 1 - s, n);
        const size_t len = chunk(k, c).len;
        bytes = len * e;
        if (len && s == 0 && !send_sym) core::CopyBytes(slot, raw(c), len * e);
        if (len && s > 0) core::Combine(a.dtype, a.op, slot, left_part(s - 1, 0, c), raw(c), len);
      }
      pipe.End(q, bytes);
      // The left neighbour's message s starts with my chunk.
      if (det) {
        const int origin = Mod(me - 1 - s, n);
        if (mine.len)
          core::CopyBytes(coll.data() + origin * ch * e, left_part(s, 0, me), mine.len * e);
        if (s == n - 2 && mine.len) {
          for (int x = 0; x < n; ++x)
            srcs[x] = x == me ? static_cast<const void*>(raw(me)) : coll.data() + x * ch * e;
          core::ReduceTree(a.dtype, a.op, out(k), srcs.data(), n, mine.len, n);
        }
      } else if (s == n - 2 && mine.len) {
        core::Combine(a.dtype, a.op, out(k), left_part(s, 0, me), raw(me), mine.len);
        core::FinishAvg(a.dtype, a.op, out(k), mine.len, n);
      }
    }
    if (!all_gather) continue;

    // All-gather: in step t rank r passes on reduced chunk r-t.
    for (int t = 0; t < n - 1; ++t) {
      const uint64_t q = q0 + (n - 1) + t;
      pipe.Begin(q);
      const Piece p = chunk(k, Mod(me - t, n));
      if (p.len && !recv_sym) core::CopyBytes(pipe.Mine(q), a.recv + p.off * e, p.len * e);
      pipe.End(q, p.len * e);
      const Piece lp = chunk(k, Mod(me - 1 - t, n));
      const char* src =
          left_recv_sym ? g->HeapPtr(left, ctx.recv_off[left]) + lp.off * e : pipe.Left(q);
      if (lp.len) core::CopyBytes(a.recv + lp.off * e, src, lp.len * e);
    }
  }
  FinishOperation(ctx, send_sym || recv_sym);
}

// A single rank reduces alone: T(0, 1), with avg dividing by 1.
void ReduceAlone(OpContext& ctx, const CollArgs& a, size_t count) {
  const void* src = a.send;
  if (count) core::ReduceTree(a.dtype, a.op, a.recv, &src, 1, count, 1);
  FinishOperation(ctx, false);
}

}  // namespace

void RingAllReduce(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  if (a.count == 0) return FinishOperation(ctx, false);
  if (n == 1) return ReduceAlone(ctx, a, a.count);
  // A message holds n-1 chunks (deterministic step 0) or one chunk.
  const size_t ch = PartElems(ctx, a.esize, a.deterministic ? n - 1 : 1, "ring");
  const size_t window = ch * n;
  const size_t rounds = CeilDiv(a.count, window);
  auto chunk = [&](size_t k, int c) {
    const size_t base = k * window;
    const size_t len = std::min(window, a.count - base);
    const size_t q = len / n, rem = len % n, uc = static_cast<size_t>(c);
    return Piece{base + uc * q + std::min(uc, rem), q + (uc < rem ? 1 : 0)};
  };
  auto out = [&](size_t k) { return a.recv + chunk(k, g->rank()).off * a.esize; };
  RingReduce(ctx, a, rounds, ch, true, chunk, out);
}

void RingReduceScatterV(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  const size_t maxc = *std::max_element(a.counts.begin(), a.counts.end());
  if (maxc == 0) return FinishOperation(ctx, false);
  if (n == 1) return ReduceAlone(ctx, a, a.counts[0]);
  const size_t ch = PartElems(ctx, a.esize, a.deterministic ? n - 1 : 1, "ring");
  auto chunk = [&](size_t k, int c) {
    const size_t from = k * ch, cnt = a.counts[c];
    return Piece{a.displs[c] + from, from >= cnt ? 0 : std::min(ch, cnt - from)};
  };
  auto out = [&](size_t k) { return a.recv + k * ch * a.esize; };
  RingReduce(ctx, a, CeilDiv(maxc, ch), ch, false, chunk, out);
}

void RingAllGatherV(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  const int me = g->rank();
  const size_t e = a.esize;
  if (!a.in_place && a.counts[me])
    core::CopyBytes(a.recv + a.displs[me] * e, a.send, a.counts[me] * e);
  const size_t maxc = *std::max_element(a.counts.begin(), a.counts.end());
  if (maxc == 0 || n == 1) return FinishOperation(ctx, false);
  const Pipe pipe(ctx);
  const int left = pipe.left();
  const bool send_sym = ctx.send_off[me] != kPrivate;
  const bool recv_sym = ctx.recv_off[me] != kPrivate;
  const bool left_send_sym = ctx.send_off[left] != kPrivate;
  const bool left_recv_sym = ctx.recv_off[left] != kPrivate;
  const bool all_recv = std::all_of(ctx.recv_off.begin(), ctx.recv_off.end(),
                                    [](uint64_t o) { return o != kPrivate; });
  const size_t w = all_recv ? maxc : PartElems(ctx, e, 1, "ring");
  const size_t rounds = CeilDiv(maxc, w);
  CheckSteps(ctx, rounds, n - 1, "ring");
  auto piece = [&](size_t k, int b) -> size_t {
    const size_t from = k * w;
    return from >= a.counts[b] ? 0 : std::min(w, a.counts[b] - from);
  };
  for (size_t k = 0; k < rounds; ++k) {
    for (int t = 0; t < n - 1; ++t) {
      const uint64_t q = k * (n - 1) + t;
      pipe.Begin(q);
      const int c = Mod(me - t, n);
      const size_t len = piece(k, c);
      // My own block is read from my send in step 0, every block from my
      // recv when it is symmetric, else from scratch.
      if (len && !((t == 0 && send_sym) || recv_sym))
        core::CopyBytes(pipe.Mine(q), a.recv + (a.displs[c] + k * w) * e, len * e);
      pipe.End(q, len * e);
      const int lc = Mod(me - 1 - t, n);
      const size_t llen = piece(k, lc);
      if (llen == 0) continue;
      const char* src = (t == 0 && left_send_sym)
                            ? g->HeapPtr(left, ctx.send_off[left]) + k * w * e
                        : left_recv_sym
                            ? g->HeapPtr(left, ctx.recv_off[left]) + (a.displs[lc] + k * w) * e
                            : pipe.Left(q);
      core::CopyBytes(a.recv + (a.displs[lc] + k * w) * e, src, llen * e);
    }
  }
  FinishOperation(ctx, send_sym || recv_sym);
}

void RingBroadcast(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  const int me = g->rank();
  const size_t e = a.esize;
  const bool root = me == a.root;
  if (root && !a.in_place && a.count) core::CopyBytes(a.recv, a.send, a.count * e);
  if (a.count == 0 || n == 1) return FinishOperation(ctx, false);
  const int v = Mod(me - a.root, n);  // position in the chain
  const int parent = Mod(me - 1, n);
  const int child = v + 1 < n ? Mod(me + 1, n) : -1;
  const bool send_sym = ctx.send_off[me] != kPrivate;
  const bool recv_sym = ctx.recv_off[me] != kPrivate;
  const size_t w = PartElems(ctx, e, 1, "ring");
  const size_t rounds = CeilDiv(a.count, w);
  CheckSteps(ctx, rounds, 1, "ring");
  // Where rank x's copy of round k can be read.
  auto src_of = [&](int x, size_t k) -> const char* {
    if (ctx.send_off[x] != kPrivate) return g->HeapPtr(x, ctx.send_off[x]) + k * w * e;  // root
    if (ctx.recv_off[x] != kPrivate) return g->HeapPtr(x, ctx.recv_off[x]) + k * w * e;
    return g->Ptr(x, g->ScratchOff(static_cast<int>(k % 2)));
  };
  const bool copies = child >= 0 && !send_sym && !recv_sym;
  for (size_t k = 0; k < rounds; ++k) {
    const size_t len = std::min(w, a.count - k * w);
    char* dst = a.recv + k * w * e;
    if (v != 0) {
      g->WaitFlag(ctx, parent, GroupImpl::StepOff(kStream), GroupImpl::FlagValue(ctx.seq, k + 1));
      core::CopyBytes(dst, src_of(parent, k), len * e);
    }
    if (copies) {
      // The child read round k-2 from this half.
      if (k >= 2)
        g->WaitFlag(ctx, child, GroupImpl::StepOff(kStream), GroupImpl::FlagValue(ctx.seq, k - 1));
      core::CopyBytes(g->Ptr(me, g->ScratchOff(static_cast<int>(k % 2))), dst, len * e);
    }
    PublishStep(ctx, kStream, k + 1, len * e);
  }
  FinishOperation(ctx, send_sym || recv_sym);
}

}  // namespace mc2::collectives
