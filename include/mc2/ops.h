// mc2/ops.h: compute building blocks of the fused compute+communication
// operators: the GEMM wrapper and 16-bit float conversions.
//
// GEMM. Row-major, C = alpha * op(A) * op(B) + beta * C (+ bias), where
// op(X) is X or its transpose, op(A) is m x k, op(B) is k x n and C is m x n.
// f32 runs on OpenBLAS (cblas_sgemm); bf16 inputs run on oneDNN's matmul,
// accumulating in f32 and writing f32 or bf16. Both are thin wrappers: the
// numbers are the libraries' own.
#ifndef MC2_OPS_H_
#define MC2_OPS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "mc2/group.h"
#include "mc2/tensor.h"
#include "mc2/work.h"

namespace mc2 {

// Which library runs a GEMM. kAuto: OpenBLAS for f32, oneDNN for bf16.
// kOneDNN also runs f32 (oneDNN's own f32 matmul, as fast as OpenBLAS here)
// and is the one to use when results must not depend on how the rows are
// cut: with one thread, a oneDNN product's row i is bitwise the same whatever
// m and whichever rows are computed with it, while OpenBLAS picks different
// kernels (and summation orders) by size. kOpenBLAS with bf16 is invalid.
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
// OpenBLAS calls go straight to the library. Measured on this host (one
// thread, bench/gemm_bench): ~102 GF/s f32, ~206 GF/s bf16.
//
// Reproducibility: the same call gives the same bits every time. Across
// shapes see GemmBackend: with kOneDNN and one thread, computing rows
// [r0, r1) alone gives exactly those rows of the full product (what chunked
// pipelines need); column blocks are not invariant (oneDNN blocks K by N).
//
// Threading: any thread may call Gemm, concurrently with other calls (ranks
// that are threads of one process included). `threads` sets OpenMP's thread
// count of the calling thread for oneDNN, and OpenBLAS's thread count, which
// is process-wide: concurrent f32 calls should use the same value. With more
// than one thread, both libraries' helper threads may spin for a while after
// a call, taking CPU from communication; the default of 1 has no helpers.
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

// ---------------------------------------------------------------------------
// Fused compute+communication operators (issue 3).
//
// Each operator multiplies local matrices and runs the collective that
// follows (or precedes) the product in a tensor-parallel layer. All matrices
// are row-major and tight; A and B are of `dtype` (kF32, or kBF16 with f32
// accumulation); C is always f32.
//
// Where things run. The operator call runs every GEMM on the calling thread
// and overlaps it with communication tasks it submits to the rank's progress
// thread (collectives) and point-to-point thread (the fused ring steps). It
// returns once the whole result is in place: the returned Work is already
// complete (Work::algorithm() names the pipeline that ran). A communication
// failure is reported by that Work (Wait() rethrows it); the ...Sync
// convenience calls Wait() for you. Invalid arguments throw
// mc2::Error(kInvalidArgument) and shapes that disagree across ranks throw
// mc2::Error(kMismatch) from the call, on EVERY rank: each call starts with a
// small all-gather of every rank's shapes and options, checked identically
// everywhere, so a bad argument on one rank fails all ranks instead of
// hanging them. Every rank of the group must call the same operator in the
// same order (like a collective). Calls on one group from one thread at a
// time. Buffers are the caller's; they are only used during the call.
//
// Determinism. In deterministic mode (Group::deterministic(), the default)
// f32 GEMMs run on oneDNN (GemmBackend::kOneDNN, row-block invariant) and
// the reductions use the canonical ReduceTree order over ranks, so every
// pipeline and every split count give the serial result bit for bit (f32
// and bf16). This needs one GEMM thread per rank (gemm_threads 0 with
// MC2_GEMM_THREADS unset, or 1). Outside deterministic mode f32 uses
// OpenBLAS and results may differ in the last bits between pipelines.

// How an operator overlaps its GEMMs with the communication.
enum class Pipeline : uint8_t {
  // GEMM, then the collective (or the collective, then the GEMM).
  kSerial = 0,
  // CoC: M is cut into `splits` chunks (every rank's row block is cut the
  // same way); the collective of chunk i runs on the progress thread while
  // chunk i+1 is multiplied.
  kChunked,
  // Ring decomposition over point-to-point channels in the symmetric heap:
  // at step i a rank multiplies the block it already holds while the next
  // block moves (AllGatherMatmul: its own shard first, then shard r-1, r-2,
  // ... as they arrive; MatmulReduceScatter: the partial for rank r+i, sent
  // while the partial for r+i+1 is computed, and reduced by its owner with
  // ReduceTree in rank order; MatmulAllReduce: the same, then an all-gather).
  kFused,
  // Chosen from the global shape (same choice on every rank): serial for one
  // rank or small products (< 2^25 flops per rank), otherwise chunked with
  // 4 chunks (a fixed rule for now, not yet the measured cost model).
  kAuto,
};
inline constexpr int kNumPipelines = 4;
// "serial", "chunked", "fused", "auto".
const char* PipelineName(Pipeline p);
std::optional<Pipeline> ParsePipeline(std::string_view name);

struct FusedOptions {
  Pipeline pipeline = Pipeline::kAuto;
  // Chunks of the chunked pipeline, 1..16 (must agree across ranks; other
  // pipelines check the range but ignore the value).
  int splits = 4;
  // Timeout of the collectives involved; 0 = the group's (MC2_TIMEOUT).
  std::chrono::nanoseconds timeout{0};
  // GemmOptions::threads for every GEMM (0 = MC2_GEMM_THREADS, default 1).
  int gemm_threads = 0;
};

// What an operator call ran (kAuto resolved), for reports and benchmarks.
struct FusedReport {
  Pipeline pipeline = Pipeline::kSerial;
  int splits = 1;
};

// C [M x n] = gather_rows(A_shard of every rank) [M x k] * B [k x n], where
// rank r holds A_shard [m_local_r x k] and M = sum of m_local_r (row counts
// may differ and be 0). k must agree across ranks; n may differ (B is this
// rank's column block; C may be null only when M x n = 0). `gathered_a` (optional, M x k of dtype) receives the
// gathered A (what backward reuses); null if not wanted.
Work AllGatherMatmul(const Group& g, const void* a_shard, size_t m_local, size_t k,
                     const void* b, size_t n, DType dtype, float* c, void* gathered_a = nullptr,
                     const FusedOptions& options = {}, FusedReport* report = nullptr);

// C_shard [m_local x n] = rows [sum(m_local of ranks < r), +m_local) of
// sum over ranks of A [M x k_local] * B [k_local x n]. M and n must agree
// across ranks, the m_local must add up to M; k_local may differ.
Work MatmulReduceScatter(const Group& g, const void* a, size_t m, size_t k, const void* b,
                         size_t n, DType dtype, float* c_shard, size_t m_local,
                         const FusedOptions& options = {}, FusedReport* report = nullptr);

// C [M x n] = sum over ranks of A [M x k_local] * B [k_local x n], on every
// rank. M and n must agree across ranks; k_local may differ.
Work MatmulAllReduce(const Group& g, const void* a, size_t m, size_t k, const void* b,
                     size_t n, DType dtype, float* c, const FusedOptions& options = {},
                     FusedReport* report = nullptr);

// Synchronous conveniences: the call, then Wait().
inline void AllGatherMatmulSync(const Group& g, const void* a_shard, size_t m_local, size_t k,
                                const void* b, size_t n, DType dtype, float* c,
                                void* gathered_a = nullptr, const FusedOptions& options = {},
                                FusedReport* report = nullptr) {
  AllGatherMatmul(g, a_shard, m_local, k, b, n, dtype, c, gathered_a, options, report).Wait();
}
inline void MatmulReduceScatterSync(const Group& g, const void* a, size_t m, size_t k,
                                    const void* b, size_t n, DType dtype, float* c_shard,
                                    size_t m_local, const FusedOptions& options = {},
                                    FusedReport* report = nullptr) {
  MatmulReduceScatter(g, a, m, k, b, n, dtype, c_shard, m_local, options, report).Wait();
}
inline void MatmulAllReduceSync(const Group& g, const void* a, size_t m, size_t k, const void* b,
                                size_t n, DType dtype, float* c, const FusedOptions& options = {},
                                FusedReport* report = nullptr) {
  MatmulAllReduce(g, a, m, k, b, n, dtype, c, options, report).Wait();
}

}  // namespace mc2

#endif  // MC2_OPS_H_
