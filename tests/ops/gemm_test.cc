// The GEMM wrapper against a naive reference accumulated in double, over
// transposes, odd shapes, strides, alpha/beta/bias, f32 and bf16.
#include "ops/gemm.h"
#include "ops/tiled_gemm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/reduce.h"
#include "mc2/error.h"
#include "mc2/ops.h"

namespace mc2 {
namespace {

using ::testing::HasSubstr;

struct Shape {
  size_t m, n, k;
};

// Element type of C in a test case.
enum class Path { kF32, kF32OneDNN, kBF16ToF32, kBF16ToBF16 };

const char* PathName(Path p) {
  switch (p) {
    case Path::kF32:
      return "f32";
    case Path::kF32OneDNN:
      return "f32_onednn";
    case Path::kBF16ToF32:
      return "bf16_f32";
    case Path::kBF16ToBF16:
      return "bf16_bf16";
  }
  return "?";
}

// Operands as the test stores them: values exactly representable in bf16
// for the bf16 paths, so the reference sees the same inputs.
struct Operands {
  size_t lda, ldb, ldc;
  std::vector<float> a, b, c0, bias;  // f32 views (padded storage)
  std::vector<bf16> a16, b16;
};

std::vector<float> Random(size_t count, std::mt19937& rng, bool bf16_exact) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (auto& x : v) {
    x = dist(rng);
    if (bf16_exact) x = core::BF16ToF32(core::F32ToBF16(x));
  }
  return v;
}

Operands MakeOperands(const Shape& s, const GemmOptions& o, bool bf16_in, size_t pad,
                      uint32_t seed) {
  std::mt19937 rng(seed);
  Operands op;
  size_t a_rows = o.trans_a ? s.k : s.m, a_cols = o.trans_a ? s.m : s.k;
  size_t b_rows = o.trans_b ? s.n : s.k, b_cols = o.trans_b ? s.k : s.n;
  op.lda = a_cols + pad;
  op.ldb = b_cols + pad;
  op.ldc = s.n + pad;
  op.a = Random(a_rows * op.lda, rng, bf16_in);
  op.b = Random(b_rows * op.ldb, rng, bf16_in);
  // C starts bf16-exact too, so that beta reads the same value on every path.
  op.c0 = Random(s.m * op.ldc, rng, true);
  op.bias = Random(s.n, rng, false);
  if (bf16_in) {
    op.a16.resize(op.a.size());
    op.b16.resize(op.b.size());
    ConvertF32ToBF16(op.a.data(), op.a16.data(), op.a.size());
    ConvertF32ToBF16(op.b.data(), op.b16.data(), op.b.size());
  }
  return op;
}

// Reference value and the error budget for C[i][j].
void Reference(const Shape& s, const GemmOptions& o, const Operands& op, size_t i, size_t j,
               double* value, double* budget) {
  double acc = 0, mag = 0;
  for (size_t p = 0; p < s.k; ++p) {
    double x = o.trans_a ? op.a[p * op.lda + i] : op.a[i * op.lda + p];
    double y = o.trans_b ? op.b[j * op.ldb + p] : op.b[p * op.ldb + j];
    acc += x * y;
    mag += std::fabs(x * y);
  }
  double c = op.c0[i * op.ldc + j];
  double bias = o.bias ? op.bias[j] : 0.0;
  *value = o.alpha * acc + (o.beta != 0 ? o.beta * c : 0.0) + bias;
  // f32 accumulation: a few ulps per term of the dot product (blocked sums
  // grow far slower than k in practice; k * eps is the classical bound).
  double scale = std::fabs(o.alpha) * mag + std::fabs(o.beta * c) + std::fabs(bias);
  *budget = (static_cast<double>(s.k) + 4) * 1.2e-7 * 2 * scale + 1e-30;
}

// Runs one case and checks every element of C (and that C's padding is
// untouched). Returns the number of wrong elements.
int RunCase(const Shape& s, GemmOptions o, Path path, size_t pad, uint32_t seed) {
  const bool bf16_in = path == Path::kBF16ToF32 || path == Path::kBF16ToBF16;
  if (path == Path::kF32OneDNN) o.backend = GemmBackend::kOneDNN;
  Operands op = MakeOperands(s, o, bf16_in, pad, seed);
  if (o.bias) o.bias = op.bias.data();
  if (pad) {
    o.lda = op.lda;
    o.ldb = op.ldb;
    o.ldc = op.ldc;
  }
  std::vector<float> c = op.c0;
  std::vector<bf16> c16(c.size());
  ConvertF32ToBF16(c.data(), c16.data(), c.size());
  switch (path) {
    case Path::kF32:
    case Path::kF32OneDNN:
      Gemm(s.m, s.n, s.k, op.a.data(), op.b.data(), c.data(), o);
      break;
    case Path::kBF16ToF32:
      Gemm(s.m, s.n, s.k, op.a16.data(), op.b16.data(), c.data(), o);
      break;
    case Path::kBF16ToBF16:
      Gemm(s.m, s.n, s.k, op.a16.data(), op.b16.data(), c16.data(), o);
      ConvertBF16ToF32(c16.data(), c.data(), c.size());
      break;
  }
  int wrong = 0;
  for (size_t i = 0; i < s.m; ++i) {
    for (size_t j = 0; j < op.ldc; ++j) {
      float got = c[i * op.ldc + j];
      if (j >= s.n) {  // padding: never written
        if (std::memcmp(&got, &op.c0[i * op.ldc + j], sizeof(float)) != 0 && wrong++ < 5)
          ADD_FAILURE() << "padding C[" << i << "][" << j << "] was overwritten";
        continue;
      }
      double want, budget;
      Reference(s, o, op, i, j, &want, &budget);
      if (path == Path::kBF16ToBF16) budget += std::fabs(want) * std::ldexp(1.0, -8) * 1.01;
      if (!(std::fabs(got - want) <= budget) && wrong++ < 5)
        ADD_FAILURE() << PathName(path) << " C[" << i << "][" << j << "] = " << got << ", expected "
                      << want << " +- " << budget;
    }
  }
  return wrong;
}

const Shape kShapes[] = {{1, 1, 1},   {17, 33, 5}, {5, 17, 33},  {33, 5, 17},   {1, 100, 3},
                         {100, 1, 3}, {3, 1, 100}, {64, 64, 64}, {96, 80, 200}, {2, 3, 513}};

struct Scalars {
  float alpha, beta;
  bool bias;
};
const Scalars kScalars[] = {
    {1, 0, false}, {0.5f, 0, true}, {1, 0.75f, false}, {-2, 1.5f, true}, {1, 1, true}};

class GemmSweep : public ::testing::TestWithParam<std::tuple<Path, bool, bool>> {};

TEST_P(GemmSweep, MatchesReference) {
  auto [path, ta, tb] = GetParam();
  uint32_t seed = 1;
  for (const Shape& s : kShapes) {
    for (const Scalars& sc : kScalars) {
      for (size_t pad : {size_t{0}, size_t{3}}) {
        GemmOptions o;
        o.trans_a = ta;
        o.trans_b = tb;
        o.alpha = sc.alpha;
        o.beta = sc.beta;
        o.bias = sc.bias ? reinterpret_cast<const float*>(1) : nullptr;  // set by RunCase
        EXPECT_EQ(RunCase(s, o, path, pad, seed++), 0)
            << "m=" << s.m << " n=" << s.n << " k=" << s.k << " alpha=" << sc.alpha
            << " beta=" << sc.beta << " bias=" << sc.bias << " pad=" << pad;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, GemmSweep,
                         ::testing::Combine(::testing::Values(Path::kF32, Path::kF32OneDNN,
                                                              Path::kBF16ToF32, Path::kBF16ToBF16),
                                            ::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(PathName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_At" : "_A") +
                                  (std::get<2>(info.param) ? "Bt" : "B");
                         });

TEST(Gemm, BetaZeroDoesNotReadC) {
  const size_t m = 7, n = 9, k = 11;
  std::vector<float> a(m * k, 1.0f), b(k * n, 2.0f);
  std::vector<bf16> a16(a.size()), b16(b.size());
  ConvertF32ToBF16(a.data(), a16.data(), a.size());
  ConvertF32ToBF16(b.data(), b16.data(), b.size());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int path = 0; path < 2; ++path) {
    std::vector<float> c(m * n, nan);
    if (path == 0)
      Gemm(m, n, k, a.data(), b.data(), c.data());
    else
      Gemm(m, n, k, a16.data(), b16.data(), c.data());
    for (float v : c) ASSERT_EQ(v, 2.0f * k) << "path " << path;
  }
}

TEST(Gemm, EmptyAndZeroK) {
  // m or n == 0: nothing to do, null pointers allowed.
  Gemm(0, 5, 5, static_cast<const float*>(nullptr), nullptr, static_cast<float*>(nullptr));
  Gemm(5, 0, 5, static_cast<const bf16*>(nullptr), nullptr, static_cast<float*>(nullptr));
  // k == 0: C = beta * C + bias, A and B unused.
  std::vector<float> bias = {1, 2, 3};
  std::vector<float> c = {10, 20, 30, 40, 50, 60};
  GemmOptions o;
  o.beta = 0.5f;
  o.bias = bias.data();
  Gemm(2, 3, 0, static_cast<const float*>(nullptr), nullptr, c.data(), o);
  EXPECT_EQ(c, (std::vector<float>{6, 12, 18, 21, 27, 33}));
  std::vector<bf16> c16(6);
  std::vector<float> c0 = {10, 20, 30, 40, 50, 60};
  ConvertF32ToBF16(c0.data(), c16.data(), 6);
  Gemm(2, 3, 0, static_cast<const bf16*>(nullptr), nullptr, c16.data(), o);
  ConvertBF16ToF32(c16.data(), c.data(), 6);
  EXPECT_EQ(c, (std::vector<float>{6, 12, 18, 21, 27, 33}));
}

template <typename F>
std::string InvalidArgument(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(Gemm, InvalidArguments) {
  std::vector<float> a(64), b(64), c(64);
  EXPECT_THAT(InvalidArgument(
                  [&] { Gemm(4, 4, 4, DType::kF32, a.data(), b.data(), DType::kBF16, c.data()); }),
              HasSubstr("unsupported types"));
  EXPECT_THAT(InvalidArgument(
                  [&] { Gemm(4, 4, 4, DType::kF16, a.data(), b.data(), DType::kF32, c.data()); }),
              HasSubstr("unsupported types"));
  {
    GemmOptions o;
    o.backend = GemmBackend::kOpenBLAS;
    EXPECT_THAT(InvalidArgument([&] {
                  Gemm(4, 4, 4, DType::kBF16, a.data(), b.data(), DType::kF32, c.data(), o);
                }),
                HasSubstr("backend"));
  }
  GemmOptions o;
  o.lda = 3;
  EXPECT_THAT(InvalidArgument([&] { Gemm(4, 4, 4, a.data(), b.data(), c.data(), o); }),
              HasSubstr("lda=3"));
  o = {};
  o.trans_b = true;
  o.ldb = 3;  // B stored 4 x 4 (n x k)
  EXPECT_THAT(InvalidArgument([&] { Gemm(4, 4, 4, a.data(), b.data(), c.data(), o); }),
              HasSubstr("ldb=3"));
  o = {};
  o.ldc = 2;
  EXPECT_THAT(InvalidArgument([&] { Gemm(4, 4, 4, a.data(), b.data(), c.data(), o); }),
              HasSubstr("ldc=2"));
  EXPECT_THAT(InvalidArgument([&] { Gemm(4, 4, 4, a.data(), nullptr, c.data()); }),
              HasSubstr("null"));
  o = {};
  o.threads = -1;
  EXPECT_THAT(InvalidArgument([&] { Gemm(4, 4, 4, a.data(), b.data(), c.data(), o); }),
              HasSubstr("threads"));
}

// Dimensions each within the libraries' int range whose matrices no buffer
// can hold (found by ops_sizes_fuzz): refused before anything is read, so
// the small buffers here are never overrun.
TEST(Gemm, MatricesLargerThanAnyBufferAreRefused) {
  std::vector<float> a(64), b(64), c(64);
  const size_t big = INT_MAX;
  EXPECT_THAT(InvalidArgument([&] { Gemm(big, 1, big, a.data(), b.data(), c.data()); }),
              HasSubstr("A (2147483647 x 2147483647, stride 2147483647) is larger"));
  EXPECT_THAT(InvalidArgument([&] { Gemm(1, big, big, a.data(), b.data(), c.data()); }),
              HasSubstr("B ("));
  GemmOptions o;
  o.ldc = big;
  EXPECT_THAT(InvalidArgument([&] { Gemm(big, 1, 1, a.data(), b.data(), c.data(), o); }),
              HasSubstr("C ("));
}

TEST(Gemm, PrimitivesAreCachedPerShape) {
  if (!ops::OneDnnRowInvariant()) GTEST_SKIP() << "bf16 runs " << ops::TiledGemmName() << " here";
  std::vector<bf16> a(48 * 48), b(48 * 48);
  std::vector<float> c(48 * 48);
  Gemm(48, 40, 24, a.data(), b.data(), c.data());
  size_t after_first = ops::CachedGemmPrimitives();
  for (int i = 0; i < 3; ++i) Gemm(48, 40, 24, a.data(), b.data(), c.data());
  EXPECT_EQ(ops::CachedGemmPrimitives(), after_first);
  Gemm(40, 48, 24, a.data(), b.data(), c.data());
  EXPECT_EQ(ops::CachedGemmPrimitives(), after_first + 1);
  GemmOptions o;
  o.beta = 1;
  Gemm(48, 40, 24, a.data(), b.data(), c.data(), o);
  EXPECT_EQ(ops::CachedGemmPrimitives(), after_first + 2);
}

// oneDNN must run an optimised kernel, not its reference loops (orders of
// magnitude slower), for every transpose and with every post-op.
TEST(Gemm, OneDNNUsesAnOptimisedKernel) {
  std::vector<float> bias(256);
  for (DType ab : {DType::kBF16, DType::kF32})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (int extras = 0; extras < 2; ++extras) {
          GemmOptions o;
          o.trans_a = ta;
          o.trans_b = tb;
          if (extras) {
            o.alpha = 0.5f;
            o.beta = 1.0f;
            o.bias = bias.data();
          }
          std::string impl = ops::GemmImplementation(256, 256, 256, ab, DType::kF32, o);
          EXPECT_THAT(impl, ::testing::Not(HasSubstr("ref")))
              << DTypeName(ab) << " ta=" << ta << " tb=" << tb << " extras=" << extras;
          if (!extras)
            std::cout << DTypeName(ab) << " 256^3 ta=" << ta << " tb=" << tb << ": " << impl
                      << "\n";
        }
  EXPECT_THAT(ops::GemmImplementation(256, 256, 256, DType::kBF16, DType::kBF16),
              ::testing::Not(HasSubstr("ref")));
  // Strided operands are copied to dense ones: still brgemm.
  GemmOptions o;
  o.lda = 300;
  o.ldb = 301;
  o.ldc = 302;
  o.beta = 1;
  o.bias = bias.data();
  EXPECT_THAT(ops::GemmImplementation(256, 256, 256, DType::kBF16, DType::kBF16, o),
              ::testing::Not(HasSubstr("ref")));
}

// Random operands of the chunking tests, exactly representable in bf16
// (a16, b16 hold the same values).
struct ChunkingOperands {
  std::vector<float> a, b, c0, bias;
  std::vector<bf16> a16, b16;
};
ChunkingOperands MakeChunkingOperands(size_t m, size_t n, size_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  ChunkingOperands x;
  x.a = Random(m * k, rng, true);
  x.b = Random(k * n, rng, true);
  x.c0 = Random(m * n, rng, true);
  x.bias = Random(n, rng, false);
  x.a16.resize(x.a.size());
  x.b16.resize(x.b.size());
  ConvertF32ToBF16(x.a.data(), x.a16.data(), x.a.size());
  ConvertF32ToBF16(x.b.data(), x.b16.data(), x.b.size());
  return x;
}

// The options of the chunking tests: path 0 bf16 and 1 f32 on oneDNN, 2
// f32 on OpenBLAS; variant 0 plain, 1 alpha, beta and bias, 2 that and A
// transposed (A^T stored k x m: rows of C are columns of it), 3 B
// transposed (with C strided by the caller).
GemmOptions ChunkingVariant(int path, int variant, const float* bias) {
  GemmOptions o;
  o.backend = path == 2 ? GemmBackend::kOpenBLAS : GemmBackend::kOneDNN;
  o.trans_a = variant == 2;
  o.trans_b = variant == 3;
  if (variant >= 1) {
    o.alpha = 0.75f;
    o.beta = 0.5f;
    o.bias = bias;
  }
  return o;
}

// Chunked pipelines cut M into row chunks: with the oneDNN backend (and one
// thread) the rows of a sub-GEMM equal the full GEMM's bit for bit, for any
// chunking, with and without alpha/beta/bias and transposes. (OpenBLAS does
// not promise this: it picks its "direct" and small-matrix kernels by size;
// the test prints how many elements differ there, for the record.)
TEST(Gemm, OneDNNRowChunksAreBitwiseEqualToTheFullProduct) {
  struct Case {
    size_t m, n, k;
  };
  for (Case cs : {Case{96, 80, 200}, Case{100, 64, 1024}, Case{257, 96, 3000}}) {
    const size_t m = cs.m, n = cs.n, k = cs.k;
    const ChunkingOperands x = MakeChunkingOperands(m, n, k, static_cast<uint32_t>(m * n + k));
    const auto& [a, b, c0, bias, a16, b16] = x;
    for (int path = 0; path < 3; ++path) {  // bf16, f32 oneDNN, f32 OpenBLAS
      // 0: plain; 1: alpha, beta, bias; 2: and A transposed; 3: B transposed
      // and C strided.
      for (int variant = 0; variant < 4; ++variant) {
        const GemmOptions o = ChunkingVariant(path, variant, bias.data());
        // B is used as k x n, or (variant 3) as the transpose of its first
        // n rows of k; C has n columns of a row of n (n - 5 with variant 3).
        const size_t nc = variant == 3 ? n - 5 : n;
        auto run = [&](size_t rows, size_t row0, float* c) {
          GemmOptions oo = o;
          oo.lda = o.trans_a ? m : k;
          oo.ldc = n;
          const size_t a_off = o.trans_a ? row0 : row0 * k;
          if (path == 0)
            Gemm(rows, nc, k, a16.data() + a_off, b16.data(), c, oo);
          else
            Gemm(rows, nc, k, a.data() + a_off, b.data(), c, oo);
        };
        std::vector<float> full = c0;
        run(m, 0, full.data());
        size_t worst = 0;
        for (size_t chunk : {size_t{1}, size_t{7}, size_t{16}, size_t{17}, m / 3 + 1}) {
          std::vector<float> part = c0;
          for (size_t r0 = 0; r0 < m; r0 += chunk)
            run(std::min(chunk, m - r0), r0, part.data() + r0 * n);
          size_t diff = 0;
          for (size_t i = 0; i < full.size(); ++i)
            diff += std::memcmp(&full[i], &part[i], sizeof(float)) != 0;
          worst = std::max(worst, diff);
          if (path < 2) {
            EXPECT_EQ(diff, 0u) << (path == 0 ? "bf16" : "f32 oneDNN") << " m=" << m << " n=" << n
                                << " k=" << k << " chunk=" << chunk << " variant=" << variant;
          }
        }
        if (path == 2)
          std::cout << "OpenBLAS m=" << m << " n=" << n << " k=" << k << " variant " << variant
                    << ": up to " << worst << " of " << m * n
                    << " elements differ between row chunkings\n";
      }
    }
  }
}

// B packed once (ops::PackedGemmB, what the operators multiply by) gives
// the plain call's result bit for bit, for any row count (so chunked and
// fused pipelines still agree with serial), with alpha/beta/bias,
// transposes and strides; f32 on OpenBLAS is not packed and still right.
TEST(Gemm, PackedBIsBitwiseThePlainCall) {
  struct Case {
    size_t m, n, k;
  };
  for (Case cs : {Case{96, 80, 200}, Case{100, 64, 1024}, Case{257, 96, 3000}}) {
    const size_t m = cs.m, n = cs.n, k = cs.k;
    const ChunkingOperands x = MakeChunkingOperands(m, n, k, static_cast<uint32_t>(m + n * k));
    const auto& [a, b, c0, bias, a16, b16] = x;
    for (int path = 0; path < 3; ++path) {  // bf16, f32 oneDNN, f32 OpenBLAS
      for (int variant = 0; variant < 4; ++variant) {
        GemmOptions o = ChunkingVariant(path, variant, bias.data());
        const size_t nc = variant == 3 ? n - 5 : n;
        o.lda = o.trans_a ? m : k;
        o.ldc = n;
        const DType ab = path == 0 ? DType::kBF16 : DType::kF32;
        const void* bp = path == 0 ? static_cast<const void*>(b16.data()) : b.data();
        ops::PackedGemmB packed(k, nc, ab, bp, o);
        EXPECT_EQ(packed.packed(), path < 2) << "path " << path << " variant " << variant;
        for (size_t chunk : {size_t{1}, size_t{7}, size_t{16}, size_t{17}, m / 3 + 1, m}) {
          std::vector<float> plain = c0, with_packed = c0;
          for (size_t r0 = 0; r0 < m; r0 += chunk) {
            const size_t rows = std::min(chunk, m - r0);
            const size_t a_off = o.trans_a ? r0 : r0 * k;
            const void* ap = path == 0 ? static_cast<const void*>(a16.data() + a_off)
                                       : static_cast<const void*>(a.data() + a_off);
            Gemm(rows, nc, k, ab, ap, bp, DType::kF32, plain.data() + r0 * n, o);
            GemmOptions rest = o;  // B's layout comes from the packing
            rest.trans_b = false;
            rest.ldb = 0;
            packed.Multiply(rows, ap, DType::kF32, with_packed.data() + r0 * n, rest);
          }
          size_t diff = 0;
          for (size_t i = 0; i < plain.size(); ++i)
            diff += std::memcmp(&plain[i], &with_packed[i], sizeof(float)) != 0;
          EXPECT_EQ(diff, 0u) << "path " << path << " m=" << m << " n=" << n << " k=" << k
                              << " chunk=" << chunk << " variant=" << variant;
        }
      }
    }
  }
}

// The operators' per-call set packs each distinct B once, and its products
// match a double-precision reference.
TEST(Gemm, PackedBSetPacksEachBOnceAndMatchesReference) {
  const size_t m = 40, n = 48, k = 96;
  std::mt19937 rng(7);
  std::vector<float> a = Random(m * k, rng, true), b1 = Random(k * n, rng, true),
                     b2 = Random(k * n, rng, true);
  GemmOptions o;
  o.backend = GemmBackend::kOneDNN;
  ops::PackedGemmBSet set(DType::kF32, o);
  std::vector<float> c1(m * n), c2(m * n);
  for (size_t r0 = 0; r0 < m; r0 += 8) {
    set.Gemm(8, n, k, a.data() + r0 * k, b1.data(), DType::kF32, c1.data() + r0 * n);
    set.Gemm(8, n, k, a.data() + r0 * k, b2.data(), DType::kF32, c2.data() + r0 * n);
  }
  EXPECT_EQ(set.size(), 2u);
  for (const auto& [b, c] : {std::pair{&b1, &c1}, std::pair{&b2, &c2}}) {
    for (size_t i = 0; i < m; ++i)
      for (size_t j = 0; j < n; ++j) {
        double ref = 0;
        for (size_t l = 0; l < k; ++l) ref += double(a[i * k + l]) * double((*b)[l * n + j]);
        EXPECT_NEAR((*c)[i * n + j], ref, 1e-4 * k) << i << "," << j;
      }
  }
}

TEST(Gemm, ConcurrentCallsFromManyThreads) {
  const size_t m = 64, n = 48, k = 96;
  std::mt19937 rng(3);
  std::vector<float> a = Random(m * k, rng, true), b = Random(k * n, rng, true);
  std::vector<bf16> a16(a.size()), b16(b.size());
  ConvertF32ToBF16(a.data(), a16.data(), a.size());
  ConvertF32ToBF16(b.data(), b16.data(), b.size());
  std::vector<float> want16(m * n), want32(m * n);
  Gemm(m, n, k, a16.data(), b16.data(), want16.data());
  Gemm(m, n, k, a.data(), b.data(), want32.data());
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      std::vector<float> c(m * n);
      for (int i = 0; i < 20; ++i) {
        Gemm(m, n, k, a16.data(), b16.data(), c.data());
        if (c != want16) ++bad;
        Gemm(m, n, k, a.data(), b.data(), c.data());
        if (c != want32) ++bad;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(Gemm, TwoThreadsMatchReference) {
  GemmOptions o;
  o.threads = 2;
  o.beta = 0.5f;
  for (Path p : {Path::kF32, Path::kF32OneDNN, Path::kBF16ToF32})
    EXPECT_EQ(RunCase({128, 96, 160}, o, p, 0, 11), 0) << PathName(p);
}

TEST(Gemm, ConversionsMatchCore) {
  std::vector<float> f = {0.0f,
                          -0.0f,
                          1.0f,
                          3.14159f,
                          -1e-40f,
                          65504.0f,
                          1e38f,
                          std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()};
  std::vector<bf16> h(f.size());
  ConvertF32ToBF16(f.data(), h.data(), f.size());
  std::vector<float> back(f.size());
  ConvertBF16ToF32(h.data(), back.data(), h.size());
  for (size_t i = 0; i < f.size(); ++i) {
    EXPECT_EQ(h[i].bits, core::F32ToBF16(f[i])) << i;
    EXPECT_EQ(core::F32ToBF16(back[i]), h[i].bits) << i;
  }
  EXPECT_TRUE(std::isnan(back.back()));
}

}  // namespace
}  // namespace mc2
