// How GradSync packs parameters into buckets: pure bookkeeping, no memory.
#ifndef MC2_GRAD_LAYOUT_H_
#define MC2_GRAD_LAYOUT_H_

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "mc2/tensor.h"

namespace mc2::grad {

struct ParamInfo {
  std::string name;
  size_t count = 0;
  DType dtype = DType::kF32;
  int group = 0;
  size_t rows = 0, cols = 0;  // registered as a matrix (else 0 x 0)
};

// A bucket: parameters of one group and dtype, contiguous in this order.
struct BucketPlan {
  int group = 0;
  DType dtype = DType::kF32;
  std::vector<int> params;
  std::vector<size_t> offsets;  // element offset of each parameter
  size_t count = 0;             // elements
};

// Walks `order` (every parameter once) and appends each parameter to the
// open bucket of its (group, dtype), closing that bucket first when the
// parameter would take it past its cap: first_cap for the first bucket of
// each (group, dtype), cap for the later ones; an empty bucket takes any
// parameter. Buckets come in the order of their first parameter in `order`.
std::vector<BucketPlan> PlanBuckets(std::span<const ParamInfo> params, std::span<const int> order,
                                    size_t first_cap, size_t cap);

}  // namespace mc2::grad

#endif  // MC2_GRAD_LAYOUT_H_
