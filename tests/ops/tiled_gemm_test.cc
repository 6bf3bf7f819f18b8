// mc2's row-invariant GEMM (ops/tiled_gemm.h), called directly so that it
// is tested on every host, also where oneDNN's kernels are used instead:
// values against a double-precision reference, and the invariance the
// pipelines need (any row chunking gives the full product's bits).
#include "ops/tiled_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/reduce.h"

namespace mc2::ops {
namespace {

struct Case {
  size_t m = 0, n = 0, k = 0;
  bool ta = false, tb = false;
  DType ab = DType::kF32, c_type = DType::kF32;
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;
  size_t pad = 0;  // extra elements per stored row (strides above the row length)
};

struct Data {
  std::vector<float> a, b, bias, c0;  // values as f32 (exactly bf16 ones for bf16)
  std::vector<uint16_t> a16, b16, c16;
  size_t lda, ldb, ldc;
};

Data Make(const Case& cs, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Data d;
  const size_t a_rows = cs.ta ? cs.k : cs.m, a_cols = cs.ta ? cs.m : cs.k;
  const size_t b_rows = cs.tb ? cs.n : cs.k, b_cols = cs.tb ? cs.k : cs.n;
  d.lda = a_cols + cs.pad;
  d.ldb = b_cols + cs.pad;
  d.ldc = cs.n + cs.pad;
  auto fill = [&](std::vector<float>& v, std::vector<uint16_t>& v16, size_t n) {
    v.resize(n);
    v16.resize(n);
    for (size_t i = 0; i < n; ++i) {
      v16[i] = core::F32ToBF16(u(rng));
      v[i] = cs.ab == DType::kBF16 ? core::BF16ToF32(v16[i]) : u(rng);
    }
  };
  fill(d.a, d.a16, a_rows * d.lda);
  fill(d.b, d.b16, b_rows * d.ldb);
  std::vector<uint16_t> unused;
  fill(d.c0, d.c16, cs.m * d.ldc);
  if (cs.c_type == DType::kBF16)
    for (size_t i = 0; i < d.c0.size(); ++i) d.c0[i] = core::BF16ToF32(d.c16[i]);
  fill(d.bias, unused, cs.n);
  return d;
}

// Runs rows [r0, r1) of the product into `c` (f32 or bf16 storage).
void Run(const Case& cs, const Data& d, size_t r0, size_t r1, void* c) {
  const size_t esize = cs.ab == DType::kBF16 ? 2 : 4;
  const char* a = cs.ab == DType::kBF16 ? reinterpret_cast<const char*>(d.a16.data())
                                        : reinterpret_cast<const char*>(d.a.data());
  const void* b = cs.ab == DType::kBF16 ? static_cast<const void*>(d.b16.data()) : d.b.data();
  const size_t a_off = (cs.ta ? r0 : r0 * d.lda) * esize;
  const size_t c_off = r0 * d.ldc * (cs.c_type == DType::kBF16 ? 2 : 4);
  TiledGemm(r1 - r0, cs.n, cs.k, cs.ab, a + a_off, d.lda, cs.ta, b, d.ldb, cs.tb, cs.c_type,
            static_cast<char*>(c) + c_off, d.ldc, cs.alpha, cs.beta,
            cs.bias ? d.bias.data() : nullptr);
}

std::vector<float> AsF32(const Case& cs, const std::vector<float>& c,
                         const std::vector<uint16_t>& c16) {
  if (cs.c_type == DType::kF32) return c;
  std::vector<float> out(c16.size());
  for (size_t i = 0; i < c16.size(); ++i) out[i] = core::BF16ToF32(c16[i]);
  return out;
}

void Check(const Case& cs, uint32_t seed) {
  const Data d = Make(cs, seed);
  std::vector<float> c = d.c0;
  std::vector<uint16_t> c16 = d.c16;
  void* cp = cs.c_type == DType::kF32 ? static_cast<void*>(c.data()) : c16.data();
  Run(cs, d, 0, cs.m, cp);
  const std::vector<float> full = AsF32(cs, c, c16);
  // Values: a double-precision reference, with a bound on the f32 rounding
  // of k products and sums (and bf16's rounding of the result).
  for (size_t i = 0; i < cs.m; ++i) {
    for (size_t j = 0; j < cs.n; ++j) {
      double s = 0, mag = 0;
      for (size_t q = 0; q < cs.k; ++q) {
        const double x = cs.ta ? d.a[q * d.lda + i] : d.a[i * d.lda + q];
        const double y = cs.tb ? d.b[j * d.ldb + q] : d.b[q * d.ldb + j];
        s += x * y;
        mag += std::fabs(x * y);
      }
      double want = cs.alpha * s + cs.beta * d.c0[i * d.ldc + j] + (cs.bias ? d.bias[j] : 0.0);
      double tol = 1e-6 * (cs.k + 2) * (std::fabs(cs.alpha) * mag + 2) +
                   (cs.c_type == DType::kBF16 ? std::fabs(want) / 128 : 0.0);
      ASSERT_NEAR(full[i * d.ldc + j], want, tol)
          << "m=" << cs.m << " n=" << cs.n << " k=" << cs.k << " at " << i << "," << j;
    }
  }
  // Elements past n in each row (the stride's padding) are never written.
  for (size_t i = 0; i < cs.m; ++i)
    for (size_t j = cs.n; j < d.ldc; ++j)
      ASSERT_EQ(std::memcmp(&full[i * d.ldc + j], &d.c0[i * d.ldc + j], 4), 0);
  // Row invariance: every chunking gives the full product's bits.
  for (size_t chunk : {size_t{1}, size_t{5}, size_t{7}, size_t{17}, cs.m / 3 + 1}) {
    std::vector<float> p = d.c0;
    std::vector<uint16_t> p16 = d.c16;
    void* pp = cs.c_type == DType::kF32 ? static_cast<void*>(p.data()) : p16.data();
    for (size_t r0 = 0; r0 < cs.m; r0 += chunk) Run(cs, d, r0, std::min(cs.m, r0 + chunk), pp);
    const std::vector<float> part = AsF32(cs, p, p16);
    size_t diff = 0;
    for (size_t i = 0; i < part.size(); ++i) diff += std::memcmp(&part[i], &full[i], 4) != 0;
    EXPECT_EQ(diff, 0u) << "m=" << cs.m << " n=" << cs.n << " k=" << cs.k << " chunk=" << chunk;
  }
}

TEST(TiledGemm, MatchesReferenceAndEveryRowChunkingGivesTheSameBits) {
  uint32_t seed = 1;
  for (DType ab : {DType::kF32, DType::kBF16})
    for (DType c_type : {DType::kF32, DType::kBF16}) {
      if (ab == DType::kF32 && c_type == DType::kBF16) continue;
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (Case cs : {Case{1, 1, 1}, Case{7, 9, 11}, Case{37, 33, 300}, Case{64, 48, 513},
                          Case{13, 17, 256}}) {
            cs.ta = ta;
            cs.tb = tb;
            cs.ab = ab;
            cs.c_type = c_type;
            cs.alpha = 1.0f;
            cs.beta = 0.0f;
            cs.bias = false;
            cs.pad = 0;
            Check(cs, seed++);
            cs.alpha = 0.5f;
            cs.beta = 1.5f;
            cs.bias = true;
            cs.pad = 3;
            Check(cs, seed++);
          }
    }
}

// beta == 0: C is not read (NaNs in it do not leak into the result).
TEST(TiledGemm, BetaZeroDoesNotReadC) {
  const size_t m = 9, n = 20, k = 300;
  std::vector<float> a(m * k, 1.0f), b(k * n, 0.5f), c(m * n, std::nanf(""));
  TiledGemm(m, n, k, DType::kF32, a.data(), k, false, b.data(), n, false, DType::kF32, c.data(), n,
            1.0f, 0.0f, nullptr);
  for (float v : c) EXPECT_EQ(v, 150.0f);
}

}  // namespace
}  // namespace mc2::ops
