// mc2's own row-invariant GEMM, for CPUs where oneDNN has no row-invariant
// kernel.
//
// The pipelines compute a product in row chunks and rely on row i of a
// chunk being bitwise row i of the full product. oneDNN's brgemm kernels
// (AVX-512 cores) are; on AVX2-only cores oneDNN 2.x runs its jit sgemm,
// whose summation order depends on the row count, and has no bf16 matmul at
// all; OpenBLAS's kernels also change with the row count and with a row's
// place in a register tile. There, the calls that need oneDNN (bf16, and
// f32 with GemmBackend::kOneDNN, which deterministic mode uses) run this
// kernel instead.
//
// Works as follows: K is cut into blocks of a fixed 256 (never chosen by
// the shape), and every element of C is one chain of fused multiply-adds
// over k in increasing order, continued from the previous block's partial
// sum; rows are independent (A is broadcast, B's columns are the vector
// lanes), so the bits of row i depend only on row i of op(A), on B and on
// row i of C. The AVX2+FMA kernel (6 rows x 16 columns of accumulators,
// B packed in 16-column panels, A in 6-row strips) and the portable one
// (std::fma per element, the same chain) give the same bits. bf16 inputs
// are widened to f32 exactly when packed; a bf16 C is rounded once, at the
// end. alpha, beta and the bias apply per element after the product:
// C = alpha * AB + beta * C + bias.
//
// Thread safety: any thread may call; packing buffers are per thread.
#ifndef MC2_OPS_TILED_GEMM_H_
#define MC2_OPS_TILED_GEMM_H_

#include <cstddef>

#include "mc2/tensor.h"

namespace mc2::ops {

// True when oneDNN's matmul kernels on this CPU are row-invariant (AVX-512
// cores: brgemm for f32 and bf16), false when the calls that need that run
// TiledGemm. MC2_GEMM_TILED=1 forces TiledGemm everywhere (tests), read once.
bool OneDnnRowInvariant();

// The kernel TiledGemm runs here: "mc2:tiled_avx2" or "mc2:tiled_scalar".
const char* TiledGemmName();

// C (m x n, row stride ldc, type c_type) = alpha * op(A) op(B) + beta * C
// + bias on the calling thread. `ab` is kF32 or kBF16; op(A) is m x k
// stored as A (ta: A^T stored k x m) with row stride lda; likewise B. With
// beta == 0, C is not read. Arguments are the caller's to check.
// `packed_b`: B as TiledPackB laid it out (then `b` is not read), so that
// many calls with one B pack it once; the bits are the same.
void TiledGemm(size_t m, size_t n, size_t k, DType ab, const void* a, size_t lda, bool ta,
               const void* b, size_t ldb, bool tb, DType c_type, void* c, size_t ldc, float alpha,
               float beta, const float* bias, const float* packed_b = nullptr);

// op(B) (k x n, stored as for TiledGemm) widened to f32 and laid out as
// TiledGemm reads it: TiledPackedBFloats(k, n) floats at `out`.
size_t TiledPackedBFloats(size_t k, size_t n);
void TiledPackB(size_t k, size_t n, DType ab, const void* b, size_t ldb, bool tb, float* out);

}  // namespace mc2::ops

#endif  // MC2_OPS_TILED_GEMM_H_
