// GradSync's PowerSGD compression against a reference written here in
// double precision: every rank simulates every rank's gradient, error-
// feedback residual and the shared Q, and runs the algorithm (P = M Q
// averaged, Gram-Schmidt, Q_w = M_w^T P, residual_w = M_w - P Q_w^T,
// result = P mean(Q_w)^T, Q warm-started) with its own code. The library
// computes in f32 (OpenBLAS products), so results are compared within a
// tolerance stated below; vectors and matrices where low rank does not
// save bytes are all-reduced exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "grad/grad_reference.h"
#include "mc2/mc2.h"

namespace mc2 {
namespace {

using gradtest::Value;
using Mat = std::vector<double>;  // row-major

struct Shape {
  size_t rows, cols;  // cols == 0: registered as a vector of `rows`
};
// A 16 x 12 and a 3 x 40 matrix (compressed at rank 2), a vector, a 2 x 2
// matrix (rank 2 would move more than the matrix: exact) and a 5 x 6 one
// (compressed).
const std::vector<Shape> kShapes = {{16, 12}, {10, 0}, {3, 40}, {2, 2}, {5, 6}};
constexpr int kRank = 2;
constexpr uint64_t kSeed = 99;

size_t Count(const Shape& s) { return s.cols == 0 ? s.rows : s.rows * s.cols; }
size_t RankOf(const Shape& s) { return std::min<size_t>({kRank, s.rows, s.cols}); }
bool Compressed(const Shape& s) {
  const size_t r = RankOf(s);
  return s.cols > 0 && r * (s.rows + s.cols) < s.rows * s.cols;
}

// Modified Gram-Schmidt on the columns of a (rows x r), in double.
void Ortho(Mat& a, size_t rows, size_t r) {
  for (size_t j = 0; j < r; ++j) {
    for (size_t k = 0; k < j; ++k) {
      double d = 0;
      for (size_t i = 0; i < rows; ++i) d += a[i * r + j] * a[i * r + k];
      for (size_t i = 0; i < rows; ++i) a[i * r + j] -= d * a[i * r + k];
    }
    double n = 0;
    for (size_t i = 0; i < rows; ++i) n += a[i * r + j] * a[i * r + j];
    n = std::sqrt(n);
    if (n > 0)
      for (size_t i = 0; i < rows; ++i) a[i * r + j] /= n;
  }
}

// The seeded start of parameter `key`'s Q, as documented: 24-bit uniform
// values on [-1, 1) from mt19937_64 seeded by seed_seq{seed, key} halves.
Mat StartQ(uint64_t key, size_t cols, size_t r) {
  std::seed_seq seq{static_cast<uint32_t>(kSeed), static_cast<uint32_t>(kSeed >> 32),
                    static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)};
  std::mt19937_64 gen(seq);
  Mat q(cols * r);
  for (double& v : q) v = static_cast<double>(gen() >> 40) / (1 << 23) - 1.0;
  Ortho(q, cols, r);
  return q;
}

float Grad(int step, int rank, size_t p, size_t i) {
  return Value(5, step, rank, static_cast<int>(p), i);
}

void RunPowerSgd(int n, bool average, int steps, bool rank0_marks_forward) {
  Group::RunInProcess(n, [&](Group& g) {
    GradSyncOptions o;
    o.average = average;
    o.compression.scheme = Compression::kPowerSgd;
    o.compression.powersgd_rank = kRank;
    o.compression.powersgd_seed = kSeed;
    GradSync sync(g, o);
    for (size_t p = 0; p < kShapes.size(); ++p) {
      const std::string name = "w" + std::to_string(p);
      if (kShapes[p].cols == 0)
        sync.Register(name, kShapes[p].rows, DType::kF32);
      else
        sync.Register(name, kShapes[p].rows, kShapes[p].cols, DType::kF32);
    }
    sync.Finalize();
    const size_t np = kShapes.size();
    // Reference state: the residual of every rank and parameter, the Q of
    // each compressed parameter.
    std::vector<std::vector<Mat>> res(n, std::vector<Mat>(np));
    std::vector<Mat> q(np);
    for (size_t p = 0; p < np; ++p) {
      for (int w = 0; w < n; ++w) res[w][p].assign(Count(kShapes[p]), 0.0);
      if (Compressed(kShapes[p])) q[p] = StartQ(p, kShapes[p].cols, RankOf(kShapes[p]));
    }
    for (int step = 0; step < steps; ++step) {
      sync.ZeroGrad();
      for (size_t k = 0; k < np; ++k) {
        // Rank 0 marks first to last in step 0 so that the rebuild changes
        // the layout (the Qs and residuals must carry over).
        const size_t p = rank0_marks_forward ? k : np - 1 - k;
        float* v = sync.GradAs<float>(static_cast<int>(p));
        for (size_t i = 0; i < Count(kShapes[p]); ++i) v[i] = Grad(step, g.rank(), p, i);
        sync.MarkReady(static_cast<int>(p));
      }
      sync.Finish();
      size_t wire_values = 0;
      for (size_t p = 0; p < np; ++p) {
        const Shape& s = kShapes[p];
        const size_t cnt = Count(s);
        std::vector<double> want(cnt, 0.0);
        double scale = 0;  // max |M_w| over ranks: the tolerance's scale
        if (!Compressed(s)) {
          wire_values += cnt;
          for (size_t i = 0; i < cnt; ++i) {
            for (int w = 0; w < n; ++w) want[i] += Grad(step, w, p, i);
            if (average) want[i] /= n;
            scale = std::max(scale, std::fabs(want[i]));
          }
        } else {
          const size_t R = s.rows, C = s.cols, r = RankOf(s);
          wire_values += (R + C) * r;
          std::vector<Mat> m(n, Mat(R * C));
          Mat P(R * r, 0.0);
          for (int w = 0; w < n; ++w) {
            for (size_t i = 0; i < R * C; ++i) {
              m[w][i] = Grad(step, w, p, i) + res[w][p][i];
              scale = std::max(scale, std::fabs(m[w][i]));
            }
            for (size_t i = 0; i < R; ++i)
              for (size_t j = 0; j < r; ++j)
                for (size_t c = 0; c < C; ++c) P[i * r + j] += m[w][i * C + c] * q[p][c * r + j];
          }
          Ortho(P, R, r);
          Mat Q(C * r, 0.0);
          for (int w = 0; w < n; ++w) {
            Mat qw(C * r, 0.0);
            for (size_t c = 0; c < C; ++c)
              for (size_t j = 0; j < r; ++j)
                for (size_t i = 0; i < R; ++i) qw[c * r + j] += m[w][i * C + c] * P[i * r + j];
            for (size_t i = 0; i < R; ++i)
              for (size_t c = 0; c < C; ++c) {
                double a = 0;
                for (size_t j = 0; j < r; ++j) a += P[i * r + j] * qw[c * r + j];
                res[w][p][i * C + c] = m[w][i * C + c] - a;
              }
            for (size_t i = 0; i < C * r; ++i) Q[i] += average ? qw[i] / n : qw[i];
          }
          q[p] = Q;
          for (size_t i = 0; i < R; ++i)
            for (size_t c = 0; c < C; ++c)
              for (size_t j = 0; j < r; ++j) want[i * C + c] += P[i * r + j] * Q[c * r + j];
        }
        // f32 products of a few dozen terms after a few steps of warm
        // start: within 1e-4 of the largest input magnitude (times n for
        // sums), against a result of that magnitude.
        const double tol = 1e-4 * scale * (average ? 1 : n) + 1e-30;
        const float* got = sync.GradAs<float>(static_cast<int>(p));
        std::span<const float> mine = sync.Residual(static_cast<int>(p));
        ASSERT_EQ(mine.size(), cnt);
        for (size_t i = 0; i < cnt; ++i) {
          ASSERT_NEAR(got[i], want[i], tol) << "step " << step << " param " << p << " i " << i;
          ASSERT_NEAR(mine[i], res[g.rank()][p][i], 1e-4 * scale + 1e-30)
              << "residual, step " << step << " param " << p << " i " << i;
          if (!Compressed(s)) {
            ASSERT_EQ(mine[i], 0.0f);
          }
        }
      }
      const GradSyncStats& st = sync.stats();
      EXPECT_EQ(st.scheme, Compression::kPowerSgd);
      if (n > 1) {
        // One bucket (the default cap): 2 (N-1)/N of its f32 values, [the
        // exact parameters | P] and then Q (rounded down per all-reduce).
        size_t plain = 0, pv = 0, qv = 0, dense = 0;
        for (const Shape& s : kShapes) {
          dense += Count(s);
          if (Compressed(s)) {
            pv += s.rows * RankOf(s);
            qv += s.cols * RankOf(s);
          } else {
            plain += Count(s);
          }
        }
        ASSERT_EQ(plain + pv + qv, wire_values);
        const size_t N = static_cast<size_t>(n);
        EXPECT_EQ(st.wire_bytes, 2 * (N - 1) * (plain + pv + qv) * 4 / N);
        EXPECT_EQ(st.dense_bytes, 2 * (N - 1) * dense * 4 / N);
        EXPECT_LT(st.wire_bytes, st.dense_bytes);
      }
    }
  });
}

TEST(PowerSgd, AveragedOverTwoRanksMatchesTheReferenceAcrossStepsAndTheRebuild) {
  RunPowerSgd(2, /*average=*/true, /*steps=*/4, /*rank0_marks_forward=*/true);
}

TEST(PowerSgd, SummedOverThreeRanksMatchesTheReference) {
  RunPowerSgd(3, /*average=*/false, /*steps=*/3, /*rank0_marks_forward=*/false);
}

TEST(PowerSgd, OneRankStillApproximates) { RunPowerSgd(1, true, 2, false); }

// Error feedback conserves the gradient: over the ranks, sum(G_w + old
// residual_w) = N x mean + sum(new residual_w). Each side is a sum of f32
// values computed from the same products, so they agree to f32 rounding:
// within 1e-5 of the largest |M_w| times N.
TEST(PowerSgd, ErrorFeedbackConservesTheGradient) {
  const int n = 3;
  const size_t R = 24, C = 20;
  Group::RunInProcess(n, [&](Group& g) {
    GradSyncOptions o;
    o.compression.scheme = Compression::kPowerSgd;
    o.compression.powersgd_rank = 3;
    GradSync sync(g, o);
    const int id = sync.Register("m", R, C, DType::kF32);
    sync.Finalize();
    std::vector<float> old(R * C, 0.0f), all_in(R * C), all_res(R * C);
    for (int step = 0; step < 3; ++step) {
      sync.ZeroGrad();
      float* v = sync.GradAs<float>(id);
      std::vector<float> in(R * C);
      for (size_t i = 0; i < R * C; ++i) {
        v[i] = Grad(step, g.rank(), 0, i);
        in[i] = v[i] + old[i];
      }
      sync.MarkReady(id);
      sync.Finish();
      std::span<const float> r = sync.Residual(id);
      AllReduce(g, in.data(), all_in.data(), R * C, DType::kF32, ReduceOp::kSum).Wait();
      AllReduce(g, r.data(), all_res.data(), R * C, DType::kF32, ReduceOp::kSum).Wait();
      const float* mean = sync.GradAs<float>(id);
      double scale = 0;
      for (float x : in) scale = std::max(scale, std::fabs(double{x}));
      for (size_t i = 0; i < R * C; ++i) {
        ASSERT_NEAR(all_in[i], n * double{mean[i]} + all_res[i], 1e-5 * scale * n)
            << "step " << step << " i " << i;
      }
      // The approximation is not the identity: something stays behind.
      double left = 0;
      for (float x : r) left = std::max(left, std::fabs(double{x}));
      EXPECT_GT(left, 1e-3 * scale);
      old.assign(r.begin(), r.end());
    }
  });
}

TEST(PowerSgd, BadArguments) {
  Group::RunInProcess(1, [&](Group& g) {
    GradSyncOptions o;
    o.compression.scheme = Compression::kPowerSgd;
    o.compression.powersgd_rank = 0;
    try {
      GradSync s(g, o);
      FAIL() << "rank 0 accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("powersgd_rank must be >= 1"), std::string::npos);
    }
    o.compression.powersgd_rank = 1;
    GradSync s(g, o);
    EXPECT_THROW(s.Register("big", SIZE_MAX / 2, 3, DType::kF32), Error);
    EXPECT_THROW(s.Register("f64", 4, 4, DType::kF64), Error);  // compression: f32 only
    std::vector<float> x(16, 1.0f);
    CompressionOptions c;
    c.scheme = Compression::kPowerSgd;
    try {
      CompressedAllReduce op(g, x.data(), x.size(), c, true);
      FAIL() << "CompressedAllReduce took powersgd";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("powersgd"), std::string::npos);
    }
    EXPECT_EQ(ParseCompression("powersgd"), Compression::kPowerSgd);
    EXPECT_STREQ(CompressionName(Compression::kPowerSgd), "powersgd");
  });
}

// A rank above min(rows, cols) is clamped to it, where low rank saves
// nothing: the matrix is all-reduced exactly (bitwise the dense mean).
TEST(PowerSgd, RankAboveTheSmallerDimensionIsExact) {
  Group::RunInProcess(2, [&](Group& g) {
    GradSyncOptions o, d;
    o.compression.scheme = Compression::kPowerSgd;
    o.compression.powersgd_rank = 50;
    GradSync s(g, o), dense(g, d);
    const int a = s.Register("m", 8, 6, DType::kF32);
    const int b = dense.Register("m", 48, DType::kF32);
    s.Finalize();
    dense.Finalize();
    for (size_t i = 0; i < 48; ++i) {
      s.GradAs<float>(a)[i] = dense.GradAs<float>(b)[i] = Grad(0, g.rank(), 0, i);
    }
    s.Finish();
    dense.Finish();
    for (size_t i = 0; i < 48; ++i) ASSERT_EQ(s.GradAs<float>(a)[i], dense.GradAs<float>(b)[i]);
    EXPECT_EQ(s.stats().wire_bytes, dense.stats().wire_bytes);
  });
}

}  // namespace
}  // namespace mc2
