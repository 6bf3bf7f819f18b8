// Inference of the transformer with a KV cache (InferenceModel,
// include/mc2/models.h):
// - the forward without cache (Score) gives the training forward's loss,
//   checked against the independent double-precision reference, and
//   after LoadWeights a trained model's;
// - the cached decode's logits equal a full recomputation of the whole
//   sequence without cache, within a stated tolerance;
// - every pipeline (and split count) generates bitwise the same logits and
//   tokens, with and without sequence parallelism in the prefill;
// - across TP sizes 1, 2, 4 (and DP replicas) the logits agree within a
//   tolerance and the tokens are identical wherever the logits' top two
//   differ by more than that tolerance;
// - each phase reports the pipeline every fused call ran (auto resolved);
// - invalid settings fail with kInvalidArgument naming the cause.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/reference_model.h"
#include "mc2/mc2.h"
#include "mc2/models.h"
#include "models/data.h"

namespace mc2::models {
namespace {

// The tests' tiny model (every TP size 1, 2, 4 valid), 4 prompts.
TransformerConfig Config() {
  TransformerConfig c = TinyConfig();
  c.vocab = 32;
  return c;
}

InferenceConfig Inference(int prompt_len = 5, int new_tokens = 6) {
  InferenceConfig in;
  in.prompt_len = prompt_len;
  in.new_tokens = new_tokens;
  in.keep_logits = true;
  return in;
}

// Generates on `ranks` in-process ranks with TP size `tp`; returns every
// DP rank's generation from its TP rank 0 (index = dp rank), after
// checking that the TP ranks of a group agree bit for bit.
std::vector<Generation> Generate(int ranks, int tp, const TransformerConfig& c,
                                 const InferenceConfig& in) {
  std::vector<Generation> out(ranks / tp);
  std::vector<Generation> all(ranks);
  Group::RunInProcess(ranks, [&](Group& world) {
    ProcessGrid grid = MakeGrid(world, tp);
    InferenceModel model(grid, c, in);
    Generation g = model.Generate();
    all[world.rank()] = g;
  });
  for (int r = 0; r < ranks; ++r) {
    const Generation& lead = all[r - r % tp];
    EXPECT_EQ(all[r].tokens, lead.tokens) << "rank " << r;
    EXPECT_EQ(
        std::memcmp(all[r].logits.data(), lead.logits.data(), lead.logits.size() * sizeof(float)),
        0)
        << "rank " << r;
    if (r % tp == 0) out[r / tp] = all[r];
  }
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Inference, ScoreGivesTheTrainingLossAndTheReference) {
  // The forward without cache over the training sequences: its
  // cross-entropy is the training forward's loss and the double-precision
  // reference's (tests/common/reference_model.cc).
  TransformerConfig c = Config();
  for (int tp : {1, 2}) {
    Group::RunInProcess(tp, [&](Group& world) {
      ProcessGrid grid = MakeGrid(world, tp);
      InferenceModel inf(grid, c, Inference(c.seq_len, 1));
      const int B = c.batch, T = c.seq_len;
      std::vector<int32_t> tokens(B * T);
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t) tokens[b * T + t] = SequenceToken(c, 2, b, t);
      std::vector<float> logits = inf.Score(tokens, T);
      double ce = 0;
      for (int t = 0; t < T; ++t) {
        for (int b = 0; b < B; ++b) {
          const float* row = logits.data() + (size_t(t) * B + b) * c.vocab;
          double mx = *std::max_element(row, row + c.vocab), sum = 0;
          for (int v = 0; v < c.vocab; ++v) sum += std::exp(double(row[v]) - mx);
          ce += mx + std::log(sum) - row[SequenceToken(c, 2, b, t + 1)];
        }
      }
      ce /= double(B) * T;
      Transformer train(grid, c);
      const double loss = train.Loss(2);
      EXPECT_NEAR(ce, loss, 1e-5 * loss) << "tp " << tp;
      if (tp == 1) {
        const double want = ReferenceLoss(train, 2);
        EXPECT_NEAR(ce, want, 1e-5 * want);
      }
    });
  }
}

TEST(Inference, LoadWeightsTakesATrainedModel) {
  // After a few training steps the weights have moved away from the seed's:
  // the inference model scores the training sequences with the trained
  // model's loss only once it has loaded them; a model of another shape is
  // refused, naming the tensor.
  TransformerConfig c = Config();
  const int tp = 2;
  Group::RunInProcess(tp, [&](Group& world) {
    ProcessGrid grid = MakeGrid(world, tp);
    Transformer train(grid, c);
    for (int step = 0; step < 3; ++step) train.TrainStep(step);
    const double loss = train.Loss(5);
    InferenceModel inf(grid, c, Inference(c.seq_len, 1));
    const int B = c.batch, T = c.seq_len;
    std::vector<int32_t> tokens(B * T);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) tokens[b * T + t] = SequenceToken(c, 5, b, t);
    auto cross_entropy = [&] {
      std::vector<float> logits = inf.Score(tokens, T);
      double ce = 0;
      for (int t = 0; t < T; ++t) {
        for (int b = 0; b < B; ++b) {
          const float* row = logits.data() + (size_t(t) * B + b) * c.vocab;
          double mx = *std::max_element(row, row + c.vocab), sum = 0;
          for (int v = 0; v < c.vocab; ++v) sum += std::exp(double(row[v]) - mx);
          ce += mx + std::log(sum) - row[SequenceToken(c, 5, b, t + 1)];
        }
      }
      return ce / (double(B) * T);
    };
    EXPECT_GT(std::fabs(cross_entropy() - loss), 1e-3 * loss);  // the seed's weights
    inf.LoadWeights(train);
    EXPECT_NEAR(cross_entropy(), loss, 1e-5 * loss);
    TransformerConfig wider = c;
    wider.ffn = 64;
    InferenceModel other(grid, wider, Inference(4, 2));
    try {
      other.LoadWeights(train);
      ADD_FAILURE() << "a model of another shape was loaded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("block0.mlp.gate_up"), std::string::npos) << e.what();
    }
  });
}

TEST(Inference, CachedDecodeMatchesFullRecomputation) {
  // Token i's logits (from the prefill for i = 0, else from a decode step
  // over the cache) against one causal forward over the whole sequence
  // (prompt + the tokens chosen before i) without any cache. They differ
  // only in summation order (dot products of the cached attention against
  // the attention GEMMs of the full pass, GEMMs of B rows against P + N - 1
  // rows): f32 rounding on logits of order 1, bounded here by 1e-5.
  TransformerConfig c = Config();
  const InferenceConfig in = Inference(5, 6);
  const int P = in.prompt_len, N = in.new_tokens, T = P + N - 1;
  for (int tp : {1, 2, 4}) {
    for (bool sp : {true, false}) {
      InferenceConfig ic = in;
      ic.sequence_parallel = sp;
      Group::RunInProcess(tp, [&](Group& world) {
        InferenceModel model(MakeGrid(world, tp), c, ic);
        Generation g = model.Generate();
        const int B = g.batch;
        std::vector<int32_t> full(B * T);
        for (int b = 0; b < B; ++b) {
          for (int t = 0; t < P; ++t) full[b * T + t] = g.prompts[b * P + t];
          for (int i = 0; i + 1 < N; ++i) full[b * T + P + i] = g.tokens[b * N + i];
        }
        std::vector<float> ref = model.Score(full, T);
        float worst = 0;
        for (int i = 0; i < N; ++i) {
          for (int b = 0; b < B; ++b) {
            const float* got = g.logits.data() + (size_t(i) * B + b) * c.vocab;
            const float* want = ref.data() + (size_t(P - 1 + i) * B + b) * c.vocab;
            for (int v = 0; v < c.vocab; ++v) worst = std::max(worst, std::fabs(got[v] - want[v]));
            // The greedy choice is the argmax of the logits it came from.
            EXPECT_EQ(g.tokens[b * N + i], std::max_element(got, got + c.vocab) - got);
          }
        }
        EXPECT_LE(worst, 1e-5f) << "tp " << tp << " sp " << sp;
        EXPECT_EQ(g.token_seconds.size(), size_t(N - 1));
      });
    }
  }
}

TEST(Inference, EveryPipelineGeneratesTheSameBits) {
  TransformerConfig c = Config();
  for (int tp : {2, 4}) {
    for (bool sp : {true, false}) {
      InferenceConfig in = Inference(6, 5);
      in.sequence_parallel = sp;
      c.fused.pipeline = Pipeline::kSerial;
      const Generation base = Generate(tp, tp, c, in)[0];
      for (Pipeline p : {Pipeline::kChunked, Pipeline::kFused, Pipeline::kAuto}) {
        for (int splits : {1, 3}) {
          c.fused.pipeline = p;
          c.fused.splits = splits;
          const Generation g = Generate(tp, tp, c, in)[0];
          EXPECT_EQ(g.tokens, base.tokens)
              << "tp " << tp << " sp " << sp << " " << PipelineName(p) << " s=" << splits;
          EXPECT_TRUE(SameBits(g.logits, base.logits))
              << "tp " << tp << " sp " << sp << " " << PipelineName(p) << " s=" << splits;
          // What ran is what was asked (auto: resolved to some pipeline).
          if (p != Pipeline::kAuto) {
            for (const auto& [name, calls] : g.decode_pipelines)
              EXPECT_EQ(name.rfind(PipelineName(p), 0), 0u) << name;
          }
        }
      }
      c.fused.splits = 4;
    }
  }
}

TEST(Inference, TpSizesAgreeWithinRounding) {
  // Across TP sizes the projections' sums over the reduction dimension are
  // split differently (one GEMM over k at tp 1; p partial GEMMs summed by
  // the all-reduce at tp p), so the logits differ in the last bits, not
  // bitwise, in deterministic mode too (it fixes the order of the sum over
  // ranks, not how the reduction dimension is split among them): a few
  // ulps of logits of order 1, bounded by 1e-5 here. The tokens are
  // identical wherever the reference's best logit beats the second by more
  // than twice that bound (a closer race may legitimately go either way;
  // on this model none is that close, and every token is compared); once
  // one token differs the sequences continue from different inputs, so
  // only the prefix up to the first close race is compared.
  TransformerConfig c = Config();
  const InferenceConfig in = Inference(5, 6);
  const Generation ref = Generate(1, 1, c, in)[0];
  const int B = ref.batch, N = in.new_tokens, V = c.vocab;
  for (int tp : {2, 4}) {
    const Generation g = Generate(tp, tp, c, in)[0];
    int compared = 0;
    for (int b = 0; b < B; ++b) {
      for (int i = 0; i < N; ++i) {
        const float* want = ref.logits.data() + (size_t(i) * B + b) * V;
        const float* got = g.logits.data() + (size_t(i) * B + b) * V;
        float diff = 0;
        for (int v = 0; v < V; ++v) diff = std::max(diff, std::fabs(got[v] - want[v]));
        EXPECT_LE(diff, 1e-5f) << "tp " << tp << " sequence " << b << " token " << i;
        std::vector<float> sorted(want, want + V);
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
        if (sorted[0] - sorted[1] <= 2e-5f) break;
        EXPECT_EQ(g.tokens[b * N + i], ref.tokens[b * N + i])
            << "tp " << tp << " sequence " << b << " token " << i;
        ++compared;
      }
    }
    EXPECT_GE(compared, B * N / 2) << "too few tokens decided by a clear margin to compare";
  }
  // Data parallelism: two replicas (tp 1) each generate their half of the
  // prompts, bit for bit what one rank generates for them (no reduction
  // crosses the replicas).
  const std::vector<Generation> dp = Generate(2, 1, c, in);
  for (int r = 0; r < 2; ++r) {
    const int half = B / 2;
    for (int b = 0; b < half; ++b) {
      for (int i = 0; i < N; ++i)
        EXPECT_EQ(dp[r].tokens[b * N + i], ref.tokens[(r * half + b) * N + i]);
      for (int t = 0; t < in.prompt_len; ++t)
        EXPECT_EQ(dp[r].prompts[b * in.prompt_len + t],
                  ref.prompts[(r * half + b) * in.prompt_len + t]);
    }
  }
}

TEST(Inference, ReportsWhatEachPhaseRan) {
  // Every fused call of a phase is counted under the pipeline that ran
  // (auto resolved): qkv, o, gate_up, down per block in the prefill (with
  // sequence parallelism; o and down alone without), o and down per block
  // and decode step.
  TransformerConfig c = Config();
  const int N = 4;
  for (Pipeline p : {Pipeline::kSerial, Pipeline::kFused, Pipeline::kAuto}) {
    for (bool sp : {true, false}) {
      c.fused.pipeline = p;
      c.fused.splits = 2;
      InferenceConfig in = Inference(5, N);
      in.sequence_parallel = sp;
      const Generation g = Generate(2, 2, c, in)[0];
      int prefill = 0, decode = 0;
      for (const auto& [name, n] : g.prefill_pipelines) {
        prefill += n;
        EXPECT_EQ(name.find("auto"), std::string::npos) << name;
        if (p == Pipeline::kSerial) {
          EXPECT_EQ(name, "serial");
        }
        if (p == Pipeline::kFused) {
          EXPECT_EQ(name, "fused s=2");
        }
      }
      for (const auto& [name, n] : g.decode_pipelines) {
        decode += n;
        EXPECT_EQ(name.find("auto"), std::string::npos) << name;
        if (p == Pipeline::kSerial) {
          EXPECT_EQ(name, "serial");
        }
        if (p == Pipeline::kFused) {
          EXPECT_EQ(name, "fused s=2");
        }
      }
      EXPECT_EQ(prefill, (sp ? 4 : 2) * c.layers) << PipelineName(p) << " sp " << sp;
      EXPECT_EQ(decode, 2 * c.layers * (N - 1)) << PipelineName(p) << " sp " << sp;
    }
  }
}

TEST(Inference, InvalidSettingsFailNamingTheCause) {
  TransformerConfig c = Config();
  auto expect_invalid = [&](const TransformerConfig& cfg, const InferenceConfig& in,
                            const std::string& words) {
    Group::RunInProcess(1, [&](Group& world) {
      try {
        InferenceModel m(MakeGrid(world, 1), cfg, in);
        ADD_FAILURE() << "no error for " << words;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      }
    });
  };
  expect_invalid(c, Inference(0, 4), "prompt_len");
  expect_invalid(c, Inference(4, 0), "new_tokens");
  TransformerConfig moe = c;
  moe.moe_experts = 2;
  expect_invalid(moe, Inference(), "moe_experts");
  TransformerConfig bad = c;
  bad.heads = 3;
  expect_invalid(bad, Inference(), "heads");
  Group::RunInProcess(1, [&](Group& world) {
    InferenceModel m(MakeGrid(world, 1), c, Inference(4, 3));
    const int B = c.batch;
    for (auto [len, tok] : {std::pair{7, 0}, std::pair{0, 0}, std::pair{3, -1}, std::pair{3, 32}}) {
      std::vector<int32_t> t(size_t(B) * std::max(len, 0), tok);
      try {
        m.Score(t, len);
        ADD_FAILURE() << "no error for len " << len << " token " << tok;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      }
    }
  });
}

}  // namespace
}  // namespace mc2::models
