// The GEMM wrapper behind mc2::Gemm (include/mc2/ops.h): OpenBLAS for f32,
// oneDNN matmul for bf16 inputs. This header adds what the operators and
// tests need beyond the public call.
//
// Thread safety: everything here may be called from any thread. The bf16
// primitive cache is guarded by a mutex held only for the lookup; primitives
// execute concurrently with per-thread streams and scratchpads.
#ifndef MC2_OPS_GEMM_H_
#define MC2_OPS_GEMM_H_

#include <cstddef>
#include <string>

#include "mc2/ops.h"

namespace mc2::ops {

// The thread count a call with GemmOptions::threads == 0 uses:
// MC2_GEMM_THREADS (an integer in [1, 1024]), read once, default 1. Throws
// kInvalidArgument naming the variable when it is invalid.
int DefaultGemmThreads();

// Number of bf16 primitives in the cache (one per distinct shape/config).
size_t CachedGemmPrimitives();

// oneDNN's name for the implementation a oneDNN call with these arguments runs
// (e.g. "brg:avx512_core_bf16"), creating and caching the primitive if
// needed: lets tests and benchmarks check that no reference kernel is used.
// `ab` is kBF16, or kF32 (the oneDNN f32 matmul).
std::string GemmImplementation(size_t m, size_t n, size_t k, DType ab, DType c_type,
                               const GemmOptions& options = {});

}  // namespace mc2::ops

#endif  // MC2_OPS_GEMM_H_
