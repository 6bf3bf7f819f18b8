// Rabenseifner all-reduce: reduce-scatter followed by all-gather.
//
// Works as follows, over shared memory: the vector is cut into N chunks,
// chunk r owned by rank r. Phase 1: rank r reduces chunk r from every rank's
// input (in place for symmetric inputs, from staged copies otherwise) with
// core::ReduceTree, the canonical deterministic order, into its output.
// Phase 2: every rank copies the other N-1 reduced chunks from their owners.
// Private inputs are staged in scratch in windows (double-buffered), all but
// a rank's own chunk, which no peer reads; symmetric send and recv buffers
// need one window and no copies beyond the two phases. Whatever a peer reads
// next (staged inputs, reduced chunks) is written with non-temporal stores:
// a core reads lines from memory faster than out of another core's cache.
// In place, a symmetric buffer is read by the peers in place too: in phase 1
// a rank writes only its own chunk (reduced over itself: ReduceTree allows
// that alias), which no peer reads, and phase 2 overwrites the other chunks
// only after every rank has finished phase 1 (the step-1 flags).
//
// On a switched fabric this is the recursive-halving/doubling schedule; on a
// shared-memory node every rank reaches every other, so both phases take a
// single step. Cost per rank: reads S (phase 1) + S(N-1)/N (phase 2), writes
// S/N + S(N-1)/N; two flag rounds per window. Bandwidth-optimal, hence the
// default for large messages. Link emulation charges each rank what it sends
// on a network: S(N-1)/N in phase 1 (a chunk to each peer) and S(N-1)/N in
// phase 2 (its reduced chunk to each of N-1 peers), 2 S(N-1)/N in all.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/algorithm.h"
#include "core/copy.h"
#include "core/reduce.h"

namespace mc2::collectives {

using internal::kPrivate;

void RabenseifnerAllReduce(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  const int n = g->size();
  const int me = g->rank();
  const size_t e = a.esize;
  const bool send_sym = ctx.send_off[me] != kPrivate;
  const bool recv_sym = ctx.recv_off[me] != kPrivate;
  if (a.count == 0) return FinishOperation(ctx, false);

  bool all_send = true, all_recv = true;
  for (int r = 0; r < n; ++r) {
    all_send &= ctx.send_off[r] != kPrivate;
    all_recv &= ctx.recv_off[r] != kPrivate;
  }
  // Window: all chunks of one round. A scratch half holds the staged input
  // window followed by this rank's reduced chunk of it.
  size_t window = a.count;
  if (!(all_send && all_recv)) {
    size_t fit = g->scratch_bytes() / e;
    window = fit * n / (n + 1);
    window = std::max<size_t>(window / (16 * n) * (16 * n), n);
  }
  const size_t rounds = (a.count + window - 1) / window;
  auto chunk = [&](size_t len, int r, size_t* off) {
    size_t q = len / n, rem = len % n;
    *off = r * q + std::min<size_t>(r, rem);
    return q + (static_cast<size_t>(r) < rem ? 1 : 0);
  };
  std::vector<const void*> srcs(n);

  for (size_t k = 0; k < rounds; ++k) {
    const size_t base = k * window;
    const size_t len = std::min(window, a.count - base);
    const uint64_t half = g->ScratchOff(static_cast<int>(k % 2));
    const size_t result_at = len * e;  // in the half, after the input window
    // Halves are reused two rounds later, once every peer staged round k-1.
    if (k >= 2) WaitAll(ctx, 0, k);
    size_t off;
    size_t m = chunk(len, me, &off);
    // A private input is staged for the peers: every chunk but this rank's
    // own, which it reduces from its input directly (2 ranks: half the
    // staging copy), with non-temporal stores (core::StreamBytes).
    if (!send_sym) {
      core::StreamBytes(g->Ptr(me, half), a.send + base * e, off * e);
      core::StreamBytes(g->Ptr(me, half) + (off + m) * e, a.send + (base + off + m) * e,
                        (len - off - m) * e);
    }
    PublishStep(ctx, 0, k + 1, (len - m) * e);
    WaitAll(ctx, 0, k + 1);

    // Phase 1: reduce my chunk of the window.
    for (int r = 0; r < n; ++r)
      srcs[r] = ctx.send_off[r] != kPrivate ? g->HeapPtr(r, ctx.send_off[r]) + (base + off) * e
                : r == me                   ? a.send + (base + off) * e
                                            : g->Ptr(r, half) + off * e;
    // The peers copy this chunk next (phase 2): written for them, it goes
    // to memory rather than staying in this core's cache (core::ResultUse;
    // a private output is staged for them the same way).
    char* mine = a.recv + (base + off) * e;
    if (m)
      core::ReduceTree(a.dtype, a.op, mine, srcs.data(), n, m, n,
                       recv_sym ? core::ResultUse::kPeers : core::ResultUse::kLocal);
    if (!recv_sym && m) core::StreamBytes(g->Ptr(me, half) + result_at, mine, m * e);
    // N-1 peers read it: each gets its own copy over this rank's port.
    PublishStep(ctx, 1, k + 1, static_cast<size_t>(n - 1) * m * e);
    WaitAll(ctx, 1, k + 1);

    // Phase 2: gather the other chunks from their owners.
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      size_t roff;
      size_t rm = chunk(len, r, &roff);
      if (!rm) continue;
      const char* src = ctx.recv_off[r] != kPrivate
                            ? g->HeapPtr(r, ctx.recv_off[r]) + (base + roff) * e
                            : g->Ptr(r, half) + result_at;
      core::CopyBytes(a.recv + (base + roff) * e, src, rm * e);
    }
  }
  FinishOperation(ctx, send_sym || recv_sym);
}

}  // namespace mc2::collectives
