// The dispatch of collectives on groups that span hosts: the algorithm per
// collective and layout, and the task that runs it (net_algorithms.h).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "collectives/net_algorithms.h"
#include "collectives/selector.h"
#include "core/reduce.h"
#include "engine/access.h"

namespace mc2::collectives {

void NetReduceBlocks(const CollArgs& a, int group_size, void* dst,
                     const std::vector<const void*>& srcs, size_t count) {
  if (count == 0) return;
  core::ReduceTree(a.dtype, a.op, dst, srcs.data(), static_cast<int>(srcs.size()), count,
                   group_size);
}

NetChoice ChooseNet(GroupImpl& gi, CollArgs& a, const CollectiveOptions& opts) {
  NetGroup& s = *gi.net_group;
  a.esize = DTypeSize(a.dtype);
  a.deterministic = gi.world().deterministic;
  const int n = static_cast<int>(s.members.size());
  const int hosts = static_cast<int>(s.hosts.size());
  int per_host = 0;  // the largest host's ranks
  for (auto& h : s.hosts) per_host = std::max(per_host, static_cast<int>(h.size()));
  const bool several = per_host > 1;  // a host with more than one rank
  auto sum = [](const std::vector<size_t>& v) {
    size_t t = 0;
    for (size_t c : v) t += c;
    return t;
  };
  // The selector's size measure (as `mc2 bench --tune` records it), one
  // every rank computes alike: all_gather the block per rank, reduce_scatter
  // the whole input, all_to_all the per-rank input. An all_to_allv's counts
  // are known only to their rank, so its choice ignores the table.
  size_t bytes = a.count * a.esize;
  bool use_table = true;
  switch (a.kind) {
    case OpKind::kAllGather:
    case OpKind::kAllGatherV: bytes = sum(a.counts) * a.esize / n; break;
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterV: bytes = sum(a.counts) * a.esize; break;
    case OpKind::kAllToAll: bytes = a.count * a.esize * n; break;
    case OpKind::kAllToAllV: use_table = false; break;
    default: break;
  }
  const Algorithm choice =
      SelectNetAlgorithm(a.kind, opts.algorithm, hosts, per_host, bytes, use_table);
  // Hierarchical unless flat is asked for; `otherwise` when nothing is.
  auto hier = [&](bool otherwise) {
    return choice == Algorithm::kHierarchical || (choice == Algorithm::kAuto && otherwise);
  };
  NetFn fn = nullptr;
  bool hierarchical = false;
  switch (a.kind) {
    case OpKind::kAllReduce:
      // The node pre-reduction must be a subtree of the canonical order.
      // `direct` asks for the flat exchange (GradSync measures both).
      hierarchical = s.aligned && hier(true);
      fn = hierarchical ? HierarchicalAllReduce : FlatAllReduce;
      break;
    case OpKind::kBroadcast:
      hierarchical = hier(true);
      fn = hierarchical ? HierarchicalBroadcast : FlatBroadcast;
      break;
    case OpKind::kReduce: fn = FlatReduce; break;
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterV:
      hierarchical = s.aligned && hier(several);
      fn = hierarchical ? HierarchicalReduceScatterV : FlatReduceScatterV;
      break;
    case OpKind::kAllGather:
    case OpKind::kAllGatherV:
      hierarchical = hier(several);
      fn = hierarchical ? HierarchicalAllGatherV : FlatAllGatherV;
      break;
    case OpKind::kGather: fn = FlatGather; break;
    case OpKind::kScatter: fn = FlatScatter; break;
    case OpKind::kAllToAll:
    case OpKind::kAllToAllV:
      // Both carry the same bytes between hosts: flat unless asked or tuned.
      hierarchical = hier(false);
      fn = hierarchical ? HierarchicalAllToAllV : FlatAllToAllV;
      break;
    case OpKind::kBarrier: fn = FlatBarrier; break;
    default:
      throw Error(ErrorCode::kInternal,
                  fmt::format("no algorithm across hosts for {}", internal::OpKindName(a.kind)));
  }
  return {fn, hierarchical};
}

Work LaunchNet(const Group& g, CollArgs&& a, const CollectiveOptions& opts, bool may_run_inline) {
  GroupImpl* gi = internal::Access::Impl(g);
  const NetChoice choice = ChooseNet(*gi, a, opts);
  const NetFn fn = choice.fn;
  const char* algo = choice.hierarchical ? "hierarchical" : "flat";
  // In place, an all-to-all overwrites blocks of its input that peers have
  // yet to receive: the messages leave from a private copy.
  if (a.in_place && (a.kind == OpKind::kAllToAll || a.kind == OpKind::kAllToAllV)) {
    size_t extent = 0;
    for (size_t r = 0; r < a.send_counts.size(); ++r)
      extent = std::max(extent, a.send_displs[r] + a.send_counts[r]);
    a.owned_send = std::make_shared<std::vector<char>>(a.send, a.send + extent * a.esize);
    a.send = a.owned_send->data();
  }
  return internal::NetSubmit(
      *gi, internal::OpKindName(a.kind), opts.timeout,
      [a = std::move(a), fn](NetGroup& sg, Deadline deadline) { fn(sg, a, deadline); }, algo,
      may_run_inline);
}

}  // namespace mc2::collectives
