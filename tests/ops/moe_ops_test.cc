// MoE operators (include/mc2/moe.h): MoeRoute's counts and dispatch order
// match an independent computation; AllToAllMatmul's and MatmulAllToAll's
// serial results are close to double-precision references computed in
// plain loops from every rank's inputs (routing recomputed independently);
// every pipeline and split count gives the serial result bit for bit in
// deterministic mode (f32 and bf16, skewed and uneven routing with empty
// experts, empty ranks and dropped slots, 1-5 ranks); inconsistent
// arguments fail on every rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/moe_problem.h"
#include "common/operands.h"
#include "common/rank_errors.h"
#include "core/reduce.h"
#include "mc2/mc2.h"
#include "trace/recorder.h"

namespace mc2 {
namespace {

using test::AllPipelines;
using test::Close;
using test::ErrorCodes;
using test::Mat;
using test::Random;
using test::SameBits;

// One MoE problem: every rank's inputs, generated identically on every rank.
struct Problem : test::MoeTokens {
  int P, El, topk;
  size_t d, h;
  DType dtype;
  std::vector<Mat> w1, w2;  // per global expert: [d x h], [h x d]
  int E() const { return P * El; }
};

// `skew`: see test::MoeTokenSpec.
Problem MakeProblem(int P, int El, int topk, size_t d, size_t h, DType dtype, uint64_t seed,
                    int skew, bool empty_rank) {
  const test::MoeTokenSpec spec{.ranks = P,
                                .experts = P * El,
                                .topk = topk,
                                .d = d,
                                .dtype = dtype,
                                .seed = seed,
                                .skew = skew,
                                .empty_rank = empty_rank};
  Problem pr{test::RandomMoeTokens(spec), P, El, topk, d, h, dtype, {}, {}};
  for (int e = 0; e < pr.E(); ++e) {
    pr.w1.push_back(Random(d * h, dtype, seed * 37 + 1000 + e));
    pr.w2.push_back(Random(h * d, dtype, seed * 41 + 2000 + e));
  }
  return pr;
}

// The expert-grouped rows of rank `me`, computed independently: (source
// rank, slot) per row.
std::vector<std::pair<int, size_t>> ExpertRows(const Problem& pr, int me) {
  return test::ExpertGroupedSlots(pr.ids, pr.El, me);
}

// The combine's input row of (source rank, slot): an arbitrary function of
// them, so that the reference knows every rank's rows.
Mat HiddenRow(const Problem& pr, int p, size_t slot) {
  return Random(pr.h, pr.dtype, 77777 + 1000003ull * p + slot);
}

struct Counters {
  std::atomic<int> runs{0}, not_bitwise{0}, not_close{0}, bad_dx{0}, bad_route{0}, wrong_report{0};
};

void RunProblem(const Problem& pr, Counters& cnt, const WorldOptions& wo = {}) {
  Group::RunInProcess(
      pr.P,
      [&](Group& g) {
        const int me = g.rank(), El = pr.El, topk = pr.topk;
        const size_t d = pr.d, h = pr.h, es = DTypeSize(pr.dtype), T = pr.T[me];
        MoeRouting r = MoeRoute(g, pr.ids[me].data(), T, topk, pr.E());

        // The routing against an independent count.
        for (int p = 0; p < pr.P; ++p) {
          for (int e = 0; e < pr.E(); ++e) {
            size_t c = 0;
            for (int32_t id : pr.ids[p]) c += id == e;
            if (r.counts[p * pr.E() + e] != c) cnt.bad_route++;
          }
        }
        std::vector<size_t> order;
        for (int e = 0; e < pr.E(); ++e) {
          for (size_t s = 0; s < pr.ids[me].size(); ++s) {
            if (pr.ids[me][s] == e) order.push_back(s);
          }
        }
        if (r.send_slots != order) cnt.bad_route++;
        auto rows = ExpertRows(pr, me);
        const size_t R = rows.size();
        if (r.num_received() != R) cnt.bad_route++;
        size_t sum = 0;
        for (int le = 0; le < El; ++le) sum += r.expert_rows(le);
        if (sum != R) cnt.bad_route++;

        // This rank's experts' weights, contiguous.
        std::vector<char> w1, w2;
        for (int le = 0; le < El; ++le) {
          const Mat& a = pr.w1[me * El + le];
          const Mat& b = pr.w2[me * El + le];
          w1.insert(w1.end(), a.bytes.begin(), a.bytes.end());
          w2.insert(w2.end(), b.bytes.begin(), b.bytes.end());
        }

        // ---- dispatch
        std::vector<float> y_serial(R * h, -3.0f);
        FusedOptions so;
        so.pipeline = Pipeline::kSerial;
        AllToAllMatmul(g, r,
                       {.a = pr.x[me].bytes.data(),
                        .b = w1.data(),
                        .c = y_serial.data(),
                        .k = d,
                        .n = h,
                        .dtype = pr.dtype},
                       so);
        std::vector<char> dx_ref(R * d * es);
        for (size_t i = 0; i < R; ++i) {
          auto [p, s] = rows[i];
          int e = pr.ids[p][s];
          size_t t = s / topk;
          if (d) std::memcpy(dx_ref.data() + i * d * es, pr.x[p].bytes.data() + t * d * es, d * es);
          for (size_t j = 0; j < h; ++j) {
            double ref = 0, as = 0;
            for (size_t q = 0; q < d; ++q) {
              double v = pr.x[p].value[t * d + q] * pr.w1[e].value[q * h + j];
              ref += v;
              as += std::fabs(v);
            }
            if (!Close(y_serial[i * h + j], ref, as)) cnt.not_close++;
          }
        }
        for (const FusedOptions& o : AllPipelines()) {
          std::vector<float> y(R * h, -7.0f);
          std::vector<char> dx(R * d * es, 0x5a);
          FusedReport rep;
          rep = AllToAllMatmul(g, r,
                               {.a = pr.x[me].bytes.data(),
                                .b = w1.data(),
                                .c = y.data(),
                                .k = d,
                                .n = h,
                                .dtype = pr.dtype,
                                .dispatched_a = dx.data()},
                               o);
          cnt.runs++;
          if (o.pipeline != Pipeline::kAuto && rep.pipeline != o.pipeline) cnt.wrong_report++;
          if (!SameBits(y, y_serial)) cnt.not_bitwise++;
          if (dx != dx_ref) cnt.bad_dx++;
        }

        // ---- combine
        std::vector<char> hidden;
        for (auto [p, s] : rows) {
          Mat m = HiddenRow(pr, p, s);
          hidden.insert(hidden.end(), m.bytes.begin(), m.bytes.end());
        }
        for (bool weighted : {true, false}) {
          const float* probs = weighted ? pr.probs[me].data() : nullptr;
          std::vector<float> out_serial(T * d, -3.0f);
          MatmulAllToAll(g, r,
                         {.a = hidden.data(),
                          .b = w2.data(),
                          .c = out_serial.data(),
                          .k = h,
                          .n = d,
                          .dtype = pr.dtype,
                          .probs = probs},
                         so);
          for (size_t t = 0; t < T; ++t) {
            for (size_t c = 0; c < d; ++c) {
              double ref = 0, as = 0, rounding = 0;
              for (int j = 0; j < topk; ++j) {
                size_t s = t * topk + j;
                int e = pr.ids[me][s];
                if (e < 0) continue;
                Mat hid = HiddenRow(pr, me, s);
                double wgt = weighted ? pr.probs[me][s] : 1.0;
                double v = 0, va = 0;
                for (size_t q = 0; q < h; ++q) {
                  v += hid.value[q] * pr.w2[e].value[q * d + c];
                  va += std::fabs(hid.value[q] * pr.w2[e].value[q * d + c]);
                }
                as += std::fabs(wgt) * va;
                if (pr.dtype == DType::kBF16) {
                  // The row travels rounded to bf16 (ops.h): the f32 sum may
                  // round to the neighbour of the exact sum's bf16, one ulp
                  // (2^-7 relative) away.
                  ref += wgt * core::BF16ToF32(core::F32ToBF16(static_cast<float>(v)));
                  rounding += std::fabs(wgt * v) * 0x1p-7;
                } else {
                  ref += wgt * v;
                }
              }
              // Close() plus the bf16 rounding of the rows.
              if (std::fabs(out_serial[t * d + c] - ref) > 1e-5 * as + rounding + 1e-6)
                cnt.not_close++;
            }
          }
          for (const FusedOptions& o : AllPipelines()) {
            std::vector<float> out(T * d, -7.0f);
            FusedReport rep;
            rep = MatmulAllToAll(g, r,
                                 {.a = hidden.data(),
                                  .b = w2.data(),
                                  .c = out.data(),
                                  .k = h,
                                  .n = d,
                                  .dtype = pr.dtype,
                                  .probs = probs},
                                 o);
            cnt.runs++;
            if (o.pipeline != Pipeline::kAuto && rep.pipeline != o.pipeline) cnt.wrong_report++;
            if (!SameBits(out, out_serial)) cnt.not_bitwise++;
          }
        }
      },
      wo);
}

void ExpectClean(const Counters& cnt, const std::string& what) {
  EXPECT_GT(cnt.runs.load(), 0) << what;
  EXPECT_EQ(cnt.not_bitwise.load(), 0) << what;
  EXPECT_EQ(cnt.not_close.load(), 0) << what;
  EXPECT_EQ(cnt.bad_dx.load(), 0) << what;
  EXPECT_EQ(cnt.bad_route.load(), 0) << what;
  EXPECT_EQ(cnt.wrong_report.load(), 0) << what;
}

class MoeSweep : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(MoeSweep, EveryPipelineIsSerialBitwise) {
  auto [size, dtype] = GetParam();
  for (int trial = 0; trial < 4; ++trial) {
    std::mt19937_64 rng(5000 * size + trial + (dtype == DType::kBF16 ? 11 : 0));
    int El = 1 + rng() % 3, topk = 1 + rng() % 3;
    size_t d = 1 + rng() % 40, h = 1 + rng() % 30;
    // Trial 0 uniform, 1 skewed, 2 everything to one expert, 3 skewed with
    // an empty rank.
    int skew = trial == 0 ? 0 : trial == 2 ? 2 : 1;
    Problem pr = MakeProblem(size, El, topk, d, h, dtype, rng(), skew, trial == 3);
    Counters cnt;
    RunProblem(pr, cnt);
    ExpectClean(cnt, "trial " + std::to_string(trial));
  }
}

INSTANTIATE_TEST_SUITE_P(RanksDtypes, MoeSweep,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                  DTypeName(std::get<1>(info.param));
                         });

// Larger shapes (GEMM kernels block rows and K; chunks cut expert
// sub-blocks in the middle): still bitwise.
TEST(MoeOps, LargerShapesBitwise) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Problem pr = MakeProblem(3, 2, 2, 129, 67, dtype, 4242, 1, false);
    // More tokens than MakeProblem draws: 150 per rank.
    std::mt19937_64 rng(7);
    for (int p = 0; p < pr.P; ++p) {
      pr.T[p] = 150;
      pr.ids[p].resize(150 * pr.topk);
      pr.probs[p].assign(150 * pr.topk, 0.5f);
      for (auto& id : pr.ids[p]) id = rng() % 3 == 0 ? 1 : static_cast<int>(rng() % pr.E());
      pr.x[p] = Random(150 * pr.d, dtype, 900 + p);
    }
    Counters cnt;
    RunProblem(pr, cnt);
    ExpectClean(cnt, DTypeName(dtype));
  }
}

// Under link emulation (every transfer paced by the modeled port), the
// messages arrive late and in a different interleaving: still bitwise.
TEST(MoeOps, UnderEmulatedLinkBitwise) {
  WorldOptions wo;
  wo.link = "bw=200MB/s,lat=20us";
  for (int size : {2, 4}) {
    Problem pr = MakeProblem(size, 2, 2, 33, 17, DType::kBF16, 99 + size, 1, false);
    Counters cnt;
    RunProblem(pr, cnt, wo);
    ExpectClean(cnt, std::to_string(size) + " ranks");
  }
}

// FusedOptions::overlap_work of the MoE operators runs exactly once and
// leaves the results bitwise unchanged. Over a slow emulated link (each
// rank's 32 KB for its peer take 640 ms, the GEMMs well under one: a rank
// descheduled that long on a loaded host or under a sanitizer is what it
// would take to see the peer finish first), chunked
// and fused run it under their transfers: at the first wait for a message
// that has not arrived (dispatch), or once every chunk is multiplied and
// sent, before waiting for them (combine), so the peer, which needs this
// rank's rows still on the link, cannot have returned from the call yet.
// (Run only after every transfer completed, the MoE backward's expert
// wgrads would hide under nothing.) Serial runs it after the call's
// communication: its result is then complete.
TEST(MoeOps, OverlapWorkRunsOnceUnderTheTransfers) {
  WorldOptions wo;
  // Slow enough (a block of 32 KB takes 640 ms) that a rank descheduled
  // for a while under ThreadSanitizer on a busy host still starts its
  // overlap work before the peer's call can end (a block of 32 or 160 ms
  // is not: a descheduled rank can miss it with both cores running tests).
  wo.link = "bw=50KB/s,lat=20us";
  std::atomic<int> wrong_count{0}, not_bitwise{0}, serial_incomplete{0}, not_overlapped{0};
  std::atomic<int> finished[2] = {0, 0};  // calls each rank has returned from
  Group::RunInProcess(2, [&](Group& g) {
    const int me = g.rank();
    const size_t T = 256, d = 64, h = 48;
    // 4 experts, 2 per rank: half of each rank's tokens go to the peer.
    std::vector<int32_t> ids(T);
    for (size_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>((t + me) % 4);
    MoeRouting r = MoeRoute(g, ids.data(), T, 1, 4);
    const size_t R = r.num_received();
    Mat x = Random(T * d, DType::kF32, 31 + me), w13 = Random(2 * d * h, DType::kF32, 37 + me);
    Mat hid = Random(R * h, DType::kF32, 41 + me), w2 = Random(2 * h * d, DType::kF32, 43 + me);
    FusedOptions so;
    so.pipeline = Pipeline::kSerial;
    std::vector<float> y_ref(R * h), out_ref(T * d);
    AllToAllMatmul(g, r,
                   {.a = x.bytes.data(),
                    .b = w13.bytes.data(),
                    .c = y_ref.data(),
                    .k = d,
                    .n = h,
                    .dtype = DType::kF32},
                   so);
    MatmulAllToAll(g, r,
                   {.a = hid.bytes.data(),
                    .b = w2.bytes.data(),
                    .c = out_ref.data(),
                    .k = h,
                    .n = d,
                    .dtype = DType::kF32},
                   so);
    int call = 0;
    for (Pipeline pl : {Pipeline::kSerial, Pipeline::kChunked, Pipeline::kFused}) {
      for (int op = 0; op < 2; ++op, ++call) {
        std::vector<float> c(op == 0 ? R * h : T * d);
        const std::vector<float>& ref = op == 0 ? y_ref : out_ref;
        int calls = 0;
        FusedOptions o;
        o.pipeline = pl;
        o.splits = 4;
        o.overlap_work = [&] {
          ++calls;
          if (pl == Pipeline::kSerial) {
            if (!SameBits(c, ref)) serial_incomplete++;
          } else if (finished[1 - me].load() > call) {
            not_overlapped++;
          }
        };
        if (op == 0) {
          AllToAllMatmul(g, r,
                         {.a = x.bytes.data(),
                          .b = w13.bytes.data(),
                          .c = c.data(),
                          .k = d,
                          .n = h,
                          .dtype = DType::kF32},
                         o);
        } else {
          MatmulAllToAll(g, r,
                         {.a = hid.bytes.data(),
                          .b = w2.bytes.data(),
                          .c = c.data(),
                          .k = h,
                          .n = d,
                          .dtype = DType::kF32},
                         o);
        }
        finished[me]++;
        if (!SameBits(c, ref)) not_bitwise++;
        if (calls != 1) wrong_count++;
      }
    }
  }, wo);
  EXPECT_EQ(wrong_count.load(), 0);
  EXPECT_EQ(not_bitwise.load(), 0);
  EXPECT_EQ(serial_incomplete.load(), 0);
  EXPECT_EQ(not_overlapped.load(), 0);
}

// The operators record their GEMMs (compute, with flops) and waits as
// spans tagged with the pipeline that ran.
TEST(MoeOps, RecordsSpans) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("mc2_moe_spans_" + std::to_string(::getpid()));
  trace::Enable(dir.string());
  Problem pr = MakeProblem(2, 1, 1, 8, 8, DType::kF32, 5, 0, false);
  Group::RunInProcess(2, [&](Group& g) {
    MoeRouting r = MoeRoute(g, pr.ids[g.rank()].data(), pr.T[g.rank()], 1, 2);
    std::vector<char> w(8 * 8 * 4, 0);
    std::vector<float> y(r.num_received() * 8);
    FusedOptions o;
    o.pipeline = Pipeline::kChunked;
    o.splits = 2;
    AllToAllMatmul(g, r,
                   {.a = pr.x[g.rank()].bytes.data(),
                    .b = w.data(),
                    .c = y.data(),
                    .k = 8,
                    .n = 8,
                    .dtype = DType::kF32},
                   o);
  });
  trace::Disable();
  int gemms = 0;
  for (const auto& s : trace::Snapshot()) {
    if (std::string(s.span.name) == "all_to_all_matmul.expert_gemm") {
      gemms++;
      EXPECT_EQ(s.span.kind, static_cast<uint8_t>(trace::Category::kCompute));
      ASSERT_NE(s.span.pipeline, nullptr);
      EXPECT_STREQ(s.span.pipeline, "chunked");
      EXPECT_GT(s.span.flops, 0u);
    }
  }
  EXPECT_GT(gemms, 0);
  std::filesystem::remove_all(dir);
}

TEST(MoeOps, InconsistentArgumentsFailEverywhere) {
  const std::vector<int> mis(3, static_cast<int>(ErrorCode::kMismatch));
  const std::vector<int> inv(3, static_cast<int>(ErrorCode::kInvalidArgument));
  std::vector<int32_t> ids = {0, 1, 2, 5, 4, 3, -1, 0};
  std::vector<float> x(64 * 64, 1.0f), w(64 * 64, 1.0f), y(64 * 64);
  // Routing: experts not a multiple of the ranks; a bad id on one rank;
  // num_experts or topk differing.
  EXPECT_EQ(ErrorCodes([&](Group& g) { MoeRoute(g, ids.data(), 8, 1, 4); }), inv);
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              std::vector<int32_t> bad = ids;
              if (g.rank() == 2) bad[3] = 6;
              MoeRoute(g, bad.data(), 8, 1, 6);
            }),
            inv);
  EXPECT_EQ(ErrorCodes([&](Group& g) { MoeRoute(g, ids.data(), 8, 1, g.rank() == 1 ? 9 : 6); }),
            mis);
  EXPECT_EQ(ErrorCodes([&](Group& g) { MoeRoute(g, ids.data(), 4, g.rank() == 0 ? 2 : 1, 6); }),
            mis);
  // d differs in the dispatch.
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              MoeRouting r = MoeRoute(g, ids.data(), 8, 1, 6);
              AllToAllMatmul(g, r,
                             {.a = x.data(),
                              .b = w.data(),
                              .c = y.data(),
                              .k = g.rank() == 1 ? 5u : 4u,
                              .n = 3,
                              .dtype = DType::kF32});
            }),
            mis);
  // Routings of different batches.
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              MoeRouting a = MoeRoute(g, ids.data(), 8, 1, 6);
              MoeRouting b = MoeRoute(g, ids.data(), 7, 1, 6);
              AllToAllMatmul(g, g.rank() == 0 ? a : b,
                             {.a = x.data(),
                              .b = w.data(),
                              .c = y.data(),
                              .k = 4,
                              .n = 3,
                              .dtype = DType::kF32});
            }),
            mis);
  // A routing whose count matrix was changed on one rank.
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              MoeRouting r = MoeRoute(g, ids.data(), 8, 1, 6);
              if (g.rank() == 1) r.counts[0] += 1;
              MatmulAllToAll(g, r,
                             {.a = x.data(),
                              .b = w.data(),
                              .c = y.data(),
                              .k = 4,
                              .n = 3,
                              .dtype = DType::kF32});
            }),
            mis);
  // Dispatch on some ranks, combine on others.
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              MoeRouting r = MoeRoute(g, ids.data(), 8, 1, 6);
              if (g.rank() == 0) {
                MatmulAllToAll(g, r,
                               {.a = x.data(),
                                .b = w.data(),
                                .c = y.data(),
                                .k = 4,
                                .n = 3,
                                .dtype = DType::kF32});
              } else {
                AllToAllMatmul(g, r,
                               {.a = x.data(),
                                .b = w.data(),
                                .c = y.data(),
                                .k = 3,
                                .n = 4,
                                .dtype = DType::kF32});
              }
            }),
            mis);
  // A routing of another group; an unsupported dtype on one rank; bad splits.
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              MoeRouting r = MoeRoute(g, ids.data(), 8, 1, 6);
              if (g.rank() == 1) r.ranks = 2;
              AllToAllMatmul(g, r,
                             {.a = x.data(),
                              .b = w.data(),
                              .c = y.data(),
                              .k = 4,
                              .n = 3,
                              .dtype = DType::kF32});
            }),
            inv);
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              MoeRouting r = MoeRoute(g, ids.data(), 8, 1, 6);
              MatmulAllToAll(g, r,
                             {.a = x.data(),
                              .b = w.data(),
                              .c = y.data(),
                              .k = 4,
                              .n = 3,
                              .dtype = g.rank() == 2 ? DType::kI32 : DType::kF32});
            }),
            inv);
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              MoeRouting r = MoeRoute(g, ids.data(), 8, 1, 6);
              FusedOptions o;
              o.splits = g.rank() == 0 ? 17 : 2;
              AllToAllMatmul(g, r,
                             {.a = x.data(),
                              .b = w.data(),
                              .c = y.data(),
                              .k = 4,
                              .n = 3,
                              .dtype = DType::kF32},
                             o);
            }),
            inv);
}

}  // namespace
}  // namespace mc2
