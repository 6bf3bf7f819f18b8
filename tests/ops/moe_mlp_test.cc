// MoeMlp (include/mc2/moe.h): the serial result and the saved buffers
// (dispatched_x, y1, hidden, in expert-grouped order) match a
// double-precision reference computed in plain loops from every rank's
// inputs, rounded to dtype where the operator rounds (SwiGLU, GELU and the
// identity activation; f32 and bf16; skewed routing with empty experts,
// empty ranks and dropped slots; 1-5 ranks; topk 1 and 2); the result is bit
// for bit that of AllToAllMatmul, act, MatmulAllToAll; every pipeline and
// split count gives the serial result bit for bit in deterministic mode
// (also under link emulation) and reports what ran; overlap_work runs once
// per call; inconsistent arguments fail on every rank, and an activation
// that throws fails its rank's call.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/moe_problem.h"
#include "common/operands.h"
#include "common/rank_errors.h"
#include "core/reduce.h"
#include "mc2/mc2.h"

namespace mc2 {
namespace {

using test::AllPipelines;
using test::ErrorCodes;
using test::Mat;
using test::Random;
using test::SameBits;

// ---------------------------------------------------------------------------
// Activations, written once for float (what the operator runs) and double
// (the reference).

enum class Act { kIdentity, kSwiGLU, kGelu };

const char* ActName(Act a) {
  return a == Act::kIdentity ? "identity" : a == Act::kSwiGLU ? "swiglu" : "gelu";
}

// w1's columns for an activation with h2 outputs.
size_t H1Of(Act a, size_t h2) { return a == Act::kSwiGLU ? 2 * h2 : h2; }

template <typename F>
F Silu(F g) {
  return g / (F(1) + std::exp(-g));
}

// GELU, tanh approximation.
template <typename F>
F Gelu(F v) {
  const F c = F(0.7978845608028654);
  return F(0.5) * v * (F(1) + std::tanh(c * (v + F(0.044715) * v * v * v)));
}

// One row: in [h1] -> out [h2]. SwiGLU: gate = the first h2 columns, up =
// the last h2.
template <typename F>
void ActRow(Act a, const F* in, size_t h2, F* out) {
  for (size_t q = 0; q < h2; ++q) {
    if (a == Act::kIdentity) {
      out[q] = in[q];
    } else if (a == Act::kGelu) {
      out[q] = Gelu(in[q]);
    } else {
      out[q] = Silu(in[q]) * in[h2 + q];
    }
  }
}

// The operator's activation: null for the identity.
MoeActivation MakeAct(Act a, size_t h2) {
  if (a == Act::kIdentity) return nullptr;
  const size_t h1 = H1Of(a, h2);
  return [a, h1, h2](const float* in, size_t rows, float* out) {
    for (size_t r = 0; r < rows; ++r) ActRow(a, in + r * h1, h2, out + r * h2);
  };
}

// v rounded to dtype (f32, or f32 then bf16 as the operator rounds its f32
// results), as a double.
double Round(DType dtype, double v) {
  float f = static_cast<float>(v);
  return dtype == DType::kBF16 ? core::BF16ToF32(core::F32ToBF16(f)) : f;
}

// Element i of a dtype buffer.
double At(DType dtype, const void* p, size_t i) {
  if (dtype == DType::kBF16) return core::BF16ToF32(static_cast<const uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// ---------------------------------------------------------------------------
// One problem: every rank's inputs, generated identically on every rank.

struct Problem : test::MoeTokens {
  int P, El, topk;
  size_t d, h2;
  Act act;
  DType dtype;
  std::vector<Mat> w1, w2;  // per global expert: [d x h1], [h2 x d]
  int E() const { return P * El; }
  size_t h1() const { return H1Of(act, h2); }
};

// `skew`: see test::MoeTokenSpec. 3 to max_tokens tokens per rank; about
// one slot in 10 is dropped, and rank 0's first token always is entirely
// (it must combine to zeros) and its last slot too.
Problem MakeProblem(int P, int El, int topk, size_t d, size_t h2, Act act, DType dtype,
                    uint64_t seed, int skew, bool empty_rank, size_t max_tokens = 25) {
  const test::MoeTokenSpec spec{.ranks = P,
                                .experts = P * El,
                                .topk = topk,
                                .d = d,
                                .dtype = dtype,
                                .seed = seed,
                                .skew = skew,
                                .empty_rank = empty_rank,
                                .min_tokens = 3,
                                .max_tokens = max_tokens,
                                .drop_edges = true};
  Problem pr{test::RandomMoeTokens(spec), P, El, topk, d, h2, act, dtype, {}, {}};
  for (int e = 0; e < pr.E(); ++e) {
    pr.w1.push_back(Random(d * pr.h1(), dtype, seed * 37 + 1000 + e));
    pr.w2.push_back(Random(h2 * d, dtype, seed * 41 + 2000 + e));
  }
  return pr;
}

// The expert-grouped rows of rank `me`, computed independently: (source
// rank, slot) per row.
std::vector<std::pair<int, size_t>> ExpertRows(const Problem& pr, int me) {
  return test::ExpertGroupedSlots(pr.ids, pr.El, me);
}

// The reference of one routed slot, in doubles, with what the operator's
// f32 arithmetic may deviate by. Where the operator rounds to dtype
// (hidden, y2), the reference gives the interval [lo, hi] the operator's
// rounded value must lie in: the rounding of every value within the f32
// error of the exact one (rounding is monotonic). Away from a rounding
// boundary lo == hi, so bf16 values are checked exactly.
struct SlotRef {
  std::vector<double> y1, y1_tol;            // [h1]
  std::vector<double> h_lo, h_mid, h_hi;     // [h2]
  std::vector<double> y2_lo, y2_mid, y2_hi;  // [d]
};

SlotRef Reference(const Problem& pr, int p, size_t s) {
  const size_t d = pr.d, h1 = pr.h1(), h2 = pr.h2, t = s / pr.topk;
  const int e = pr.ids[p][s];
  const double* x = pr.x[p].value.data() + t * d;
  const std::vector<double>& w1 = pr.w1[e].value;
  const std::vector<double>& w2 = pr.w2[e].value;
  SlotRef r;
  r.y1.resize(h1);
  r.y1_tol.resize(h1);
  for (size_t j = 0; j < h1; ++j) {
    double v = 0, as = 0;
    for (size_t q = 0; q < d; ++q) {
      v += x[q] * w1[q * h1 + j];
      as += std::fabs(x[q] * w1[q * h1 + j]);
    }
    r.y1[j] = v;
    r.y1_tol[j] = 1e-5 * as + 1e-6;  // Close()'s bound
  }
  std::vector<double> a(h2);
  ActRow(pr.act, r.y1.data(), h2, a.data());
  std::vector<double> eh(h2);
  for (size_t q = 0; q < h2; ++q) {
    // How far act(y1 of the operator), evaluated in float, may be from
    // act(y1): slopes |silu'| <= 1.1, |gelu'| <= 1.13, plus float's own
    // error in the formula (GELU's 1 + tanh cancels for negative inputs).
    double ea;
    if (pr.act == Act::kIdentity) {
      ea = r.y1_tol[q];
    } else if (pr.act == Act::kGelu) {
      ea = 1.2 * r.y1_tol[q] + 4e-6 * std::fabs(a[q]) + 2e-7 * std::fabs(r.y1[q]) + 1e-7;
    } else {
      const double eg = r.y1_tol[q], eu = r.y1_tol[h2 + q];
      ea = 1.1 * std::fabs(r.y1[h2 + q]) * eg + (std::fabs(Silu(r.y1[q])) + 1.1 * eg) * eu +
           4e-6 * std::fabs(a[q]) + 1e-7;
    }
    r.h_lo.push_back(Round(pr.dtype, a[q] - ea));
    r.h_hi.push_back(Round(pr.dtype, a[q] + ea));
    r.h_mid.push_back(Round(pr.dtype, a[q]));
    eh[q] = std::max(r.h_hi[q] - r.h_mid[q], r.h_mid[q] - r.h_lo[q]);
  }
  for (size_t c = 0; c < d; ++c) {
    double v = 0, as = 0, spread = 0;
    for (size_t q = 0; q < h2; ++q) {
      v += r.h_mid[q] * w2[q * d + c];
      as += std::fabs(r.h_mid[q] * w2[q * d + c]);
      spread += std::fabs(w2[q * d + c]) * eh[q];
    }
    const double e2 = 1e-5 * as + 1e-6 + spread;
    r.y2_lo.push_back(Round(pr.dtype, v - e2));
    r.y2_hi.push_back(Round(pr.dtype, v + e2));
    r.y2_mid.push_back(Round(pr.dtype, v));
  }
  return r;
}

// Whether `rep` says what `o` asked for: the pipeline and its splits
// (serial: 1); auto resolves to a concrete one.
bool ReportOk(const FusedOptions& o, const FusedReport& rep) {
  if (rep.pipeline == Pipeline::kSerial && rep.splits != 1) return false;
  if (o.pipeline == Pipeline::kAuto) {
    return rep.pipeline != Pipeline::kAuto && rep.splits >= 1 && rep.splits <= 16;
  }
  return rep.pipeline == o.pipeline &&
         rep.splits == (o.pipeline == Pipeline::kSerial ? 1 : o.splits);
}

struct Counters {
  std::atomic<int> runs{0}, not_bitwise{0}, not_close{0}, bad_saved{0}, not_sequence{0},
      wrong_report{0};
};

void ExpectClean(const Counters& cnt, const std::string& what) {
  EXPECT_GT(cnt.runs.load(), 0) << what;
  EXPECT_EQ(cnt.not_bitwise.load(), 0) << what;
  EXPECT_EQ(cnt.not_close.load(), 0) << what;
  EXPECT_EQ(cnt.bad_saved.load(), 0) << what;
  EXPECT_EQ(cnt.not_sequence.load(), 0) << what;
  EXPECT_EQ(cnt.wrong_report.load(), 0) << what;
}

// This rank's experts' weights, contiguous: w1 [El x d x h1], w2 [El x h2 x d].
void LocalWeights(const Problem& pr, int me, std::vector<char>& w1, std::vector<char>& w2) {
  for (int le = 0; le < pr.El; ++le) {
    const Mat& a = pr.w1[me * pr.El + le];
    const Mat& b = pr.w2[me * pr.El + le];
    w1.insert(w1.end(), a.bytes.begin(), a.bytes.end());
    w2.insert(w2.end(), b.bytes.begin(), b.bytes.end());
  }
}

// Buffers for MoeMlp's saved outputs, filled with garbage.
struct SavedBufs {
  std::vector<char> dx, hidden;
  std::vector<float> y1;
  SavedBufs(size_t R, const Problem& pr)
      : dx(R * pr.d * DTypeSize(pr.dtype), 0x5a),
        hidden(R * pr.h2 * DTypeSize(pr.dtype), 0x3c),
        y1(R * pr.h1(), -7.0f) {}
  // Which to keep: bit 0 dispatched_x, 1 y1, 2 hidden.
  MoeMlpSaved Get(int keep) {
    return {keep & 1 ? dx.data() : nullptr, keep & 2 ? y1.data() : nullptr,
            keep & 4 ? hidden.data() : nullptr};
  }
};

// Runs one problem: the serial result and saved buffers against the
// reference, against AllToAllMatmul -> act -> MatmulAllToAll, and every
// pipeline against serial.
void RunProblem(const Problem& pr, Counters& cnt, const WorldOptions& wo = {}) {
  Group::RunInProcess(
      pr.P,
      [&](Group& g) {
        const int me = g.rank(), topk = pr.topk;
        const size_t d = pr.d, h1 = pr.h1(), h2 = pr.h2, T = pr.T[me];
        const size_t es = DTypeSize(pr.dtype);
        const DType dt = pr.dtype;
        MoeRouting r = MoeRoute(g, pr.ids[me].data(), T, topk, pr.E());
        auto rows = ExpertRows(pr, me);
        const size_t R = rows.size();
        if (r.num_received() != R) {
          cnt.bad_saved++;
          return;
        }
        std::vector<char> w1, w2;
        LocalWeights(pr, me, w1, w2);
        const MoeActivation act = MakeAct(pr.act, h2);
        const void* x = pr.x[me].bytes.data();
        FusedOptions so;
        so.pipeline = Pipeline::kSerial;

        // ---- serial against the reference
        std::vector<SlotRef> mine(T * topk);  // the reference of this rank's slots
        for (size_t s = 0; s < T * topk; ++s) {
          if (pr.ids[me][s] >= 0) mine[s] = Reference(pr, me, s);
        }
        std::vector<float> out_serial[2];  // [weighted]
        SavedBufs serial(R, pr);
        for (bool weighted : {false, true}) {
          const float* probs = weighted ? pr.probs[me].data() : nullptr;
          std::vector<float>& out = out_serial[weighted];
          out.assign(T * d, -3.0f);
          MoeMlp(g, r,
                 {.a = x,
                  .w1 = w1.data(),
                  .w2 = w2.data(),
                  .c = out.data(),
                  .d = d,
                  .h1 = h1,
                  .h2 = h2,
                  .dtype = dt,
                  .act = act,
                  .probs = probs,
                  .saved = serial.Get(7)},
                 so);
          cnt.runs++;
          for (size_t t = 0; t < T; ++t) {
            for (size_t c = 0; c < d; ++c) {
              double ref = 0, tol = 1e-7, mag = 0;
              for (int j = 0; j < topk; ++j) {
                const size_t s = t * topk + j;
                if (pr.ids[me][s] < 0) continue;
                const SlotRef& sr = mine[s];
                const double wgt = weighted ? pr.probs[me][s] : 1.0;
                ref += wgt * sr.y2_mid[c];
                mag += std::fabs(wgt * sr.y2_mid[c]);
                tol += std::fabs(wgt) *
                       std::max(sr.y2_hi[c] - sr.y2_mid[c], sr.y2_mid[c] - sr.y2_lo[c]);
              }
              // Plus the combine's f32 multiply-adds.
              if (std::fabs(out[t * d + c] - ref) > tol + 1e-6 * mag) cnt.not_close++;
            }
          }
        }
        // The saved buffers, row by row in expert-grouped order.
        for (size_t i = 0; i < R; ++i) {
          auto [p, s] = rows[i];
          const size_t t = s / topk;
          if (std::memcmp(serial.dx.data() + i * d * es, pr.x[p].bytes.data() + t * d * es,
                          d * es) != 0)
            cnt.bad_saved++;
          SlotRef sr = Reference(pr, p, s);
          for (size_t j = 0; j < h1; ++j) {
            if (std::fabs(serial.y1[i * h1 + j] - sr.y1[j]) > sr.y1_tol[j]) cnt.bad_saved++;
          }
          for (size_t q = 0; q < h2; ++q) {
            double v = At(dt, serial.hidden.data(), i * h2 + q);
            if (!(v >= sr.h_lo[q] && v <= sr.h_hi[q])) cnt.bad_saved++;
          }
        }
        // hidden is exactly act(the saved y1), rounded to dtype.
        std::vector<char> hidden_of_y1(R * h2 * es);
        {
          std::vector<float> a(R * h2);
          for (size_t i = 0; i < R; ++i) ActRow(pr.act, serial.y1.data() + i * h1, h2, &a[i * h2]);
          if (dt == DType::kBF16) {
            auto* hb = reinterpret_cast<uint16_t*>(hidden_of_y1.data());
            for (size_t i = 0; i < R * h2; ++i) hb[i] = core::F32ToBF16(a[i]);
          } else if (!a.empty()) {
            std::memcpy(hidden_of_y1.data(), a.data(), a.size() * 4);
          }
        }
        if (hidden_of_y1 != serial.hidden) cnt.bad_saved++;

        // ---- the three-call sequence gives the same bits
        {
          std::vector<float> y1(R * h1, -5.0f);
          std::vector<char> dx(R * d * es, 0x11);
          AllToAllMatmul(g, r,
                         {.a = x,
                          .b = w1.data(),
                          .c = y1.data(),
                          .k = d,
                          .n = h1,
                          .dtype = dt,
                          .dispatched_a = dx.data()},
                         so);
          if (!SameBits(y1, serial.y1) || dx != serial.dx) cnt.not_sequence++;
          std::vector<float> a(R * h2);
          if (act) {
            act(y1.data(), R, a.data());
          } else {
            a = y1;
          }
          std::vector<char> hidden(R * h2 * es);
          if (dt == DType::kBF16) {
            auto* hb = reinterpret_cast<uint16_t*>(hidden.data());
            for (size_t i = 0; i < R * h2; ++i) hb[i] = core::F32ToBF16(a[i]);
          } else if (!a.empty()) {
            std::memcpy(hidden.data(), a.data(), a.size() * 4);
          }
          if (hidden != serial.hidden) cnt.not_sequence++;
          for (bool weighted : {false, true}) {
            std::vector<float> out(T * d, -9.0f);
            MatmulAllToAll(g, r,
                           {.a = hidden.data(),
                            .b = w2.data(),
                            .c = out.data(),
                            .k = h2,
                            .n = d,
                            .dtype = dt,
                            .probs = weighted ? pr.probs[me].data() : nullptr},
                           so);
            if (!SameBits(out, out_serial[weighted])) cnt.not_sequence++;
          }
        }

        // ---- every pipeline gives the serial bits, whatever it keeps
        for (const FusedOptions& o : AllPipelines()) {
          std::vector<int> keeps = {7, 0};
          if (o.splits == 3) keeps.insert(keeps.end(), {1, 2, 4});
          for (int keep : keeps) {
            SavedBufs sv(R, pr);
            std::vector<float> out(T * d, -7.0f);
            FusedReport rep;
            rep = MoeMlp(g, r,
                         {.a = x,
                          .w1 = w1.data(),
                          .w2 = w2.data(),
                          .c = out.data(),
                          .d = d,
                          .h1 = h1,
                          .h2 = h2,
                          .dtype = dt,
                          .act = act,
                          .probs = pr.probs[me].data(),
                          .saved = sv.Get(keep)},
                         o);
            cnt.runs++;
            if (!ReportOk(o, rep)) cnt.wrong_report++;
            if (!SameBits(out, out_serial[1])) cnt.not_bitwise++;
            if ((keep & 1) && sv.dx != serial.dx) cnt.not_bitwise++;
            if ((keep & 2) && !SameBits(sv.y1, serial.y1)) cnt.not_bitwise++;
            if ((keep & 4) && sv.hidden != serial.hidden) cnt.not_bitwise++;
          }
        }
      },
      wo);
}

std::string Describe(const Problem& pr) {
  std::string s = std::to_string(pr.P) + " ranks, " + DTypeName(pr.dtype) + ", " + ActName(pr.act) +
                  ", El " + std::to_string(pr.El) + ", topk " + std::to_string(pr.topk) + ", d " +
                  std::to_string(pr.d) + ", h2 " + std::to_string(pr.h2) + ", T";
  for (size_t t : pr.T) s += " " + std::to_string(t);
  return s;
}

class MoeMlpSweep : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(MoeMlpSweep, MatchesReferenceAndEveryPipelineIsSerialBitwise) {
  auto [size, dtype] = GetParam();
  // Trial 0: SwiGLU, uniform, topk 2; 1: GELU, skewed, topk 1, an empty
  // rank; 2: identity, everything to one expert, topk 2; 3: SwiGLU,
  // skewed, an empty rank, topk 1; 4: identity, uniform, topk 2 (several
  // experts' blocks, each activated at its own row offset).
  const Act acts[5] = {Act::kSwiGLU, Act::kGelu, Act::kIdentity, Act::kSwiGLU, Act::kIdentity};
  for (int trial = 0; trial < 5; ++trial) {
    std::mt19937_64 rng(7000 * size + trial + (dtype == DType::kBF16 ? 13 : 0));
    const int El = (trial == 4 ? 2 : 1) + rng() % 3, topk = trial % 2 == 0 ? 2 : 1;
    const size_t d = 1 + rng() % 40, h2 = 1 + rng() % 24;
    const int skew = trial == 0 || trial == 4 ? 0 : trial == 2 ? 2 : 1;
    Problem pr =
        MakeProblem(size, El, topk, d, h2, acts[trial], dtype, rng(), skew, trial % 2 == 1);
    Counters cnt;
    RunProblem(pr, cnt);
    ExpectClean(cnt, "trial " + std::to_string(trial) + ": " + Describe(pr));
  }
}

INSTANTIATE_TEST_SUITE_P(RanksDtypes, MoeMlpSweep,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                  DTypeName(std::get<1>(info.param));
                         });

// Larger shapes (GEMM kernels block rows and K; chunks cut expert
// sub-blocks in the middle): still close to the reference and bitwise.
TEST(MoeMlp, LargerShapes) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Problem pr = MakeProblem(3, 2, 2, 64, 96, Act::kSwiGLU, dtype, 4343, 1, false, 60);
    Counters cnt;
    RunProblem(pr, cnt);
    ExpectClean(cnt, Describe(pr));
  }
}

// Under link emulation (every transfer paced by the modeled port) the
// messages arrive late and in another interleaving: still bitwise.
TEST(MoeMlp, UnderEmulatedLinkBitwise) {
  WorldOptions wo;
  wo.link = "bw=200MB/s,lat=20us";
  Problem two = MakeProblem(2, 2, 2, 33, 17, Act::kSwiGLU, DType::kBF16, 101, 1, false);
  Problem three = MakeProblem(3, 1, 2, 24, 20, Act::kGelu, DType::kF32, 102, 1, false);
  for (const Problem* pr : {&two, &three}) {
    Counters cnt;
    RunProblem(*pr, cnt, wo);
    ExpectClean(cnt, Describe(*pr));
  }
}

// With an explicit pipeline, FusedReport says that
// pipeline and its splits (serial: 1); auto names what it chose.
TEST(MoeMlp, ReportsThePipelineThatRan) {
  Problem pr = MakeProblem(3, 2, 1, 16, 8, Act::kGelu, DType::kF32, 55, 0, false);
  std::atomic<int> wrong{0}, runs{0};
  Group::RunInProcess(3, [&](Group& g) {
    const int me = g.rank();
    MoeRouting r = MoeRoute(g, pr.ids[me].data(), pr.T[me], 1, pr.E());
    std::vector<char> w1, w2;
    LocalWeights(pr, me, w1, w2);
    std::vector<float> out(pr.T[me] * pr.d);
    std::vector<FusedOptions> opts = AllPipelines();
    FusedOptions serial4;  // splits is ignored by serial
    serial4.pipeline = Pipeline::kSerial;
    serial4.splits = 4;
    opts.push_back(serial4);
    for (const FusedOptions& o : opts) {
      FusedReport rep;
      rep.pipeline = Pipeline::kAuto;
      rep.splits = -1;
      rep = MoeMlp(g, r,
                   {.a = pr.x[me].bytes.data(),
                    .w1 = w1.data(),
                    .w2 = w2.data(),
                    .c = out.data(),
                    .d = pr.d,
                    .h1 = pr.h1(),
                    .h2 = pr.h2,
                    .dtype = pr.dtype,
                    .act = MakeAct(pr.act, 8)},
                   o);
      runs++;
      if (!ReportOk(o, rep)) {
        wrong++;
        ADD_FAILURE() << "asked " << PipelineName(o.pipeline) << " s=" << o.splits << ", got "
                      << PipelineName(rep.pipeline) << " s=" << rep.splits;
      }
    }
  });
  EXPECT_EQ(runs.load(), 3 * 15);
  EXPECT_EQ(wrong.load(), 0);
}

// FusedOptions::overlap_work runs exactly once per call, whatever the
// pipeline, and leaves the result bitwise unchanged; serial runs it after
// its communication, when the result is complete.
TEST(MoeMlp, OverlapWorkRunsOnce) {
  std::atomic<int> wrong_count{0}, not_bitwise{0}, serial_incomplete{0};
  Problem pr = MakeProblem(2, 2, 2, 32, 24, Act::kSwiGLU, DType::kBF16, 77, 0, false);
  Group::RunInProcess(2, [&](Group& g) {
    const int me = g.rank();
    const size_t T = pr.T[me];
    MoeRouting r = MoeRoute(g, pr.ids[me].data(), T, 2, pr.E());
    std::vector<char> w1, w2;
    LocalWeights(pr, me, w1, w2);
    const MoeActivation act = MakeAct(pr.act, pr.h2);
    auto call = [&](std::vector<float>& out, const FusedOptions& o) {
      MoeMlp(g, r,
             {.a = pr.x[me].bytes.data(),
              .w1 = w1.data(),
              .w2 = w2.data(),
              .c = out.data(),
              .d = pr.d,
              .h1 = pr.h1(),
              .h2 = pr.h2,
              .dtype = pr.dtype,
              .act = act,
              .probs = pr.probs[me].data()},
             o);
    };
    std::vector<float> ref(T * pr.d);
    FusedOptions so;
    so.pipeline = Pipeline::kSerial;
    call(ref, so);
    for (Pipeline pl : {Pipeline::kSerial, Pipeline::kChunked, Pipeline::kFused, Pipeline::kAuto}) {
      for (int splits : {1, 3}) {
        std::vector<float> out(T * pr.d, -7.0f);
        int calls = 0;
        FusedOptions o;
        o.pipeline = pl;
        o.splits = splits;
        o.overlap_work = [&] {
          ++calls;
          if (pl == Pipeline::kSerial && !SameBits(out, ref)) serial_incomplete++;
        };
        call(out, o);
        if (calls != 1) wrong_count++;
        if (!SameBits(out, ref)) not_bitwise++;
      }
    }
  });
  EXPECT_EQ(wrong_count.load(), 0);
  EXPECT_EQ(not_bitwise.load(), 0);
  EXPECT_EQ(serial_incomplete.load(), 0);
}

TEST(MoeMlp, InconsistentArgumentsFailEverywhere) {
  const std::vector<int> mis(3, static_cast<int>(ErrorCode::kMismatch));
  const std::vector<int> inv(3, static_cast<int>(ErrorCode::kInvalidArgument));
  // 6 experts, 2 per rank; every rank sends to every rank.
  std::vector<int32_t> ids = {0, 1, 2, 5, 4, 3, -1, 0};
  std::vector<float> x(4096, 1.0f), w1(4096, 1.0f), w2(4096, 1.0f);
  // One output per rank: the ranks are threads of this process.
  std::vector<std::vector<float>> out(3, std::vector<float>(4096));
  // Keeps the first h2 of h1 columns (h2 <= h1): valid for any shapes.
  auto first_cols = [](size_t h1, size_t h2) -> MoeActivation {
    return [h1, h2](const float* in, size_t rows, float* o) {
      for (size_t r = 0; r < rows; ++r) std::memcpy(o + r * h2, in + r * h1, h2 * 4);
    };
  };
  auto call = [&](Group& g, size_t d, size_t h1, size_t h2, const MoeActivation& act,
                  const FusedOptions& o = {}) {
    MoeRouting r = MoeRoute(g, ids.data(), 8, 1, 6);
    MoeMlp(g, r,
           {.a = x.data(),
            .w1 = w1.data(),
            .w2 = w2.data(),
            .c = out[g.rank()].data(),
            .d = d,
            .h1 = h1,
            .h2 = h2,
            .dtype = DType::kF32,
            .act = act},
           o);
  };
  // The valid call runs.
  EXPECT_EQ(ErrorCodes([&](Group& g) { call(g, 4, 8, 3, first_cols(8, 3)); }),
            std::vector<int>(3, -1));
  // h1, h2 or d differing on one rank.
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              size_t h1 = g.rank() == 1 ? 6 : 8;
              call(g, 4, h1, 3, first_cols(h1, 3));
            }),
            mis);
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              size_t h2 = g.rank() == 2 ? 2 : 3;
              call(g, 4, 8, h2, first_cols(8, h2));
            }),
            mis);
  EXPECT_EQ(ErrorCodes([&](Group& g) { call(g, g.rank() == 0 ? 5 : 4, 8, 3, first_cols(8, 3)); }),
            mis);
  // The identity (null act) with h2 != h1: on every rank, or on one.
  EXPECT_EQ(ErrorCodes([&](Group& g) { call(g, 4, 8, 3, nullptr); }), inv);
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              call(g, 4, 8, 3, g.rank() == 1 ? MoeActivation() : first_cols(8, 3));
            }),
            inv);
  // A routing whose count matrix was changed on one rank; bad splits on one.
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              MoeRouting r = MoeRoute(g, ids.data(), 8, 1, 6);
              if (g.rank() == 1) r.counts[0] += 1;
              MoeMlp(g, r,
                     {.a = x.data(),
                      .w1 = w1.data(),
                      .w2 = w2.data(),
                      .c = out[g.rank()].data(),
                      .d = 4,
                      .h1 = 8,
                      .h2 = 3,
                      .dtype = DType::kF32,
                      .act = first_cols(8, 3)});
            }),
            mis);
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              FusedOptions o;
              o.pipeline = Pipeline::kFused;
              o.splits = g.rank() == 0 ? 17 : 2;
              call(g, 4, 8, 3, first_cols(8, 3), o);
            }),
            inv);
}

// An activation that throws on one rank fails that rank's call; the rank
// leaves the world (as a failed rank does), and the others' calls fail
// then too instead of waiting for its rows: with an error that is not the
// group's timeout, which only waiting out the timeout would raise.
TEST(MoeMlp, ThrowingActivationFailsTheCall) {
  WorldOptions wo;
  wo.timeout = std::chrono::seconds(8);
  for (Pipeline pl : {Pipeline::kSerial, Pipeline::kChunked, Pipeline::kFused}) {
    std::vector<int> failed(3, 0), act_calls(3, 0), timed_out(3, 0);
    std::vector<std::string> what(3);
    EXPECT_THROW(Group::RunInProcess(
                     3,
                     [&](Group& g) {
                       const int me = g.rank();
                       // 12 tokens to experts 0..5 in turn: every rank
                       // sends rows to every rank.
                       std::vector<int32_t> ids(12);
                       for (size_t t = 0; t < 12; ++t) ids[t] = static_cast<int32_t>(t % 6);
                       std::vector<float> x(12 * 8, 0.5f), w1(2 * 8 * 8, 0.25f),
                           w2(2 * 8 * 8, 0.25f), out(12 * 8);
                       MoeActivation act = [&, me](const float* in, size_t rows, float* o) {
                         act_calls[me]++;
                         if (me == 1) throw std::runtime_error("activation failed on purpose");
                         std::memcpy(o, in, rows * 8 * 4);
                       };
                       FusedOptions o;
                       o.pipeline = pl;
                       o.splits = 2;
                       try {
                         MoeRouting r = MoeRoute(g, ids.data(), 12, 1, 6);
                         MoeMlp(g, r,
                                {.a = x.data(),
                                 .w1 = w1.data(),
                                 .w2 = w2.data(),
                                 .c = out.data(),
                                 .d = 8,
                                 .h1 = 8,
                                 .h2 = 8,
                                 .dtype = DType::kF32,
                                 .act = act},
                                o);
                       } catch (const std::exception& e) {
                         failed[me] = 1;
                         what[me] = e.what();
                         if (const auto* err = dynamic_cast<const Error*>(&e))
                           timed_out[me] = err->code() == ErrorCode::kTimeout;
                         throw;
                       }
                     },
                     wo),
                 std::exception)
        << PipelineName(pl);
    EXPECT_GT(act_calls[1], 0) << PipelineName(pl);
    for (int q = 0; q < 3; ++q) {
      EXPECT_EQ(failed[q], 1) << PipelineName(pl) << " rank " << q;
      EXPECT_EQ(timed_out[q], 0) << PipelineName(pl) << " rank " << q
                                 << " waited out the timeout: " << what[q];
    }
  }
}

}  // namespace
}  // namespace mc2
