// Which buckets of a GradSync step start together as one Batch exchange
// (GradSyncOptions::fuse_buckets): pure bookkeeping, no communication.
#ifndef MC2_GRAD_FUSE_H_
#define MC2_GRAD_FUSE_H_

#include <cstddef>
#include <span>
#include <vector>

namespace mc2::grad {

// One bucket as the fusion sees it.
struct FuseItem {
  bool eligible = false;  // this step all-reduces it uncompressed, in place,
                          // with the group's default algorithm
  int group = 0;
  size_t bytes = 0;
};

// For each bucket b, the end (one past the last bucket) of the set that
// starts with it when b is the first of its set: runs of consecutive
// eligible buckets of one group are cut greedily into sets whose bytes add
// up to at most max_bytes (a bucket larger than that, or an ineligible one,
// is a set of its own). Every rank computes the same sets from the same
// layout, so every rank issues the same collectives whatever order its
// gradients become ready in.
std::vector<size_t> PlanFusion(std::span<const FuseItem> items, size_t max_bytes);

}  // namespace mc2::grad

#endif  // MC2_GRAD_FUSE_H_
