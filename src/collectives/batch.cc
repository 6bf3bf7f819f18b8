// The public Batch call (include/mc2/batch.h): checks every entry once,
// lays out the packed stream, fingerprints the entries and hands the
// exchange (batch_exchange.cc) to the progress engine, as collectives.cc
// does for the single collectives.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/batch_plan.h"
#include "core/checked.h"
#include "core/enforce.h"
#include "core/log.h"
#include "engine/access.h"
#include "trace/recorder.h"

namespace mc2 {

const char* BatchKindName(BatchKind k) {
  switch (k) {
    case BatchKind::kAllReduce:
      return "all_reduce";
    case BatchKind::kAllGather:
      return "all_gather";
    case BatchKind::kReduceScatter:
      return "reduce_scatter";
    case BatchKind::kBroadcast:
      return "broadcast";
  }
  return "?";
}

namespace collectives {
namespace {

// Batches whose packed stream is at most this large run on the caller when
// the engine is idle (as the single collectives, collectives.cc).
constexpr size_t kBatchInlineMaxBytes = 4 * 1024 * 1024;

struct Hash {
  uint64_t h = 1469598103934665603ull;
  void Add(uint64_t v) {
    h ^= v;
    h *= 1099511628211ull;
  }
};

// A byte range one entry reads or writes, for the aliasing check.
struct Range {
  uintptr_t lo, hi;
  size_t entry;
  bool output;
};

bool IsAt(const void* p, const void* base, size_t offset) {
  return reinterpret_cast<uintptr_t>(p) == reinterpret_cast<uintptr_t>(base) + offset;
}

bool Overlap(const void* a, size_t an, const void* b, size_t bn) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
}

void CheckPtr(const std::string& name, const char* what, const void* p, size_t bytes) {
  MC2_CHECK_ARG(p != nullptr || bytes == 0, "{}: {} is null but {} bytes are needed", name, what,
                bytes);
  core::CheckBufferRange(name, what, p, bytes);
}

// Checks entry `i` as its single collective would and fills `it` (all but
// the offset); appends its buffers to `ranges`.
BatchItem CheckEntry(const BatchEntry& e, size_t i, int n, int me, std::vector<Range>& ranges) {
  const std::string name = fmt::format(
      "batch entry {} ({})", i,
      static_cast<int>(e.kind) <= static_cast<int>(BatchKind::kBroadcast) ? BatchKindName(e.kind)
                                                                          : "?");
  MC2_CHECK_ARG(static_cast<int>(e.kind) <= static_cast<int>(BatchKind::kBroadcast),
                "{}: kind {} is not a valid mc2::BatchKind", name, static_cast<int>(e.kind));
  MC2_CHECK_ARG(static_cast<int>(e.dtype) < kNumDTypes, "{}: dtype {} is not a valid mc2::DType",
                name, static_cast<int>(e.dtype));
  const bool reducing = e.kind == BatchKind::kAllReduce || e.kind == BatchKind::kReduceScatter;
  if (reducing)
    MC2_CHECK_ARG(IsValidReduction(e.dtype, e.op), "{}: op {} is not defined for dtype {}", name,
                  ReduceOpName(e.op), DTypeName(e.dtype));
  if (e.kind == BatchKind::kBroadcast)
    MC2_CHECK_ARG(e.root >= 0 && e.root < n, "{}: root {} is out of range [0, {})", name, e.root,
                  n);
  const size_t b = core::CheckedBytes(name, "count", e.count, e.dtype);
  BatchItem it;
  it.kind = e.kind;
  it.dtype = e.dtype;
  it.op = reducing ? e.op : ReduceOp::kSum;
  it.root = e.kind == BatchKind::kBroadcast ? e.root : kNoRoot;
  it.count = e.count;
  it.esize = DTypeSize(e.dtype);
  it.recv = static_cast<char*>(e.recv);
  size_t in_bytes = b, out_bytes = b;
  const void* in = e.send;
  switch (e.kind) {
    case BatchKind::kAllReduce:
      it.in_place = e.send == e.recv;
      it.contrib = b;
      it.send = static_cast<const char*>(e.send);
      break;
    case BatchKind::kAllGather:
      out_bytes = core::CheckedMul(b, static_cast<size_t>(n), "{}: count {} x {} bytes x {} ranks",
                                   name, e.count, it.esize, n);
      core::CheckBufferBytes(name, "recv (count x ranks)", out_bytes);
      it.in_place = IsAt(e.send, e.recv, me * b);
      it.contrib = b;
      it.send = it.in_place ? it.recv + me * b : static_cast<const char*>(e.send);
      break;
    case BatchKind::kReduceScatter:
      in_bytes = core::CheckedMul(b, static_cast<size_t>(n), "{}: count {} x {} bytes x {} ranks",
                                  name, e.count, it.esize, n);
      core::CheckBufferBytes(name, "send (count x ranks)", in_bytes);
      it.in_place = IsAt(e.recv, e.send, me * b);
      it.contrib = in_bytes;
      it.send = static_cast<const char*>(e.send);
      break;
    case BatchKind::kBroadcast:
      it.in_place = me == e.root && e.send == e.recv;
      it.contrib = b;
      it.send = me == e.root ? static_cast<const char*>(e.send) : nullptr;
      if (me != e.root) in_bytes = 0, in = nullptr;
      break;
  }
  if (in_bytes) CheckPtr(name, "send", in, in_bytes);
  CheckPtr(name, "recv", e.recv, out_bytes);
  // Within the entry: in place exactly as its collective defines it, or
  // disjoint.
  MC2_CHECK_ARG(it.in_place || !Overlap(in, in_bytes, e.recv, out_bytes),
                "{}: send and recv overlap without being in place", name);
  if (in_bytes)
    ranges.push_back(
        {reinterpret_cast<uintptr_t>(in), reinterpret_cast<uintptr_t>(in) + in_bytes, i, false});
  if (out_bytes)
    ranges.push_back({reinterpret_cast<uintptr_t>(e.recv),
                      reinterpret_cast<uintptr_t>(e.recv) + out_bytes, i, true});
  return it;
}

// Across entries: an output overlaps no other entry's input or output.
void CheckAliasing(std::vector<Range>& ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.lo < b.lo; });
  for (size_t i = 0; i < ranges.size(); ++i)
    for (size_t j = i + 1; j < ranges.size() && ranges[j].lo < ranges[i].hi; ++j) {
      const Range &a = ranges[i], &b = ranges[j];
      if (a.entry == b.entry || (!a.output && !b.output)) continue;
      const Range& out = a.output ? a : b;
      const Range& other = a.output ? b : a;
      MC2_CHECK_ARG(false, "batch: the recv buffer of entry {} overlaps the {} buffer of entry {}",
                    out.entry, other.output ? "recv" : "send", other.entry);
    }
}

BatchPlan MakePlan(const Group& g, std::span<const BatchEntry> entries) {
  const int n = g.size(), me = g.rank();
  BatchPlan p;
  std::vector<Range> ranges;
  Hash h;
  p.items.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    BatchItem it = CheckEntry(entries[i], i, n, me, ranges);
    it.offset = p.total;
    const size_t padded = core::CheckedAdd(it.contrib, kBatchAlign - 1,
                                           "batch: entry {} of {} bytes", i, it.contrib) /
                          kBatchAlign * kBatchAlign;
    p.total = core::CheckedAdd(p.total, padded, "batch: the packed size up to entry {}", i);
    core::CheckBufferBytes("batch", "the packed contributions", p.total);
    for (uint64_t v :
         {uint64_t{static_cast<uint8_t>(it.kind)}, uint64_t{static_cast<uint8_t>(it.dtype)},
          uint64_t{static_cast<uint8_t>(it.op)}, static_cast<uint64_t>(it.root),
          uint64_t{it.count}})
      h.Add(v);
    p.items.push_back(it);
  }
  CheckAliasing(ranges);
  p.hash = h.h;
  return p;
}

void RunBatchBody(OpContext& ctx, const BatchPlan& p, const internal::Fingerprint& fp,
                  std::chrono::nanoseconds timeout) {
  ctx.g->AwaitReuse(ctx);
  trace::ScopedSpan span(trace::Category::kComm);
  if (span.on()) {
    span.span().name = ctx.name;
    span.span().algorithm = "batch";
    span.span().bytes = p.total;
    span.span().rank = ctx.g->trace_rank();
  }
  if (timeout.count() > 0) ctx.timeout = timeout;
  ctx.work->SetAlgorithm("batch");
  MC2_LOG(kDebug, "batch #{}: {} entries, {} bytes packed per rank on {} ranks", ctx.seq,
          p.items.size(), p.total, ctx.g->size());
  RunBatchExchange(ctx, p, fp);
}

}  // namespace
}  // namespace collectives

Work Batch(const Group& g, std::span<const BatchEntry> entries, const CollectiveOptions& opts) {
  using namespace collectives;
  MC2_CHECK_ARG(g.valid(), "batch: the group is invalid (empty)");
  MC2_CHECK_ARG(opts.algorithm == Algorithm::kAuto || opts.algorithm == Algorithm::kDirect,
                "batch: algorithm {} is not available (the batch runs its own exchange; use "
                "auto or direct)",
                AlgorithmName(opts.algorithm));
  BatchPlan plan = MakePlan(g, entries);
  GroupImpl* gi = internal::Access::Impl(g);
  if (gi->net_group) return NetBatch(g, std::move(plan), opts);
  internal::Fingerprint fp;
  fp.kind = static_cast<uint16_t>(OpKind::kBatch);
  fp.count = plan.items.size();
  fp.aux = plan.hash;
  fp.algorithm = static_cast<uint8_t>(Algorithm::kDirect);
  const char* name = internal::OpKindName(OpKind::kBatch);
  const std::chrono::nanoseconds timeout = opts.timeout;
  if (opts.may_run_inline && plan.total <= kBatchInlineMaxBytes) {
    if (auto w =
            gi->TryRunInline(name, [&](OpContext& ctx) { RunBatchBody(ctx, plan, fp, timeout); }))
      return std::move(*w);
  }
  return gi->Submit(name, false, [plan = std::move(plan), fp, timeout](OpContext& ctx) {
    RunBatchBody(ctx, plan, fp, timeout);
  });
}

}  // namespace mc2
