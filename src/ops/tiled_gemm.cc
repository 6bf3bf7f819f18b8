#include "ops/tiled_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <dnnl.hpp>
#include <vector>

#include "core/env.h"
#include "core/reduce.h"

namespace mc2::ops {
namespace {

constexpr size_t kKc = 256;  // K block: fixed, so a row's summation order never depends on m
constexpr size_t kNr = 16;   // columns per B panel (two 8-float vectors)
constexpr size_t kMr = 6;    // rows per A strip
constexpr size_t kNc = 256;  // columns per pass over the A strips (B block in L2)

// op(X)[i][j] of a stored matrix, widened to f32.
struct Source {
  const void* p;
  size_t ld;
  bool trans;
  bool bf16;
  float At(size_t i, size_t j) const {
    const size_t off = trans ? j * ld + i : i * ld + j;
    return bf16 ? core::BF16ToF32(static_cast<const uint16_t*>(p)[off])
                : static_cast<const float*>(p)[off];
  }
};

// op(B) rows [k0, k0 + kc), all n columns, as panels of kNr columns:
// panel p holds [kk][jj] = op(B)[k0 + kk][p kNr + jj], zero past n.
void PackB(const Source& b, size_t k0, size_t kc, size_t n, float* out) {
  const size_t panels = (n + kNr - 1) / kNr;
  for (size_t p = 0; p < panels; ++p) {
    float* dst = out + p * kc * kNr;
    const size_t j0 = p * kNr, cols = std::min(kNr, n - j0);
    if (!b.trans && !b.bf16) {
      const float* src = static_cast<const float*>(b.p) + k0 * b.ld + j0;
      for (size_t kk = 0; kk < kc; ++kk, dst += kNr, src += b.ld) {
        std::memcpy(dst, src, cols * sizeof(float));
        std::fill(dst + cols, dst + kNr, 0.0f);
      }
      continue;
    }
    for (size_t kk = 0; kk < kc; ++kk, dst += kNr) {
      for (size_t jj = 0; jj < cols; ++jj) dst[jj] = b.At(k0 + kk, j0 + jj);
      std::fill(dst + cols, dst + kNr, 0.0f);
    }
  }
}

// op(A) rows [0, m), columns [k0, k0 + kc), as strips of kMr rows: strip s
// holds [kk][r] = op(A)[s kMr + r][k0 + kk], zero past m.
void PackA(const Source& a, size_t m, size_t k0, size_t kc, float* out) {
  const size_t strips = (m + kMr - 1) / kMr;
  for (size_t s = 0; s < strips; ++s) {
    float* dst = out + s * kc * kMr;
    const size_t r0 = s * kMr, rows = std::min(kMr, m - r0);
    for (size_t r = 0; r < rows; ++r)
      for (size_t kk = 0; kk < kc; ++kk) dst[kk * kMr + r] = a.At(r0 + r, k0 + kk);
    for (size_t r = rows; r < kMr; ++r)
      for (size_t kk = 0; kk < kc; ++kk) dst[kk * kMr + r] = 0.0f;
  }
}

#define MC2_AVX2 __attribute__((target("avx2,fma"), always_inline)) inline

// Row r's half h (8 columns) of the tile at c: from C or zero.
MC2_AVX2 __m256 LoadHalf(const float* c, size_t ldc, float (*tile)[kNr], int r, int h, bool cont,
                         size_t cols) {
  if (!cont) return _mm256_setzero_ps();
  if (cols == kNr) return _mm256_loadu_ps(c + r * ldc + 8 * h);
  if (h == 0) {
    std::memset(tile[r], 0, sizeof(tile[r]));
    std::memcpy(tile[r], c + r * ldc, cols * sizeof(float));
  }
  return _mm256_load_ps(tile[r] + 8 * h);
}

MC2_AVX2 void StoreRow(float* c, size_t ldc, float (*tile)[kNr], int r, __m256 lo, __m256 hi,
                       size_t cols) {
  if (cols == kNr) {
    _mm256_storeu_ps(c + r * ldc, lo);
    _mm256_storeu_ps(c + r * ldc + 8, hi);
    return;
  }
  _mm256_store_ps(tile[r], lo);
  _mm256_store_ps(tile[r] + 8, hi);
  std::memcpy(c + r * ldc, tile[r], cols * sizeof(float));
}

// acc[r][j] over R rows and `cols` columns of a tile: starts from C
// (`cont`: a later K block) or zero, then one fma per k in order. The
// accumulators are named variables (an array of them is kept in memory by
// the compiler, a store per fma).
template <int R>
__attribute__((target("avx2,fma"))) void KernelAvx2(size_t kc, const float* ap, const float* bp,
                                                    float* c, size_t ldc, bool cont, size_t cols) {
  alignas(32) float tile[kMr][kNr];
#define MC2_LOAD(r, h) LoadHalf(c, ldc, tile, r, h, cont, cols)
  __m256 c00 = MC2_LOAD(0, 0), c01 = MC2_LOAD(0, 1);
  __m256 c10 = R > 1 ? MC2_LOAD(1, 0) : c00, c11 = R > 1 ? MC2_LOAD(1, 1) : c01;
  __m256 c20 = R > 2 ? MC2_LOAD(2, 0) : c00, c21 = R > 2 ? MC2_LOAD(2, 1) : c01;
  __m256 c30 = R > 3 ? MC2_LOAD(3, 0) : c00, c31 = R > 3 ? MC2_LOAD(3, 1) : c01;
  __m256 c40 = R > 4 ? MC2_LOAD(4, 0) : c00, c41 = R > 4 ? MC2_LOAD(4, 1) : c01;
  __m256 c50 = R > 5 ? MC2_LOAD(5, 0) : c00, c51 = R > 5 ? MC2_LOAD(5, 1) : c01;
#undef MC2_LOAD
  // Row r's step: broadcast op(A)[r][k], one fma per half of the tile.
#define MC2_ROW(r)                                 \
  if constexpr (R > r) {                           \
    const __m256 a = _mm256_broadcast_ss(ap + r);  \
    c##r##0 = _mm256_fmadd_ps(a, b0, c##r##0);     \
    c##r##1 = _mm256_fmadd_ps(a, b1, c##r##1);     \
  }
  for (size_t kk = 0; kk < kc; ++kk, ap += kMr, bp += kNr) {
    const __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
    MC2_ROW(0)
    MC2_ROW(1)
    MC2_ROW(2)
    MC2_ROW(3)
    MC2_ROW(4)
    MC2_ROW(5)
  }
#undef MC2_ROW
  StoreRow(c, ldc, tile, 0, c00, c01, cols);
  if constexpr (R > 1) StoreRow(c, ldc, tile, 1, c10, c11, cols);
  if constexpr (R > 2) StoreRow(c, ldc, tile, 2, c20, c21, cols);
  if constexpr (R > 3) StoreRow(c, ldc, tile, 3, c30, c31, cols);
  if constexpr (R > 4) StoreRow(c, ldc, tile, 4, c40, c41, cols);
  if constexpr (R > 5) StoreRow(c, ldc, tile, 5, c50, c51, cols);
}
#undef MC2_AVX2

// The same chain per element, without vectors: bitwise KernelAvx2's result.
void KernelScalar(size_t rows, size_t kc, const float* ap, const float* bp, float* c, size_t ldc,
                  bool cont, size_t cols) {
  for (size_t r = 0; r < rows; ++r) {
    for (size_t j = 0; j < cols; ++j) {
      float acc = cont ? c[r * ldc + j] : 0.0f;
      for (size_t kk = 0; kk < kc; ++kk) acc = std::fma(ap[kk * kMr + r], bp[kk * kNr + j], acc);
      c[r * ldc + j] = acc;
    }
  }
}

bool HasAvx2Fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

void Kernel(size_t rows, size_t kc, const float* ap, const float* bp, float* c, size_t ldc,
            bool cont, size_t cols) {
  if (!HasAvx2Fma()) return KernelScalar(rows, kc, ap, bp, c, ldc, cont, cols);
  switch (rows) {
    case 6:
      return KernelAvx2<6>(kc, ap, bp, c, ldc, cont, cols);
    case 5:
      return KernelAvx2<5>(kc, ap, bp, c, ldc, cont, cols);
    case 4:
      return KernelAvx2<4>(kc, ap, bp, c, ldc, cont, cols);
    case 3:
      return KernelAvx2<3>(kc, ap, bp, c, ldc, cont, cols);
    case 2:
      return KernelAvx2<2>(kc, ap, bp, c, ldc, cont, cols);
    default:
      return KernelAvx2<1>(kc, ap, bp, c, ldc, cont, cols);
  }
}

struct Buffers {
  std::vector<float> a, b, acc;
};
Buffers& ThreadBuffers() {
  thread_local Buffers buf;
  return buf;
}

float* Grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace

bool OneDnnRowInvariant() {
  static const bool invariant = [] {
    if (core::EnvBool("MC2_GEMM_TILED", false)) return false;
    return dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core;
  }();
  return invariant;
}

const char* TiledGemmName() { return HasAvx2Fma() ? "mc2:tiled_avx2" : "mc2:tiled_scalar"; }

size_t TiledPackedBFloats(size_t k, size_t n) { return k * ((n + kNr - 1) / kNr) * kNr; }

void TiledPackB(size_t k, size_t n, DType ab, const void* b, size_t ldb, bool tb, float* out) {
  const Source sb{b, ldb, tb, ab == DType::kBF16};
  const size_t panels = (n + kNr - 1) / kNr;
  for (size_t k0 = 0; k0 < k; k0 += kKc)
    PackB(sb, k0, std::min(kKc, k - k0), n, out + k0 * panels * kNr);
}

void TiledGemm(size_t m, size_t n, size_t k, DType ab, const void* a, size_t lda, bool ta,
               const void* b, size_t ldb, bool tb, DType c_type, void* c, size_t ldc, float alpha,
               float beta, const float* bias, const float* packed_b) {
  if (m == 0 || n == 0) return;
  const bool bf16 = ab == DType::kBF16;
  const Source sa{a, lda, ta, bf16}, sb{b, ldb, tb, bf16};
  Buffers& buf = ThreadBuffers();
  // The product accumulates in C itself when C is f32 and not an input;
  // otherwise in an f32 buffer, combined with C at the end.
  const bool direct = c_type == DType::kF32 && beta == 0.0f;
  float* acc = direct ? static_cast<float*>(c) : Grow(buf.acc, m * n);
  const size_t ldacc = direct ? ldc : n;
  const size_t panels = (n + kNr - 1) / kNr, strips = (m + kMr - 1) / kMr;
  float* bp =
      packed_b ? nullptr : Grow(buf.b, std::min(kKc, std::max<size_t>(k, 1)) * panels * kNr);
  float* ap = Grow(buf.a, std::min(kKc, std::max<size_t>(k, 1)) * strips * kMr);
  if (k == 0) {
    for (size_t i = 0; i < m; ++i) std::fill(acc + i * ldacc, acc + i * ldacc + n, 0.0f);
  }
  for (size_t k0 = 0; k0 < k; k0 += kKc) {
    const size_t kc = std::min(kKc, k - k0);
    const bool cont = k0 > 0;
    if (packed_b)
      bp = const_cast<float*>(packed_b) + k0 * panels * kNr;
    else
      PackB(sb, k0, kc, n, bp);
    PackA(sa, m, k0, kc, ap);
    for (size_t j0 = 0; j0 < n; j0 += kNc) {
      const size_t p_end = std::min(panels, (j0 + kNc) / kNr);
      for (size_t s = 0; s < strips; ++s) {
        const size_t rows = std::min(kMr, m - s * kMr);
        const float* as = ap + s * kc * kMr;
        for (size_t p = j0 / kNr; p < p_end; ++p) {
          const size_t col = p * kNr;
          Kernel(rows, kc, as, bp + p * kc * kNr, acc + s * kMr * ldacc + col, ldacc, cont,
                 std::min(kNr, n - col));
        }
      }
    }
  }
  // Epilogue, per element: alpha * AB + beta * C + bias.
  for (size_t i = 0; i < m; ++i) {
    const float* arow = acc + i * ldacc;
    if (c_type == DType::kF32) {
      float* crow = static_cast<float*>(c) + i * ldc;
      if (direct && alpha == 1.0f && bias == nullptr) continue;
      for (size_t j = 0; j < n; ++j) {
        float v = alpha * arow[j];
        if (!direct) v += beta * crow[j];
        if (bias) v += bias[j];
        crow[j] = v;
      }
    } else {
      uint16_t* crow = static_cast<uint16_t*>(c) + i * ldc;
      for (size_t j = 0; j < n; ++j) {
        float v = alpha * arow[j];
        if (beta != 0.0f) v += beta * core::BF16ToF32(crow[j]);
        if (bias) v += bias[j];
        crow[j] = core::F32ToBF16(v);
      }
    }
  }
}

}  // namespace mc2::ops
