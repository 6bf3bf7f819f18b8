// The arithmetic of gradient compression, apart from any communication:
// 16-bit casts, sparse selection (threshold, top-k) with error feedback, and
// the merge of every rank's (index, value) pairs in the canonical order.
#ifndef MC2_GRAD_CODEC_H_
#define MC2_GRAD_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "mc2/grad.h"
#include "mc2/tensor.h"

namespace mc2::grad {

// One element of a sparse gradient: its index in the bucket and its value.
// 8 bytes, exchanged as one i64 word.
struct Pair {
  uint32_t index;
  float value;
};
static_assert(sizeof(Pair) == 8);

// dst[i] = src[i] rounded to f16 or bf16 (`t`), nearest even.
void ToHalf(DType t, const float* src, uint16_t* dst, size_t n);
// dst[i] = src[i] widened to f32 (exact).
void FromHalf(DType t, const uint16_t* src, float* dst, size_t n);

// Sparse selection of one bucket. `g` is the gradient (n elements);
// `residual` (n elements, or empty: no error feedback) is added to it first
// and then holds what was not selected. Returns the selected pairs in
// increasing index order.
// - threshold: the elements whose |value| >= threshold (a NaN is selected);
// - top-k: in each segment (a parameter: `starts` are the segments' first
//   elements, in increasing order, starts[0] == 0, the last one ending at
//   n) the TopKCount(segment length, ratio) elements of largest |value|
//   (NaN largest, ties to the lower index). Per parameter, not per bucket:
//   tensors of a bucket have gradients of different scales, and a bucket-
//   wide selection would starve the small ones (norm gains next to a
//   projection).
std::vector<Pair> SelectThreshold(const float* g, std::span<float> residual, size_t n,
                                  float threshold);
std::vector<Pair> SelectTopK(const float* g, std::span<float> residual, size_t n,
                             std::span<const size_t> starts, double ratio);
// The k that top-k sends for a segment of n elements: ceil(ratio n), at
// least 1 (0 for an empty one).
size_t TopKCount(size_t n, double ratio);

// out[0..n) = the elementwise sum of the N ranks' sparse vectors lists[r]
// (each sorted by index), absent elements counting as +0, combined in the
// canonical tree order over ranks (core/reduce.h), so bitwise the dense
// all-reduce of the densified vectors; divided by N when `average`.
void MergeSparse(std::span<const std::span<const Pair>> lists, float* out, size_t n, bool average);

}  // namespace mc2::grad

#endif  // MC2_GRAD_CODEC_H_
