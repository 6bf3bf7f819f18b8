// InferenceModel of include/mc2/models/inference.h: prefill and greedy decoding of the
// tensor-parallel transformer with a KV cache.
//
// Works as follows (the notation of transformer.cc: a TP group of p ranks,
// B sequences on this DP rank, hl = heads / p local heads of width d, hd =
// hl d, fl = ffn / p). A pass runs positions [pos0, pos0 + len) of every
// sequence: R = len B rows, sequence-major (row = (t - pos0) B + b).
//
// Prefill (pos0 = 0, len = prompt_len), with sequence parallelism: rank r
// holds rows [R r / p, R (r+1) / p) of the residual stream (uneven when p
// does not divide R), and block l runs
//   qkv = AllGatherMatmul(RMSNorm(x), Wqkv_r)   [R x 3 hd]; RoPE; K, V -> cache
//   ctx = causal attention per (sequence, local head)          local
//   x1  = x + MatmulReduceScatter(ctx, Wo_r)
//   gu  = AllGatherMatmul(RMSNorm(x1), Wgu_r);  x' = x1 + MatmulReduceScatter(SwiGLU(gu), Wdown_r)
// then the last position's B rows are all-gathered (AllGatherV) for the
// final norm and the LM head (replicated: every TP rank computes the same
// logits and picks the same tokens). Without sequence parallelism every
// rank holds all R rows, qkv and gate|up are local GEMMs of its columns,
// and o and down end in MatmulAllReduce.
//
// Decode step (len = 1, R = B, the token chosen last at position pos):
// the rows are replicated (B rows are too few to shard), qkv and gate|up
// local GEMMs, K and V of pos appended to the cache, each query attends to
// positions 0..pos of its sequence in the cache (KvCache::Attend), o and
// down end in MatmulAllReduce with M = B: tiny, latency-bound calls.
//
// Every operation is deterministic for a given grid (the fused operators'
// guarantee in deterministic mode, fixed kernels otherwise), so every
// pipeline generates the same tokens from the same logits, bit for bit.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/models.h"
#include "mc2/trace.h"
#include "models/data.h"
#include "models/dims.h"
#include "models/kernels.h"
#include "models/kv_cache.h"
#include "models/parallel_linear.h"
#include "models/parameters.h"

namespace mc2::models {

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void Invalid(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "InferenceConfig: " + msg);
}

// Checked before anything is built; `config` itself by Dims (ValidateConfig).
void ValidateInference(const TransformerConfig& c, const InferenceConfig& in, int cp) {
  if (cp != 1) {
    Invalid("inference runs without context parallelism: the grid's cp must be 1, not " +
            std::to_string(cp));
  }
  constexpr int kMaxPositions = 1 << 20;
  if (in.prompt_len < 1 || in.prompt_len > kMaxPositions) {
    Invalid("prompt_len must be in 1.." + std::to_string(kMaxPositions) + ", not " +
            std::to_string(in.prompt_len));
  }
  if (in.new_tokens < 1 || in.new_tokens > kMaxPositions) {
    Invalid("new_tokens must be in 1.." + std::to_string(kMaxPositions) + ", not " +
            std::to_string(in.new_tokens));
  }
  if (in.prompt_step < 0)
    Invalid("prompt_step must be >= 0, not " + std::to_string(in.prompt_step));
  if (c.moe_experts != 0) {
    Invalid("inference runs dense models only: moe_experts must be 0, not " +
            std::to_string(c.moe_experts));
  }
}

// Rows [lo, hi) of `rows` that rank r of p holds when they are sharded.
std::pair<size_t, size_t> Shard(size_t rows, int r, int p) {
  return {rows * r / p, rows * (r + 1) / p};
}

std::string RanName(const FusedReport& r) {
  if (r.pipeline == Pipeline::kSerial) return "serial";
  return std::string(PipelineName(r.pipeline)) + " s=" + std::to_string(r.splits);
}

}  // namespace

// Invariants: cache holds positions [0, cache.length()) of the sequences
// of the last Generate or Score (cap at most); the buffers are sized for a
// pass of cap positions; `ran` is null or points into the Generation being
// made (each entry point sets it before any fused call).
// Thread safety: one thread per rank (the InferenceModel's contract).
struct InferenceModel::Impl {
  Impl(const ProcessGrid& g, const TransformerConfig& c, const InferenceConfig& in);

  // The projections' trace span names of one block, made once.
  struct Spans {
    std::string qkv_sp, qkv, o_sp, o, gu_sp, gu, down_sp, down;
  };

  ProcessGrid grid;
  TransformerConfig cfg;
  InferenceConfig inf;
  Dims dims;
  ParamStore params;
  size_t B, P, N, cap, h, hl, d, hd, fl, V, L;
  Rope rope;
  KvCache cache;
  std::vector<Spans> spans;
  GemmOptions gemm;  // the local GEMMs'
  Operand op;
  std::map<std::string, int>* ran = nullptr;  // the phase's pipelines

  // Buffers, sized for the largest pass (cap positions).
  std::vector<float> x, x1, y, xn, qkv, ctx, gu, act, probs, rows, rstd, logits;

  // `auto` resolved once per call shape: (projection, rows, sp) -> what it
  // chose. The cost model's choice depends only on the shapes and settings,
  // on which every rank agrees, and every decode step repeats its
  // predecessor's shapes: choosing again per token would only add the
  // choice's own cost to latency-bound calls.
  std::map<std::tuple<int, size_t, bool>, FusedReport> resolved;

  FusedOptions Options(int p, size_t R, bool sp) const {
    FusedOptions o = cfg.fused;
    if (o.pipeline != Pipeline::kAuto) return o;
    auto it = resolved.find({p, R, sp});
    if (it != resolved.end()) {
      o.pipeline = it->second.pipeline;
      o.splits = it->second.splits;
    }
    return o;
  }
  void Record(int p, size_t R, bool sp, const FusedReport& r) {
    if (cfg.fused.pipeline == Pipeline::kAuto) resolved.emplace(std::make_tuple(p, R, sp), r);
    if (ran != nullptr) ++(*ran)[RanName(r)];
  }
  // x = the embeddings of this rank's rows of `tokens` (row-major R rows).
  void Embed(const int32_t* tokens, size_t lo, size_t hi);
  // The blocks over positions [pos0, pos0 + len); x holds this rank's rows
  // (all R of them unless sp). cached: decode (len = 1, attention over the
  // cache); else pos0 = 0 and causal attention over the pass itself.
  void Blocks(size_t pos0, size_t len, bool sp, bool cached);
  // Row-parallel projection ending the sublayer: y = (this rank's rows of)
  // the sum over TP of a [R x k] W_p.
  void RowParallel(const float* a, size_t R, size_t k, int p, bool sp, size_t m_local,
                   const std::string& span_sp, const std::string& span);
  // Column-parallel projection: out [R x n] = (gathered) xn W_p.
  void ColumnParallel(size_t R, size_t m_local, int p, size_t n, float* out, bool sp,
                      const std::string& span_sp, const std::string& span);
  // logits [(R - g0) x V] of rows [g0, R) of the pass's output.
  void Head(size_t R, size_t g0, bool sp);
};

InferenceModel::Impl::Impl(const ProcessGrid& g, const TransformerConfig& c,
                           const InferenceConfig& in)
    : grid(g),
      cfg((ValidateInference(c, in, g.cp_size), c)),
      inf(in),
      dims(grid, cfg),
      params(dims, grid, cfg, [] {}),
      B(dims.Bl),
      P(in.prompt_len),
      N(in.new_tokens),
      cap(P + N - 1),
      h(dims.h),
      hl(dims.hl),
      d(dims.d),
      hd(dims.hl * dims.d),
      fl(dims.fl),
      V(dims.V),
      L(dims.L),
      rope(cap, d, cfg.rope_base),
      cache(L, B, hl, d, cap) {
  params.RefreshWeights();
  gemm.threads = cfg.fused.gemm_threads;
  // Deterministic mode: the kernel the fused operators use (row-block
  // invariant), so a row's result does not depend on how many rows a call has.
  if (grid.world.deterministic()) gemm.backend = GemmBackend::kOneDNN;
  for (size_t l = 0; l < L; ++l) {
    const std::string b = "block" + std::to_string(l);
    spans.push_back({b + ".attn.qkv.all_gather_matmul", b + ".attn.qkv.matmul",
                     b + ".attn.o.matmul_reduce_scatter", b + ".attn.o.matmul_all_reduce",
                     b + ".mlp.gate_up.all_gather_matmul", b + ".mlp.gate_up.matmul",
                     b + ".mlp.down.matmul_reduce_scatter", b + ".mlp.down.matmul_all_reduce"});
  }
  const size_t R = cap * B;
  x.resize(R * h);
  x1.resize(R * h);
  y.resize(R * h);
  xn.resize(R * h);
  qkv.resize(R * 3 * hd);
  ctx.resize(R * hd);
  gu.resize(R * 2 * fl);
  act.resize(R * fl);
  probs.resize(cap * cap);
  rows.resize(R * h);
  rstd.resize(R);
  logits.resize(R * V);
}

void InferenceModel::Impl::Embed(const int32_t* tokens, size_t lo, size_t hi) {
  trace::Scope span("embedding", trace::Category::kCompute);
  const float* E = params[params.p_embed].w;
  for (size_t i = lo; i < hi; ++i) {
    std::memcpy(&x[(i - lo) * h], E + static_cast<size_t>(tokens[i]) * h, h * sizeof(float));
  }
}

void InferenceModel::Impl::ColumnParallel(size_t R, size_t m_local, int p, size_t n, float* out,
                                          bool sp, const std::string& span_sp,
                                          const std::string& span) {
  const DType dt = dims.dt;
  if (sp) {
    const void* a = op.Set(xn.data(), m_local * h, dt);
    trace::Scope s(span_sp, trace::Category::kHost);
    Record(p, R, sp,
           AllGatherMatmul(
               grid.tp,
               {.a = a, .b = params.W(p), .c = out, .m = m_local, .k = h, .n = n, .dtype = dt},
               Options(p, R, sp)));
    return;
  }
  const void* a = op.Set(xn.data(), R * h, dt);
  trace::Scope s(span, trace::Category::kCompute, GemmFlops(R, n, h));
  Gemm(R, n, h, dt, a, params.W(p), DType::kF32, out, gemm);
}

void InferenceModel::Impl::RowParallel(const float* a_f32, size_t R, size_t k, int p, bool sp,
                                       size_t m_local, const std::string& span_sp,
                                       const std::string& span) {
  const DType dt = dims.dt;
  const void* a = op.Set(a_f32, R * k, dt);
  if (sp) {
    trace::Scope s(span_sp, trace::Category::kHost);
    Record(p, R, sp,
           MatmulReduceScatter(grid.tp,
                               {.a = a,
                                .b = params.W(p),
                                .c = y.data(),
                                .m = R,
                                .k = k,
                                .n = h,
                                .dtype = dt,
                                .m_local = m_local},
                               Options(p, R, sp)));
    return;
  }
  trace::Scope s(span, trace::Category::kHost);
  Record(
      p, R, sp,
      MatmulAllReduce(
          grid.tp, {.a = a, .b = params.W(p), .c = y.data(), .m = R, .k = k, .n = h, .dtype = dt},
          Options(p, R, sp)));
}

void InferenceModel::Impl::Blocks(size_t pos0, size_t len, bool sp, bool cached) {
  const size_t R = len * B;
  const auto [lo, hi] = sp ? Shard(R, grid.tp_rank, grid.tp_size) : std::pair<size_t, size_t>{0, R};
  const size_t m = hi - lo, ld = 3 * hd;
  for (size_t l = 0; l < L; ++l) {
    const BlockParams& bp = params.bp[l];
    const Spans& sn = spans[l];
    {
      trace::Scope span("rmsnorm", trace::Category::kCompute);
      RmsNormForward(x.data(), params[bp.norm1].w, m, h, cfg.norm_eps, xn.data(), rstd.data());
    }
    ColumnParallel(R, m, bp.qkv, ld, qkv.data(), sp, sn.qkv_sp, sn.qkv);
    {
      trace::Scope span("attention", trace::Category::kCompute,
                        cached ? 4 * static_cast<uint64_t>(B * hl) * (pos0 + 1) * d
                               : 2 * static_cast<uint64_t>(B * hl) * len * len * d);
      for (size_t row = 0; row < R; ++row) {
        const size_t t = pos0 + row / B;
        float* q = qkv.data() + row * ld;
        for (size_t j = 0; j < hl; ++j) {
          RopeApply(rope, t, q + j * d, false);
          RopeApply(rope, t, q + hd + j * d, false);
        }
      }
      cache.Store(l, pos0, len, qkv.data(), ld);
      if (cached) {
        cache.Attend(l, pos0, qkv.data(), ld, ctx.data(), hd);
      } else {
        for (size_t b = 0; b < B; ++b) {
          for (size_t j = 0; j < hl; ++j) {
            const float* q = qkv.data() + b * ld + j * d;
            AttentionForward(q, q + hd, q + 2 * hd, len, d, B * ld, B * ld, B * ld, probs.data(),
                             ctx.data() + b * hd + j * d, B * hd);
          }
        }
      }
    }
    RowParallel(ctx.data(), R, hd, bp.o, sp, m, sn.o_sp, sn.o);
    for (size_t i = 0; i < m * h; ++i) x1[i] = x[i] + y[i];
    {
      trace::Scope span("rmsnorm", trace::Category::kCompute);
      RmsNormForward(x1.data(), params[bp.norm2].w, m, h, cfg.norm_eps, xn.data(), rstd.data());
    }
    ColumnParallel(R, m, bp.gu, 2 * fl, gu.data(), sp, sn.gu_sp, sn.gu);
    {
      trace::Scope span("swiglu", trace::Category::kCompute);
      SwiGluForward(gu.data(), R, fl, act.data());
    }
    RowParallel(act.data(), R, fl, bp.down, sp, m, sn.down_sp, sn.down);
    for (size_t i = 0; i < m * h; ++i) x[i] = x1[i] + y[i];
  }
}

void InferenceModel::Impl::Head(size_t R, size_t g0, bool sp) {
  const size_t G = R - g0;
  const float* src = x.data() + g0 * h;  // replicated rows: all of them are here
  if (sp) {
    // Each rank's part of rows [g0, R), in rank order.
    std::vector<size_t> counts(grid.tp_size);
    for (int r = 0; r < grid.tp_size; ++r) {
      const auto [lo, hi] = Shard(R, r, grid.tp_size);
      counts[r] = (std::max(hi, g0) - std::max(lo, g0)) * h;
    }
    const auto [lo, hi] = Shard(R, grid.tp_rank, grid.tp_size);
    const float* send = x.data() + (std::max(lo, g0) - lo) * h;
    trace::Scope span("final_rows.all_gather", trace::Category::kHost);
    AllGatherV(grid.tp, send, rows.data(), counts, {}, DType::kF32).Wait();
    src = rows.data();
  }
  trace::Scope span("lm_head", trace::Category::kCompute, GemmFlops(G, V, h));
  RmsNormForward(src, params[params.p_final_norm].w, G, h, cfg.norm_eps, xn.data(), rstd.data());
  Gemm(G, V, h, DType::kF32, xn.data(), params[params.p_lm_head].w, DType::kF32, logits.data(),
       gemm);
}

// ------------------------------------------------------------------ public

InferenceModel::InferenceModel(const ProcessGrid& grid, const TransformerConfig& config,
                               const InferenceConfig& inference)
    : impl_(std::make_unique<Impl>(grid, config, inference)) {}

InferenceModel::~InferenceModel() = default;

const InferenceConfig& InferenceModel::inference() const { return impl_->inf; }

void InferenceModel::SetFusedOptions(const FusedOptions& fused) {
  TransformerConfig c = impl_->cfg;
  c.fused = fused;
  ValidateConfig(c, impl_->grid.tp_size, impl_->grid.dp_size, impl_->grid.ep_size);
  impl_->cfg.fused = fused;
  impl_->resolved.clear();
}

void InferenceModel::LoadWeights(Transformer& trained) {
  Impl& m = *impl_;
  if (trained.grid().tp_size != m.grid.tp_size || trained.grid().tp_rank != m.grid.tp_rank) {
    throw Error(ErrorCode::kInvalidArgument,
                "InferenceModel::LoadWeights: the trained model's TP grid (tp " +
                    std::to_string(trained.grid().tp_size) + ") differs from this one's (tp " +
                    std::to_string(m.grid.tp_size) + ")");
  }
  std::vector<ParamView> views = trained.Parameters();
  const std::vector<Param>& mine = m.params.list();
  if (views.size() != mine.size()) {
    throw Error(ErrorCode::kInvalidArgument, "InferenceModel::LoadWeights: the trained model has " +
                                                 std::to_string(views.size()) +
                                                 " tensors, this one " +
                                                 std::to_string(mine.size()));
  }
  for (size_t i = 0; i < views.size(); ++i) {
    const Param& p = mine[i];
    if (views[i].name != p.name || views[i].rows != p.rows || views[i].cols != p.cols) {
      throw Error(ErrorCode::kInvalidArgument,
                  "InferenceModel::LoadWeights: tensor " + views[i].name + " [" +
                      std::to_string(views[i].rows) + " x " + std::to_string(views[i].cols) +
                      "] does not match " + p.name + " [" + std::to_string(p.rows) + " x " +
                      std::to_string(p.cols) + "]");
    }
  }
  for (size_t i = 0; i < views.size(); ++i) {
    std::memcpy(mine[i].w, views[i].value, mine[i].rows * mine[i].cols * sizeof(float));
  }
  m.params.Changed();
  m.params.RefreshWeights();
}

Generation InferenceModel::Generate() {
  Impl& m = *impl_;
  const size_t B = m.B, P = m.P, N = m.N, V = m.V;
  Generation g;
  g.batch = static_cast<int>(B);
  g.prompts.resize(B * P);
  g.tokens.resize(B * N);
  g.expected.resize(B * N);
  if (m.inf.keep_logits) g.logits.resize(N * B * V);
  // Prompt tokens, sequence-major rows as the pass takes them.
  std::vector<int32_t> in(P * B);
  for (size_t b = 0; b < B; ++b) {
    const int64_t seq =
        static_cast<int64_t>(m.grid.dp_rank) * static_cast<int64_t>(B) + static_cast<int64_t>(b);
    for (size_t t = 0; t < P; ++t) {
      const int32_t tok = SequenceToken(m.cfg, m.inf.prompt_step, seq, static_cast<int>(t));
      g.prompts[b * P + t] = tok;
      in[t * B + b] = tok;
    }
    for (size_t i = 0; i < N; ++i) {
      g.expected[b * N + i] = SequenceToken(m.cfg, m.inf.prompt_step, seq, static_cast<int>(P + i));
    }
  }
  // Greedy choice of token i of every sequence from the B rows of logits.
  auto choose = [&](size_t i) {
    for (size_t b = 0; b < B; ++b) {
      const float* row = m.logits.data() + b * V;
      g.tokens[b * N + i] = static_cast<int32_t>(std::max_element(row, row + V) - row);
    }
    if (m.inf.keep_logits)
      std::memcpy(&g.logits[i * B * V], m.logits.data(), B * V * sizeof(float));
  };
  m.cache.Clear();
  trace::MarkStep(0);
  auto t0 = Clock::now();
  {
    trace::Scope span("prefill", trace::Category::kHost);
    m.ran = &g.prefill_pipelines;
    const bool sp = m.inf.sequence_parallel;
    const size_t R = P * B;
    const auto [lo, hi] =
        sp ? Shard(R, m.grid.tp_rank, m.grid.tp_size) : std::pair<size_t, size_t>{0, R};
    m.Embed(in.data(), lo, hi);
    m.Blocks(0, P, sp, /*cached=*/false);
    m.cache.SetLength(P);
    m.Head(R, R - B, sp);
    choose(0);
  }
  g.prefill_seconds = Since(t0);
  m.ran = &g.decode_pipelines;
  std::vector<int32_t> last(B);
  for (size_t i = 1; i < N; ++i) {
    trace::MarkStep(static_cast<int64_t>(i));
    t0 = Clock::now();
    trace::Scope span("decode", trace::Category::kHost);
    const size_t pos = P + i - 1;  // of the token chosen last
    for (size_t b = 0; b < B; ++b) last[b] = g.tokens[b * N + i - 1];
    m.Embed(last.data(), 0, B);
    m.Blocks(pos, 1, /*sp=*/false, /*cached=*/true);
    m.cache.SetLength(pos + 1);
    m.Head(B, 0, /*sp=*/false);
    choose(i);
    g.token_seconds.push_back(Since(t0));
  }
  trace::EndStep();
  m.ran = nullptr;
  return g;
}

std::vector<float> InferenceModel::Score(const std::vector<int32_t>& tokens, int len) {
  Impl& m = *impl_;
  const size_t B = m.B, V = m.V;
  if (len < 1 || static_cast<size_t>(len) > m.cap) {
    throw Error(ErrorCode::kInvalidArgument,
                "InferenceModel::Score: len must be in 1.." + std::to_string(m.cap) +
                    " (prompt_len + new_tokens - 1, the cache's capacity), not " +
                    std::to_string(len));
  }
  const size_t T = static_cast<size_t>(len), R = T * B;
  if (tokens.size() != R) {
    throw Error(ErrorCode::kInvalidArgument,
                "InferenceModel::Score: tokens has " + std::to_string(tokens.size()) +
                    " entries, not batch " + std::to_string(B) + " x len " + std::to_string(T));
  }
  std::vector<int32_t> in(R);
  for (size_t b = 0; b < B; ++b) {
    for (size_t t = 0; t < T; ++t) {
      const int32_t tok = tokens[b * T + t];
      if (tok < 0 || static_cast<size_t>(tok) >= V) {
        throw Error(ErrorCode::kInvalidArgument,
                    "InferenceModel::Score: token " + std::to_string(tok) + " at [" +
                        std::to_string(b) + ", " + std::to_string(t) +
                        "] is outside the vocab [0, " + std::to_string(V) + ")");
      }
      in[t * B + b] = tok;
    }
  }
  const bool sp = m.inf.sequence_parallel;
  const auto [lo, hi] =
      sp ? Shard(R, m.grid.tp_rank, m.grid.tp_size) : std::pair<size_t, size_t>{0, R};
  m.ran = nullptr;
  m.cache.Clear();
  m.Embed(in.data(), lo, hi);
  m.Blocks(0, T, sp, /*cached=*/false);
  m.cache.SetLength(T);
  m.Head(R, 0, sp);
  return std::vector<float>(m.logits.begin(), m.logits.begin() + R * V);
}

}  // namespace mc2::models
