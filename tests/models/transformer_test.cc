// The tensor + sequence parallel transformer (include/mc2/models.h):
// - its forward loss against an independent double-precision reference;
// - every parameter tensor's gradient against central finite differences,
//   at TP=1, TP=2, TP=4, DP=2 and DP=2 x TP=2;
// - data-parallel gradients bitwise the same whenever they are marked
//   ready (during backward or after it) and whatever the buckets;
// - losses bitwise identical for every pipeline and split count at a grid;
// - every projection is a fused operator call at every TP size (TP=1 too);
// - losses across grids (1, 2, 4 ranks; DP x TP) within a tolerance;
// - the loss falls on the learnable synthetic task;
// - invalid configurations fail with kInvalidArgument naming the cause.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/gradient_check.h"
#include "common/reference_model.h"
#include "mc2/mc2.h"
#include "mc2/models.h"
#include "mc2/trace_file.h"
#include "models/data.h"

namespace mc2::models {
namespace {

namespace fs = std::filesystem;

// A tiny model: 2 layers, 4 heads of width 4, every TP size 1, 2, 4 valid.
TransformerConfig Tiny() { return TinyConfig(); }

// Runs `steps` training steps on `ranks` in-process ranks with the given
// TP size and returns rank 0's losses (every rank checks it saw the same).
std::vector<double> TrainLosses(int ranks, int tp, const TransformerConfig& c, int steps) {
  std::vector<double> out;
  std::mutex mu;
  Group::RunInProcess(ranks, [&](Group& world) {
    auto stats = TrainSteps(world, c, tp, steps);
    std::vector<double> losses;
    for (auto& s : stats) {
      losses.push_back(s.loss);
      // The timings add up (the parts are disjoint intervals of the step).
      EXPECT_EQ(s.block_forward_seconds.size(), size_t(c.layers));
      double blocks = 0;
      for (double b : s.block_forward_seconds) blocks += b;
      EXPECT_LE(blocks, s.forward_seconds);
      EXPECT_LE(s.forward_seconds + s.backward_seconds + s.sync_wait_seconds +
                    s.optimizer_seconds, s.seconds);
      EXPECT_EQ(s.tokens, int64_t(c.batch) * c.seq_len);
    }
    std::lock_guard<std::mutex> lock(mu);
    if (world.rank() == 0) out = losses;
  });
  return out;
}

bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// The double-precision reference (ReferenceLoss) is in
// tests/common/reference_model.cc, shared with the MoE tests.

TEST(Transformer, ForwardMatchesDoubleReference) {
  for (Task task : {Task::kModAdd, Task::kCopy}) {
    TransformerConfig c = Tiny();
    c.task = task;
    Group::RunInProcess(1, [&](Group& world) {
      Transformer model(MakeGrid(world, 1), c);
      for (int step : {0, 3}) {
        double got = model.Loss(step);
        double want = ReferenceLoss(model, step);
        EXPECT_NEAR(got, want, 1e-5 * std::fabs(want)) << TaskName(task) << " step " << step;
      }
    });
  }
}

TEST(Transformer, SyntheticTasksHaveTheirStructure) {
  TransformerConfig c = Tiny();
  c.vocab = 23;
  c.task_param = 5;
  for (int seq = 0; seq < 50; ++seq) {
    int d = (SequenceToken(c, 2, seq, 1) - SequenceToken(c, 2, seq, 0) + c.vocab) % c.vocab;
    EXPECT_GE(d, 1);
    EXPECT_LE(d, c.task_param);
    for (int t = 0; t < c.seq_len; ++t) {
      EXPECT_EQ(SequenceToken(c, 2, seq, t + 1), (SequenceToken(c, 2, seq, t) + d) % c.vocab);
    }
  }
  c.task = Task::kCopy;
  for (int seq = 0; seq < 50; ++seq) {
    for (int t = c.task_param; t <= c.seq_len; ++t) {
      EXPECT_EQ(SequenceToken(c, 1, seq, t), SequenceToken(c, 1, seq, t - c.task_param));
    }
  }
  // Different steps and sequences give different data.
  int differ = 0;
  for (int seq = 0; seq < 20; ++seq) differ += SequenceToken(c, 0, seq, 0) != SequenceToken(c, 1, seq, 0);
  EXPECT_GT(differ, 10);
}

// ------------------------------------------------------ gradient check

// Central finite differences of the global loss, for every parameter
// tensor: (a) along a random direction of the whole tensor (every element
// takes part), (b) for the element of largest gradient. A TP-sharded tensor
// is perturbed on every TP rank (each its own shard, the direction's
// components), a replicated one identically everywhere; DP replicas always
// identically. Analytic values are summed over the TP shards.
void GradientCheck(int ranks, int tp) {
  TransformerConfig c = Tiny();
  std::mutex mu;
  std::vector<std::string> report;
  Group::RunInProcess(ranks, [&](Group& world) {
    ProcessGrid grid = MakeGrid(world, tp);
    Transformer model(grid, c);
    const int step = 1;
    model.ForwardBackward(step);
    std::vector<ParamView> ps = model.Parameters();
    // Gradients are overwritten by later calls: keep them.
    std::vector<std::vector<float>> grads;
    for (auto& p : ps) grads.emplace_back(p.grad, p.grad + p.rows * p.cols);
    auto loss_at = [&](ParamView& p, const std::vector<float>& dir, double eps) {
      std::vector<float> saved(p.value, p.value + p.rows * p.cols);
      for (size_t i = 0; i < saved.size(); ++i) p.value[i] = saved[i] + static_cast<float>(eps) * dir[i];
      model.WeightsChanged();
      double l = model.Loss(step);
      std::copy(saved.begin(), saved.end(), p.value);
      model.WeightsChanged();
      return l;
    };
    auto tp_sum = [&](double v) {
      double out = v;
      if (grid.tp.size() > 1) AllReduce(grid.tp, &v, &out, 1, DType::kF64, ReduceOp::kSum).Wait();
      return out;
    };
    for (size_t pi = 0; pi < ps.size(); ++pi) {
      ParamView& p = ps[pi];
      const size_t n = p.rows * p.cols;
      // The tensor's scale sets the perturbation (gammas ~1, weights ~0.1).
      // (over the whole tensor, so that every TP rank uses the same eps).
      double ss = 0;
      for (size_t i = 0; i < n; ++i) ss += double(p.value[i]) * p.value[i];
      const double scale =
          p.tp_replicated ? std::sqrt(ss / n) : std::sqrt(tp_sum(ss) / tp_sum(double(n)));
      // 1% of the tensor's scale: small enough for the O(eps^2) truncation
      // error, large enough that f32 rounding in the loss (~1e-7 relative)
      // stays far below the difference.
      const double eps = 1e-2 * scale;
      // (a) random direction.
      std::mt19937 rng(1000 + pi * 16 + (p.tp_replicated ? 0 : grid.tp_rank));
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      std::vector<float> dir(n);
      for (auto& x : dir) x = u(rng);
      double dot = 0, mag = 0;
      for (size_t i = 0; i < n; ++i) {
        dot += double(grads[pi][i]) * dir[i];
        mag += std::fabs(double(grads[pi][i]) * dir[i]);
      }
      const double analytic = p.tp_replicated ? dot : tp_sum(dot);
      // The terms of the dot product may cancel: the error is judged against
      // the sum of their magnitudes too (as for any computed sum).
      const double terms = p.tp_replicated ? mag : tp_sum(mag);
      const double fd = (loss_at(p, dir, eps) - loss_at(p, dir, -eps)) / (2 * eps);
      // (b) the largest-gradient element of TP rank 0's copy/shard.
      size_t imax = 0;
      for (size_t i = 1; i < n; ++i)
        if (std::fabs(grads[pi][i]) > std::fabs(grads[pi][imax])) imax = i;
      double gi = grid.tp_rank == 0 ? grads[pi][imax] : 0.0;
      size_t idx = imax;
      if (grid.tp.size() > 1) {
        double g_all = 0;
        AllReduce(grid.tp, &gi, &g_all, 1, DType::kF64, ReduceOp::kSum).Wait();
        gi = g_all;
        uint64_t i64 = grid.tp_rank == 0 ? imax : 0, i_all = 0;
        AllReduce(grid.tp, &i64, &i_all, 1, DType::kI64, ReduceOp::kSum).Wait();
        idx = i_all;
      }
      std::vector<float> one(n, 0.0f);
      if (p.tp_replicated || grid.tp_rank == 0) one[idx] = 1.0f;
      const double eps1 = 1e-2 * scale;
      const double fd1 = (loss_at(p, one, eps1) - loss_at(p, one, -eps1)) / (2 * eps1);
      if (world.rank() == 0) {
        std::string line = test::JudgeGradient(p.name, analytic, fd, terms, idx, gi, fd1);
        std::lock_guard<std::mutex> lock(mu);
        report.push_back(line);
      }
    }
  });
  std::printf("[ gradcheck ] ranks=%d tp=%d\n", ranks, tp);
  for (auto& l : report) std::printf("[ gradcheck ] %s\n", l.c_str());
  EXPECT_EQ(report.size(), 3u + 6u * Tiny().layers);  // every parameter tensor
}

TEST(Transformer, GradientCheckTp1) { GradientCheck(1, 1); }
TEST(Transformer, GradientCheckTp2) { GradientCheck(2, 2); }
TEST(Transformer, GradientCheckDp2) { GradientCheck(2, 1); }  // wgrads first, marked one by one
TEST(Transformer, GradientCheckDp2Tp2) { GradientCheck(4, 2); }
TEST(Transformer, GradientCheckTp4) { GradientCheck(4, 4); }  // one head per rank

// Data parallel only, each projection's gradient is marked ready as soon as
// its wgrad is done, in its own bucket: the summed gradients must be
// bitwise those of marking everything after backward (which cannot read a
// gradient before it is complete), and of other bucket caps, at DP 2 and
// DP 4, f32 and bf16, over steps whose weights moved (the second step runs
// on rebuilt buckets).
TEST(Transformer, DataParallelGradientsIndependentOfWhenTheyAreMarked) {
  for (auto [ranks, dt] : {std::pair{2, DType::kF32}, std::pair{4, DType::kF32},
                           std::pair{2, DType::kBF16}}) {
    // Wide enough that a wgrad GEMM takes longer than the progress thread
    // needs to start an all-reduce: a tensor marked before its wgrad is
    // done would travel stale.
    TransformerConfig base;
    base.hidden = 128;
    base.ffn = 256;
    base.seq_len = 64;
    base.batch = 4;
    base.gemm_dtype = dt;
    std::vector<TransformerConfig> cfgs(4, base);
    cfgs[1].grad_overlap = false;                     // the reference: marked after backward
    cfgs[2].grad_bucket_cap_bytes = 1;                // one bucket per tensor, the world's too
    cfgs[3].grad_bucket_cap_bytes = size_t{1} << 30;  // one bucket for all
    Group::RunInProcess(ranks, [&](Group& world) {
      ProcessGrid grid = MakeGrid(world, 1);
      std::vector<std::unique_ptr<Transformer>> ms;
      for (const auto& c : cfgs) ms.push_back(std::make_unique<Transformer>(grid, c));
      for (int step = 0; step < 2; ++step) {
        std::vector<std::vector<std::vector<float>>> grads(ms.size());
        for (size_t v = 0; v < ms.size(); ++v) {
          ms[v]->ForwardBackward(step);
          for (const ParamView& p : ms[v]->Parameters())
            grads[v].emplace_back(p.grad, p.grad + p.rows * p.cols);
          ms[v]->OptimizerStep();
        }
        const std::vector<std::vector<float>>& ref = grads[1];
        bool nonzero = false;  // (all zero, the comparison would prove little)
        for (size_t v = 0; v < ms.size(); ++v) {
          EXPECT_EQ(grads[v].size(), ref.size());
          for (size_t t = 0; t < ref.size() && t < grads[v].size(); ++t) {
            EXPECT_EQ(std::memcmp(grads[v][t].data(), ref[t].data(), ref[t].size() * sizeof(float)),
                      0)
                << ranks << " ranks, " << DTypeName(dt) << ", variant " << v << ", step " << step
                << ", tensor " << t << " on rank " << world.rank();
            for (float x : ref[t]) nonzero = nonzero || x != 0.0f;
          }
        }
        EXPECT_TRUE(nonzero);
      }
    });
  }
}

// ------------------------------------------------------ pipelines, grids

// In deterministic mode every pipeline and split count gives the serial
// losses bit for bit, at TP=2 and at DP=2 x TP=2.
TEST(Transformer, LossesBitwiseIdenticalAcrossPipelines) {
  for (auto [ranks, tp] : {std::pair{2, 1}, std::pair{2, 2}, std::pair{4, 2}}) {
    TransformerConfig c = Tiny();
    c.seq_len = 16;  // 16 rows per TP rank: every chunk of s = 4 non-empty
    const int steps = 4;
    std::vector<double> serial = TrainLosses(ranks, tp, c, steps);
    ASSERT_EQ(serial.size(), size_t(steps));
    struct Variant {
      Pipeline p;
      int splits;
    };
    std::vector<Variant> variants = {{Pipeline::kChunked, 1}, {Pipeline::kChunked, 2},
                                     {Pipeline::kChunked, 3}, {Pipeline::kChunked, 4},
                                     {Pipeline::kFused, 1},   {Pipeline::kAuto, 4}};
    for (auto v : variants) {
      c.fused.pipeline = v.p;
      c.fused.splits = v.splits;
      std::vector<double> got = TrainLosses(ranks, tp, c, steps);
      EXPECT_TRUE(SameBits(got, serial))
          << "ranks " << ranks << " tp " << tp << " " << PipelineName(v.p) << " s=" << v.splits
          << ": first loss " << got.at(0) << " vs " << serial[0] << ", last " << got.back()
          << " vs " << serial.back();
    }
    // The losses moved: identical sequences of a model that does not train
    // would prove little.
    EXPECT_NE(serial.front(), serial.back());
  }
}

// TrainStep defers the optimizer's updates into the next forward (under
// its fused operators' transfers): losses and weights must be bitwise those
// of ForwardBackward + OptimizerStep, which update at once, for f32 and
// bf16 GEMM inputs (whose bf16 weight copies are remade per update), dense
// and with a MoE layer.
// Every projection is a fused operator call on the TP group, whatever its
// size: the model's span of each call (the projection's name and operator)
// appears once per step on every rank, forward and backward, at TP = 1 as
// at TP = 2.
TEST(Transformer, EveryTpSizeCallsTheFusedOperators) {
  const fs::path dir =
      fs::temp_directory_path() / ("mc2-models-spans-" + std::to_string(::getpid()));
  for (int tp : {1, 2}) {
    fs::remove_all(dir);
    TransformerConfig c = Tiny();
    const int steps = 2;
    trace::Enable(dir.string());
    Group::RunInProcess(2, [&](Group& world) { TrainSteps(world, c, tp, steps); });
    trace::Disable();
    trace::Flush();
    trace::TraceData t = trace::LoadTrace(dir.string());
    fs::remove_all(dir);
    for (int l = 0; l < c.layers; ++l) {
      const std::string b = "block" + std::to_string(l);
      for (const std::string& name :
           {b + ".attn.qkv.all_gather_matmul", b + ".attn.o.matmul_reduce_scatter",
            b + ".mlp.gate_up.all_gather_matmul", b + ".mlp.down.matmul_reduce_scatter",
            b + ".attn.qkv.dgrad.matmul_reduce_scatter", b + ".attn.o.dgrad.all_gather_matmul",
            b + ".mlp.gate_up.dgrad.matmul_reduce_scatter",
            b + ".mlp.down.dgrad.all_gather_matmul"}) {
        for (int rank = 0; rank < 2; ++rank) {
          int n = 0;
          for (const trace::SpanRecord& sp : t.spans) n += sp.rank == rank && sp.name == name;
          EXPECT_EQ(n, steps) << name << " on rank " << rank << " at tp " << tp;
        }
      }
    }
  }
}

TEST(Transformer, DeferredUpdatesEqualImmediateOnes) {
  for (int variant = 0; variant < 3; ++variant) {
    TransformerConfig c = Tiny();
    c.seq_len = 16;
    c.fused.pipeline = Pipeline::kFused;
    if (variant == 1) c.gemm_dtype = DType::kBF16;
    if (variant == 2) {
      c.moe_experts = 4;
      c.moe_every = 2;  // block 1 is a MoE block
    }
    const int ep = variant == 2 ? 2 : 1;
    Group::RunInProcess(4, [&](Group& world) {
      ProcessGrid grid = MakeGrid(world, 2, ep);
      Transformer deferred(grid, c), immediate(grid, c);
      for (int step = 0; step < 4; ++step) {
        const double a = deferred.TrainStep(step).loss;
        const double b = immediate.ForwardBackward(step);
        immediate.OptimizerStep();
        EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0)
            << "variant " << variant << " step " << step << ": " << a << " vs " << b;
      }
      std::vector<ParamView> pd = deferred.Parameters(), pi = immediate.Parameters();
      ASSERT_EQ(pd.size(), pi.size());
      bool moved = false;
      for (size_t t = 0; t < pd.size(); ++t) {
        const size_t n = pd[t].rows * pd[t].cols;
        EXPECT_EQ(std::memcmp(pd[t].value, pi[t].value, n * sizeof(float)), 0)
            << "variant " << variant << ": " << pd[t].name;
      }
      // The last step's updates were pending until Parameters(): a model
      // that never trained would pass the comparison trivially.
      Transformer fresh(grid, c);
      std::vector<ParamView> p0 = fresh.Parameters();
      for (size_t t = 0; t < pd.size(); ++t) {
        moved = moved || std::memcmp(pd[t].value, p0[t].value,
                                     pd[t].rows * pd[t].cols * sizeof(float)) != 0;
      }
      EXPECT_TRUE(moved);
    });
  }
}

// bf16 GEMM inputs are deterministic too.
TEST(Transformer, Bf16LossesBitwiseIdenticalAcrossPipelinesAndCloseToF32) {
  TransformerConfig c = Tiny();
  c.seq_len = 16;
  c.gemm_dtype = DType::kBF16;
  std::vector<double> serial = TrainLosses(2, 2, c, 3);
  c.fused.pipeline = Pipeline::kFused;
  EXPECT_TRUE(SameBits(TrainLosses(2, 2, c, 3), serial));
  c.fused.pipeline = Pipeline::kChunked;
  c.fused.splits = 3;
  EXPECT_TRUE(SameBits(TrainLosses(2, 2, c, 3), serial));
  c.gemm_dtype = DType::kF32;
  std::vector<double> f32 = TrainLosses(2, 2, c, 3);
  for (size_t i = 0; i < f32.size(); ++i) {
    // bf16 has 8 mantissa bits: the losses agree to about 1%.
    EXPECT_NEAR(serial[i], f32[i], 2e-2 * f32[i]) << "step " << i;
  }
}

// The same model and batches on different grids: the losses agree within
// a tolerance (the sums are cut and ordered differently; f32 rounding).
void LossesAgreeAcrossGrids(const TransformerConfig& c, const char* label) {
  const int steps = 20;
  std::vector<double> ref = TrainLosses(1, 1, c, steps);
  ASSERT_EQ(ref.size(), size_t(steps));
  struct Grid {
    int ranks, tp;
  };
  double worst = 0;
  for (Grid g : {Grid{2, 1}, Grid{2, 2}, Grid{4, 1}, Grid{4, 2}, Grid{4, 4}}) {
    std::vector<double> got = TrainLosses(g.ranks, g.tp, c, steps);
    ASSERT_EQ(got.size(), size_t(steps));
    double max_rel = 0;
    for (int i = 0; i < steps; ++i) max_rel = std::max(max_rel, std::fabs(got[i] - ref[i]) / ref[i]);
    std::printf("[ grids ] %s: %d ranks, dp %d x tp %d: max relative loss difference vs 1 rank "
                "over %d steps: %.3e (last loss %.6f vs %.6f)\n",
                label, g.ranks, g.ranks / g.tp, g.tp, steps, max_rel, got.back(), ref.back());
    EXPECT_LT(max_rel, 1e-5) << g.ranks << " ranks, tp " << g.tp;
    worst = std::max(worst, max_rel);
  }
  std::printf("[ grids ] %s: worst max relative difference: %.3e\n", label, worst);
}

TEST(Transformer, LossesAgreeAcrossGridsTiny) {
  TransformerConfig c = Tiny();
  c.seq_len = 16;
  c.batch = 8;
  c.fused.pipeline = Pipeline::kFused;
  LossesAgreeAcrossGrids(c, "tiny");
}

// The default model (4x the width), chunked pipeline, copy task.
TEST(Transformer, LossesAgreeAcrossGridsSmall) {
  TransformerConfig c;
  c.batch = 8;
  c.task = Task::kCopy;
  c.task_param = 5;
  c.fused.pipeline = Pipeline::kChunked;
  c.fused.splits = 2;
  LossesAgreeAcrossGrids(c, "small");
}

// The backward is right enough to learn: on the modular-addition task the
// loss falls below half of its initial value.
TEST(Transformer, LossDecreasesOnLearnableTask) {
  TransformerConfig c;  // the default small model
  c.seq_len = 16;
  c.batch = 16;
  c.task = Task::kModAdd;
  c.task_param = 4;
  c.lr = 1e-2f;
  const int steps = 150;
  for (auto [ranks, tp] : {std::pair{1, 1}, std::pair{2, 2}}) {
    std::vector<double> l = TrainLosses(ranks, tp, c, steps);
    ASSERT_EQ(l.size(), size_t(steps));
    std::printf("[ learn ] ranks %d tp %d: loss", ranks, tp);
    for (int i = 0; i < steps; i += 15) std::printf(" %d:%.3f", i, l[i]);
    std::printf(" %d:%.3f\n", steps - 1, l.back());
    // An untrained model: about ln(vocab) or more (random logits).
    EXPECT_GT(l[0], 0.9 * std::log(double(c.vocab)));
    double tail = 0;
    for (int i = steps - 10; i < steps; ++i) tail += l[i] / 10;
    EXPECT_LT(tail, 0.5 * l[0]) << "mean of the last 10 losses vs the first";
    // Stronger: below ln(task_param), the best loss of a model that sees
    // only the current token (it cannot know the step d), so attention to
    // the previous token was learned too. The task's floor is
    // ln(task_param) / seq_len (only the first target is uncertain).
    EXPECT_LT(tail, std::log(double(c.task_param)));
  }
}

// ------------------------------------------------------------- errors

void ExpectInvalid(int ranks, int tp, const TransformerConfig& c, const std::string& needle) {
  Group::RunInProcess(ranks, [&](Group& world) {
    try {
      TrainSteps(world, c, tp, 1);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  });
}

TEST(Transformer, InvalidConfigsNameTheCause) {
  TransformerConfig c = Tiny();
  c.heads = 2;
  c.hidden = 16;
  ExpectInvalid(4, 4, c, "heads (2) must be divisible by tp (4)");
  c = Tiny();
  c.ffn = 30;
  ExpectInvalid(4, 4, c, "ffn");
  c = Tiny();
  c.seq_len = 6;
  ExpectInvalid(4, 4, c, "seq_len (6) must be divisible by tp (4)");
  c = Tiny();
  c.batch = 3;
  ExpectInvalid(2, 1, c, "batch (3) must be divisible by dp (2)");
  c = Tiny();
  c.hidden = 12;  // head_dim 3
  ExpectInvalid(1, 1, c, "must be even");
  c = Tiny();
  c.fused.splits = 0;
  ExpectInvalid(1, 1, c, "fused.splits");
  ExpectInvalid(4, 3, Tiny(), "tp = 3 must be >= 1 and divide the 4 ranks");
  Group::RunInProcess(4, [&](Group& world) {
    try {
      MakeGrid(world, 2, 3);
      ADD_FAILURE() << "no error for ep 3";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("ep = 3"), std::string::npos) << e.what();
    }
  });
}

TEST(Transformer, GridGroupsHaveTheDocumentedMembers) {
  Group::RunInProcess(8, [&](Group& world) {
    ProcessGrid g = MakeGrid(world, 2, 2);  // dp 4, ep 2
    EXPECT_EQ(g.tp.size(), 2);
    EXPECT_EQ(g.dp.size(), 4);
    EXPECT_EQ(g.ep.size(), 2);
    EXPECT_EQ(g.tp.rank(), world.rank() % 2);
    EXPECT_EQ(g.dp.rank(), world.rank() / 2);
    // The members, checked by gathering world ranks in each group.
    int me = world.rank();
    std::vector<int> tp_members(2), dp_members(4), ep_members(2);
    AllGather(g.tp, &me, tp_members.data(), 1, DType::kI32).Wait();
    AllGather(g.dp, &me, dp_members.data(), 1, DType::kI32).Wait();
    AllGather(g.ep, &me, ep_members.data(), 1, DType::kI32).Wait();
    const int dpi = me / 2, tpi = me % 2;
    EXPECT_EQ(tp_members, (std::vector<int>{dpi * 2, dpi * 2 + 1}));
    EXPECT_EQ(dp_members, (std::vector<int>{tpi, 2 + tpi, 4 + tpi, 6 + tpi}));
    const int e0 = (dpi / 2) * 2;
    EXPECT_EQ(ep_members, (std::vector<int>{e0 * 2 + tpi, (e0 + 1) * 2 + tpi}));
  });
}

}  // namespace
}  // namespace mc2::models
