// Collectives on groups that span hosts (engine/span.h): the dispatch and
// the algorithms, one file per family.
//
// A span collective runs as one task on the net world's engine
// (SpanSubmit). It combines the node subgroup's ordinary shared-memory
// collectives (run and waited for like any call) with messages between
// hosts over the MPI engine (Isend / Irecv on the group's communicator,
// cut into pieces there). Two kinds of algorithm exist:
//
// - hierarchical (span_all_reduce.cc, span_broadcast.cc,
//   span_hierarchical.cc for all_gather(v) and reduce_scatter(v),
//   span_all_to_all.cc for the node-aggregated all_to_all(v)): inside the
//   node over shared memory, between hosts only what must cross, once;
// - flat (span_flat.cc): every rank exchanges with every other over MPI
//   (Open MPI uses its own shared memory between ranks of one host), for
//   every collective and every layout.
//
// Determinism: reductions follow core/reduce.h's canonical order T(0, N)
// over the group's ranks, so a group across hosts gives the bits a group of
// the same size on one host gives. The flat reductions send raw
// contributions to the owner of each block, which reduces them with
// ReduceTree. The hierarchical all-reduce and reduce-scatter pre-reduce
// inside each node, which is a subtree of T only when every host holds a
// contiguous, power-of-two block of ranks in order (SpanGroup::aligned);
// otherwise the flat algorithm runs.
//
// Selection (LaunchSpan, collectives/selector.h SelectSpanAlgorithm): the
// call's algorithm (`hierarchical`, or `direct` = flat), MC2_ALGO, the
// tuning table's entries for groups across hosts, then the default: the
// hierarchical algorithm where it carries fewer bytes over the host links.
#ifndef MC2_COLLECTIVES_SPAN_ALGORITHMS_H_
#define MC2_COLLECTIVES_SPAN_ALGORITHMS_H_

#include <chrono>
#include <memory>
#include <vector>

#include "collectives/algorithm.h"
#include "engine/span.h"

namespace mc2::collectives {

using internal::SpanGroup;
using Deadline = std::chrono::steady_clock::time_point;

// The one entry point from collectives.cc for a span group. `may_run_inline`:
// the call may run on the calling thread (collectives.cc's rule for one host).
Work LaunchSpan(const Group& g, CollArgs&& a, const CollectiveOptions& opts, bool may_run_inline);

// The algorithm a span collective runs, as LaunchSpan selects it (the
// call's algorithm, MC2_ALGO, the tuning table, the default) for `a`'s
// kind, layout and size; sets a.esize and a.deterministic. The fused batch
// (span_batch.cc) runs several of them inside one operation.
using SpanFn = void (*)(SpanGroup&, const CollArgs&, Deadline);
struct SpanChoice {
  SpanFn fn = nullptr;
  bool hierarchical = false;
};
SpanChoice ChooseSpan(GroupImpl& gi, CollArgs& a, const CollectiveOptions& opts);

// Point-to-point traffic of one span algorithm step: post, then wait for
// all (a failure or timeout throws, naming the operation).
class SpanXfer {
 public:
  SpanXfer(SpanGroup& s, Deadline deadline, const char* op)
      : s_(s), deadline_(deadline), op_(op) {}
  void Send(int peer, int tag, const void* data, size_t bytes) {
    pending_.push_back(s_.net->mpi->Isend(s_.comm, peer, tag, data, bytes));
  }
  void Recv(int peer, int tag, void* data, size_t bytes) {
    pending_.push_back(s_.net->mpi->Irecv(s_.comm, peer, tag, data, bytes));
  }
  void WaitAll() {
    for (auto& c : pending_) internal::SpanWait(s_, *c, deadline_, op_);
    pending_.clear();
  }

 private:
  SpanGroup& s_;
  Deadline deadline_;
  const char* op_;
  std::vector<std::shared_ptr<transport::mpi::Completion>> pending_;
};

// Tags of the algorithms' messages on a group's communicator. Messages of
// one (peer, tag) match in posting order, and a group's operations run one
// at a time, so operations need no tags of their own.
enum SpanTag : int {
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
void SpanReduceBlocks(const CollArgs& a, int group_size, void* dst,
                      const std::vector<const void*>& srcs, size_t count);

// span_all_reduce.cc
void HierarchicalAllReduce(SpanGroup& s, const CollArgs& a, Deadline deadline);
// span_broadcast.cc
void HierarchicalBroadcast(SpanGroup& s, const CollArgs& a, Deadline deadline);
// span_hierarchical.cc
void HierarchicalAllGatherV(SpanGroup& s, const CollArgs& a, Deadline deadline);
void HierarchicalReduceScatterV(SpanGroup& s, const CollArgs& a, Deadline deadline);
// span_all_to_all.cc
void HierarchicalAllToAllV(SpanGroup& s, const CollArgs& a, Deadline deadline);
// span_flat.cc
void FlatBroadcast(SpanGroup& s, const CollArgs& a, Deadline deadline);
void FlatAllReduce(SpanGroup& s, const CollArgs& a, Deadline deadline);
void FlatReduce(SpanGroup& s, const CollArgs& a, Deadline deadline);
void FlatReduceScatterV(SpanGroup& s, const CollArgs& a, Deadline deadline);
void FlatAllGatherV(SpanGroup& s, const CollArgs& a, Deadline deadline);
void FlatGather(SpanGroup& s, const CollArgs& a, Deadline deadline);
void FlatScatter(SpanGroup& s, const CollArgs& a, Deadline deadline);
void FlatAllToAllV(SpanGroup& s, const CollArgs& a, Deadline deadline);
void FlatBarrier(SpanGroup& s, const CollArgs& a, Deadline deadline);

}  // namespace mc2::collectives

#endif  // MC2_COLLECTIVES_SPAN_ALGORITHMS_H_
