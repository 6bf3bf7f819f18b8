// The GEMM wrapper behind mc2::Gemm (include/mc2/gemm.h): OpenBLAS for f32,
// oneDNN matmul for bf16 inputs. This header adds what the operators and
// tests need beyond the public call.
//
// Thread safety: everything here may be called from any thread. The bf16
// primitive cache is guarded by a mutex held only for the lookup; primitives
// execute concurrently with per-thread streams and scratchpads.
#ifndef MC2_OPS_GEMM_H_
#define MC2_OPS_GEMM_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

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

// B (k x n) laid out once in the blocked layout oneDNN's matmul kernels
// read, for many products with the same B. Given plain B, oneDNN re-lays
// all k n elements out on every call, which is most of the cost of a call
// with few rows: 64-row f32 products (k = 2048, n = 1024, one core) ran
// 19% slower than 256-row ones, and the fused pipelines multiply chunk
// after chunk by one B. Packed, every m runs at the large-m rate.
//
// Multiply(m, a, c_type, c, o) computes what Gemm(m, n, k, ab, a, b, c_type,
// c, o) computes, bitwise: the same kernel runs, it only reads B from the
// packed copy (a row count whose kernel would differ runs the plain call).
// B's layout (trans_b, ldb), the backend and the thread count are those
// given at packing; `o` gives the rest. Calls that would not run on oneDNN
// (f32 with backend kAuto or kOpenBLAS), and empty B, keep B as it is and
// call Gemm. The source B must stay alive and unchanged while this is used.
// Copies share the packed data; Multiply may run on several threads at once.
class PackedGemmB {
 public:
  PackedGemmB() = default;
  PackedGemmB(size_t k, size_t n, DType ab, const void* b, const GemmOptions& o = {});
  void Multiply(size_t m, const void* a, DType c_type, void* c, const GemmOptions& o = {}) const;
  bool packed() const { return packed_ != nullptr; }

 private:
  size_t k_ = 0, n_ = 0;
  DType ab_ = DType::kF32;
  const void* b_ = nullptr;
  GemmOptions options_;
  std::shared_ptr<void> packed_;
};

// The packed B of every B one operator call multiplies by, each packed at
// its first product (a call's Bs stay unchanged while it runs). Gemm
// computes what mc2::Gemm(m, n, k, ab, a, b, c_type, c, o) computes, bitwise,
// with the type and options given here. For one thread at a time.
class PackedGemmBSet {
 public:
  PackedGemmBSet() = default;
  PackedGemmBSet(DType ab, const GemmOptions& o) : ab_(ab), options_(o) {}
  void Gemm(size_t m, size_t n, size_t k, const void* a, const void* b, DType c_type, void* c);
  size_t size() const { return packs_.size(); }

 private:
  struct Entry {
    const void* b;
    size_t k, n;
    PackedGemmB packed;
  };
  DType ab_ = DType::kF32;
  GemmOptions options_;
  std::vector<Entry> packs_;
};

}  // namespace mc2::ops

#endif  // MC2_OPS_GEMM_H_
