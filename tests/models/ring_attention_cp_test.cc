// Ring attention (RingAttention, include/mc2/models.h) over CP groups of
// 1, 2, 3 and 4 ranks, causal and not, with and without overlap:
// - the forward output and dQ, dK, dV, gathered from the ranks by global
//   position, equal an independent double-precision full attention over
//   the whole sequence on one rank (plain loops, below), within a stated
//   f32 tolerance;
// - the overlapped and the non-overlapped ring give the same bits (the
//   same arithmetic in the same order; only the waits move);
// - bad shapes and arguments fail with kInvalidArgument on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/rank_errors.h"
#include "mc2/mc2.h"
#include "mc2/models.h"
#include "models/kernels.h"

namespace mc2::models {
namespace {

// Global tensors [T x B x H x d] (position-major, as the local layout).
struct Problem {
  int T, B, H, d;
  std::vector<float> q, k, v, dout;
  size_t Index(int t, int b, int h, int e) const {
    return ((static_cast<size_t>(t) * B + b) * H + h) * d + e;
  }
};

Problem MakeProblem(int T, int B, int H, int d, uint64_t seed) {
  Problem p{T, B, H, d, {}, {}, {}, {}};
  const size_t n = static_cast<size_t>(T) * B * H * d;
  for (auto [vec, stream] : {std::pair{&p.q, 1}, {&p.k, 2}, {&p.v, 3}, {&p.dout, 4}}) {
    vec->resize(n);
    // Scores of order a few units, so the softmax is far from uniform.
    const float amp = stream <= 2 ? 2.0f : 1.0f;
    for (size_t i = 0; i < n; ++i) (*vec)[i] = amp * HashUniform(seed, stream, i);
  }
  return p;
}

struct Grads {
  std::vector<double> out, dq, dk, dv;
};

// Full attention and its gradients in double, one (b, h) at a time, from
// the textbook formulas: P = softmax(Q K^T / sqrt(d)), O = P V,
// dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)), dQ = dS K / sqrt(d),
// dK = dS^T Q / sqrt(d).
Grads Reference(const Problem& p, bool causal) {
  const int T = p.T, d = p.d;
  const size_t n = p.q.size();
  Grads g{std::vector<double>(n), std::vector<double>(n), std::vector<double>(n),
          std::vector<double>(n)};
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> P(static_cast<size_t>(T) * T), dS(static_cast<size_t>(T) * T);
  for (int b = 0; b < p.B; ++b) {
    for (int h = 0; h < p.H; ++h) {
      auto at = [&](const std::vector<float>& x, int t, int e) {
        return static_cast<double>(x[p.Index(t, b, h, e)]);
      };
      for (int i = 0; i < T; ++i) {
        const int n_keys = causal ? i + 1 : T;
        double mx = -1e300;
        for (int j = 0; j < n_keys; ++j) {
          double s = 0;
          for (int e = 0; e < d; ++e) s += at(p.q, i, e) * at(p.k, j, e);
          P[i * T + j] = s * scale;
          mx = std::max(mx, P[i * T + j]);
        }
        double sum = 0;
        for (int j = 0; j < T; ++j) {
          P[i * T + j] = j < n_keys ? std::exp(P[i * T + j] - mx) : 0.0;
          sum += P[i * T + j];
        }
        for (int j = 0; j < T; ++j) P[i * T + j] /= sum;
        for (int e = 0; e < d; ++e) {
          double o = 0;
          for (int j = 0; j < T; ++j) o += P[i * T + j] * at(p.v, j, e);
          g.out[p.Index(i, b, h, e)] = o;
        }
        double dot = 0;
        for (int j = 0; j < T; ++j) {
          double dp = 0;
          for (int e = 0; e < d; ++e) dp += at(p.dout, i, e) * at(p.v, j, e);
          dS[i * T + j] = dp;
          dot += dp * P[i * T + j];
        }
        for (int j = 0; j < T; ++j) dS[i * T + j] = P[i * T + j] * (dS[i * T + j] - dot);
      }
      for (int i = 0; i < T; ++i) {
        for (int e = 0; e < d; ++e) {
          double dq = 0, dk = 0, dv = 0;
          for (int j = 0; j < T; ++j) {
            dq += dS[i * T + j] * at(p.k, j, e);
            dk += dS[j * T + i] * at(p.q, j, e);
            dv += P[j * T + i] * at(p.dout, j, e);
          }
          g.dq[p.Index(i, b, h, e)] = dq * scale;
          g.dk[p.Index(i, b, h, e)] = dk * scale;
          g.dv[p.Index(i, b, h, e)] = dv;
        }
      }
    }
  }
  return g;
}

struct RingResult {
  std::vector<float> out, dq, dk, dv;  // global layout
};

// Runs the ring on `cp` in-process ranks: each rank takes the rows of its
// positions (RingAttention::Position) into buffers with a padded row
// stride (ld > H d, as inside a fused QKV matrix), and writes its results
// back to the global layout.
RingResult RunRing(const Problem& p, int cp, bool causal, bool overlap) {
  const size_t n = p.q.size(), HD = static_cast<size_t>(p.H) * p.d, ld = HD + 3;
  RingResult res{std::vector<float>(n, NAN), std::vector<float>(n, NAN), std::vector<float>(n, NAN),
                 std::vector<float>(n, NAN)};
  std::mutex mu;
  Group::RunInProcess(cp, [&](Group& g) {
    RingAttentionConfig c;
    c.batch = p.B;
    c.seq_len = p.T;
    c.heads = p.H;
    c.head_dim = p.d;
    c.causal = causal;
    c.overlap = overlap;
    RingAttention ring(g, c);
    const int Tl = ring.local_len();
    ASSERT_EQ(Tl * cp, p.T);
    const size_t rows = static_cast<size_t>(Tl) * p.B;
    std::vector<float> q(rows * ld), k(rows * ld), v(rows * ld), dout(rows * ld);
    std::vector<float> out(rows * ld), dq(rows * ld), dk(rows * ld), dv(rows * ld);
    auto gather = [&](const std::vector<float>& global, std::vector<float>& local) {
      for (int t = 0; t < Tl; ++t) {
        const int pos = static_cast<int>(ring.Position(t));
        for (int b = 0; b < p.B; ++b) {
          std::memcpy(&local[(static_cast<size_t>(t) * p.B + b) * ld],
                      &global[p.Index(pos, b, 0, 0)], HD * sizeof(float));
        }
      }
    };
    gather(p.q, q);
    gather(p.k, k);
    gather(p.v, v);
    gather(p.dout, dout);
    ring.Forward(q.data(), ld, k.data(), ld, v.data(), ld, out.data(), ld);
    ring.Backward(dout.data(), ld, dq.data(), ld, dk.data(), ld, dv.data(), ld);
    // Backward starts from the block the forward ended with, which it
    // keeps: a second Backward of the same Forward gives the same bits.
    std::vector<float> dq2(rows * ld), dk2(rows * ld), dv2(rows * ld);
    ring.Backward(dout.data(), ld, dq2.data(), ld, dk2.data(), ld, dv2.data(), ld);
    for (size_t i = 0; i < rows; ++i) {
      const size_t o = i * ld, nb = HD * sizeof(float);
      EXPECT_EQ(0, std::memcmp(&dq[o], &dq2[o], nb)) << "row " << i;
      EXPECT_EQ(0, std::memcmp(&dk[o], &dk2[o], nb)) << "row " << i;
      EXPECT_EQ(0, std::memcmp(&dv[o], &dv2[o], nb)) << "row " << i;
    }
    std::lock_guard<std::mutex> lock(mu);
    auto scatter = [&](const std::vector<float>& local, std::vector<float>& global) {
      for (int t = 0; t < Tl; ++t) {
        const int pos = static_cast<int>(ring.Position(t));
        for (int b = 0; b < p.B; ++b) {
          std::memcpy(&global[p.Index(pos, b, 0, 0)],
                      &local[(static_cast<size_t>(t) * p.B + b) * ld], HD * sizeof(float));
        }
      }
    };
    scatter(out, res.out);
    scatter(dq, res.dq);
    scatter(dk, res.dk);
    scatter(dv, res.dv);
  });
  return res;
}

// max |got - want| / (1 + max |want|): every global element must be
// written (a NaN left from the initial fill fails).
double MaxError(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0, scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(e <= 1e30)) return INFINITY;  // NaN: not written
    worst = std::max(worst, e);
  }
  return worst / (1.0 + scale);
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(RingAttention, EqualsFullAttentionOnOneRank) {
  // f32 against a double reference. Every output element is a sum of at
  // most T = 24 products, with d = 8 products per score; the online
  // softmax sums the same terms in another order (block by block, with up
  // to 2 cp rescalings of the running sum by exp(m - m') of its own rows),
  // and the gradients add the ranks' parts of dK, dV in ring order. Each
  // step rounds with a relative error <= 2^-24; with inputs and scores of
  // order 1 and about 100 rounding steps on any element's path (the score,
  // the exponential, the sum, the product with V, the rescalings) the
  // error stays below 100 * 6e-8 = 6e-6 of the largest reference value
  // (plus 1 for values near 0), so 1e-5 bounds it with margin, while a
  // wrong mask, a block applied twice or missed moves values by 1e-2 or
  // more.
  const Problem p = MakeProblem(/*T=*/24, /*B=*/2, /*H=*/2, /*d=*/8, /*seed=*/7);
  for (bool causal : {true, false}) {
    const Grads want = Reference(p, causal);
    for (int cp : {1, 2, 3, 4}) {
      const RingResult got = RunRing(p, cp, causal, /*overlap=*/true);
      const std::string what = "cp " + std::to_string(cp) + (causal ? " causal" : " full");
      EXPECT_LE(MaxError(got.out, want.out), 1e-5) << what << " out";
      EXPECT_LE(MaxError(got.dq, want.dq), 1e-5) << what << " dq";
      EXPECT_LE(MaxError(got.dk, want.dk), 1e-5) << what << " dk";
      EXPECT_LE(MaxError(got.dv, want.dv), 1e-5) << what << " dv";
      const RingResult serial = RunRing(p, cp, causal, /*overlap=*/false);
      EXPECT_TRUE(SameBits(got.out, serial.out)) << what;
      EXPECT_TRUE(SameBits(got.dq, serial.dq)) << what;
      EXPECT_TRUE(SameBits(got.dk, serial.dk)) << what;
      EXPECT_TRUE(SameBits(got.dv, serial.dv)) << what;
    }
  }
}

TEST(RingAttention, EachRankHoldsTwoMirroredChunks) {
  // 4 ranks, 16 positions: 8 chunks of 2; rank r holds chunks r and 7 - r.
  Group::RunInProcess(4, [](Group& g) {
    RingAttentionConfig c;
    c.seq_len = 16;
    RingAttention ring(g, c);
    ASSERT_EQ(ring.local_len(), 4);
    const int r = g.rank();
    EXPECT_EQ(ring.Position(0), 2 * r);
    EXPECT_EQ(ring.Position(1), 2 * r + 1);
    EXPECT_EQ(ring.Position(2), 2 * (7 - r));
    EXPECT_EQ(ring.Position(3), 2 * (7 - r) + 1);
  });
}

TEST(RingAttention, BadShapesFailOnEveryRank) {
  auto expect_invalid = [](const std::function<void(RingAttentionConfig&)>& edit,
                           const char* what) {
    const std::vector<int> codes = test::ErrorCodes(
        [&](Group& g) {
          RingAttentionConfig c;
          c.seq_len = 12;
          c.heads = 2;
          c.head_dim = 4;
          edit(c);
          RingAttention ring(g, c);
        },
        3);
    for (int code : codes) EXPECT_EQ(code, static_cast<int>(ErrorCode::kInvalidArgument)) << what;
  };
  // 3 ranks: 6 chunks; 12 positions is fine, 9 and 15 are not.
  expect_invalid([](RingAttentionConfig& c) { c.seq_len = 9; }, "seq_len 9");
  expect_invalid([](RingAttentionConfig& c) { c.seq_len = 15; }, "seq_len 15");
  expect_invalid([](RingAttentionConfig& c) { c.seq_len = 0; }, "seq_len 0");
  expect_invalid([](RingAttentionConfig& c) { c.batch = 0; }, "batch 0");
  expect_invalid([](RingAttentionConfig& c) { c.heads = 0; }, "heads 0");
  expect_invalid([](RingAttentionConfig& c) { c.head_dim = -1; }, "head_dim -1");
  // The message names the cause.
  Group::RunInProcess(2, [](Group& g) {
    RingAttentionConfig c;
    c.seq_len = 6;
    try {
      RingAttention ring(g, c);
      ADD_FAILURE() << "seq_len 6 on 2 ranks was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("seq_len (6)"), std::string::npos) << e.what();
    }
  });
  // Call errors: a stride below heads * head_dim, a null pointer, Backward
  // before Forward; every rank alike, and nothing posted.
  const std::vector<int> codes = test::ErrorCodes(
      [](Group& g) {
        RingAttentionConfig c;
        c.seq_len = 12;
        c.heads = 2;
        c.head_dim = 4;
        RingAttention ring(g, c);
        std::vector<float> buf(static_cast<size_t>(ring.local_len()) * 8);
        int failures = 0;
        auto fails = [&](const std::function<void()>& f) {
          try {
            f();
          } catch (const Error& e) {
            if (e.code() == ErrorCode::kInvalidArgument) ++failures;
          }
        };
        float* b = buf.data();
        fails([&] { ring.Backward(b, 8, b, 8, b, 8, b, 8); });
        fails([&] { ring.Forward(b, 7, b, 8, b, 8, b, 8); });
        fails([&] { ring.Forward(b, 8, nullptr, 8, b, 8, b, 8); });
        if (failures == 3) throw Error(ErrorCode::kInvalidArgument, "all three refused");
      },
      3);
  for (int code : codes) EXPECT_EQ(code, static_cast<int>(ErrorCode::kInvalidArgument));
}

}  // namespace
}  // namespace mc2::models
