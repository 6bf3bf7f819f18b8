#include "grad/levels.h"

#include <chrono>
#include <string>
#include <vector>

#include "grad/autotune.h"
#include "mc2/collectives.h"

namespace mc2::grad {

BucketReduction ChooseBucketReduction(const Group& g, void* data, size_t count, DType dtype,
                                      BucketAlgorithm policy) {
  BucketReduction r;
  r.bytes = count * DTypeSize(dtype);
  if (g.size() == 1) {
    r.algorithm = "none";
    return r;
  }
  CollectiveOptions hier, flat;
  flat.algorithm = Algorithm::kDirect;
  // What the bucket's all-reduce runs by default tells whether the group
  // spans levels the hierarchical algorithm takes.
  Work probe = AllReduce(g, data, data, count, dtype, ReduceOp::kSum, hier);
  probe.Wait();
  r.algorithm = probe.algorithm();
  if (r.algorithm != "hierarchical") return r;
  r.spans_levels = true;
  if (policy == BucketAlgorithm::kFlat) r.algorithm = "flat";
  if (policy != BucketAlgorithm::kAuto) return r;
  using Clock = std::chrono::steady_clock;
  std::vector<double> th, tf;
  for (int i = 0; i < kLevelTrials; ++i) {
    for (int k = 0; k < 2; ++k) {
      const bool h = (i + k) % 2 == 0;  // alternate which one goes first
      const auto t0 = Clock::now();
      AllReduce(g, data, data, count, dtype, ReduceOp::kSum, h ? hier : flat).Wait();
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      (h ? th : tf).push_back(s);
    }
  }
  double mine[2] = {Median(th), Median(tf)}, agreed[2];
  AllReduce(g, mine, agreed, 2, DType::kF64, ReduceOp::kMax).Wait();
  r.measured = true;
  r.hierarchical_seconds = agreed[0];
  r.flat_seconds = agreed[1];
  r.algorithm = agreed[1] < agreed[0] ? "flat" : "hierarchical";
  return r;
}

}  // namespace mc2::grad
