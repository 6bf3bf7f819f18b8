// The all-reduce of one bucket on a group that spans levels (hosts): the
// hierarchical algorithm (a reduce-scatter inside each host, an all-reduce
// across hosts, an all-gather inside) or the flat one (every rank with
// every other), whichever is measured faster.
//
// Both follow the canonical reduction order (docs/multi-host.md,
// "Determinism"), so the choice never changes a result bit: it is a
// matter of time only.
#ifndef MC2_GRAD_LEVELS_H_
#define MC2_GRAD_LEVELS_H_

#include <cstddef>

#include "mc2/grad.h"

namespace mc2::grad {

// Collective over `g` (every member calls it with the same count, dtype and
// policy). `data`: the bucket's storage in g's symmetric heap, all zeros
// (the timed all-reduces sum it in place, which leaves it zero).
//   - One rank, or a group whose all-reduce is not hierarchical (one host,
//     or a layout the hierarchical algorithm does not take): `algorithm`
//     names what runs, nothing is timed.
//   - kHierarchical / kFlat: that one, untimed.
//   - kAuto: kLevelTrials all-reduces with each, alternating; each rank's
//     median per algorithm, then the max over the ranks (one all-reduce),
//     so every rank picks the same: the hierarchical one unless the flat
//     one is faster.
inline constexpr int kLevelTrials = 3;
BucketReduction ChooseBucketReduction(const Group& g, void* data, size_t count, DType dtype,
                                      BucketAlgorithm policy);

}  // namespace mc2::grad

#endif  // MC2_GRAD_LEVELS_H_
