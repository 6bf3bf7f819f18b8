// MoE blocks and expert parallelism inside the pipeline (PipelineTransformer,
// include/mc2/models.h; docs/models.md "MoE in the pipeline"):
// - with one stage and one micro-batch, losses, aux losses and parameters
//   bitwise equal to Transformer (its whole-batch load-balancing loss), at
//   EP 1 and EP 2;
// - losses, aux losses and every parameter bitwise equal to the same model
//   without pipeline parallelism and the same micro-batches (pp = 1:
//   gradient accumulation), at PP 2 with EP 1 (1F1B, eager 1F1B and
//   interleaved), PP 2
//   x EP 2 (1F1B, interleaved, dense and MoE blocks mixed) and TP 2 x EP 2
//   x PP 2;
// - the load-balancing loss per micro-batch (the mean over the
//   micro-batches of each one's coef E sum_e f_e P_e) against the
//   independent double-precision reference on each micro-batch's sequences;
// - invalid EP grids and MoE configurations throw kInvalidArgument naming
//   the cause on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/reference_model.h"
#include "mc2/mc2.h"
#include "mc2/models.h"

namespace mc2::models {
namespace {

// Four MoE blocks (a block per chunk at PP 2 x v 2), 4 experts of width 16,
// top-2, a visible load-balancing term.
TransformerConfig MoeModel(int every = 1) {
  TransformerConfig c = TinyConfig();
  c.layers = 4;
  c.batch = 8;
  c.moe_experts = 4;
  c.moe_topk = 2;
  c.moe_ffn = 16;
  c.moe_every = every;
  c.moe_aux_loss_coef = 0.1f;
  return c;
}

// What a run leaves: rank 0's losses and aux losses per step, and every
// parameter tensor by (name, tp_rank, dp_rank) -- whichever stage holds it.
struct Trained {
  std::vector<double> loss, aux;
  std::map<std::string, std::vector<float>> params;
  std::map<std::string, std::vector<float>> grads;  // of the last step (summed over DP)
};

std::string Key(const std::string& name, const ProcessGrid& g) {
  return name + " tp" + std::to_string(g.tp_rank) + " dp" + std::to_string(g.dp_rank);
}

void Keep(Trained& run, std::mutex& mu, const ProcessGrid& g, const std::vector<ParamView>& views) {
  std::lock_guard<std::mutex> lock(mu);
  for (const ParamView& v : views) {
    std::vector<float>& dst = run.params[Key(v.name, g)];
    EXPECT_TRUE(dst.empty()) << v.name << " held twice";
    dst.assign(v.value, v.value + v.rows * v.cols);
    run.grads[Key(v.name, g)].assign(v.grad, v.grad + v.rows * v.cols);
  }
}

void KeepLosses(Trained& run, std::vector<std::vector<double>>& seen, int rank,
                const std::vector<double>& loss, const std::vector<double>& aux) {
  seen[rank] = loss;
  if (rank == 0) {
    run.loss = loss;
    run.aux = aux;
  }
}

Trained Pipelined(int ranks, int tp, int pp, int ep, const TransformerConfig& c,
                  const PipelineConfig& pipe, int steps) {
  Trained run;
  std::mutex mu;
  std::vector<std::vector<double>> seen(ranks);
  Group::RunInProcess(ranks, [&](Group& world) {
    ProcessGrid grid = MakeGrid3D(world, {.dp = ranks / (tp * pp), .tp = tp, .pp = pp, .ep = ep});
    PipelineTransformer model(grid, c, pipe);
    std::vector<double> loss, aux;
    for (int step = 0; step < steps; ++step) {
      PipelineStepStats st = model.TrainStep(step);
      loss.push_back(st.step.loss);
      aux.push_back(st.step.aux_loss);
    }
    Keep(run, mu, grid, model.Parameters());
    std::lock_guard<std::mutex> lock(mu);
    KeepLosses(run, seen, world.rank(), loss, aux);
  });
  for (int r = 1; r < ranks; ++r) {
    EXPECT_EQ(0, std::memcmp(seen[r].data(), seen[0].data(), seen[0].size() * sizeof(double)))
        << "rank " << r << " saw another loss";
  }
  return run;
}

Trained Plain(int ranks, int tp, int ep, const TransformerConfig& c, int steps) {
  Trained run;
  std::mutex mu;
  std::vector<std::vector<double>> seen(ranks);
  Group::RunInProcess(ranks, [&](Group& world) {
    ProcessGrid grid = MakeGrid(world, tp, ep);
    Transformer model(grid, c);
    std::vector<double> loss, aux;
    for (int step = 0; step < steps; ++step) {
      StepStats st = model.TrainStep(step);
      loss.push_back(st.loss);
      aux.push_back(st.aux_loss);
    }
    Keep(run, mu, grid, model.Parameters());
    std::lock_guard<std::mutex> lock(mu);
    KeepLosses(run, seen, world.rank(), loss, aux);
  });
  return run;
}

void ExpectSameBits(const Trained& got, const Trained& want, const std::string& what) {
  ASSERT_EQ(got.loss.size(), want.loss.size()) << what;
  for (size_t i = 0; i < got.loss.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(&got.loss[i], &want.loss[i], sizeof(double)))
        << what << ": loss of step " << i << " " << got.loss[i] << " vs " << want.loss[i];
    EXPECT_EQ(0, std::memcmp(&got.aux[i], &want.aux[i], sizeof(double)))
        << what << ": aux loss of step " << i << " " << got.aux[i] << " vs " << want.aux[i];
    EXPECT_GT(got.aux[i], 0.0) << what << ": no load-balancing loss";
  }
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  for (const auto& [key, w] : want.params) {
    auto it = got.params.find(key);
    ASSERT_NE(it, got.params.end()) << what << ": no " << key;
    ASSERT_EQ(it->second.size(), w.size()) << what << ": " << key;
    EXPECT_EQ(0, std::memcmp(it->second.data(), w.data(), w.size() * sizeof(float)))
        << what << ": " << key << " differs";
  }
}

TEST(PipelineMoe, OneStageOneMicroBatchIsTransformerBitwise) {
  const TransformerConfig c = MoeModel();
  ExpectSameBits(Pipelined(1, 1, 1, 1, c, Pipe(1), 3), Plain(1, 1, 1, c, 3), "1 rank");
  ExpectSameBits(Pipelined(2, 1, 1, 2, c, Pipe(1), 3), Plain(2, 1, 2, c, 3), "ep 2");
}

TEST(PipelineMoe, PipelinedEqualsUnpipelinedWithTheSameMicroBatchesEp1) {
  const TransformerConfig c = MoeModel();
  const int steps = 3;
  const Trained ref = Pipelined(1, 1, 1, 1, c, Pipe(4), steps);
  ExpectSameBits(Pipelined(2, 1, 2, 1, c, Pipe(4), steps), ref, "pp 2 1f1b m 4");
  ExpectSameBits(Pipelined(2, 1, 2, 1, c, Pipe(4, PipelineSchedule::kInterleaved, 2), steps), ref,
                 "pp 2 interleaved v 2 m 4");
  // Three micro-batches in flight on stage 0, each with its own loads.
  ExpectSameBits(Pipelined(2, 1, 2, 1, c, Pipe(4, PipelineSchedule::kEager1F1B), steps), ref,
                 "pp 2 eager-1f1b m 4");
}

TEST(PipelineMoe, PipelinedEqualsUnpipelinedWithTheSameMicroBatchesEp2) {
  const int steps = 3;
  // PP 2 x EP 2 (each stage DP 2 = one EP group of 2) against EP 2 alone.
  const TransformerConfig c = MoeModel();
  const Trained ref = Pipelined(2, 1, 1, 2, c, Pipe(2), steps);
  ExpectSameBits(Pipelined(4, 1, 2, 2, c, Pipe(2), steps), ref, "pp 2 x ep 2 1f1b m 2");
  ExpectSameBits(Pipelined(4, 1, 2, 2, c, Pipe(2, PipelineSchedule::kInterleaved, 2), steps), ref,
                 "pp 2 x ep 2 interleaved v 2 m 2");
  // Dense and MoE blocks mixed (blocks 1 and 3 MoE): interleaved v 2 gives
  // every stage a dense chunk and a MoE chunk.
  const TransformerConfig mixed = MoeModel(/*every=*/2);
  ExpectSameBits(Pipelined(4, 1, 2, 2, mixed, Pipe(2, PipelineSchedule::kInterleaved, 2), steps),
                 Pipelined(2, 1, 1, 2, mixed, Pipe(2), steps), "mixed, pp 2 x ep 2 interleaved");
}

TEST(PipelineMoe, TpEpPp) {
  // TP 2 x EP 2 x PP 2 on 8 ranks (each stage DP 2 x TP 2, its EP groups
  // the DP ranks of each TP index) against TP 2 x EP 2 alone.
  const TransformerConfig c = MoeModel();
  ExpectSameBits(Pipelined(8, 2, 2, 2, c, Pipe(2), 2), Pipelined(4, 2, 1, 2, c, Pipe(2), 2),
                 "tp 2 x ep 2 x pp 2");
}

TEST(PipelineMoe, AuxLossPerMicroBatchAgainstTheReference) {
  // Step 0 (the initial weights) with two micro-batches, pipelined over PP 2
  // x EP 2: the loss is the mean of the micro-batches' losses (equal token
  // counts), each with its own load-balancing term, as the double-precision
  // reference computes it on each micro-batch's sequences alone.
  const TransformerConfig c = MoeModel();
  const Trained got = Pipelined(4, 1, 2, 2, c, Pipe(2), 1);
  double ref_loss = 0, ref_aux = 0, whole_aux = 0;
  Group::RunInProcess(1, [&](Group& world) {
    Transformer model(MakeGrid(world, 1), c);  // the same initial weights
    const int half = c.batch / 2;
    double a0 = 0, a1 = 0;
    const double l0 = ReferenceLoss(model, 0, 0, half, &a0);
    const double l1 = ReferenceLoss(model, 0, half, half, &a1);
    ref_loss = (l0 + l1) / 2;
    ref_aux = (a0 + a1) / 2;
    ReferenceLoss(model, 0, &whole_aux);
  });
  ASSERT_EQ(got.loss.size(), 1u);
  EXPECT_NEAR(got.loss[0], ref_loss, 1e-5 * ref_loss);
  EXPECT_NEAR(got.aux[0], ref_aux, 1e-5 * ref_aux);
  // The per-micro-batch definition is not the whole batch's: the test tells
  // them apart.
  EXPECT_GT(std::fabs(ref_aux - whole_aux), 1e-4 * ref_aux)
      << "the micro-batches' and the whole batch's aux losses coincide: no discrimination";
}

// The gradient of the load-balancing term alone (the gradients with coef c
// minus those with coef 0; the router is the only tensor it reaches) after
// one pipelined step on two micro-batches, against the central difference
// of the reference's per-micro-batch aux loss, mean over the micro-batches.
TEST(PipelineMoe, AuxGradientPerMicroBatchAgainstTheReference) {
  const TransformerConfig c = MoeModel();
  TransformerConfig c0 = c;
  c0.moe_aux_loss_coef = 0.0f;
  const Trained with = Pipelined(4, 1, 2, 2, c, Pipe(2), 1);
  const Trained without = Pipelined(4, 1, 2, 2, c0, Pipe(2), 1);
  for (const std::string name : {"block0.moe.router", "block3.moe.router"}) {
    const std::string key = name + " tp0 dp0";
    const std::vector<float>& g1 = with.grads.at(key);
    const std::vector<float>& g0 = without.grads.at(key);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> dir(g1.size());
    for (auto& x : dir) x = u(rng);
    double analytic = 0;
    for (size_t i = 0; i < g1.size(); ++i) analytic += (double(g1[i]) - g0[i]) * dir[i];
    double fd_micro = 0, fd_whole = 0;
    Group::RunInProcess(1, [&](Group& world) {
      Transformer model(MakeGrid(world, 1), c);  // the pipeline's initial weights
      ParamView r;
      for (const ParamView& v : model.Parameters())
        if (v.name == name) r = v;
      ASSERT_EQ(r.rows * r.cols, dir.size());
      const std::vector<float> saved(r.value, r.value + dir.size());
      const int half = c.batch / 2;
      auto aux_at = [&](double eps, bool micro) {
        for (size_t i = 0; i < dir.size(); ++i) r.value[i] = saved[i] + float(eps) * dir[i];
        model.WeightsChanged();
        double a0 = 0, a1 = 0;
        if (micro) {
          ReferenceLoss(model, 0, 0, half, &a0);
          ReferenceLoss(model, 0, half, half, &a1);
        } else {
          ReferenceLoss(model, 0, &a0);
          a1 = a0;
        }
        std::copy(saved.begin(), saved.end(), r.value);
        model.WeightsChanged();
        return (a0 + a1) / 2;
      };
      const double eps = 1e-4;  // the router is ~0.25: small enough for no top-k flip
      fd_micro = (aux_at(eps, true) - aux_at(-eps, true)) / (2 * eps);
      fd_whole = (aux_at(eps, false) - aux_at(-eps, false)) / (2 * eps);
    });
    std::printf("[ aux ] %s: analytic %+.6e, fd per micro-batch %+.6e, whole batch %+.6e\n",
                name.c_str(), analytic, fd_micro, fd_whole);
    const double tol = 2e-3 * std::fabs(fd_micro) + 1e-7;
    EXPECT_GT(std::fabs(analytic), 1e-6) << name;
    EXPECT_NEAR(analytic, fd_micro, tol) << name;
    // The whole batch's gradient is another one: the check tells them apart.
    EXPECT_GT(std::fabs(fd_whole - fd_micro), 2 * tol) << name << ": no discrimination";
  }
}

TEST(PipelineMoe, InvalidGridsThrowOnEveryRank) {
  struct Bad {
    std::string what;
    int ranks, tp, pp, ep, cp;
    TransformerConfig c;
    std::string names;  // in the message
  };
  TransformerConfig dense = MoeModel();
  dense.moe_experts = 0;
  TransformerConfig three = MoeModel();
  three.moe_experts = 3;
  const std::vector<Bad> bad = {
      {"ep not dividing the stage's dp", 4, 1, 2, 4, 1, MoeModel(), "ep = 4"},
      {"ep with tp taking the stage's dp", 4, 2, 2, 2, 1, MoeModel(), "ep = 2"},
      {"ep not dividing the experts", 4, 1, 2, 2, 1, three, "moe_experts"},
      {"ep without MoE layers", 4, 1, 2, 2, 1, dense, "needs MoE layers"},
      {"ep with cp", 8, 1, 2, 2, 2, MoeModel(), "context parallelism"},
  };
  for (const Bad& b : bad) {
    std::mutex mu;
    int thrown = 0;
    Group::RunInProcess(b.ranks, [&](Group& world) {
      try {
        const GridShape shape = {.dp = b.ranks / (b.tp * b.pp * b.cp),
                                 .tp = b.tp,
                                 .pp = b.pp,
                                 .ep = b.ep,
                                 .cp = b.cp};
        TrainPipelineSteps(world, b.c, Pipe(2), shape, 1);
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << b.what << ": " << e.what();
        EXPECT_NE(std::string(e.what()).find(b.names), std::string::npos)
            << b.what << ": " << e.what();
        std::lock_guard<std::mutex> lock(mu);
        ++thrown;
      }
    });
    EXPECT_EQ(thrown, b.ranks) << b.what;
  }
}

}  // namespace
}  // namespace mc2::models
