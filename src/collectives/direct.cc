// Direct ("one-shot") algorithms.
//
// Works as follows: after the arrival handshake every rank reads what it
// needs straight from its peers -- from their user buffers when those are in
// the symmetric heap, otherwise from copies the peers staged in their scratch
// (in windows of one scratch half, double-buffered). A rank writes only its
// own output. Inputs of at most kInlineBytes/size bytes are staged into the
// inline area before arrival, so a small all-reduce costs one handshake.
//
// Cost (N ranks, S bytes per rank): one flag round-trip per window; every
// rank reads (N-1) S for all_reduce (latency-optimal, bandwidth-heavy), S
// per block for the gathers. Reductions use core::ReduceTree over all N
// contributions, the canonical deterministic order.
//
// Link emulation charges each rank what its peers read of its data
// (DirectPeerBytes; (N-1) S for all_reduce and all-gather, one block per
// peer for all-to-all), on the flag that makes that data readable: the
// arrival when it is staged inline or exposed in place, else each staged
// round's flag.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <vector>

#include "collectives/algorithm.h"
#include "core/copy.h"
#include "core/reduce.h"

namespace mc2::collectives {
namespace {

using internal::kPrivate;

// Pointer to peer r's send buffer at element `elem`, or null if private.
const char* PeerSend(OpContext& ctx, int r, size_t byte_off) {
  return ctx.send_off[r] == kPrivate ? nullptr : ctx.g->HeapPtr(r, ctx.send_off[r]) + byte_off;
}


bool AllSend(OpContext& ctx) {
  return std::all_of(ctx.send_off.begin(), ctx.send_off.end(),
                     [](uint64_t o) { return o != kPrivate; });
}

// Reduction of `n` elements at element offset `elem` of every rank's input
// into dst, reading symmetric inputs in place and staged ones from `half`.
void ReduceWindow(OpContext& ctx, const CollArgs& a, char* dst, size_t elem, size_t n,
                  uint64_t half_off, size_t half_elem) {
  GroupImpl* g = ctx.g;
  std::vector<const void*> srcs(g->size());
  for (int r = 0; r < g->size(); ++r) {
    const char* p = PeerSend(ctx, r, elem * a.esize);
    srcs[r] = p ? p : g->Ptr(r, half_off) + half_elem * a.esize;
  }
  core::ReduceTree(a.dtype, a.op, dst, srcs.data(), g->size(), n, g->size());
}

}  // namespace

size_t DirectInlineBytes(const CollArgs& a, int n) {
  size_t maxc = 0;
  for (size_t c : a.counts) maxc = std::max(maxc, c);
  size_t total = a.counts.empty() ? 0 : a.displs.back() + a.counts.back();
  switch (a.kind) {
    case OpKind::kAllReduce:
    case OpKind::kReduce: return a.count * a.esize;
    case OpKind::kBroadcast: return a.count * a.esize;
    case OpKind::kAllGather:
    case OpKind::kAllGatherV:
    case OpKind::kGather: return maxc * a.esize;
    case OpKind::kScatter: return a.count * a.esize * n;
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterV: return total * a.esize;
    default: return ~size_t{0};
  }
}

size_t DirectPeerBytes(const CollArgs& a, int n, int me) {
  if (n <= 1) return 0;
  const size_t peers = static_cast<size_t>(n - 1);
  const bool root = me == a.root;
  auto others = [&](const std::vector<size_t>& counts) {
    size_t sum = 0;
    for (int r = 0; r < n; ++r)
      if (r != me) sum += counts[r];
    return sum * a.esize;
  };
  switch (a.kind) {
    case OpKind::kAllReduce: return peers * a.count * a.esize;
    case OpKind::kReduce: return root ? 0 : a.count * a.esize;
    case OpKind::kBroadcast:
    case OpKind::kScatter: return root ? peers * a.count * a.esize : 0;
    case OpKind::kAllGather:
    case OpKind::kAllGatherV: return peers * a.counts[me] * a.esize;
    case OpKind::kGather: return root ? 0 : a.counts[me] * a.esize;
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterV: return others(a.counts);
    case OpKind::kAllToAll:
    case OpKind::kAllToAllV: return others(a.send_counts);
    default: return 0;
  }
}

bool DirectInline(const CollArgs& a, int n) {
  // Kept small: the inline copy sits on the latency path of every rank.
  return DirectInlineBytes(a, n) * static_cast<size_t>(n) <= GroupImpl::kInlineBytes;
}

void DirectAllReduce(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  bool exposed = ctx.send_off[g->rank()] != kPrivate;
  if (a.count == 0) return FinishOperation(ctx, false);
  if (AllSend(ctx) || DirectInline(a, g->size())) {
    // Inputs are in place or were staged in the inline area before arrival.
    std::vector<const void*> srcs(g->size());
    for (int r = 0; r < g->size(); ++r) {
      const char* p = PeerSend(ctx, r, 0);
      srcs[r] = p ? p : g->Ptr(r, g->InlineOff(ctx.seq));
    }
    core::ReduceTree(a.dtype, a.op, a.recv, srcs.data(), g->size(), a.count, g->size());
    return FinishOperation(ctx, exposed);
  }
  size_t w = PartElems(ctx, a.esize, 1, "direct");
  RunStagedRounds(
      ctx, 0, CeilDiv(a.count, w),
      [&](size_t k, char* half) -> size_t {
        if (ctx.send_off[g->rank()] != kPrivate) return 0;  // charged at arrival
        size_t n = std::min(w, a.count - k * w);
        core::CopyBytes(half, a.send + k * w * a.esize, n * a.esize);
        return static_cast<size_t>(g->size() - 1) * n * a.esize;
      },
      [&](size_t k, uint64_t half_off) {
        size_t n = std::min(w, a.count - k * w);
        ReduceWindow(ctx, a, a.recv + k * w * a.esize, k * w, n, half_off, 0);
      });
  FinishOperation(ctx, exposed);
}

void DirectReduce(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  bool root = g->rank() == a.root;
  bool exposed = ctx.send_off[g->rank()] != kPrivate;
  if (a.count == 0) return FinishOperation(ctx, false);
  if (AllSend(ctx) || DirectInline(a, g->size())) {
    if (root) {
      std::vector<const void*> srcs(g->size());
      for (int r = 0; r < g->size(); ++r) {
        const char* p = PeerSend(ctx, r, 0);
        srcs[r] = p ? p : g->Ptr(r, g->InlineOff(ctx.seq));
      }
      core::ReduceTree(a.dtype, a.op, a.recv, srcs.data(), g->size(), a.count, g->size());
    }
    return FinishOperation(ctx, exposed || root);
  }
  size_t w = PartElems(ctx, a.esize, 1, "direct");
  RunStagedRounds(
      ctx, 0, CeilDiv(a.count, w),
      [&](size_t k, char* half) -> size_t {
        if (ctx.send_off[g->rank()] != kPrivate) return 0;  // charged at arrival
        size_t n = std::min(w, a.count - k * w);
        core::CopyBytes(half, a.send + k * w * a.esize, n * a.esize);
        return root ? 0 : n * a.esize;
      },
      [&](size_t k, uint64_t half_off) {
        if (!root) return;
        size_t n = std::min(w, a.count - k * w);
        ReduceWindow(ctx, a, a.recv + k * w * a.esize, k * w, n, half_off, 0);
      });
  // Non-roots' staged halves must outlive the root's reads: wait for it.
  FinishOperation(ctx, true);
}

void DirectBroadcast(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  bool root = g->rank() == a.root;
  size_t bytes = a.count * a.esize;
  if (root && !a.in_place && bytes) core::CopyBytes(a.recv, a.send, bytes);
  const char* src = PeerSend(ctx, a.root, 0);
  if (bytes == 0) return FinishOperation(ctx, false);
  if (src || DirectInline(a, g->size())) {
    if (!root) core::CopyBytes(a.recv, src ? src : g->Ptr(a.root, g->InlineOff(ctx.seq)), bytes);
    return FinishOperation(ctx, root);
  }
  size_t w = PartElems(ctx, a.esize, 1, "direct");
  RunStagedRounds(
      ctx, 0, CeilDiv(a.count, w),
      [&](size_t k, char* half) -> size_t {
        if (!root) return 0;
        size_t n = std::min(w, a.count - k * w);
        core::CopyBytes(half, a.send + k * w * a.esize, n * a.esize);
        return static_cast<size_t>(g->size() - 1) * n * a.esize;
      },
      [&](size_t k, uint64_t half_off) {
        if (root) return;
        size_t n = std::min(w, a.count - k * w);
        core::CopyBytes(a.recv + k * w * a.esize, g->Ptr(a.root, half_off), n * a.esize);
      });
  FinishOperation(ctx, root);
}

// Shared by all_gather(v) and gather: `receive(r)` tells whether this rank
// collects rank r's block.
static void GatherBlocks(OpContext& ctx, const CollArgs& a, bool collect) {
  GroupImpl* g = ctx.g;
  int me = g->rank();
  int n = g->size();
  const char* mine = a.in_place ? a.recv + a.displs[me] * a.esize : a.send;
  if (collect && !a.in_place && a.counts[me])
    core::CopyBytes(a.recv + a.displs[me] * a.esize, a.send, a.counts[me] * a.esize);
  size_t maxc = *std::max_element(a.counts.begin(), a.counts.end());
  bool exposed = ctx.send_off[me] != kPrivate;
  bool all_in_place = AllSend(ctx);
  if (maxc == 0) return FinishOperation(ctx, false);
  if (all_in_place || DirectInline(a, n)) {
    if (collect)
      for (int r = 0; r < n; ++r) {
        if (r == me || a.counts[r] == 0) continue;
        const char* p = PeerSend(ctx, r, 0);
        core::CopyBytes(a.recv + a.displs[r] * a.esize, p ? p : g->Ptr(r, g->InlineOff(ctx.seq)),
                    a.counts[r] * a.esize);
      }
    return FinishOperation(ctx, exposed);
  }
  size_t w = PartElems(ctx, a.esize, 1, "direct");
  RunStagedRounds(
      ctx, 0, CeilDiv(maxc, w),
      [&](size_t k, char* half) -> size_t {
        if (exposed || k * w >= a.counts[me]) return 0;  // exposed: charged at arrival
        size_t m = std::min(w, a.counts[me] - k * w);
        core::CopyBytes(half, mine + k * w * a.esize, m * a.esize);
        if (a.kind == OpKind::kGather) return me == a.root ? 0 : m * a.esize;
        return static_cast<size_t>(n - 1) * m * a.esize;
      },
      [&](size_t k, uint64_t half_off) {
        if (!collect) return;
        for (int r = 0; r < n; ++r) {
          if (r == me || k * w >= a.counts[r]) continue;
          size_t m = std::min(w, a.counts[r] - k * w);
          const char* p = PeerSend(ctx, r, k * w * a.esize);
          core::CopyBytes(a.recv + (a.displs[r] + k * w) * a.esize, p ? p : g->Ptr(r, half_off),
                      m * a.esize);
        }
      });
  FinishOperation(ctx, true);
}

void DirectAllGatherV(OpContext& ctx, const CollArgs& a) { GatherBlocks(ctx, a, true); }

void DirectGather(OpContext& ctx, const CollArgs& a) {
  GatherBlocks(ctx, a, ctx.g->rank() == a.root);
}

void DirectScatter(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  int me = g->rank();
  int n = g->size();
  bool root = me == a.root;
  size_t bytes = a.count * a.esize;
  if (root && !a.in_place && bytes) core::CopyBytes(a.recv, a.send + me * bytes, bytes);
  if (bytes == 0) return FinishOperation(ctx, false);
  const char* src = PeerSend(ctx, a.root, me * bytes);
  if (src || DirectInline(a, n)) {
    if (!root)
      core::CopyBytes(a.recv, src ? src : g->Ptr(a.root, g->InlineOff(ctx.seq)) + me * bytes, bytes);
    return FinishOperation(ctx, root);
  }
  size_t w = PartElems(ctx, a.esize, n, "direct");
  RunStagedRounds(
      ctx, 0, CeilDiv(a.count, w),
      [&](size_t k, char* half) -> size_t {
        if (!root) return 0;
        size_t m = std::min(w, a.count - k * w);
        for (int r = 0; r < n; ++r)
          core::CopyBytes(half + r * w * a.esize, a.send + (r * a.count + k * w) * a.esize,
                      m * a.esize);
        return static_cast<size_t>(n - 1) * m * a.esize;
      },
      [&](size_t k, uint64_t half_off) {
        if (root) return;
        size_t m = std::min(w, a.count - k * w);
        core::CopyBytes(a.recv + k * w * a.esize, g->Ptr(a.root, half_off) + me * w * a.esize,
                    m * a.esize);
      });
  FinishOperation(ctx, root);
}

void DirectReduceScatterV(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  int me = g->rank();
  int n = g->size();
  size_t maxc = *std::max_element(a.counts.begin(), a.counts.end());
  bool exposed = ctx.send_off[me] != kPrivate;
  if (maxc == 0) return FinishOperation(ctx, false);
  if (AllSend(ctx) || DirectInline(a, n)) {
    if (a.counts[me]) {
      std::vector<const void*> srcs(n);
      for (int r = 0; r < n; ++r) {
        const char* p = PeerSend(ctx, r, a.displs[me] * a.esize);
        srcs[r] = p ? p : g->Ptr(r, g->InlineOff(ctx.seq)) + a.displs[me] * a.esize;
      }
      core::ReduceTree(a.dtype, a.op, a.recv, srcs.data(), n, a.counts[me], n);
    }
    return FinishOperation(ctx, exposed);
  }
  // Half layout: n slots of w elements; slot r holds window k of block r.
  size_t w = PartElems(ctx, a.esize, n, "direct");
  RunStagedRounds(
      ctx, 0, CeilDiv(maxc, w),
      [&](size_t k, char* half) -> size_t {
        if (exposed) return 0;  // charged at arrival
        size_t peers_read = 0;
        for (int r = 0; r < n; ++r) {
          if (k * w >= a.counts[r]) continue;
          size_t m = std::min(w, a.counts[r] - k * w);
          core::CopyBytes(half + r * w * a.esize, a.send + (a.displs[r] + k * w) * a.esize,
                      m * a.esize);
          if (r != me) peers_read += m * a.esize;
        }
        return peers_read;
      },
      [&](size_t k, uint64_t half_off) {
        if (k * w >= a.counts[me]) return;
        size_t m = std::min(w, a.counts[me] - k * w);
        std::vector<const void*> srcs(n);
        for (int r = 0; r < n; ++r) {
          const char* p = PeerSend(ctx, r, (a.displs[me] + k * w) * a.esize);
          srcs[r] = p ? p : g->Ptr(r, half_off) + me * w * a.esize;
        }
        core::ReduceTree(a.dtype, a.op, a.recv + k * w * a.esize, srcs.data(), n, m, n);
      });
  FinishOperation(ctx, true);
}

void DirectAllToAllV(OpContext& ctx, const CollArgs& a) {
  GroupImpl* g = ctx.g;
  int me = g->rank();
  int n = g->size();
  // Every rank's send counts and displacements were exchanged before
  // arrival (see the dispatcher): table[r] = {counts[0..n), displs[0..n)}.
  auto peer_counts = [&](int r) {
    return reinterpret_cast<const uint64_t*>(g->Ptr(r, g->InlineOff(ctx.seq)));
  };
  auto peer_displs = [&](int r) { return peer_counts(r) + n; };
  for (int r = 0; r < n; ++r)
    if (peer_counts(r)[me] != a.recv_counts[r])
      throw Error(ErrorCode::kMismatch,
                  fmt::format("all_to_allv: rank {} expects {} elements from rank {}, which "
                              "sends {}",
                              me, a.recv_counts[r], r, peer_counts(r)[me]),
                  me, ctx.name, ctx.seq);
  bool exposed = ctx.send_off[me] != kPrivate;
  if (a.recv_counts[me])
    std::memmove(a.recv + a.recv_displs[me] * a.esize, a.send + a.send_displs[me] * a.esize,
                 a.recv_counts[me] * a.esize);
  size_t maxc = 0;
  for (int r = 0; r < n; ++r)
    for (int p = 0; p < n; ++p) maxc = std::max<size_t>(maxc, peer_counts(r)[p]);
  if (maxc == 0 || n == 1) return FinishOperation(ctx, false);
  size_t w = PartElems(ctx, a.esize, n, "direct");
  size_t rounds = AllSend(ctx) ? 1 : CeilDiv(maxc, w);
  if (AllSend(ctx)) w = maxc;
  RunStagedRounds(
      ctx, 0, rounds,
      [&](size_t k, char* half) -> size_t {
        if (exposed) return 0;  // charged at arrival
        size_t peers_read = 0;
        for (int r = 0; r < n; ++r) {
          if (r == me || k * w >= a.send_counts[r]) continue;
          size_t m = std::min(w, a.send_counts[r] - k * w);
          core::CopyBytes(half + r * w * a.esize, a.send + (a.send_displs[r] + k * w) * a.esize,
                      m * a.esize);
          peers_read += m * a.esize;
        }
        return peers_read;
      },
      [&](size_t k, uint64_t half_off) {
        for (int r = 0; r < n; ++r) {
          if (r == me || k * w >= a.recv_counts[r]) continue;
          size_t m = std::min(w, a.recv_counts[r] - k * w);
          const char* p = PeerSend(ctx, r, (peer_displs(r)[me] + k * w) * a.esize);
          core::CopyBytes(a.recv + (a.recv_displs[r] + k * w) * a.esize,
                      p ? p : g->Ptr(r, half_off) + me * w * a.esize, m * a.esize);
        }
      });
  FinishOperation(ctx, true);
}

void DirectBarrier(OpContext& ctx, const CollArgs&) { ctx.g->FinishReads(ctx); }

}  // namespace mc2::collectives
