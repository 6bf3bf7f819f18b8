// mc2/gemm.h: the compute building blocks of the fused operators: the GEMM
// wrapper and 16-bit float conversions.
//
// GEMM. Row-major, C = alpha * op(A) * op(B) + beta * C (+ bias), where
// op(X) is X or its transpose, op(A) is m x k, op(B) is k x n and C is m x n.
// f32 runs on OpenBLAS (cblas_sgemm); bf16 inputs run on oneDNN's matmul,
// accumulating in f32 and writing f32 or bf16. Both are thin wrappers: the
// numbers are the libraries' own. On hosts without AVX-512, where oneDNN
// has no bf16 matmul and its f32 one is not row-invariant (see
// GemmBackend), those calls run mc2's own kernel instead
// (src/ops/tiled_gemm.h: f32 fused multiply-adds in a fixed order).
#ifndef MC2_GEMM_H_
#define MC2_GEMM_H_

#include <cstddef>
#include <cstdint>

#include "mc2/tensor.h"

namespace mc2 {

// Which library runs a GEMM. kAuto: OpenBLAS for f32, oneDNN for bf16.
// kOneDNN also runs f32 (oneDNN's own f32 matmul, faster than OpenBLAS's
// on AVX-512 cores) and is the one to use when results must not
// depend on how the rows are cut: a oneDNN product's row i
// is bitwise the same whatever m and whichever rows are computed with it,
// while OpenBLAS picks different kernels (and summation orders) by size.
// kOpenBLAS with bf16 is invalid. On hosts without AVX-512 (and with
// MC2_GEMM_TILED=1) bf16 and kOneDNN calls run mc2's tiled kernel, which is
// row-invariant by construction, and column-invariant too.
enum class GemmBackend : uint8_t { kAuto = 0, kOpenBLAS, kOneDNN };

struct GemmOptions {
  // op(A) = A^T: A is stored k x m (row-major). Likewise trans_b: B is n x k.
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  // With beta == 0, C is not read (it may hold NaNs or garbage).
  float beta = 0.0f;
  // Optional f32 vector of n elements added to every row of C, after the
  // alpha/beta combination: C = alpha * op(A) op(B) + beta * C + bias.
  const float* bias = nullptr;
  // Row strides in elements of the stored matrices; 0 means tight (the
  // stored row length: k or m for A, n or k for B, n for C). A non-zero
  // stride must be at least the stored row length.
  size_t lda = 0;
  size_t ldb = 0;
  size_t ldc = 0;
  // Threads this call may use: 0 = MC2_GEMM_THREADS, default 1 (one core
  // per rank; the rank's other threads are for communication).
  int threads = 0;
  GemmBackend backend = GemmBackend::kAuto;
};

// C = alpha * op(A) * op(B) + beta * C (+ bias), synchronously on the calling
// thread (and `threads` - 1 helpers).
//
// Types: `ab` is the type of A and B, `c_type` that of C. Supported:
//   ab = kF32,  c_type = kF32    OpenBLAS cblas_sgemm (oneDNN with kOneDNN)
//   ab = kBF16, c_type = kF32    oneDNN matmul, f32 accumulation
//   ab = kBF16, c_type = kBF16   same, the result rounded to bf16 (nearest
//                                even); beta reads the bf16 C
// Anything else, a null pointer with a non-empty operand, or a stride below
// the row length throws mc2::Error(kInvalidArgument); a library failure
// throws mc2::Error(kInternal) naming it. m, n or k may be 0 (k == 0 gives
// C = beta * C + bias).
//
// The buffers are the caller's and only read (A, B, bias) or written (C)
// during the call; C must not overlap A, B or bias.
//
// Performance: oneDNN primitives are created once per (shape, transposes,
// strides, types, alpha, beta, bias, threads) and cached for the life of the
// process (a thread-safe cache; the first call of a shape pays for the
// primitive's creation, about a millisecond). On oneDNN, a transposed A and
// strided (non-tight) operands are first copied to dense buffers (m k, k n
// or m n elements, small next to the 2 m n k flops), which keeps every call
// on its fast kernels; those buffers stay allocated per calling thread.
// OpenBLAS calls go straight to the library.
//
// Reproducibility: the same call gives the same bits every time. Across
// shapes see GemmBackend: with kOneDNN, computing rows [r0, r1) alone gives
// exactly those rows of the full product (what chunked pipelines need), for
// any `threads`; column blocks are not invariant (oneDNN blocks K by N).
//
// Errors: kInvalidArgument, before any matrix is read, for unsupported
// types or backends, dimensions or strides above INT_MAX (the libraries'
// index type), a stored matrix larger than any buffer can be (PTRDIFF_MAX
// bytes), and a null matrix when the product is not empty (m x n = 0 needs
// none).
//
// Threading: any thread may call Gemm, concurrently with other calls (ranks
// that are threads of one process included). On oneDNN (bf16, or kOneDNN)
// `threads` T cuts C into up to T row blocks of at least 16 rows, each
// computed by one thread with a single-threaded kernel, so the
// result is bitwise the same for every T (a product of fewer than 32 rows
// runs on one thread). On OpenBLAS `threads` is OpenBLAS's own thread
// count, which is process-wide: concurrent f32 calls should use the same
// value. oneDNN's helper threads belong to the calling thread, inherit its
// CPU affinity (docs/topology.md) and sleep between calls; OpenBLAS's may
// spin for a while after a call, taking CPU from communication. The
// default of 1 has no helpers.
void Gemm(size_t m, size_t n, size_t k, DType ab, const void* a, const void* b, DType c_type,
          void* c, const GemmOptions& options = {});

inline void Gemm(size_t m, size_t n, size_t k, const float* a, const float* b, float* c,
                 const GemmOptions& options = {}) {
  Gemm(m, n, k, DType::kF32, a, b, DType::kF32, c, options);
}
inline void Gemm(size_t m, size_t n, size_t k, const bf16* a, const bf16* b, float* c,
                 const GemmOptions& options = {}) {
  Gemm(m, n, k, DType::kBF16, a, b, DType::kF32, c, options);
}
inline void Gemm(size_t m, size_t n, size_t k, const bf16* a, const bf16* b, bf16* c,
                 const GemmOptions& options = {}) {
  Gemm(m, n, k, DType::kBF16, a, b, DType::kBF16, c, options);
}

// The FLOP count of one Gemm call, 2 m n k, for reporting GF/s.
inline double GemmFlops(size_t m, size_t n, size_t k) {
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
}

// Element-wise conversions between f32 and bf16 (round to nearest even; NaN
// stays NaN, quiet). src and dst must not overlap. Any thread may call.
void ConvertF32ToBF16(const float* src, bf16* dst, size_t count);
void ConvertBF16ToF32(const bf16* src, float* dst, size_t count);

}  // namespace mc2

#endif  // MC2_GEMM_H_
