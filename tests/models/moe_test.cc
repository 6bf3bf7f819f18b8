// The MoE block of the transformer (include/mc2/models.h, docs/models.md
// "Mixture of experts"):
// - the forward loss, load-balancing loss included, against an independent
//   double-precision reference (dense and MoE blocks mixed, top-1 and top-2);
// - every parameter tensor's gradient (router, experts, and the rest)
//   against central finite differences, at EP=1, EP=2 and DP=2 x TP=2 x EP=2;
// - losses bitwise identical for every pipeline and split count (EP=2, and
//   TP=2 x EP=2), and the same across grids within a tolerance;
// - maximally uneven expert loads (a zero router: every token picks experts
//   0..k-1, the other experts and EP ranks receive nothing);
// - the loss falls on the learnable task;
// - invalid MoE configurations fail with kInvalidArgument naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "mc2/mc2.h"
#include "mc2/models.h"
#include "common/gradient_check.h"
#include "common/reference_model.h"
#include "models/data.h"

namespace mc2::models {
namespace {

// A tiny MoE model: 2 layers, both MoE, 4 experts of width 16, top-2.
TransformerConfig TinyMoe() {
  TransformerConfig c = TinyConfig();
  c.moe_experts = 4;
  c.moe_topk = 2;
  c.moe_ffn = 16;
  c.moe_every = 1;
  // Large enough that the load-balancing term's gradient is a visible part
  // of the router's in the gradient check.
  c.moe_aux_loss_coef = 0.1f;
  return c;
}

bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// Trains `steps` steps on an in-process world (tp, ep) and returns rank 0's
// losses (every rank checks it saw the same). `prepare` edits the initial
// weights (then WeightsChanged is called).
std::vector<double> Train(int ranks, int tp, int ep, const TransformerConfig& c, int steps,
                          const std::function<void(Transformer&)>& prepare = {},
                          std::vector<double>* aux = nullptr) {
  std::vector<double> out, out_aux;
  std::mutex mu;
  Group::RunInProcess(ranks, [&](Group& world) {
    Transformer model(MakeGrid(world, tp, ep), c);
    if (prepare) {
      prepare(model);
      model.WeightsChanged();
    }
    std::vector<double> losses, auxes;
    for (int step = 0; step < steps; ++step) {
      StepStats st = model.TrainStep(step);
      losses.push_back(st.loss);
      auxes.push_back(st.aux_loss);
    }
    // Every rank reports the same global losses.
    std::vector<double> all(losses.size() * ranks);
    AllGather(world, losses.data(), all.data(), losses.size(), DType::kF64).Wait();
    for (int r = 1; r < ranks; ++r) {
      EXPECT_TRUE(std::equal(losses.begin(), losses.end(), all.begin() + r * losses.size()));
    }
    std::lock_guard<std::mutex> lock(mu);
    if (world.rank() == 0) {
      out = losses;
      out_aux = auxes;
    }
  });
  if (aux) *aux = out_aux;
  return out;
}

ParamView Find(Transformer& model, const std::string& name) {
  for (auto& p : model.Parameters())
    if (p.name == name) return p;
  ADD_FAILURE() << "no parameter " << name;
  return {};
}

// The double-precision reference (ReferenceLoss, dense and MoE layers) is
// in tests/common/reference_model.cc, shared with the dense tests.

TEST(Moe, ForwardMatchesDoubleReference) {
  struct Case {
    int topk, every;
  };
  for (Case k : {Case{2, 1}, Case{1, 2}, Case{3, 1}}) {
    TransformerConfig c = TinyMoe();
    c.moe_topk = k.topk;
    c.moe_every = k.every;  // 2: block 0 dense, block 1 MoE
    Group::RunInProcess(1, [&](Group& world) {
      Transformer model(MakeGrid(world, 1), c);
      for (int step : {0, 3}) {
        double got = model.Loss(step);
        double aux = 0, want = ReferenceLoss(model, step, &aux);
        EXPECT_NEAR(got, want, 1e-5 * std::fabs(want)) << "topk " << k.topk << " step " << step;
        // The balancing term is there, and at its scale (coef x ~1).
        EXPECT_GT(aux, 0.5 * c.moe_aux_loss_coef);
      }
    });
  }
}

// ------------------------------------------------------ gradient check

// Central finite differences of the global loss (load-balancing term
// included), as in transformer_test.cc, for every parameter tensor: (a)
// along a random direction of the whole tensor, (b) for the element of
// largest gradient. A sharded tensor (over TP, or the experts over EP) is
// perturbed on every rank of its shard group (each its shard), the
// analytic side summed over that group; replicas (DP, TP, EP replicas of
// the experts) are perturbed identically.
void GradientCheck(int ranks, int tp, int ep) {
  TransformerConfig c = TinyMoe();
  std::mutex mu;
  std::vector<std::string> report;
  Group::RunInProcess(ranks, [&](Group& world) {
    ProcessGrid grid = MakeGrid(world, tp, ep);
    Transformer model(grid, c);
    const int step = 1;
    model.ForwardBackward(step);
    std::vector<ParamView> ps = model.Parameters();
    std::vector<std::vector<float>> grads;
    for (auto& p : ps) grads.emplace_back(p.grad, p.grad + p.rows * p.cols);
    auto loss_at = [&](ParamView& p, const std::vector<float>& dir, double eps) {
      std::vector<float> saved(p.value, p.value + p.rows * p.cols);
      for (size_t i = 0; i < saved.size(); ++i)
        p.value[i] = saved[i] + static_cast<float>(eps) * dir[i];
      model.WeightsChanged();
      double l = model.Loss(step);
      std::copy(saved.begin(), saved.end(), p.value);
      model.WeightsChanged();
      return l;
    };
    for (size_t pi = 0; pi < ps.size(); ++pi) {
      ParamView& p = ps[pi];
      const Group* shard = p.ep_sharded ? &grid.ep : !p.tp_replicated ? &grid.tp : nullptr;
      const int shard_rank = shard ? shard->rank() : 0;
      auto sum = [&](double v) {
        double out = v;
        if (shard && shard->size() > 1)
          AllReduce(*shard, &v, &out, 1, DType::kF64, ReduceOp::kSum).Wait();
        return out;
      };
      const size_t n = p.rows * p.cols;
      double ss = 0;
      for (size_t i = 0; i < n; ++i) ss += double(p.value[i]) * p.value[i];
      const double scale = std::sqrt(sum(ss) / sum(double(n)));
      // 1% of the tensor's scale, as for the dense model, except for the
      // routers: moving every logit by ~1% flips the top-k choice of some
      // token whose k-th and (k+1)-th probabilities are that close, a jump
      // in the loss (not a gradient error) that swamps the difference. At
      // 0.1% no choice flips in these checks; f32 rounding in the loss
      // (~1e-8 on the mean) stays below 1e-4 of the difference.
      const bool router = p.name.find(".moe.router") != std::string::npos;
      const double eps = (router ? 1e-3 : 1e-2) * scale;
      std::mt19937 rng(1000 + pi * 16 + shard_rank);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      std::vector<float> dir(n);
      for (auto& x : dir) x = u(rng);
      double dot = 0, mag = 0;
      for (size_t i = 0; i < n; ++i) {
        dot += double(grads[pi][i]) * dir[i];
        mag += std::fabs(double(grads[pi][i]) * dir[i]);
      }
      const double analytic = sum(dot), terms = sum(mag);
      const double fd = (loss_at(p, dir, eps) - loss_at(p, dir, -eps)) / (2 * eps);
      // (b) the largest-gradient element of the shard group's rank 0.
      size_t imax = 0;
      for (size_t i = 1; i < n; ++i)
        if (std::fabs(grads[pi][i]) > std::fabs(grads[pi][imax])) imax = i;
      const double gi = sum(shard_rank == 0 ? grads[pi][imax] : 0.0);
      const size_t idx = static_cast<size_t>(sum(shard_rank == 0 ? double(imax) : 0.0));
      std::vector<float> one(n, 0.0f);
      if (shard_rank == 0) one[idx] = 1.0f;
      const double fd1 = (loss_at(p, one, eps) - loss_at(p, one, -eps)) / (2 * eps);
      if (world.rank() == 0) {
        std::string line = test::JudgeGradient(p.name, analytic, fd, terms, idx, gi, fd1);
        std::lock_guard<std::mutex> lock(mu);
        report.push_back(line);
      }
    }
  });
  std::printf("[ gradcheck ] ranks=%d tp=%d ep=%d\n", ranks, tp, ep);
  for (auto& l : report) std::printf("[ gradcheck ] %s\n", l.c_str());
  // embed, final_norm, lm_head + per block norm1, qkv, o, norm2, router,
  // experts' gate_up and down.
  EXPECT_EQ(report.size(), 3u + 7u * TinyMoe().layers);
}

TEST(Moe, GradientCheckEp1) { GradientCheck(1, 1, 1); }
TEST(Moe, GradientCheckEp2) { GradientCheck(2, 1, 2); }
TEST(Moe, GradientCheckDp2Tp2Ep2) { GradientCheck(4, 2, 2); }

// The load-balancing term's gradient alone (the router is the only tensor
// it reaches): the gradient with coef c minus the one with coef 0 against
// the finite difference of the aux loss alone.
TEST(Moe, AuxLossGradientAlone) {
  TransformerConfig c = TinyMoe();
  Group::RunInProcess(1, [&](Group& world) {
    ProcessGrid grid = MakeGrid(world, 1);
    Transformer with(grid, c);
    TransformerConfig c0 = c;
    c0.moe_aux_loss_coef = 0.0f;
    Transformer without(grid, c0);
    const int step = 2;
    with.ForwardBackward(step);
    without.ForwardBackward(step);
    ParamView r1 = Find(with, "block1.moe.router"), r0 = Find(without, "block1.moe.router");
    const size_t n = r1.rows * r1.cols;
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> dir(n), saved(r1.value, r1.value + n);
    for (auto& x : dir) x = u(rng);
    double analytic = 0;
    for (size_t i = 0; i < n; ++i) analytic += (double(r1.grad[i]) - r0.grad[i]) * dir[i];
    auto aux_at = [&](double eps) {
      for (size_t i = 0; i < n; ++i) r1.value[i] = saved[i] + float(eps) * dir[i];
      with.WeightsChanged();
      StepStats st;
      with.ForwardBackward(step, &st);  // aux_loss is reported by the stats
      std::copy(saved.begin(), saved.end(), r1.value);
      with.WeightsChanged();
      return st.aux_loss;
    };
    const double eps = 1e-4;  // the router is ~0.25: small enough for no top-k flip
    const double fd = (aux_at(eps) - aux_at(-eps)) / (2 * eps);
    std::printf("[ aux ] d aux / d router along a direction: analytic %+.6e fd %+.6e\n", analytic,
                fd);
    EXPECT_GT(std::fabs(analytic), 1e-6);
    EXPECT_NEAR(fd, analytic, 2e-2 * std::fabs(analytic) + 1e-7);
  });
}

// ------------------------------------------------------ pipelines, grids

TEST(Moe, LossesBitwiseIdenticalAcrossPipelines) {
  struct Grid {
    int ranks, tp, ep;
  };
  for (Grid g : {Grid{2, 1, 2}, Grid{4, 2, 2}}) {
    TransformerConfig c = TinyMoe();
    c.seq_len = 16;
    const int steps = 4;
    std::vector<double> serial = Train(g.ranks, g.tp, g.ep, c, steps);
    ASSERT_EQ(serial.size(), size_t(steps));
    struct Variant {
      Pipeline p;
      int splits;
    };
    for (Variant v : {Variant{Pipeline::kChunked, 1}, Variant{Pipeline::kChunked, 2},
                      Variant{Pipeline::kChunked, 3}, Variant{Pipeline::kChunked, 4},
                      Variant{Pipeline::kFused, 1}, Variant{Pipeline::kFused, 3},
                      Variant{Pipeline::kAuto, 4}}) {
      c.fused.pipeline = v.p;
      c.fused.splits = v.splits;
      std::vector<double> got = Train(g.ranks, g.tp, g.ep, c, steps);
      EXPECT_TRUE(SameBits(got, serial))
          << "ranks " << g.ranks << " tp " << g.tp << " ep " << g.ep << " " << PipelineName(v.p)
          << " s=" << v.splits << ": first loss " << got.at(0) << " vs " << serial[0];
    }
    EXPECT_NE(serial.front(), serial.back());
  }
}

// bf16 expert GEMMs are deterministic too, and close to f32.
TEST(Moe, Bf16LossesBitwiseIdenticalAcrossPipelinesAndCloseToF32) {
  TransformerConfig c = TinyMoe();
  c.seq_len = 16;
  c.gemm_dtype = DType::kBF16;
  std::vector<double> serial = Train(2, 1, 2, c, 3);
  c.fused.pipeline = Pipeline::kFused;
  EXPECT_TRUE(SameBits(Train(2, 1, 2, c, 3), serial));
  c.fused.pipeline = Pipeline::kChunked;
  c.fused.splits = 3;
  EXPECT_TRUE(SameBits(Train(2, 1, 2, c, 3), serial));
  c.gemm_dtype = DType::kF32;
  std::vector<double> f32 = Train(2, 1, 2, c, 3);
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_NEAR(serial[i], f32[i], 2e-2 * f32[i]);
}

// The same model and batches on different grids agree within a tolerance
// (the sums are cut and ordered differently), experts local or spread.
TEST(Moe, LossesAgreeAcrossGrids) {
  TransformerConfig c = TinyMoe();
  c.seq_len = 16;
  c.batch = 8;
  c.fused.pipeline = Pipeline::kFused;
  const int steps = 10;
  std::vector<double> ref = Train(1, 1, 1, c, steps);
  struct Grid {
    int ranks, tp, ep;
  };
  for (Grid g : {Grid{2, 1, 1}, Grid{2, 1, 2}, Grid{4, 1, 4}, Grid{4, 2, 2}, Grid{4, 4, 1}}) {
    std::vector<double> got = Train(g.ranks, g.tp, g.ep, c, steps);
    ASSERT_EQ(got.size(), ref.size());
    double max_rel = 0;
    for (int i = 0; i < steps; ++i) max_rel = std::max(max_rel, std::fabs(got[i] - ref[i]) / ref[i]);
    std::printf("[ grids ] %d ranks, tp %d, ep %d: max relative loss difference vs 1 rank over %d "
                "steps: %.3e\n",
                g.ranks, g.tp, g.ep, steps, max_rel);
    EXPECT_LT(max_rel, 1e-5) << g.ranks << " ranks, tp " << g.tp << ", ep " << g.ep;
  }
}

// A zero router: every probability is 1/E, so every token picks experts
// 0..k-1 (ties to the lower index): experts k.. and, at EP=2, all of rank
// 1's experts receive no token. The loss still matches the reference, the
// idle experts' gradients are exactly zero, the busy ones' are not, and the
// pipelines agree bit for bit while the router learns to spread the load.
TEST(Moe, UnevenExpertLoads) {
  TransformerConfig c = TinyMoe();
  c.seq_len = 16;
  auto zero_router = [](Transformer& m) {
    for (auto& p : m.Parameters())
      if (p.name.find(".moe.router") != std::string::npos)
        std::fill(p.value, p.value + p.rows * p.cols, 0.0f);
  };
  Group::RunInProcess(1, [&](Group& world) {
    Transformer model(MakeGrid(world, 1), c);
    zero_router(model);
    model.WeightsChanged();
    double aux = 0, want = ReferenceLoss(model, 0, &aux);
    EXPECT_NEAR(model.Loss(0), want, 1e-5 * want);
    // Per MoE layer f = (1/2, 1/2, 0, 0), P = 1/4 each: coef * 4 * (1/8 +
    // 1/8) = coef (balanced top-2 would give the same; collapsed onto
    // experts 0 and 1 with P following would give 2 coef).
    EXPECT_NEAR(aux, c.layers * double(c.moe_aux_loss_coef), 1e-12);
  });
  Group::RunInProcess(2, [&](Group& world) {
    ProcessGrid grid = MakeGrid(world, 1, 2);
    Transformer model(grid, c);
    zero_router(model);
    model.WeightsChanged();
    model.ForwardBackward(0);
    for (auto& p : model.Parameters()) {
      if (!p.ep_sharded) continue;
      double norm = 0;
      for (size_t i = 0; i < p.rows * p.cols; ++i) norm += std::fabs(p.grad[i]);
      if (grid.ep_rank == 1) {
        EXPECT_EQ(norm, 0.0) << p.name << ": experts 2, 3 received no token";
      } else {
        EXPECT_GT(norm, 0.0) << p.name;
      }
    }
    EXPECT_GT(std::fabs(Find(model, "block0.moe.router").grad[0]), 0.0f);
  });
  std::vector<double> serial = Train(2, 1, 2, c, 3, zero_router);
  for (Pipeline p : {Pipeline::kChunked, Pipeline::kFused}) {
    c.fused.pipeline = p;
    c.fused.splits = 3;
    EXPECT_TRUE(SameBits(Train(2, 1, 2, c, 3, zero_router), serial)) << PipelineName(p);
  }
}

// The MoE model learns the modular-addition task (the dense test's bar).
TEST(Moe, LossDecreasesOnLearnableTask) {
  TransformerConfig c;  // the default small model, with 4 experts, top-2
  c.seq_len = 16;
  c.batch = 16;
  c.task = Task::kModAdd;
  c.task_param = 4;
  c.lr = 1e-2f;
  c.moe_experts = 4;
  c.moe_topk = 2;
  c.moe_ffn = 64;
  const int steps = 150;
  std::vector<double> aux;
  std::vector<double> l = Train(2, 1, 2, c, steps, {}, &aux);
  ASSERT_EQ(l.size(), size_t(steps));
  std::printf("[ learn ] ranks 2 ep 2: loss (aux)");
  for (int i = 0; i < steps; i += 15) std::printf(" %d:%.3f(%.4f)", i, l[i], aux[i]);
  std::printf(" %d:%.3f(%.4f)\n", steps - 1, l.back(), aux.back());
  EXPECT_GT(l[0], 0.9 * std::log(double(c.vocab)));
  double tail = 0;
  for (int i = steps - 10; i < steps; ++i) tail += l[i] / 10;
  EXPECT_LT(tail, 0.5 * l[0]);
  EXPECT_LT(tail, std::log(double(c.task_param)));
  // The balancing loss stays near its balanced value, coef per layer, far
  // from a collapse onto k experts (coef * E / k = 2 coef per layer).
  EXPECT_LT(aux.back(), 1.5 * c.layers * c.moe_aux_loss_coef);
}

// ------------------------------------------------------------- errors

void ExpectInvalid(int ranks, int tp, int ep, const TransformerConfig& c,
                   const std::string& needle) {
  Group::RunInProcess(ranks, [&](Group& world) {
    try {
      TrainSteps(world, c, tp, ep, 1);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  });
}

TEST(Moe, InvalidConfigsNameTheField) {
  TransformerConfig c = TinyMoe();
  c.moe_experts = 3;
  c.moe_topk = 1;
  ExpectInvalid(2, 1, 2, c, "moe_experts (3) must be a multiple of ep (2)");
  c = TinyMoe();
  c.moe_topk = 5;
  ExpectInvalid(1, 1, 1, c, "moe_topk (5) must be in 1..moe_experts (4)");
  c.moe_topk = 0;
  ExpectInvalid(1, 1, 1, c, "moe_topk (0)");
  c = TinyMoe();
  c.moe_experts = -1;
  ExpectInvalid(1, 1, 1, c, "moe_experts must be >= 0");
  c = TinyMoe();
  c.moe_experts = 0;
  ExpectInvalid(2, 1, 2, c, "ep (2) > 1 needs MoE layers");
  c = TinyMoe();
  c.moe_every = 0;
  ExpectInvalid(1, 1, 1, c, "moe_every");
  c = TinyMoe();
  c.moe_ffn = -4;
  ExpectInvalid(1, 1, 1, c, "moe_ffn");
  c = TinyMoe();
  c.moe_aux_loss_coef = -1.0f;
  ExpectInvalid(1, 1, 1, c, "moe_aux_loss_coef");
  ExpectInvalid(4, 2, 4, TinyMoe(), "ep (4) must be >= 1 and divide dp (2)");
}

// grid.edp: the ranks holding the same experts (same ep_rank).
TEST(Moe, ExpertReplicaGroupHasTheDocumentedMembers) {
  Group::RunInProcess(8, [&](Group& world) {
    ProcessGrid g = MakeGrid(world, 2, 2);  // dp 4, ep 2
    const int me = world.rank(), ep_rank = (me / 2) % 2;
    EXPECT_EQ(g.ep_rank, ep_rank);
    ASSERT_EQ(g.edp.size(), 4);
    std::vector<int> members(4);
    AllGather(g.edp, &me, members.data(), 1, DType::kI32).Wait();
    std::vector<int> want;
    for (int w = 0; w < 8; ++w)
      if ((w / 2) % 2 == ep_rank) want.push_back(w);
    EXPECT_EQ(members, want);
  });
}

}  // namespace
}  // namespace mc2::models
