// Pipeline parallelism (PipelineTransformer, include/mc2/models.h):
// - the schedules: every stage runs each (chunk, micro-batch) forward and
//   backward once, never waits in a cycle, and with uniform operation times
//   idles exactly the bubble formula's fraction; with transfers of up to a
//   forward each, eager 1F1B waits for none in its steady state (its
//   makespan is the transfer-free one plus one transfer per hop there and
//   back, its uncovered time does not grow with the micro-batches) while
//   1F1B's grows; the micro-batches a stage holds in flight;
// - the 3D grid's groups (DP x TP x PP, TP innermost);
// - losses bitwise equal to the same model without pipeline parallelism
//   and the same micro-batching (PP 2 and 4, 1F1B, eager 1F1B and
//   interleaved, TP 2 x
//   PP 2, DP 2 x PP 2, DP 2 x TP 2 x PP 2), every stage running its
//   schedule's operations in order; with one micro-batch, bitwise equal to
//   Transformer;
//   with several, within a tolerance of Transformer on the whole batch
//   (gradient accumulation sums the micro-batches' gradients in another
//   order than one backward over the batch);
// - invalid configurations throw kInvalidArgument on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/reference_model.h"
#include "mc2/mc2.h"
#include "mc2/models.h"
#include "models/schedule.h"

namespace mc2::models {
namespace {

// Four blocks, so that PP 4 and PP 2 x v 2 have a block per chunk.
TransformerConfig Model() {
  TransformerConfig c = TinyConfig();
  c.layers = 4;
  c.batch = 8;
  return c;
}

// Rank 0's losses of `steps` pipelined steps; every rank must report the same.
std::vector<double> PipeLosses(int ranks, int tp, int pp, const TransformerConfig& c,
                               const PipelineConfig& pipe, int steps) {
  std::vector<std::vector<double>> all(ranks);
  std::mutex mu;
  Group::RunInProcess(ranks, [&](Group& world) {
    auto stats =
        TrainPipelineSteps(world, c, pipe, {.dp = ranks / (tp * pp), .tp = tp, .pp = pp}, steps);
    const int stage = world.rank() / (world.size() / pp);
    const std::vector<ScheduleOp> order = MakeSchedule(pipe, pp, stage);
    std::vector<double> losses;
    for (const auto& s : stats) {
      losses.push_back(s.step.loss);
      // Every operation of the schedule ran, in its order, one after the
      // other inside the pipeline phase.
      ASSERT_EQ(s.ops.size(), order.size());
      double last_end = 0;
      for (size_t k = 0; k < order.size(); ++k) {
        EXPECT_EQ(s.ops[k].forward, order[k].forward);
        EXPECT_EQ(s.ops[k].chunk, order[k].local_chunk * pp + stage);
        EXPECT_EQ(s.ops[k].micro, order[k].micro);
        EXPECT_GE(s.ops[k].start, last_end);
        EXPECT_GE(s.ops[k].end, s.ops[k].start);
        EXPECT_LE(s.ops[k].uncovered, s.ops[k].recv_wait);
        last_end = s.ops[k].end;
      }
      EXPECT_LE(last_end, s.pipeline_seconds);
      EXPECT_LE(s.busy_seconds, s.pipeline_seconds * 1.0001);
      EXPECT_GE(s.bubble, 0.0);
      EXPECT_LE(s.bubble, 1.0);
      // The activations held at once: the warm-up forwards plus one.
      const int m = pipe.micro_batches, rest = pp - stage;
      if (pipe.schedule == PipelineSchedule::k1F1B) {
        EXPECT_EQ(s.peak_in_flight, std::min(rest, m)) << "stage " << stage;
      } else if (pipe.schedule == PipelineSchedule::kEager1F1B) {
        EXPECT_EQ(s.peak_in_flight, std::min(2 * rest - 1, m)) << "stage " << stage;
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    all[world.rank()] = losses;
  });
  for (int r = 1; r < ranks; ++r) {
    EXPECT_EQ(0, std::memcmp(all[r].data(), all[0].data(), all[0].size() * sizeof(double)))
        << "rank " << r << " saw another loss";
  }
  return all[0];
}

std::vector<double> PlainLosses(int ranks, int tp, const TransformerConfig& c, int steps) {
  std::vector<double> out;
  std::mutex mu;
  Group::RunInProcess(ranks, [&](Group& world) {
    auto stats = TrainSteps(world, c, tp, steps);
    std::lock_guard<std::mutex> lock(mu);
    if (world.rank() == 0) {
      for (const auto& s : stats) out.push_back(s.loss);
    }
  });
  return out;
}

void ExpectSameBits(const std::vector<double>& got, const std::vector<double>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(&got[i], &want[i], sizeof(double)))
        << what << ": step " << i << " " << got[i] << " vs " << want[i];
  }
}

TEST(PipelineSchedule, EveryOpOnceAndTheBubbleFormula) {
  struct Case {
    PipelineSchedule s;
    int pp, m, v;
  };
  for (Case k : {Case{PipelineSchedule::k1F1B, 2, 1, 1}, Case{PipelineSchedule::k1F1B, 2, 4, 1},
                 Case{PipelineSchedule::k1F1B, 4, 8, 1}, Case{PipelineSchedule::k1F1B, 4, 2, 1},
                 Case{PipelineSchedule::kEager1F1B, 2, 1, 1},
                 Case{PipelineSchedule::kEager1F1B, 2, 4, 1},
                 Case{PipelineSchedule::kEager1F1B, 4, 8, 1},
                 Case{PipelineSchedule::kEager1F1B, 4, 2, 1},
                 Case{PipelineSchedule::kEager1F1B, 3, 5, 1},
                 Case{PipelineSchedule::kInterleaved, 2, 4, 2},
                 Case{PipelineSchedule::kInterleaved, 4, 8, 2},
                 Case{PipelineSchedule::kInterleaved, 4, 4, 3}}) {
    const PipelineConfig pipe = Pipe(k.m, k.s, k.v);
    const std::string what = std::string(ScheduleName(k.s)) + " pp " + std::to_string(k.pp) +
                             " m " + std::to_string(k.m) + " v " + std::to_string(k.v);
    for (int r = 0; r < k.pp; ++r) {
      std::set<std::tuple<bool, int, int>> seen;
      std::set<std::pair<int, int>> forwarded;
      for (const ScheduleOp& o : MakeSchedule(pipe, k.pp, r)) {
        EXPECT_TRUE(seen.insert({o.forward, o.local_chunk, o.micro}).second) << what;
        ASSERT_GE(o.local_chunk, 0);
        ASSERT_LT(o.local_chunk, k.v);
        ASSERT_GE(o.micro, 0);
        ASSERT_LT(o.micro, k.m);
        if (o.forward) {
          forwarded.insert({o.local_chunk, o.micro});
        } else {
          EXPECT_TRUE(forwarded.count({o.local_chunk, o.micro})) << what << ": backward first";
        }
      }
      EXPECT_EQ(seen.size(), size_t(2 * k.m * k.v)) << what;
    }
    // Backward twice the forward, a chunk's share of a stage's time: the
    // idle fraction of every stage is the formula's (1F1B: stages start
    // p - 1 forwards apart and end p - 1 backwards apart; interleaved:
    // the same in chunk-sized operations).
    const double f = 1.0 / k.v, b = 2.0 / k.v;
    SimulatedSchedule sim = SimulateSchedule(pipe, k.pp, f, b);
    const double formula = BubbleFormula(pipe, k.pp);
    if (k.s != PipelineSchedule::kInterleaved) {
      EXPECT_DOUBLE_EQ(formula, double(k.pp - 1) / (k.m + k.pp - 1)) << what;
    } else {
      EXPECT_DOUBLE_EQ(formula, double(k.pp - 1) / (k.v * k.m + k.pp - 1)) << what;
    }
    for (int r = 0; r < k.pp; ++r) {
      EXPECT_NEAR(1.0 - sim.busy[r] / sim.makespan, formula, 1e-12) << what << " stage " << r;
    }
  }
}

// Transfers of c each (one egress port per stage), F = 1, B = 2. Eager
// 1F1B: stage r is 2 (p - r - 1) forwards ahead, so the gradient it needs
// next leaves while it runs its previous backward and arrives during the
// forward in between; only the first micro-batch's trip down and the last
// one's trip up wait for transfers, so the makespan is the transfer-free
// (m + p - 1)(F + B) plus 2 (p - 1) c, and a stage's uncovered time is the
// same for m and m + p micro-batches. 1F1B: every steady-state step waits
// for a gradient sent when it was already due, so its uncovered time
// grows with m and its makespan exceeds eager 1F1B's from m = max(p, 3).
TEST(PipelineSchedule, EagerOneFOneBHidesTheSteadyStateTransfers) {
  const double f = 1, b = 2;
  for (int pp = 2; pp <= 5; ++pp) {
    for (double c : {0.25, 0.5, 1.0}) {
      for (int m : {1, 2, pp, 2 * pp - 1, 2 * pp, 3 * pp + 1}) {
        const std::string what =
            "pp " + std::to_string(pp) + " m " + std::to_string(m) + " c " + std::to_string(c);
        const SimulatedSchedule eager =
            SimulateSchedule(Pipe(m, PipelineSchedule::kEager1F1B), pp, f, b, c);
        const SimulatedSchedule plain = SimulateSchedule(Pipe(m), pp, f, b, c);
        EXPECT_NEAR(eager.makespan, (m + pp - 1) * (f + b) + 2 * (pp - 1) * c, 1e-9) << what;
        if (m >= std::max(pp, 3)) {
          EXPECT_GT(plain.makespan, eager.makespan + c / 2) << what;
        } else {
          EXPECT_GE(plain.makespan, eager.makespan - 1e-9) << what;
        }
        if (m < 2 * pp - 1) continue;
        const SimulatedSchedule eager_more =
            SimulateSchedule(Pipe(m + pp, PipelineSchedule::kEager1F1B), pp, f, b, c);
        const SimulatedSchedule plain_more = SimulateSchedule(Pipe(m + pp), pp, f, b, c);
        for (int r = 0; r < pp; ++r) {
          EXPECT_NEAR(eager_more.uncovered[r], eager.uncovered[r], 1e-9) << what << " stage " << r;
          EXPECT_GT(plain_more.uncovered[r], plain.uncovered[r] + c / 2) << what << " stage " << r;
        }
      }
    }
  }
  // Free transfers: nothing uncovered, and both make the same time.
  const SimulatedSchedule eager = SimulateSchedule(Pipe(8, PipelineSchedule::kEager1F1B), 4, f, b);
  const SimulatedSchedule plain = SimulateSchedule(Pipe(8), 4, f, b);
  EXPECT_DOUBLE_EQ(eager.makespan, plain.makespan);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(eager.uncovered[r], 0.0);
}

TEST(Pipeline, OneStageOneMicroBatchIsTransformerBitwise) {
  TransformerConfig c = Model();
  ExpectSameBits(PipeLosses(1, 1, 1, c, Pipe(1), 3), PlainLosses(1, 1, c, 3), "1 rank");
  ExpectSameBits(PipeLosses(2, 2, 1, c, Pipe(1), 3), PlainLosses(2, 2, c, 3), "tp 2");
}

TEST(Pipeline, PipelinedEqualsUnpipelinedWithTheSameMicroBatches) {
  const TransformerConfig c = Model();
  const int steps = 3;
  const std::vector<double> ref4 = PipeLosses(1, 1, 1, c, Pipe(4), steps);
  ExpectSameBits(PipeLosses(2, 1, 2, c, Pipe(4), steps), ref4, "pp 2 1f1b m 4");
  ExpectSameBits(PipeLosses(4, 1, 4, c, Pipe(4), steps), ref4, "pp 4 1f1b m 4");
  ExpectSameBits(PipeLosses(2, 1, 2, c, Pipe(4, PipelineSchedule::kInterleaved, 2), steps), ref4,
                 "pp 2 interleaved v 2 m 4");
  ExpectSameBits(PipeLosses(2, 1, 2, c, Pipe(4, PipelineSchedule::kEager1F1B), steps), ref4,
                 "pp 2 eager-1f1b m 4");
  // Stage 0 runs all four forwards first (warm-up 2 (p - 1) = 6 > m).
  ExpectSameBits(PipeLosses(4, 1, 4, c, Pipe(4, PipelineSchedule::kEager1F1B), steps), ref4,
                 "pp 4 eager-1f1b m 4");
  // Fewer micro-batches than stages is valid with 1F1B (a larger bubble).
  ExpectSameBits(PipeLosses(4, 1, 4, c, Pipe(2), steps), PipeLosses(1, 1, 1, c, Pipe(2), steps),
                 "pp 4 1f1b m 2");
}

TEST(Pipeline, StagesThatAreTpOrDpGroups) {
  const TransformerConfig c = Model();
  const int steps = 3;
  // TP 2 x PP 2: each stage a TP group of 2, against TP 2 alone.
  const std::vector<double> tp2 = PipeLosses(2, 2, 1, c, Pipe(2), steps);
  ExpectSameBits(PipeLosses(4, 2, 2, c, Pipe(2), steps), tp2, "tp 2 x pp 2");
  ExpectSameBits(PipeLosses(4, 2, 2, c, Pipe(2, PipelineSchedule::kEager1F1B), steps), tp2,
                 "tp 2 x pp 2 eager-1f1b");
  // DP 2 x PP 2 against DP 2 alone.
  ExpectSameBits(PipeLosses(4, 1, 2, c, Pipe(2), steps), PipeLosses(2, 1, 1, c, Pipe(2), steps),
                 "dp 2 x pp 2");
}

TEST(Pipeline, TheFullGridDpTpPp) {
  // DP 2 x TP 2 x PP 2 on 8 ranks against DP 2 x TP 2 alone.
  const TransformerConfig c = Model();
  ExpectSameBits(PipeLosses(8, 2, 2, c, Pipe(2), 2), PipeLosses(4, 2, 1, c, Pipe(2), 2),
                 "dp 2 x tp 2 x pp 2");
}

TEST(Grid, ThreeDimensionalLayout) {
  // w = (pp_index * dp + dp_index) * tp + tp_index; the groups' members,
  // in rank order, are the world ranks that formula gives.
  const int tp = 2, pp = 2, dp = 2, n = tp * pp * dp;
  Group::RunInProcess(n, [&](Group& world) {
    ProcessGrid g = MakeGrid3D(world, {.dp = dp, .tp = tp, .pp = pp});
    const int w = world.rank();
    EXPECT_EQ(g.tp_size, tp);
    EXPECT_EQ(g.dp_size, dp);
    EXPECT_EQ(g.pp_size, pp);
    EXPECT_EQ(w, (g.pp_rank * dp + g.dp_rank) * tp + g.tp_rank);
    auto members = [&](const Group& grp) {
      std::vector<int32_t> out(grp.size());
      const int32_t me = w;
      AllGather(grp, &me, out.data(), 1, DType::kI32).Wait();
      return out;
    };
    auto rank_of = [&](int ppi, int dpi, int tpi) { return (ppi * dp + dpi) * tp + tpi; };
    std::vector<int32_t> want;
    for (int t = 0; t < tp; ++t) want.push_back(rank_of(g.pp_rank, g.dp_rank, t));
    EXPECT_EQ(members(g.tp), want) << "tp group of " << w;
    want.clear();
    for (int d = 0; d < dp; ++d) want.push_back(rank_of(g.pp_rank, d, g.tp_rank));
    EXPECT_EQ(members(g.dp), want) << "dp group of " << w;
    want.clear();
    for (int q = 0; q < pp; ++q) want.push_back(rank_of(q, g.dp_rank, g.tp_rank));
    EXPECT_EQ(members(g.pp), want) << "pp group of " << w;
    want.clear();
    for (int d = 0; d < dp; ++d) {
      for (int t = 0; t < tp; ++t) want.push_back(rank_of(g.pp_rank, d, t));
    }
    EXPECT_EQ(members(g.stage), want) << "stage of " << w;
  });
}

TEST(Pipeline, MicroBatchedLossesNearTheWholeBatch) {
  const TransformerConfig c = Model();
  const std::vector<double> plain = PlainLosses(1, 1, c, 4);
  const std::vector<double> pipe = PipeLosses(2, 1, 2, c, Pipe(4), 4);
  ASSERT_EQ(plain.size(), pipe.size());
  // Step 0: the same weights; the loss is the same f64 sum of the same f32
  // per-token losses in another order.
  EXPECT_NEAR(pipe[0], plain[0], 1e-12 * plain[0]);
  // Later steps: the weights differ by the f32 rounding of summing four
  // micro-batch gradients instead of one batch's (relative 1e-6 per
  // element), carried by a few AdamW steps: a relative 2e-8 after three
  // steps here; 1e-6 leaves a wide margin, while dropping one
  // micro-batch's gradient moves it by more than 1e-4.
  for (size_t i = 1; i < plain.size(); ++i) {
    EXPECT_NEAR(pipe[i], plain[i], 1e-6 * plain[i]) << "step " << i;
  }
}

TEST(Pipeline, InvalidConfigsThrowOnEveryRank) {
  struct Bad {
    std::string what;
    int ranks, tp, pp;
    TransformerConfig c;
    PipelineConfig pipe;
  };
  TransformerConfig three = Model();
  three.layers = 3;
  TransformerConfig odd_batch = Model();
  odd_batch.batch = 6;
  const std::vector<Bad> bad = {
      {"layers not divisible by pp", 2, 1, 2, three, Pipe(2)},
      {"layers not divisible by pp * v", 2, 1, 2, Model(),
       Pipe(2, PipelineSchedule::kInterleaved, 4)},
      {"interleaved micro-batches < stages", 4, 1, 4, Model(),
       Pipe(2, PipelineSchedule::kInterleaved, 2)},
      {"interleaved micro-batches not a multiple of pp", 2, 1, 2, Model(),
       Pipe(3, PipelineSchedule::kInterleaved, 2)},
      {"interleaved with one virtual stage", 2, 1, 2, Model(),
       Pipe(2, PipelineSchedule::kInterleaved, 1)},
      {"1f1b with virtual stages", 2, 1, 2, Model(), Pipe(2, PipelineSchedule::k1F1B, 2)},
      {"eager-1f1b with virtual stages", 2, 1, 2, Model(),
       Pipe(2, PipelineSchedule::kEager1F1B, 2)},
      {"micro-batches not dividing the batch", 2, 1, 2, odd_batch, Pipe(4)},
      {"zero micro-batches", 2, 1, 2, Model(), Pipe(0)},
      {"pp not dividing the world", 3, 1, 2, Model(), Pipe(2)},
  };
  for (const Bad& b : bad) {
    std::mutex mu;
    int thrown = 0;
    Group::RunInProcess(b.ranks, [&](Group& world) {
      try {
        TrainPipelineSteps(world, b.c, b.pipe,
                           {.dp = b.ranks / (b.tp * b.pp), .tp = b.tp, .pp = b.pp}, 1);
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << b.what << ": " << e.what();
        std::lock_guard<std::mutex> lock(mu);
        ++thrown;
      }
    });
    EXPECT_EQ(thrown, b.ranks) << b.what;
  }
}

}  // namespace
}  // namespace mc2::models
