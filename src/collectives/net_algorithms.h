// Collectives on net groups, whose ranks live on several hosts
// (engine/net.h): the dispatch and
// the algorithms, one file per family.
//
// A net collective runs as one task on the net world's engine
// (NetSubmit). It combines the node subgroup's ordinary shared-memory
// collectives (run and waited for like any call) with messages between
// hosts over the net transport (Isend / Irecv on the group's communicator,
// cut into pieces there). Two kinds of algorithm exist:
//
// - hierarchical (net_all_reduce.cc, net_broadcast.cc,
//   net_hierarchical.cc for all_gather(v) and reduce_scatter(v),
//   net_all_to_all.cc for the node-aggregated all_to_all(v)): inside the
//   node over shared memory, between hosts only what must cross, once;
// - flat (net_flat.cc): every rank exchanges with every other over the
//   net transport (which may use shared memory of its own between ranks of
//   one host, as Open MPI does), for every collective and every layout.
//
// Determinism: reductions follow core/reduce.h's canonical order T(0, N)
// over the group's ranks, so a group across hosts gives the bits a group of
// the same size on one host gives. The flat reductions send raw
// contributions to the owner of each block, which reduces them with
// ReduceTree. The hierarchical all-reduce and reduce-scatter pre-reduce
// inside each node, which is a subtree of T only when every host holds a
// contiguous, power-of-two block of ranks in order (NetGroup::aligned);
// otherwise the flat algorithm runs.
//
// Selection (LaunchNet, collectives/selector.h SelectNetAlgorithm): the
// call's algorithm (`hierarchical`, or `direct` = flat), MC2_ALGO, the
// tuning table's entries for groups across hosts, then the default: the
// hierarchical algorithm where it carries fewer bytes over the host links.
#ifndef MC2_COLLECTIVES_NET_ALGORITHMS_H_
#define MC2_COLLECTIVES_NET_ALGORITHMS_H_

#include <chrono>
#include <memory>
#include <vector>

#include "collectives/algorithm.h"
#include "engine/net.h"

namespace mc2::collectives {

using internal::NetGroup;
using Deadline = std::chrono::steady_clock::time_point;

// The one entry point from collectives.cc for a net group. `may_run_inline`:
// the call may run on the calling thread (collectives.cc's rule for one host).
Work LaunchNet(const Group& g, CollArgs&& a, const CollectiveOptions& opts, bool may_run_inline);

// The algorithm a net collective runs, as LaunchNet selects it (the
// call's algorithm, MC2_ALGO, the tuning table, the default) for `a`'s
// kind, layout and size; sets a.esize and a.deterministic. The fused batch
// (net_batch.cc) runs several of them inside one operation.
using NetFn = void (*)(NetGroup&, const CollArgs&, Deadline);
struct NetChoice {
  NetFn fn = nullptr;
  bool hierarchical = false;
};
NetChoice ChooseNet(GroupImpl& gi, CollArgs& a, const CollectiveOptions& opts);

// Point-to-point traffic of one net algorithm step: post, then wait for
// all (a failure or timeout throws, naming the operation).
class NetXfer {
 public:
  NetXfer(NetGroup& s, Deadline deadline, const char* op) : s_(s), deadline_(deadline), op_(op) {}
  void Send(int peer, int tag, const void* data, size_t bytes) {
    pending_.push_back(s_.net->transport->Isend(s_.comm, peer, tag, data, bytes, {},
                                                transport::NetTransport::kNoDeadline));
  }
  void Recv(int peer, int tag, void* data, size_t bytes) {
    pending_.push_back(s_.net->transport->Irecv(s_.comm, peer, tag, data, bytes, {},
                                                transport::NetTransport::kNoDeadline));
  }
  void WaitAll() {
    for (auto& c : pending_) internal::NetWait(s_, *c, deadline_, op_);
    pending_.clear();
  }

 private:
  NetGroup& s_;
  Deadline deadline_;
  const char* op_;
  std::vector<std::shared_ptr<transport::Completion>> pending_;
};

// Tags of the algorithms' messages on a group's communicator. Messages of
// one (peer, tag) match in posting order, and a group's operations run one
// at a time, so operations need no tags of their own.
enum NetTag : int {
  kTagReduceScatter = 1,
  kTagAllGather,
  kTagReduce,
  kTagBroadcast,
  kTagGather,
  kTagScatter,
  kTagAllToAll,
  kTagBarrier,
};

// The contiguous share of `count` elements that part `i` of `parts` gets.
inline void Share(size_t count, int parts, int i, size_t* off, size_t* len) {
  size_t base = count / parts, extra = count % parts;
  *off = i * base + std::min<size_t>(i, extra);
  *len = base + (static_cast<size_t>(i) < extra ? 1 : 0);
}

// The canonical reduction of the n blocks at srcs into dst (ReduceTree,
// with the group size as kAvg's divisor).
void NetReduceBlocks(const CollArgs& a, int group_size, void* dst,
                     const std::vector<const void*>& srcs, size_t count);

// net_all_reduce.cc
void HierarchicalAllReduce(NetGroup& s, const CollArgs& a, Deadline deadline);
// net_broadcast.cc
void HierarchicalBroadcast(NetGroup& s, const CollArgs& a, Deadline deadline);
// net_hierarchical.cc
void HierarchicalAllGatherV(NetGroup& s, const CollArgs& a, Deadline deadline);
void HierarchicalReduceScatterV(NetGroup& s, const CollArgs& a, Deadline deadline);
// net_all_to_all.cc
void HierarchicalAllToAllV(NetGroup& s, const CollArgs& a, Deadline deadline);
// net_flat.cc
void FlatBroadcast(NetGroup& s, const CollArgs& a, Deadline deadline);
void FlatAllReduce(NetGroup& s, const CollArgs& a, Deadline deadline);
void FlatReduce(NetGroup& s, const CollArgs& a, Deadline deadline);
void FlatReduceScatterV(NetGroup& s, const CollArgs& a, Deadline deadline);
void FlatAllGatherV(NetGroup& s, const CollArgs& a, Deadline deadline);
void FlatGather(NetGroup& s, const CollArgs& a, Deadline deadline);
void FlatScatter(NetGroup& s, const CollArgs& a, Deadline deadline);
void FlatAllToAllV(NetGroup& s, const CollArgs& a, Deadline deadline);
void FlatBarrier(NetGroup& s, const CollArgs& a, Deadline deadline);

}  // namespace mc2::collectives

#endif  // MC2_COLLECTIVES_NET_ALGORITHMS_H_
