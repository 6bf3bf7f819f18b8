// The tensor + sequence parallel transformer of include/mc2/models/transformer.h.
//
// Works as follows (docs/models.md has the full picture). Notation: a TP
// group of p ranks, rank r; the local batch has Bl sequences of T tokens,
// S = T * Bl rows in sequence-major order (row = t * Bl + b), and every TP
// rank holds the s = S / p contiguous rows [r s, (r+1) s) of the residual
// stream (sequence parallelism). h = hidden, hl = heads / p local heads of
// width d, fl = ffn / p.
//
// Forward of block l, x the [s x h] shard:
//   xn  = RMSNorm(x)                                           local
//   qkv = AllGatherMatmul(xn, Wqkv_r [h x 3 hl d])  -> [S x 3 hl d], keeps
//         the gathered xn for the weight gradient
//   RoPE(q, k); causal attention per (sequence, local head)    local
//   x1  = x + MatmulReduceScatter(ctx [S x hl d], Wo_r [hl d x h])
//   gu  = AllGatherMatmul(RMSNorm(x1), Wgu_r [h x 2 fl])       gate | up
//   x'  = x1 + MatmulReduceScatter(silu(gate) * up, Wdown_r [fl x h])
// then the final RMSNorm, the LM head and the cross-entropy on the shard.
// A MoE block replaces the last two lines by the MoE MLP on the same s rows
// (experts whole, spread over the EP group; see MoeForward):
//   x'  = x1 + combine(MatmulAllToAll(silu * up of AllToAllMatmul(RMSNorm(x1), W13), W2))
//
// Backward of a row-parallel projection (dy: [s x h] shard):
//   da  = AllGatherMatmul(dy, W^T)   (dgrad; keeps the gathered dy)
//   dW  = a^T gather(dy)             (wgrad)
// of a column-parallel one (dy: [S x n_local]):
//   dx  = MatmulReduceScatter(dy, W^T)  (dgrad, summed over TP, scattered)
//   dW  = gather(x)^T dy               (wgrad, from the forward's gathered x)
//
// Overlap in backward: each sublayer (MLP, then attention, block by block)
// runs its dgrad chain (the fused operators, on the critical path), with
// the weight-gradient GEMMs as the operators' overlap work, spread so that
// every operator has some (a row-parallel dgrad all-gather takes the
// largest wgrad of the sublayer above, deferred to it: deferred_wgrad),
// then marks the PREVIOUS sublayer's weight gradients ready for their
// data-parallel all-reduce (mc2::GradSync, async on the progress thread;
// grad_sync.h), which the next
// sublayer's compute hides. A MoE MLP joins the same scheme with its
// experts' gradients (summed over grid.edp, the ranks holding the same
// experts). The TP-replicated tensors (embedding, norms, LM head, MoE
// routers; their gradients are partial sums over the sequence shards) are
// all-reduced over the whole world at the end. Data parallel only, the
// backward runs no collectives of its own, so nothing needs the wgrads as
// overlap work: each sublayer then runs each wgrad as soon as its inputs
// exist, before the dgrad GEMMs, and marks that tensor's gradient at once
// (its own GradSync bucket), so its all-reduce travels under the dgrads and
// the last one to start (block 0's qkv) under the last dgrad GEMM.
//
// The code, by concern: dims.h (sizes), parameters.h (tensors, GEMM copies,
// AdamW), grad_sync.h (gradient all-reduces), parallel_linear.h (the TP
// projections), activations.h (buffers), attention.cc, mlp.cc,
// moe_layer.cc (the sublayers) and this file (forward, backward, the
// public Transformer).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/models.h"
#include "mc2/trace.h"
#include "models/data.h"
#include "models/model.h"

namespace mc2::models {

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

TransformerImpl::TransformerImpl(const ProcessGrid& g, const TransformerConfig& c,
                                 const StageSpec& stage)
    : grid(g),
      cfg(c),
      dims(grid, cfg, stage),
      params(dims, grid, cfg, [this] { sync.WaitWorld(); }),
      sync(grid, params, cfg, /*tensor_buckets=*/!BackwardCollectives(grid, dims)),
      linear(dims, grid.tp, params, cfg.fused),
      acts(dims),
      rope(static_cast<size_t>(cfg.seq_len), dims.d, cfg.rope_base) {
  ring = MakeRings();
  backward_collectives = BackwardCollectives(grid, dims);
  loss.local.assign(1 + 2 * dims.E * dims.n_moe, 0.0);
  loss.total = loss.local;
  block_fwd_s.assign(dims.L, 0.0);
  block_bwd_s.assign(dims.L, 0.0);
  for (size_t l = 0; l < dims.L; ++l) {
    block_span_fwd.push_back("block" + std::to_string(dims.L0 + l) + ".forward");
    block_span_bwd.push_back("block" + std::to_string(dims.L0 + l) + ".backward");
  }
}

std::vector<std::unique_ptr<RingAttention>> TransformerImpl::MakeRings() const {
  std::vector<std::unique_ptr<RingAttention>> out;
  if (dims.cp == 1) return out;
  RingAttentionConfig rc;
  rc.batch = static_cast<int>(dims.Bl);
  rc.seq_len = cfg.seq_len;
  rc.heads = static_cast<int>(dims.hl);
  rc.head_dim = static_cast<int>(dims.d);
  rc.causal = true;
  for (size_t l = 0; l < dims.L; ++l) out.push_back(std::make_unique<RingAttention>(grid.cp, rc));
  return out;
}

double TransformerImpl::ChunkForward(int step, int micro, const float* x_in, float* x_out) {
  const size_t s = dims.s, h = dims.h, V = dims.V;
  // Deferred updates: the replicated tensors' now (small, and the
  // embedding is needed first); the projections' as the blocks come.
  for (size_t pi = 0; pi < params.size(); ++pi) {
    if (params.world_synced(static_cast<int>(pi))) params.ApplyUpdate(static_cast<int>(pi));
  }
  params.RefreshWeights();
  // This rank's rows of its DP slice of the global batch (of micro-batch
  // `micro`: sequences [micro B / m, (micro + 1) B / m) of the batch).
  // (With CP: local row t * Bl + b is global row Position(t) * Bl + b.)
  const int64_t micro_first = static_cast<int64_t>(micro) * grid.dp_size * dims.Bl;
  const int64_t first = micro_first + static_cast<int64_t>(grid.dp_rank) * dims.Bl;
  if (dims.cp == 1) {
    MakeBatch(cfg, step, first, static_cast<int>(dims.Bl), static_cast<int64_t>(grid.tp_rank * s),
              static_cast<int64_t>((grid.tp_rank + 1) * s), acts.inputs.data(),
              acts.targets.data());
  } else {
    for (size_t i = 0; i < s; ++i) {
      const size_t row = grid.tp_rank * s + i;
      const auto global = static_cast<int64_t>(Position(row / dims.Bl) * dims.Bl + row % dims.Bl);
      MakeBatch(cfg, step, first, static_cast<int>(dims.Bl), global, global + 1, &acts.inputs[i],
                &acts.targets[i]);
    }
  }
  std::vector<float> x(s * h), y(s * h);
  if (x_in != nullptr) {
    std::memcpy(x.data(), x_in, s * h * sizeof(float));
  } else {
    trace::Scope span("embedding", trace::Category::kCompute);
    for (size_t i = 0; i < s; ++i) {
      std::memcpy(&x[i * h], params[params.p_embed].w + static_cast<size_t>(acts.inputs[i]) * h,
                  h * sizeof(float));
    }
  }
  for (size_t l = 0; l < dims.L; ++l) {
    trace::Scope span(block_span_fwd[l], trace::Category::kHost);
    auto t0 = Clock::now();
    AttentionSublayerForward(l, x.data());
    if (dims.is_moe[l]) {
      MoeForward(l, y.data());
    } else {
      MlpForward(l, y.data());
    }
    block_fwd_s[l] = Since(t0);
    std::swap(x, y);
  }
  double local = 0;
  if (x_out != nullptr) {
    std::memcpy(x_out, x.data(), s * h * sizeof(float));
  } else {
    trace::Scope span("lm_head", trace::Category::kCompute, GemmFlops(s, V, h));
    acts.x_final = x;
    RmsNormForward(x.data(), params[params.p_final_norm].w, s, h, cfg.norm_eps, acts.xf.data(),
                   acts.rstd_f.data());
    Gemm(s, V, h, acts.xf.data(), params[params.p_lm_head].w, acts.logits.data(), RowGemm());
    local = CrossEntropy(acts.logits.data(), acts.targets.data(), s, V, dims.grad_scale,
                         acts.dlogits.data());
  }
  params.ApplyAllUpdates();  // any left (none when every block ran): backward writes the gradients
  return local;
}

void TransformerImpl::Forward(int step) {
  const double local = ChunkForward(step, 0, nullptr, nullptr);
  // The global mean: a sum over every rank's rows (f64, deterministic
  // order), in the background: backward does not need it, and a blocking
  // call here would make every rank wait for the slowest one's forward.
  // (The MoE layers' load statistics ride along: loss.local[1..].)
  loss.local[0] = local;
  loss.total = loss.local;
  if (grid.world.size() > 1) {
    CollectiveOptions o;
    o.may_run_inline = false;
    loss.work = AllReduce(grid.world, loss.local.data(), loss.total.data(), loss.local.size(),
                          DType::kF64, ReduceOp::kSum, o);
  }
}

double TransformerImpl::WaitLoss() {
  loss.work.Wait();
  loss.work = Work();
  const size_t E = dims.E;
  const double N = static_cast<double>(cfg.batch) * static_cast<double>(cfg.seq_len);
  // Per MoE layer: coef * E * sum_e f_e P_e, f_e = slots_e / (N k),
  // P_e = (sum of p_e over the N tokens) / N; from the global sums, so the
  // same on every rank and every grid.
  loss.aux = 0;
  for (size_t m = 0; 1 + 2 * E * m < loss.total.size(); ++m) {
    loss.aux += LayerAuxLoss(loss.total.data() + 1 + 2 * E * m, N);
  }
  return loss.total[0] / N + loss.aux;
}

double TransformerImpl::LayerAuxLoss(const double* st, double tokens) const {
  const size_t E = dims.E, K = dims.K;
  double sum = 0;
  for (size_t e = 0; e < E; ++e) sum += st[e] / (tokens * K) * (st[E + e] / tokens);
  return cfg.moe_aux_loss_coef * static_cast<double>(E) * sum;
}

void TransformerImpl::ChunkBackward(const float* dy, float* dx_in) {
  const size_t s = dims.s, h = dims.h, V = dims.V;
  // Replicated gradients accumulate (norms, embedding): Restart zeroes
  // them; the projections' are written by their wgrad GEMM.
  sync.Restart();
  deferred_wgrad = nullptr;
  std::vector<float>& dx = acts.dx;
  if (dy != nullptr) {
    std::memcpy(dx.data(), dy, s * h * sizeof(float));
  } else {
    trace::Scope span("lm_head.backward", trace::Category::kCompute, 2 * GemmFlops(s, V, h));
    GemmOptions ow;
    ow.trans_a = true;  // dW = xf^T dlogits
    Gemm(h, V, s, acts.xf.data(), acts.dlogits.data(), params[params.p_lm_head].g, ow);
    GemmOptions od = RowGemm();
    od.trans_b = true;  // dxf = dlogits W^T
    Gemm(s, h, V, acts.dlogits.data(), params[params.p_lm_head].w, acts.tmp_s.data(), od);
    RmsNormBackward(acts.x_final.data(), params[params.p_final_norm].w, acts.rstd_f.data(),
                    acts.tmp_s.data(), s, h, dx.data(), params[params.p_final_norm].g);
  }
  for (size_t l = dims.L; l-- > 0;) {
    trace::Scope span(block_span_bwd[l], trace::Category::kHost);
    auto t0 = Clock::now();
    if (dims.is_moe[l]) {
      MoeBackward(l, dx.data());
    } else {
      MlpBackward(l, dx.data());
    }
    AttentionSublayerBackward(l, dx.data());
    block_bwd_s[l] = Since(t0);
  }
  if (dx_in != nullptr) {
    std::memcpy(dx_in, dx.data(), s * h * sizeof(float));
  } else {
    trace::Scope span("embedding.backward", trace::Category::kCompute);
    float* ge = params[params.p_embed].g;
    for (size_t i = 0; i < s; ++i) {
      float* row = ge + static_cast<size_t>(acts.inputs[i]) * h;
      for (size_t c = 0; c < h; ++c) row[c] += dx[i * h + c];
    }
  }
  if (deferred_wgrad) TakeDeferred()();  // (block 0 defers nothing)
}

bool TransformerImpl::BackwardCollectives(const ProcessGrid& grid, const Dims& dims) {
  return grid.tp_size > 1 || grid.cp_size > 1 || grid.pp_size > 1 || dims.n_moe > 0;
}

void TransformerImpl::WgradAndMark(const void* a, const float* dy, int p) {
  linear.Wgrad(a, linear.op_b.Set(dy, dims.S * params[p].cols, dims.dt), p);
  sync.IssueTensor(p);
}

void TransformerImpl::EndSublayerBackward(int bucket) {
  // (Data parallel only, the sublayer marked each of its tensors already.)
  if (backward_collectives) sync.IssuePendingThen(bucket);
}

void TransformerImpl::Backward() {
  ChunkBackward(nullptr, nullptr);
  sync.IssuePendingThen(-1);
  sync.Issue(0);
}

// ------------------------------------------------------------------ public

Transformer::Transformer(const ProcessGrid& grid, const TransformerConfig& config)
    : impl_(std::make_unique<TransformerImpl>(grid, config)) {}

Transformer::~Transformer() {
  // Never leave an all-reduce running on buffers that are about to go (the
  // GradSyncs wait for theirs when they go).
  try {
    impl_->loss.work.Wait();
  } catch (...) {
  }
}

double Transformer::Loss(int step) {
  trace::Scope span("forward", trace::Category::kHost);
  impl_->Forward(step);
  return impl_->WaitLoss();
}

double Transformer::ForwardBackward(int step, StepStats* stats) {
  TransformerImpl& m = *impl_;
  auto t0 = Clock::now();
  double loss;
  {
    trace::Scope span("forward", trace::Category::kHost);
    m.Forward(step);
  }
  auto t1 = Clock::now();
  {
    trace::Scope span("backward", trace::Category::kHost);
    m.Backward();
  }
  auto t2 = Clock::now();
  double wait = m.sync.Wait();
  loss = m.WaitLoss();
  m.has_grads = true;
  if (stats != nullptr) {
    stats->step = step;
    stats->loss = loss;
    stats->aux_loss = m.loss.aux;
    stats->forward_seconds = std::chrono::duration<double>(t1 - t0).count();
    stats->backward_seconds = std::chrono::duration<double>(t2 - t1).count();
    stats->sync_wait_seconds = wait;
    stats->tokens = static_cast<int64_t>(m.cfg.batch) * m.cfg.seq_len;
    stats->block_forward_seconds = m.block_fwd_s;
    stats->block_backward_seconds = m.block_bwd_s;
  }
  return loss;
}

void Transformer::OptimizerStep(StepStats* stats) {
  TransformerImpl& m = *impl_;
  if (!m.has_grads) {
    throw Error(ErrorCode::kInvalidArgument,
                "Transformer::OptimizerStep: no gradients (call ForwardBackward first)");
  }
  auto t0 = Clock::now();
  trace::Scope span("optimizer", trace::Category::kHost);
  m.params.NextStep();
  if (m.updates_deferred) {
    // TrainStep: the next forward applies the updates (ParamStore::
    // ApplyUpdate), and waits for the world all-reduce before the first it
    // needs.
    m.params.DeferUpdates();
    m.has_grads = false;
    if (stats != nullptr) stats->optimizer_seconds = Since(t0);
    return;
  }
  // Each tensor's update is independent of the others': the world-reduced
  // ones (bucket 0) go last, after their all-reduce, which the others'
  // updates hide when TrainStep left it running (DpSync::defer_world).
  m.params.UpdateAll(/*world=*/false);
  // Counted as gradient-sync wait, not optimizer time.
  const double world_wait = m.sync.WaitWorld();
  m.params.UpdateAll(/*world=*/true);
  m.params.Changed();
  m.has_grads = false;
  if (stats != nullptr) {
    stats->optimizer_seconds = Since(t0) - world_wait;
    stats->sync_wait_seconds += world_wait;
  }
}

StepStats Transformer::TrainStep(int step) {
  trace::MarkStep(step);
  StepStats st;
  auto t0 = Clock::now();
  impl_->sync.defer_world = true;
  try {
    ForwardBackward(step, &st);
  } catch (...) {
    impl_->sync.defer_world = false;
    throw;
  }
  impl_->sync.defer_world = false;
  impl_->updates_deferred = true;
  try {
    OptimizerStep(&st);
  } catch (...) {
    impl_->updates_deferred = false;
    throw;
  }
  impl_->updates_deferred = false;
  st.seconds = Since(t0);
  return st;
}

std::vector<ParamView> Transformer::Parameters() {
  impl_->params.ApplyAllUpdates();  // the values TrainStep's optimizer left deferred
  std::vector<ParamView> out;
  for (const Param& p : impl_->params.list()) {
    ParamView v;
    v.name = p.name;
    v.rows = p.rows;
    v.cols = p.cols;
    v.value = p.w;
    v.grad = p.g;
    v.tp_replicated = p.replicated;
    v.ep_sharded = p.experts;
    out.push_back(v);
  }
  return out;
}

void Transformer::WeightsChanged() {
  impl_->params.ApplyAllUpdates();
  impl_->params.Changed();
}

const TransformerConfig& Transformer::config() const { return impl_->cfg; }
const ProcessGrid& Transformer::grid() const { return impl_->grid; }

std::vector<StepStats> TrainSteps(const Group& world, const TransformerConfig& config, int tp,
                                  int steps, const std::function<void(const StepStats&)>& on_step) {
  return TrainSteps(world, config, tp, 1, steps, on_step);
}

std::vector<StepStats> TrainSteps(const Group& world, const TransformerConfig& config, int tp,
                                  int ep, int steps,
                                  const std::function<void(const StepStats&)>& on_step) {
  if (steps < 0) throw Error(ErrorCode::kInvalidArgument, "TrainSteps: steps must be >= 0");
  // A tp that does not fit the world: MakeGrid throws, naming it, before
  // splitting anything.
  if (tp < 1 || !world.valid() || world.size() % tp != 0) MakeGrid(world, tp);
  ValidateConfig(config, tp, world.size() / tp, ep);
  ProcessGrid grid = MakeGrid(world, tp, ep);
  Transformer model(grid, config);
  std::vector<StepStats> out;
  for (int step = 0; step < steps; ++step) {
    out.push_back(model.TrainStep(step));
    if (on_step) on_step(out.back());
  }
  trace::EndStep();
  return out;
}

}  // namespace mc2::models
