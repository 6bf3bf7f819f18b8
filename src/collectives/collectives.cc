// The public collective calls: validate once, fingerprint, pick the
// algorithm, and hand the call to the progress engine (the one dispatch
// point for every collective).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>

#include "collectives/algorithm.h"
#include "collectives/net_algorithms.h"
#include "collectives/selector.h"
#include "core/checked.h"
#include "core/enforce.h"
#include "core/log.h"
#include "engine/access.h"
#include "trace/recorder.h"

namespace mc2 {

namespace collectives {

const AlgorithmTable& Algorithms() {
  static const AlgorithmTable table = [] {
    AlgorithmTable t;
    auto set = [&](Algorithm a, OpKind k, AlgorithmFn f) {
      t.fn[static_cast<int>(a)][static_cast<int>(k)] = f;
    };
    set(Algorithm::kDirect, OpKind::kAllReduce, DirectAllReduce);
    set(Algorithm::kDirect, OpKind::kReduce, DirectReduce);
    set(Algorithm::kDirect, OpKind::kBroadcast, DirectBroadcast);
    set(Algorithm::kDirect, OpKind::kAllGather, DirectAllGatherV);
    set(Algorithm::kDirect, OpKind::kAllGatherV, DirectAllGatherV);
    set(Algorithm::kDirect, OpKind::kGather, DirectGather);
    set(Algorithm::kDirect, OpKind::kScatter, DirectScatter);
    set(Algorithm::kDirect, OpKind::kReduceScatter, DirectReduceScatterV);
    set(Algorithm::kDirect, OpKind::kReduceScatterV, DirectReduceScatterV);
    set(Algorithm::kDirect, OpKind::kAllToAll, DirectAllToAllV);
    set(Algorithm::kDirect, OpKind::kAllToAllV, DirectAllToAllV);
    set(Algorithm::kDirect, OpKind::kBarrier, DirectBarrier);
    set(Algorithm::kRabenseifner, OpKind::kAllReduce, RabenseifnerAllReduce);
    RegisterMoreAlgorithms(t);
    return t;
  }();
  return table;
}

namespace {

constexpr size_t kInlineMaxBytes = 4 * 1024 * 1024;

uint64_t HashCounts(const std::vector<size_t>& a, const std::vector<size_t>& b = {}) {
  uint64_t h = 1469598103934665603ull;
  for (auto* v : {&a, &b})
    for (size_t x : *v) {
      h ^= x;
      h *= 1099511628211ull;
    }
  return h;
}

bool Overlap(const void* a, size_t an, const void* b, size_t bn) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
}

void CheckCommon(const Group& g, const char* name, DType dtype) {
  MC2_CHECK_ARG(g.valid(), "{}: the group is invalid (empty)", name);
  MC2_CHECK_ARG(static_cast<int>(dtype) < kNumDTypes, "{}: dtype {} is not a valid mc2::DType",
                name, static_cast<int>(dtype));
}

void CheckRoot(const Group& g, const char* name, int root) {
  MC2_CHECK_ARG(root >= 0 && root < g.size(), "{}: root {} is out of range [0, {})", name, root,
                g.size());
}

// A buffer argument: not null when it holds data, and small enough that its
// end is an address (bytes is already checked against overflow).
void CheckPtr(const char* name, const char* what, const void* p, size_t bytes) {
  MC2_CHECK_ARG(p != nullptr || bytes == 0, "{}: {} is null but {} bytes are needed", name, what,
                bytes);
  core::CheckBufferRange(name, what, p, bytes);
}

// Whether `p` is the address `base` + `offset`, compared as integers so that
// no out-of-range pointer is formed.
bool IsAt(const void* p, const void* base, size_t offset) {
  return reinterpret_cast<uintptr_t>(p) == reinterpret_cast<uintptr_t>(base) + offset;
}

// What Launch decided for one call, shared by its inline and queued forms.
struct Plan {
  AlgorithmFn fn;
  Algorithm algo;
  internal::Fingerprint fp;
  const void* expose_send;
  size_t expose_bytes;
  const void* expose_recv;
  std::chrono::nanoseconds timeout;
  int n;
  bool eager;
  size_t eager_stage_bytes;  // EagerStagedBytes, when eager
};

internal::Fingerprint MakeFingerprint(OpKind kind, DType dtype, ReduceOp op, int root, size_t count,
                                      Algorithm algo) {
  internal::Fingerprint fp;
  fp.kind = static_cast<uint16_t>(kind);
  fp.dtype = static_cast<uint8_t>(dtype);
  fp.op = static_cast<uint8_t>(op);
  fp.root = root;
  fp.count = count;
  // Algorithms may differ across ranks only if the user forces different
  // ones; record the choice so such a mix is reported, not run.
  fp.algorithm = static_cast<uint8_t>(algo);
  return fp;
}

// The start of every collective body: names its trace span (one per
// collective, from the start of its body -- staging, arrival, algorithm --
// to its end; off, the span costs one relaxed load), applies the call's
// timeout, and records and logs the algorithm.
void Announce(OpContext& ctx, trace::ScopedSpan& span, Algorithm algo, size_t bytes, size_t count,
              DType dtype, int n, bool eager, std::chrono::nanoseconds timeout) {
  if (span.on()) {
    span.span().name = ctx.name;
    span.span().algorithm = AlgorithmName(algo);
    span.span().bytes = bytes;
    span.span().rank = ctx.g->trace_rank();
  }
  if (timeout.count() > 0) ctx.timeout = timeout;
  ctx.work->SetAlgorithm(AlgorithmName(algo));
  MC2_LOG(kDebug, "{} #{}: {}{} count={} dtype={} on {} ranks", ctx.name, ctx.seq,
          AlgorithmName(algo), eager ? " (eager)" : "", count, DTypeName(dtype), n);
}

// The body of every collective, on whichever thread runs it.
void RunBody(OpContext& ctx, const CollArgs& a, const Plan& p) {
  GroupImpl* g = ctx.g;
  // Inline areas are written below, before any handshake (RunEager waits
  // for its own slots).
  if (!p.eager) g->AwaitReuse(ctx);
  trace::ScopedSpan span(trace::Category::kComm);
  Announce(ctx, span, p.algo, std::max(a.send_bytes, a.recv_bytes), a.count, a.dtype, p.n, p.eager,
           p.timeout);
  if (p.eager) return RunEager(ctx, a, p.fp, p.eager_stage_bytes);
  // Stage what travels with the arrival handshake.
  char* inl = g->Ptr(g->rank(), g->InlineOff(ctx.seq));
  // Small direct calls always stage: copying a few bytes is cheaper
  // than the extra handshake that protects in-place reads at the end.
  bool inline_stage = p.algo == Algorithm::kDirect && DirectInline(a, p.n);
  bool exposed = p.expose_send && !inline_stage &&
                 g->HeapOffset(p.expose_send, p.expose_bytes) != internal::kPrivate;
  if (inline_stage) {
    size_t b = DirectInlineBytes(a, p.n);
    const char* src = static_cast<const char*>(p.expose_send);
    if (a.kind == OpKind::kAllReduce || a.kind == OpKind::kReduce ||
        a.kind == OpKind::kReduceScatter || a.kind == OpKind::kReduceScatterV)
      src = a.send;
    if (a.kind == OpKind::kAllGather || a.kind == OpKind::kAllGatherV ||
        a.kind == OpKind::kGather) {
      src = a.in_place ? a.recv + a.displs[g->rank()] * a.esize : a.send;
      b = a.counts[g->rank()] * a.esize;
    }
    bool stages = true;
    if (a.kind == OpKind::kBroadcast || a.kind == OpKind::kScatter)
      stages = g->rank() == a.root;
    if (stages && b) std::memcpy(inl, src, b);
  }
  if (a.kind == OpKind::kAllToAllV || a.kind == OpKind::kAllToAll) {
    auto* t = reinterpret_cast<uint64_t*>(inl);
    for (int r = 0; r < p.n; ++r) {
      t[r] = a.send_counts[r];
      t[p.n + r] = a.send_displs[r];
    }
  }
  // A direct call's data is readable from the arrival on when it was
  // staged inline or is exposed in place: the arrival carries it (the staged
  // rounds charge the rest; other algorithms charge their own steps).
  const size_t arrival_payload = p.algo == Algorithm::kDirect && (inline_stage || exposed)
                                     ? DirectPeerBytes(a, p.n, g->rank())
                                     : 0;
  g->Arrive(ctx, p.fp, exposed ? p.expose_send : nullptr, p.expose_bytes, p.expose_recv,
            a.recv_bytes, arrival_payload);
  p.fn(ctx, a);
}

// `a` by reference: a call run inline never copies or moves its arguments
// (only a queued one moves them into its task).
Work Launch(const Group& g, CollArgs&& a, const CollectiveOptions& opts, size_t select_bytes) {
  GroupImpl* gi = internal::Access::Impl(g);
  // A group that spans hosts has algorithms of its own (net_algorithms.h).
  if (gi->net_group)
    return LaunchNet(g, std::move(a), opts, opts.may_run_inline && select_bytes <= kInlineMaxBytes);
  const int n = gi->size();
  a.esize = DTypeSize(a.dtype);
  a.deterministic = gi->world().deterministic;
  Algorithm algo = collectives::SelectAlgorithm(a.kind, opts.algorithm, n, select_bytes);
  AlgorithmFn fn = Algorithms().fn[static_cast<int>(algo)][static_cast<int>(a.kind)];
  MC2_ENFORCE(fn != nullptr, "no implementation of {} for {}", AlgorithmName(algo),
              internal::OpKindName(a.kind));

  const size_t eager_stage_bytes = EagerStagedBytes(a, n);
  const bool eager = algo == Algorithm::kDirect && !gi->strict_check() &&
                     eager_stage_bytes <= GroupImpl::kInlineBytes;
  // In place, an all-to-all overwrites blocks of its input that peers have
  // yet to read. The eager path stages the whole input before it writes any
  // output. The staged rounds of the direct all-to-all stage window k of
  // every outgoing block, then write window k of every incoming block: with
  // one count for all blocks (not v) both windows cover the same bytes, so
  // in place they need no copy either, only an input the peers do not read
  // directly (expose_send below), which saves copying a large input.
  // All-to-allv works from a private copy of the input (documented cost of
  // in-place all-to-allv).
  const bool a2a_stages_in_place = a.in_place && !eager && a.kind == OpKind::kAllToAll;
  if (a.in_place && !eager && a.kind == OpKind::kAllToAllV) {
    size_t extent = 0;
    for (int r = 0; r < n; ++r) extent = std::max(extent, a.send_displs[r] + a.send_counts[r]);
    a.owned_send = gi->CopyOfInput(a.send, extent * a.esize);
    a.send = a.owned_send->data();
  }
  internal::Fingerprint fp = MakeFingerprint(a.kind, a.dtype, a.op, a.root, a.count, algo);
  if (a.kind == OpKind::kAllGatherV || a.kind == OpKind::kReduceScatterV)
    fp.aux = HashCounts(a.counts, a.displs);

  // What the peers may read in place: reducing collectives do not expose an
  // in-place buffer (it is overwritten while others still read it), except
  // Rabenseifner's all-reduce: there a rank writes only the chunk it owns
  // until every rank has reduced (rabenseifner.cc), so its peers read their
  // chunks of the input undisturbed, and in place needs no staged copy.
  const bool reducing = a.kind == OpKind::kAllReduce || a.kind == OpKind::kReduce;
  // The direct reduce is the other exception: only the root writes, and
  // only the root reads the root's input (ReduceTree lets the result alias
  // it); a non-root's buffer is not written at all, so staging it in place
  // would be a copy for nothing.
  const bool input_intact_while_read =
      (a.kind == OpKind::kAllReduce && algo == Algorithm::kRabenseifner) ||
      (a.kind == OpKind::kReduce && algo == Algorithm::kDirect);
  const void* expose_send = (a.in_place && reducing && !input_intact_while_read) ? nullptr : a.send;
  if (a.kind == OpKind::kAllGather || a.kind == OpKind::kAllGatherV ||
      a.kind == OpKind::kGather) {
    if (a.in_place) expose_send = a.recv + a.displs[gi->rank()] * a.esize;
  }
  if (a.kind == OpKind::kBroadcast && a.in_place) expose_send = a.recv;
  if (a.kind == OpKind::kScatter && a.in_place) expose_send = a.send;
  if (a2a_stages_in_place) expose_send = nullptr;
  size_t expose_bytes = a.send_bytes;
  if (a.kind == OpKind::kAllGather || a.kind == OpKind::kAllGatherV || a.kind == OpKind::kGather)
    expose_bytes = a.counts[gi->rank()] * a.esize;
  const void* expose_recv = a.recv;

  // Calls up to kInlineMaxBytes run on the caller when the engine is idle:
  // a hand-off to the progress thread and back costs two thread wake-ups
  // and a queued task, a large share of such a call-and-wait
  // (docs/architecture.md). Larger calls stay asynchronous; callers
  // that overlap set may_run_inline = false.
  bool small = opts.may_run_inline && select_bytes <= kInlineMaxBytes;
  const char* name = internal::OpKindName(a.kind);
  const Plan plan{.fn = fn,
                  .algo = algo,
                  .fp = fp,
                  .expose_send = expose_send,
                  .expose_bytes = expose_bytes,
                  .expose_recv = expose_recv,
                  .timeout = opts.timeout,
                  .n = n,
                  .eager = eager,
                  .eager_stage_bytes = eager_stage_bytes};
  if (small) {
    // Runs before this function returns: the arguments need not be moved.
    if (auto w = gi->TryRunInline(name, [&](OpContext& ctx) { RunBody(ctx, a, plan); }))
      return std::move(*w);
  }
  return gi->Submit(name, false, [a = std::move(a), plan](OpContext& ctx) mutable {
    RunBody(ctx, a, plan);
    // Let go of the input's copy before the call completes, so that the
    // caller's next call finds it free (GroupImpl::CopyOfInput): the task
    // itself may be destroyed only after the caller woke.
    a.owned_send.reset();
  });
}

// An all_reduce that takes the eager path (a stage of at most
// GroupImpl::kInlineBytes: the latency-bound calls) runs inline from its
// arguments: the same protocol, fingerprint, span and checks as Launch's
// path, without building a CollArgs and a Plan and without RunEager's
// dispatch on the kind, because at these sizes that software is a large
// part of the call. Empty when the call takes Launch's path instead:
// an algorithm other than direct (forced or tuned), MC2_CHECK=1,
// may_run_inline off, or a busy engine.
std::optional<Work> TryEagerAllReduce(const Group& g, const void* send, void* recv, size_t count,
                                      DType dtype, ReduceOp op, const CollectiveOptions& opts,
                                      size_t bytes) {
  GroupImpl* gi = internal::Access::Impl(g);
  if (gi->net_group || bytes > GroupImpl::kInlineBytes || !opts.may_run_inline ||
      gi->strict_check())
    return std::nullopt;
  const int n = gi->size();
  const Algorithm algo = SelectAlgorithm(OpKind::kAllReduce, opts.algorithm, n, bytes);
  if (algo != Algorithm::kDirect) return std::nullopt;
  const internal::Fingerprint fp =
      MakeFingerprint(OpKind::kAllReduce, dtype, op, kNoRoot, count, algo);
  return gi->TryRunInline(internal::OpKindName(OpKind::kAllReduce), [&](OpContext& ctx) {
    trace::ScopedSpan span(trace::Category::kComm);
    Announce(ctx, span, algo, bytes, count, dtype, n, /*eager=*/true, opts.timeout);
    RunEagerAllReduce(ctx, send, recv, count, dtype, op, fp);
  });
}

}  // namespace
}  // namespace collectives

using collectives::CollArgs;
using collectives::CheckCommon;
using collectives::CheckPtr;
using collectives::CheckRoot;
using collectives::Launch;
using internal::OpKind;

Work AllReduce(const Group& g, const void* send, void* recv, size_t count, DType dtype,
               ReduceOp op, const CollectiveOptions& opts) {
  CheckCommon(g, "all_reduce", dtype);
  MC2_CHECK_ARG(IsValidReduction(dtype, op), "all_reduce: op {} is not defined for dtype {}",
                ReduceOpName(op), DTypeName(dtype));
  const size_t bytes = core::CheckedBytes("all_reduce", "count", count, dtype);
  CheckPtr("all_reduce", "send", send, bytes);
  CheckPtr("all_reduce", "recv", recv, bytes);
  MC2_CHECK_ARG(send == recv || !collectives::Overlap(send, bytes, recv, bytes),
                "all_reduce: send and recv overlap without being the same buffer");
  if (auto w = collectives::TryEagerAllReduce(g, send, recv, count, dtype, op, opts, bytes))
    return std::move(*w);
  CollArgs a;
  a.kind = OpKind::kAllReduce;
  a.send = static_cast<const char*>(send);
  a.recv = static_cast<char*>(recv);
  a.count = count;
  a.dtype = dtype;
  a.op = op;
  a.in_place = send == recv;
  a.send_bytes = a.recv_bytes = bytes;
  return Launch(g, std::move(a), opts, bytes);
}

Work Reduce(const Group& g, const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
            int root, const CollectiveOptions& opts) {
  CheckCommon(g, "reduce", dtype);
  CheckRoot(g, "reduce", root);
  MC2_CHECK_ARG(IsValidReduction(dtype, op), "reduce: op {} is not defined for dtype {}",
                ReduceOpName(op), DTypeName(dtype));
  const size_t bytes = core::CheckedBytes("reduce", "count", count, dtype);
  bool is_root = g.rank() == root;
  CheckPtr("reduce", "send", send, bytes);
  if (is_root) CheckPtr("reduce", "recv", recv, bytes);
  MC2_CHECK_ARG(!is_root || send == recv || !collectives::Overlap(send, bytes, recv, bytes),
                "reduce: send and recv overlap without being the same buffer");
  CollArgs a;
  a.kind = OpKind::kReduce;
  a.send = static_cast<const char*>(send);
  a.recv = is_root ? static_cast<char*>(recv) : nullptr;
  a.count = count;
  a.dtype = dtype;
  a.op = op;
  a.root = root;
  a.in_place = is_root && send == recv;
  a.send_bytes = bytes;
  a.recv_bytes = is_root ? bytes : 0;
  return Launch(g, std::move(a), opts, bytes);
}

Work Broadcast(const Group& g, const void* send, void* recv, size_t count, DType dtype, int root,
               const CollectiveOptions& opts) {
  CheckCommon(g, "broadcast", dtype);
  CheckRoot(g, "broadcast", root);
  const size_t bytes = core::CheckedBytes("broadcast", "count", count, dtype);
  bool is_root = g.rank() == root;
  if (is_root) CheckPtr("broadcast", "send", send, bytes);
  CheckPtr("broadcast", "recv", recv, bytes);
  MC2_CHECK_ARG(!is_root || send == recv || !collectives::Overlap(send, bytes, recv, bytes),
                "broadcast: send and recv overlap without being the same buffer");
  CollArgs a;
  a.kind = OpKind::kBroadcast;
  a.send = is_root ? static_cast<const char*>(send) : nullptr;
  a.recv = static_cast<char*>(recv);
  a.count = count;
  a.dtype = dtype;
  a.root = root;
  a.in_place = is_root && send == recv;
  a.send_bytes = is_root ? bytes : 0;
  a.recv_bytes = bytes;
  return Launch(g, std::move(a), opts, bytes);
}

namespace {
Work GatherLike(const Group& g, OpKind kind, const char* name, const void* send, void* recv,
                std::vector<size_t> counts, std::vector<size_t> displs, DType dtype, int root,
                const CollectiveOptions& opts) {
  CheckCommon(g, name, dtype);
  int n = g.size();
  MC2_CHECK_ARG(static_cast<int>(counts.size()) == n, "{}: {} counts given for {} ranks", name,
                counts.size(), n);
  if (displs.empty()) displs = core::CheckedPackedDispls(name, "counts", counts);
  MC2_CHECK_ARG(static_cast<int>(displs.size()) == n, "{}: {} displacements given for {} ranks",
                name, displs.size(), n);
  size_t e = DTypeSize(dtype);
  bool receives = root < 0 || g.rank() == root;
  // Counts and displacements agree across ranks (the fingerprint checks
  // them), so every rank checks the whole output extent and all fail alike.
  size_t extent = 0;
  for (int r = 0; r < n; ++r)
    extent =
        std::max(extent, core::CheckedAdd(displs[r], counts[r], "{}: displs[{}] {} + counts[{}] {}",
                                          name, r, displs[r], r, counts[r]));
  // Every block lies within the extent, so no block's byte size overflows.
  const size_t extent_bytes =
      core::CheckedBytes(name, "the output extent (elements)", extent, dtype);
  for (int r = 0; r < n && receives; ++r)
    for (int q = r + 1; q < n; ++q)
      MC2_CHECK_ARG(!collectives::Overlap(reinterpret_cast<void*>(displs[r] * e + 1), counts[r] * e,
                                          reinterpret_cast<void*>(displs[q] * e + 1), counts[q] * e),
                    "{}: the output blocks of ranks {} and {} overlap", name, r, q);
  size_t mine = counts[g.rank()] * e;
  char* recvc = static_cast<char*>(recv);
  bool in_place = receives && collectives::IsAt(send, recv, displs[g.rank()] * e);
  if (!in_place) CheckPtr(name, "send", send, mine);
  if (receives) CheckPtr(name, "recv", recv, extent_bytes);
  MC2_CHECK_ARG(in_place || !receives || !collectives::Overlap(send, mine, recv, extent_bytes),
                "{}: send overlaps recv without being this rank's block of it (in place)", name);
  CollArgs a;
  a.kind = kind;
  a.send = static_cast<const char*>(send);
  a.recv = receives ? recvc : nullptr;
  a.count = kind == OpKind::kAllGatherV ? 0 : counts[0];
  a.dtype = dtype;
  a.root = root;
  a.in_place = in_place;
  a.counts = std::move(counts);
  a.displs = std::move(displs);
  a.send_bytes = mine;
  a.recv_bytes = receives ? extent_bytes : 0;
  size_t maxb = *std::max_element(a.counts.begin(), a.counts.end()) * e;
  return Launch(g, std::move(a), opts, maxb);
}

// The gathers with one count per rank: count x ranks elements must fit,
// checked with a message that names the count.
void CheckGatheredCount(const Group& g, const char* name, size_t count, DType dtype) {
  CheckCommon(g, name, dtype);
  const size_t total = core::CheckedMul(count, static_cast<size_t>(g.size()),
                                        "{}: count {} x {} ranks", name, count, g.size());
  core::CheckedBytes(name, "count x ranks", total, dtype);
}
}  // namespace

Work AllGather(const Group& g, const void* send, void* recv, size_t count, DType dtype,
               const CollectiveOptions& opts) {
  CheckGatheredCount(g, "all_gather", count, dtype);
  return GatherLike(g, OpKind::kAllGather, "all_gather", send, recv,
                    std::vector<size_t>(g.size(), count), {}, dtype, -1, opts);
}

Work AllGatherV(const Group& g, const void* send, void* recv, std::span<const size_t> counts,
                std::span<const size_t> displs, DType dtype, const CollectiveOptions& opts) {
  return GatherLike(g, OpKind::kAllGatherV, "all_gatherv", send, recv,
                    {counts.begin(), counts.end()}, {displs.begin(), displs.end()}, dtype, -1,
                    opts);
}

Work Gather(const Group& g, const void* send, void* recv, size_t count, DType dtype, int root,
            const CollectiveOptions& opts) {
  CheckGatheredCount(g, "gather", count, dtype);
  CheckRoot(g, "gather", root);
  return GatherLike(g, OpKind::kGather, "gather", send, recv,
                    std::vector<size_t>(g.size(), count), {}, dtype, root, opts);
}

Work Scatter(const Group& g, const void* send, void* recv, size_t count, DType dtype, int root,
             const CollectiveOptions& opts) {
  CheckCommon(g, "scatter", dtype);
  CheckRoot(g, "scatter", root);
  const size_t n = static_cast<size_t>(g.size());
  const size_t bytes = core::CheckedBytes("scatter", "count", count, dtype);
  // The root's input; checked on every rank, so that all fail alike.
  const size_t send_bytes =
      core::CheckedMul(bytes, n, "scatter: count {} x {} bytes ({}) x {} ranks", count,
                       DTypeSize(dtype), DTypeName(dtype), n);
  core::CheckBufferBytes("scatter", "send (count x ranks)", send_bytes);
  bool is_root = g.rank() == root;
  const char* sendc = static_cast<const char*>(send);
  bool in_place = is_root && collectives::IsAt(recv, send, static_cast<size_t>(root) * bytes);
  if (is_root) CheckPtr("scatter", "send", send, send_bytes);
  CheckPtr("scatter", "recv", recv, bytes);
  MC2_CHECK_ARG(!is_root || in_place || !collectives::Overlap(send, send_bytes, recv, bytes),
                "scatter: recv overlaps send without being the root's block of it (in place)");
  CollArgs a;
  a.kind = OpKind::kScatter;
  a.send = is_root ? sendc : nullptr;
  a.recv = static_cast<char*>(recv);
  a.count = count;
  a.dtype = dtype;
  a.root = root;
  a.in_place = in_place;
  a.send_bytes = is_root ? send_bytes : 0;
  a.recv_bytes = bytes;
  return Launch(g, std::move(a), opts, bytes);
}

Work ReduceScatterV(const Group& g, const void* send, void* recv, std::span<const size_t> counts,
                    DType dtype, ReduceOp op, const CollectiveOptions& opts) {
  CheckCommon(g, "reduce_scatterv", dtype);
  MC2_CHECK_ARG(IsValidReduction(dtype, op), "reduce_scatter: op {} is not defined for dtype {}",
                ReduceOpName(op), DTypeName(dtype));
  int n = g.size();
  MC2_CHECK_ARG(static_cast<int>(counts.size()) == n, "reduce_scatterv: {} counts for {} ranks",
                counts.size(), n);
  std::vector<size_t> c(counts.begin(), counts.end());
  size_t total = 0;
  auto d = core::CheckedPackedDispls("reduce_scatterv", "counts", c, &total);
  const size_t total_bytes =
      core::CheckedBytes("reduce_scatterv", "the sum of counts", total, dtype);
  size_t e = DTypeSize(dtype);
  const size_t mine = c[g.rank()] * e;  // within total_bytes
  bool in_place = collectives::IsAt(recv, send, d[g.rank()] * e);
  CheckPtr("reduce_scatter", "send", send, total_bytes);
  CheckPtr("reduce_scatter", "recv", recv, mine);
  MC2_CHECK_ARG(in_place || !collectives::Overlap(send, total_bytes, recv, mine),
                "reduce_scatter: recv overlaps send without being this rank's block (in place)");
  CollArgs a;
  a.kind = OpKind::kReduceScatterV;
  a.send = static_cast<const char*>(send);
  a.recv = static_cast<char*>(recv);
  a.dtype = dtype;
  a.op = op;
  a.in_place = in_place;
  a.counts = std::move(c);
  a.displs = std::move(d);
  a.send_bytes = total_bytes;
  a.recv_bytes = mine;
  size_t maxb = *std::max_element(a.counts.begin(), a.counts.end()) * e;
  return Launch(g, std::move(a), opts, core::SaturatingMul(maxb, n));
}

Work ReduceScatter(const Group& g, const void* send, void* recv, size_t count, DType dtype,
                   ReduceOp op, const CollectiveOptions& opts) {
  MC2_CHECK_ARG(g.valid(), "reduce_scatter: the group is invalid (empty)");
  // Same implementation; kind differs only for the fingerprint and tables.
  CheckCommon(g, "reduce_scatter", dtype);
  MC2_CHECK_ARG(IsValidReduction(dtype, op), "reduce_scatter: op {} is not defined for dtype {}",
                ReduceOpName(op), DTypeName(dtype));
  const size_t n = static_cast<size_t>(g.size());
  const size_t e = DTypeSize(dtype);
  const size_t recv_bytes = core::CheckedBytes("reduce_scatter", "count", count, dtype);
  const size_t send_bytes =
      core::CheckedMul(recv_bytes, n, "reduce_scatter: count {} x {} bytes ({}) x {} ranks", count,
                       e, DTypeName(dtype), n);
  core::CheckBufferBytes("reduce_scatter", "send (count x ranks)", send_bytes);
  std::vector<size_t> counts(n, count);
  bool in_place = collectives::IsAt(recv, send, g.rank() * recv_bytes);
  CheckPtr("reduce_scatter", "send", send, send_bytes);
  CheckPtr("reduce_scatter", "recv", recv, recv_bytes);
  MC2_CHECK_ARG(in_place || !collectives::Overlap(send, send_bytes, recv, recv_bytes),
                "reduce_scatter: recv overlaps send without being this rank's block (in place)");
  CollArgs a;
  a.kind = OpKind::kReduceScatter;
  a.send = static_cast<const char*>(send);
  a.recv = static_cast<char*>(recv);
  a.count = count;
  a.dtype = dtype;
  a.op = op;
  a.in_place = in_place;
  a.counts = std::move(counts);
  a.displs = core::CheckedPackedDispls("reduce_scatter", "counts", a.counts);
  a.send_bytes = send_bytes;
  a.recv_bytes = recv_bytes;
  return Launch(g, std::move(a), opts, send_bytes);
}

namespace {
// all_to_all is all_to_allv with every count equal; it keeps its own kind so
// that the fingerprint carries the count (every rank then agrees the call is
// small enough for the eager path).
Work AllToAllLike(const Group& g, OpKind kind, const char* name, const void* send,
                  std::span<const size_t> send_counts, std::span<const size_t> send_displs,
                  void* recv, std::span<const size_t> recv_counts,
                  std::span<const size_t> recv_displs, DType dtype, const CollectiveOptions& opts) {
  CheckCommon(g, name, dtype);
  int n = g.size();
  MC2_CHECK_ARG(
      static_cast<int>(send_counts.size()) == n && static_cast<int>(recv_counts.size()) == n,
      "{}: need {} send and recv counts", name, n);
  MC2_CHECK_ARG(n <= 512, "{}: groups of more than 512 ranks are not supported", name);
  std::vector<size_t> sc(send_counts.begin(), send_counts.end());
  std::vector<size_t> rc(recv_counts.begin(), recv_counts.end());
  std::vector<size_t> sd = send_displs.empty()
                               ? core::CheckedPackedDispls(name, "send_counts", sc)
                               : std::vector<size_t>(send_displs.begin(), send_displs.end());
  std::vector<size_t> rd = recv_displs.empty()
                               ? core::CheckedPackedDispls(name, "recv_counts", rc)
                               : std::vector<size_t>(recv_displs.begin(), recv_displs.end());
  MC2_CHECK_ARG(static_cast<int>(sd.size()) == n && static_cast<int>(rd.size()) == n,
                "{}: need {} send and recv displacements", name, n);
  MC2_CHECK_ARG(sc[g.rank()] == rc[g.rank()],
                "{}: this rank sends itself {} elements but expects {}", name, sc[g.rank()],
                rc[g.rank()]);
  // Counts and displacements are this rank's own: an overflow here is
  // local, as a null buffer is (docs/errors.md, kInvalidArgument).
  size_t e = DTypeSize(dtype), sspan = 0, rspan = 0;
  for (int r = 0; r < n; ++r) {
    sspan = std::max(
        sspan, core::CheckedAdd(sd[r], sc[r], "{}: send_displs[{}] {} + send_counts[{}] {}", name,
                                r, sd[r], r, sc[r]));
    rspan = std::max(
        rspan, core::CheckedAdd(rd[r], rc[r], "{}: recv_displs[{}] {} + recv_counts[{}] {}", name,
                                r, rd[r], r, rc[r]));
  }
  const size_t sbytes = core::CheckedBytes(name, "the send extent (elements)", sspan, dtype);
  const size_t rbytes = core::CheckedBytes(name, "the recv extent (elements)", rspan, dtype);
  CheckPtr(name, "send", send, sbytes);
  CheckPtr(name, "recv", recv, rbytes);
  CollArgs a;
  a.kind = kind;
  if (kind == OpKind::kAllToAll) a.count = sc[0];
  a.in_place = send == recv;
  MC2_CHECK_ARG(a.in_place || !collectives::Overlap(send, sbytes, recv, rbytes),
                "{}: send and recv overlap without being the same buffer", name);
  // In place, Launch gives the algorithms that need one a private copy of
  // the input.
  a.send = static_cast<const char*>(send);
  a.recv = static_cast<char*>(recv);
  a.dtype = dtype;
  a.send_counts = std::move(sc);
  a.send_displs = std::move(sd);
  a.recv_counts = std::move(rc);
  a.recv_displs = std::move(rd);
  a.send_bytes = a.in_place ? 0 : sbytes;
  a.recv_bytes = rbytes;
  size_t maxb = 0;  // each block lies within the send extent
  for (size_t c : a.send_counts) maxb = std::max(maxb, c * e);
  return Launch(g, std::move(a), opts, core::SaturatingMul(maxb, n));
}
}  // namespace

Work AllToAllV(const Group& g, const void* send, std::span<const size_t> send_counts,
               std::span<const size_t> send_displs, void* recv,
               std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
               DType dtype, const CollectiveOptions& opts) {
  return AllToAllLike(g, OpKind::kAllToAllV, "all_to_allv", send, send_counts, send_displs, recv,
                      recv_counts, recv_displs, dtype, opts);
}

Work AllToAll(const Group& g, const void* send, void* recv, size_t count, DType dtype,
              const CollectiveOptions& opts) {
  CheckGatheredCount(g, "all_to_all", count, dtype);
  std::vector<size_t> c(g.size(), count);
  return AllToAllLike(g, OpKind::kAllToAll, "all_to_all", send, c, {}, recv, c, {}, dtype, opts);
}

Work Barrier(const Group& g, const CollectiveOptions& opts) {
  MC2_CHECK_ARG(g.valid(), "barrier: the group is invalid (empty)");
  CollArgs a;
  a.kind = OpKind::kBarrier;
  return Launch(g, std::move(a), opts, 0);
}

}  // namespace mc2
