// The dispatch of collectives on groups that span hosts: the algorithm per
// collective and layout, and the task that runs it (span_algorithms.h).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "collectives/span_algorithms.h"
#include "core/reduce.h"
#include "engine/access.h"

namespace mc2::collectives {

void SpanReduceBlocks(const CollArgs& a, int group_size, void* dst,
                      const std::vector<const void*>& srcs, size_t count) {
  if (count == 0) return;
  core::ReduceTree(a.dtype, a.op, dst, srcs.data(), static_cast<int>(srcs.size()), count,
                   group_size);
}

Work LaunchSpan(const Group& g, CollArgs&& a, const CollectiveOptions& opts) {
  GroupImpl* gi = internal::Access::Impl(g);
  SpanGroup& s = *gi->span;
  a.esize = DTypeSize(a.dtype);
  a.deterministic = gi->world().deterministic;
  using Fn = void (*)(SpanGroup&, const CollArgs&, Deadline);
  Fn fn = nullptr;
  const char* algo = "flat";
  switch (a.kind) {
    case OpKind::kAllReduce:
      // The node pre-reduction must be a subtree of the canonical order.
      // `direct` asks for the flat exchange (GradSync measures both).
      if (s.aligned && opts.algorithm != Algorithm::kDirect) {
        fn = HierarchicalAllReduce;
        algo = "hierarchical";
      } else {
        fn = FlatAllReduce;
      }
      break;
    case OpKind::kBroadcast:
      fn = HierarchicalBroadcast;
      algo = "hierarchical";
      break;
    case OpKind::kReduce: fn = FlatReduce; break;
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterV: fn = FlatReduceScatterV; break;
    case OpKind::kAllGather:
    case OpKind::kAllGatherV: fn = FlatAllGatherV; break;
    case OpKind::kGather: fn = FlatGather; break;
    case OpKind::kScatter: fn = FlatScatter; break;
    case OpKind::kAllToAll:
    case OpKind::kAllToAllV: fn = FlatAllToAllV; break;
    case OpKind::kBarrier: fn = FlatBarrier; break;
    default:
      throw Error(ErrorCode::kInternal,
                  fmt::format("no span algorithm for {}", internal::OpKindName(a.kind)));
  }
  // In place, an all-to-all overwrites blocks of its input that peers have
  // yet to receive: the messages leave from a private copy.
  if (a.in_place && (a.kind == OpKind::kAllToAll || a.kind == OpKind::kAllToAllV)) {
    size_t span = 0;
    for (size_t r = 0; r < a.send_counts.size(); ++r)
      span = std::max(span, a.send_displs[r] + a.send_counts[r]);
    a.owned_send = std::make_shared<std::vector<char>>(a.send, a.send + span * a.esize);
    a.send = a.owned_send->data();
  }
  return internal::SpanSubmit(
      *gi, internal::OpKindName(a.kind), opts.timeout,
      [a = std::move(a), fn](SpanGroup& sg, Deadline deadline) { fn(sg, a, deadline); }, algo);
}

}  // namespace mc2::collectives
