// Reduction kernels: the arithmetic every reducing collective uses.
//
// Determinism. mc2's deterministic mode promises that a reduction's result is
// bitwise identical for every algorithm, chunk size and run. It does so by
// fixing one canonical combination order over the group's ranks and having
// every algorithm realise exactly that order:
//
//   T(lo, hi) = x_lo                                  if hi - lo == 1
//             = T(lo, lo + p) (+) T(lo + p, hi)       otherwise,
//   where p is the largest power of two strictly less than hi - lo.
//
// This is the order in which a binomial tree rooted at rank 0 and recursive
// doubling/halving combine partial results, so those algorithms get it for
// free; algorithms that see all N contributions at once (direct, reduce-
// scatter based) call ReduceTree below. Elementwise, (+) is the operator
// applied in f32 for f16/bf16 and rounded back to the storage type (nearest
// even) at every node of the tree, in the type itself for f32/f64/integers
// (integers wrap). Rounding at every node is what lets algorithms that carry
// 16-bit partial results match ReduceTree bit for bit.
#ifndef MC2_CORE_REDUCE_H_
#define MC2_CORE_REDUCE_H_

#include <bit>
#include <cstddef>
#include <cstdint>

#include "mc2/tensor.h"

namespace mc2::core {

// dst[i] = a[i] (+) b[i] for i < count. dst may alias a or b exactly (not
// partially). For f16/bf16 the sum is rounded to the storage type, so a chain
// of Combine calls rounds after every step.
void Combine(DType t, ReduceOp op, void* dst, const void* a, const void* b,
             size_t count);

// dst[i] = T(0, n)[i] over srcs[0..n) (the canonical order above), computed
// in one pass over memory; bitwise equal to evaluating the same tree with
// Combine. n >= 1; dst may alias any one src exactly.
// ReduceOp::kAvg divides the tree's sum by `divisor` (pass the group size;
// integers truncate toward zero); other ops ignore divisor.
// `use` says who reads dst next, a hint for how to write it: kPeers (other
// cores, e.g. the chunk a rank reduced for an all-gather phase) has the
// AVX-512 kernels write results from 64 KiB with non-temporal stores. The
// peers then read them from memory instead of out of this core's cache,
// which is faster for them. kLocal streams only from 8 MiB.
enum class ResultUse { kLocal, kPeers };
void ReduceTree(DType t, ReduceOp op, void* dst, const void* const* srcs, int n, size_t count,
                int divisor, ResultUse use = ResultUse::kLocal);

// Applies the final step of kAvg to a sum produced by Combine chains:
// dst[i] = dst[i] / divisor (in f32 for f16/bf16; truncating for integers).
// A no-op for every other op.
void FinishAvg(DType t, ReduceOp op, void* dst, size_t count, int divisor);

// Conversions between 16-bit floats and f32, round-to-nearest-even, NaN kept
// quiet. Exposed for operators and tests.
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);
// Exact (a signalling NaN stays signalling); inline, as combines widen
// whole rows with it.
inline float BF16ToF32(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }
uint16_t F32ToBF16(float f);

// Name of the instruction set the kernels dispatched to ("avx512", "avx2" or
// "portable"), chosen once at start-up from cpuid; MC2_KERNELS=portable
// forces the portable path (used by tests to compare both).
const char* ReduceKernelIsa();

}  // namespace mc2::core

#endif  // MC2_CORE_REDUCE_H_
