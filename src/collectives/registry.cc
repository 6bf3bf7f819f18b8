// Registration of the algorithms that live in their own files. Each file
// provides its entry points; this is the one list that names them.
#include "collectives/algorithm.h"

namespace mc2::collectives {

void RegisterMoreAlgorithms(AlgorithmTable& t) {
  auto set = [&](Algorithm a, OpKind k, AlgorithmFn f) {
    t.fn[static_cast<int>(a)][static_cast<int>(k)] = f;
  };
  // ring.cc
  set(Algorithm::kRing, OpKind::kAllReduce, RingAllReduce);
  set(Algorithm::kRing, OpKind::kAllGather, RingAllGatherV);
  set(Algorithm::kRing, OpKind::kAllGatherV, RingAllGatherV);
  set(Algorithm::kRing, OpKind::kReduceScatter, RingReduceScatterV);
  set(Algorithm::kRing, OpKind::kReduceScatterV, RingReduceScatterV);
  set(Algorithm::kRing, OpKind::kBroadcast, RingBroadcast);
  // recursive_doubling.cc
  set(Algorithm::kRecursiveDoubling, OpKind::kAllReduce, RecursiveDoublingAllReduce);
  set(Algorithm::kRecursiveDoubling, OpKind::kAllGather, RecursiveDoublingAllGatherV);
  set(Algorithm::kRecursiveDoubling, OpKind::kAllGatherV, RecursiveDoublingAllGatherV);
  // tree.cc
  set(Algorithm::kBinomialTree, OpKind::kReduce, TreeReduce);
  set(Algorithm::kBinomialTree, OpKind::kAllReduce, TreeAllReduce);
  set(Algorithm::kBinomialTree, OpKind::kBroadcast, TreeBroadcast);
  set(Algorithm::kBinomialTree, OpKind::kGather, TreeGather);
  set(Algorithm::kBinomialTree, OpKind::kScatter, TreeScatter);
  set(Algorithm::kBinomialTree, OpKind::kBarrier, TreeBarrier);
}

}  // namespace mc2::collectives
