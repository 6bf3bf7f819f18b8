// The tensor + sequence parallel transformer of include/mc2/models.h.
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
// then issues the data-parallel all-reduce of the PREVIOUS sublayer's weight
// gradients (async, on the progress thread), which the next sublayer's
// compute hides. The progress thread runs tasks in order, so the
// all-reduce must be issued after this sublayer's fused operators (else
// their collectives would queue behind it): the seed's FFN-to-attention
// overlap. A MoE MLP joins the same scheme with its experts' bucket (summed
// over grid.edp, the ranks holding the same experts). The TP-replicated
// tensors (embedding, norms, LM head, MoE routers; their
// gradients are partial sums over the sequence shards) are all-reduced over
// the whole world at the end.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/models.h"
#include "mc2/ops.h"
#include "mc2/trace.h"
#include "models/data.h"
#include "models/kernels.h"

namespace mc2::models {

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void Invalid(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "TransformerConfig: " + msg);
}

std::string Str(long long v) { return std::to_string(v); }

// Where a tensor's gradient is summed and over which group: the world (TP-
// replicated tensors), the DP group (TP shards) or the ranks holding the
// same experts (grid.edp).
enum class Sync { kWorld, kDp, kExpert };

struct Param {
  std::string name;
  size_t rows = 0, cols = 0;
  bool replicated = false;
  bool decay = false;
  int bucket = 0;
  size_t offset = 0;
  float* w = nullptr;
  float* g = nullptr;
  // Trace span names of the projection's fused calls, made once (building
  // them per call would cost an allocation even with tracing off).
  std::string span_fwd, span_dgrad;
  bool experts = false;  // a MoE layer's experts: sharded over EP
};

// Parameters whose gradients are all-reduced together (one call).
struct Bucket {
  Sync sync = Sync::kDp;
  std::vector<float> w, g, m, v;
};

// A matrix in the GEMM input type: the f32 data itself, or a bf16 copy.
class Operand {
 public:
  const void* Set(const float* x, size_t n, DType dt) {
    if (dt == DType::kF32) return x;
    if (buf_.size() < n) buf_.resize(n);
    ConvertF32ToBF16(x, buf_.data(), n);
    return buf_.data();
  }

 private:
  std::vector<bf16> buf_;
};

// Per-block activations kept for backward.
struct BlockActs {
  std::vector<float> x;      // [s x h] block input
  std::vector<float> rstd1;  // [s]
  std::vector<char> xn1_g;   // [S x h] gathered RMSNorm(x), GEMM dtype
  std::vector<float> qkv;    // [S x 3 hl d], q and k after RoPE
  std::vector<float> probs;  // [Bl * hl x T x T]
  std::vector<float> ctx;    // [S x hl d]
  std::vector<float> x1;     // [s x h] after the attention residual
  std::vector<float> rstd2;  // [s]
  std::vector<char> xn2_g;   // [S x h] gathered RMSNorm(x1), GEMM dtype
  std::vector<float> gu;     // [S x 2 fl]
  std::vector<float> act;    // [S x fl]
};

// A MoE layer's activations kept for backward (R: the slots this rank's
// experts received this step, so the expert-side buffers are resized per
// step). Slots are this rank's (token t, choice j) pairs, t * k + j.
struct MoeActs {
  MoeRouting routing;          // of the slots (topk 1, see MoeForward)
  std::vector<float> xn;       // [s x h] RMSNorm(x1)
  std::vector<float> probs;    // [s x E] router softmax
  std::vector<int32_t> ids;    // [s x k] chosen experts
  std::vector<float> gates;    // [s x k] their probabilities
  std::vector<char> xd;        // [R x h] dispatched xn, expert-grouped, GEMM dtype
  std::vector<float> gu;       // [R x 2 F] expert gate | up
  std::vector<float> act;      // [R x F]
  std::vector<float> yslot;    // [s k x h] each slot's expert output, unweighted
};

}  // namespace

bool IsMoeLayer(const TransformerConfig& c, int layer) {
  return c.moe_experts > 0 && c.moe_every >= 1 && (layer + 1) % c.moe_every == 0;
}

void ValidateConfig(const TransformerConfig& c, int tp, int dp, int ep) {
  auto positive = [](const char* name, long long v) {
    if (v < 1) Invalid(std::string(name) + " must be >= 1, not " + Str(v));
  };
  positive("vocab", c.vocab);
  positive("hidden", c.hidden);
  positive("heads", c.heads);
  positive("ffn", c.ffn);
  positive("layers", c.layers);
  positive("seq_len", c.seq_len);
  positive("batch", c.batch);
  positive("task_param", c.task_param);
  if (tp < 1) Invalid("tp must be >= 1, not " + Str(tp));
  if (dp < 1) Invalid("dp must be >= 1, not " + Str(dp));
  if (ep < 1 || dp % ep != 0) {
    Invalid("ep (" + Str(ep) + ") must be >= 1 and divide dp (" + Str(dp) +
            "): EP groups are carved out of the DP dimension");
  }
  // NOTES: experts are whole on a rank (not split over TP), E / ep per EP
  // rank; top-k picks distinct experts, so k <= E.
  if (c.moe_experts < 0) {
    Invalid("moe_experts must be >= 0 (0: dense MLP), not " + Str(c.moe_experts));
  }
  if (c.moe_experts == 0 && ep > 1) {
    Invalid("ep (" + Str(ep) + ") > 1 needs MoE layers (moe_experts > 0): a dense model has "
            "nothing to spread over the EP group");
  }
  if (c.moe_experts > 0) {
    if (c.moe_experts % ep != 0) {
      Invalid("moe_experts (" + Str(c.moe_experts) + ") must be a multiple of ep (" + Str(ep) +
              "): every EP rank holds moe_experts / ep experts");
    }
    if (c.moe_topk < 1 || c.moe_topk > c.moe_experts) {
      Invalid("moe_topk (" + Str(c.moe_topk) + ") must be in 1..moe_experts (" +
              Str(c.moe_experts) + ")");
    }
    if (c.moe_ffn < 0) Invalid("moe_ffn must be >= 0 (0: ffn), not " + Str(c.moe_ffn));
    if (c.moe_every < 1) Invalid("moe_every must be >= 1, not " + Str(c.moe_every));
    if (!(c.moe_aux_loss_coef >= 0.0f)) Invalid("moe_aux_loss_coef must be >= 0");
  }
  if (c.vocab < 2) Invalid("vocab must be >= 2, not " + Str(c.vocab));
  if (c.hidden % c.heads != 0) {
    Invalid("heads (" + Str(c.heads) + ") must divide hidden (" + Str(c.hidden) + ")");
  }
  if ((c.hidden / c.heads) % 2 != 0) {
    Invalid("head_dim = hidden / heads = " + Str(c.hidden / c.heads) + " must be even (RoPE)");
  }
  if (c.heads % tp != 0) {
    Invalid("heads (" + Str(c.heads) + ") must be divisible by tp (" + Str(tp) +
            "): heads are split across the TP ranks");
  }
  if (c.ffn % tp != 0) {
    Invalid("ffn (" + Str(c.ffn) + ") must be divisible by tp (" + Str(tp) + ")");
  }
  if (c.seq_len % tp != 0) {
    Invalid("seq_len (" + Str(c.seq_len) + ") must be divisible by tp (" + Str(tp) +
            "): the sequence is sharded across the TP ranks");
  }
  if (c.batch % dp != 0) {
    Invalid("batch (" + Str(c.batch) + ") must be divisible by dp (" + Str(dp) +
            "): it is the global batch, split across the DP ranks");
  }
  if (c.task == Task::kCopy && c.task_param >= c.seq_len) {
    Invalid("task_param (the copy period, " + Str(c.task_param) + ") must be < seq_len (" +
            Str(c.seq_len) + ")");
  }
  if (c.task != Task::kModAdd && c.task != Task::kCopy) Invalid("unknown task");
  if (c.gemm_dtype != DType::kF32 && c.gemm_dtype != DType::kBF16) {
    Invalid(std::string("gemm_dtype must be f32 or bf16, not ") + DTypeName(c.gemm_dtype));
  }
  if (c.fused.splits < 1 || c.fused.splits > 16) {
    Invalid("fused.splits must be in 1..16, not " + Str(c.fused.splits));
  }
  if (static_cast<int>(c.fused.pipeline) >= kNumPipelines) Invalid("fused.pipeline is invalid");
  if (!(c.norm_eps > 0.0f)) Invalid("norm_eps must be > 0");
  if (!(c.rope_base > 1.0f)) Invalid("rope_base must be > 1");
  if (!(c.lr >= 0.0f)) Invalid("lr must be >= 0");
  if (!(c.beta1 >= 0.0f && c.beta1 < 1.0f)) Invalid("beta1 must be in [0, 1)");
  if (!(c.beta2 >= 0.0f && c.beta2 < 1.0f)) Invalid("beta2 must be in [0, 1)");
  if (!(c.adam_eps > 0.0f)) Invalid("adam_eps must be > 0");
  if (!(c.weight_decay >= 0.0f)) Invalid("weight_decay must be >= 0");
}

// Invariants: buckets' vectors are sized once in the constructor (Param::w
// and Param::g point into them); cache[p].w (bf16) and .wt match params[p]
// when their w_version / wt_version == version (bumped by every optimizer step and by
// WeightsChanged); between ForwardBackward calls sync_works is empty and
// world_sync is complete, except between TrainStep's ForwardBackward and
// OptimizerStep, whose world_sync the optimizer waits for (every
// all-reduce is waited for before the gradients are used). Activations of
// the last Forward stay in acts until the next one.
// Thread safety: one thread per rank (the Transformer's contract).
struct Transformer::Impl {
  ProcessGrid grid;
  TransformerConfig cfg;
  DType dt;
  size_t esz;
  int tp, dp;
  // Shapes.
  size_t V, h, heads, hl, d, f, fl, L, T, Bl, S, s;
  // MoE: experts, local experts (E / ep), top-k, expert inner width.
  size_t E = 0, El = 0, K = 0, Fm = 0;
  std::vector<bool> is_moe;       // per block
  std::vector<int> moe_index;     // per block: its MoE layer number, or -1
  float grad_scale;  // 1 / (global batch tokens)
  Rope rope;

  std::vector<Param> params;
  std::vector<Bucket> buckets;  // 0: replicated (world); 1 + 2l: attn l; 2 + 2l: mlp l
                                // (dense: DP; MoE: its experts, over grid.edp)
  // Parameter indices.
  int p_embed = -1, p_final_norm = -1, p_lm_head = -1;
  struct BlockParams {
    int norm1, qkv, o, norm2;
    int gu = -1, down = -1;                 // dense MLP
    int router = -1, egu = -1, edown = -1;  // MoE: router, experts' gate|up, down
  };
  std::vector<BlockParams> bp;

  // GEMM copies of the projection weights (W in the GEMM dtype, W^T),
  // rebuilt when the weights changed. An expert tensor is El matrices
  // stacked by rows ([El x k x n]); its W^T is each one transposed
  // ([El x n x k]), as the MoE operators take it.
  struct Cached {
    std::vector<char> w, wt;
    uint64_t w_version = ~0ull, wt_version = ~0ull;  // of w (bf16 only) and of wt
    size_t blocks = 1;                                // stacked matrices
  };
  std::vector<Cached> cache;  // by param index
  std::vector<float> transpose_scratch;  // RefreshWeights' f32 W^T before bf16 rounding
  std::vector<std::pair<int, size_t>> gemm_params;  // (param, stacked matrices)
  uint64_t version = 0;

  // Activations and scratch.
  std::vector<BlockActs> acts;
  std::vector<MoeActs> moe_acts;  // per block (used by MoE blocks)
  // MoE backward scratch (expert-side ones resized per step).
  std::vector<float> m_dys, m_dxs, m_dact, m_dgu, m_dgates, m_dlogits, m_dprob;
  std::vector<char> m_dyd;  // [R x h] dispatched dys, GEMM dtype
  std::vector<int32_t> inputs, targets;
  std::vector<float> x_final, rstd_f, xf, logits, dlogits;
  std::vector<float> tmp_s, dx, dx1, dtmp;      // [s x h]
  std::vector<float> dS3, dS2, dS1;            // [S x 3hld], [S x 2fl], [S x max(fl,hld)]
  std::vector<char> dy_g;                      // [S x h] gathered dy, GEMM dtype
  std::vector<float> att_scratch;              // [T x T]
  // op_a: the operators' A; op_b, op_c: the wgrads' operands, which may
  // run inside an operator as its overlap work while op_a is in use.
  Operand op_a, op_b, op_c;
  int opt_step = 0;
  int pending_bucket = -1;  // a sublayer's gradients not yet all-reduced
  // A weight gradient of the sublayer above, deferred to run under the
  // transfers of the next sublayer's first dgrad operator (see Backward).
  std::function<void()> deferred_wgrad;
  std::function<void()> TakeDeferred() {
    std::function<void()> f = std::move(deferred_wgrad);
    deferred_wgrad = nullptr;
    return f;
  }
  std::vector<Work> sync_works;
  // The all-reduce of the TP-replicated bucket over the world, issued last.
  // TrainStep leaves it running into OptimizerStep (defer_world_sync), which
  // updates every other tensor first, under it: nothing else is left to
  // hide it behind at the end of backward.
  Work world_sync;
  bool defer_world_sync = false;
  // Deferred optimizer. TrainStep leaves the AdamW updates of step t to the
  // forward of step t+1 (update_pending), which applies each tensor's just
  // before it is used, and the projection matrices earlier, as the overlap
  // work of the forward's reduce-scatters and all-gathers: the forward has
  // nothing else independent of them to hide their transfers behind. Every
  // update is the same elementwise AdamW on the same gradient and moments,
  // so the weights (and the losses) are bitwise those of updating at once.
  std::vector<char> update_pending;  // by param index
  std::vector<char> is_gemm_param;   // by param index: in gemm_params
  bool updates_deferred = false;     // set by TrainStep for its OptimizerStep
  void AdamWUpdate(int pi);
  void ApplyUpdate(int pi);
  void ApplyUpdates(std::initializer_list<int> ps) {
    for (int pi : ps) ApplyUpdate(pi);
  }
  void ApplyAllUpdates();
  // The loss all-reduce's buffers (f64): [0] the cross-entropy sum, then per
  // MoE layer its routed slots per expert (E) and probability sums (E), from
  // which every rank computes the same load-balancing loss (and backward its
  // gradient) for the global batch.
  std::vector<double> loss_local, loss_total;
  Work loss_work;
  double aux_loss = 0;  // of the last WaitLoss
  bool has_grads = false;
  std::vector<double> block_fwd_s, block_bwd_s;  // of the last step, per block
  std::vector<std::string> block_span_fwd, block_span_bwd;  // "block<l>.forward", ...

  Impl(const ProcessGrid& g, const TransformerConfig& c);
  void AddParam(const std::string& name, size_t rows, size_t cols, bool replicated, bool decay,
                int bucket, int* index);
  void InitParams();
  // The GEMM copies of the weights (Cached): RefreshWeights makes what the
  // forward needs (the bf16 W) and the experts' W^T; the dense projections'
  // W^T, needed only in backward, are made by RefreshTransposes(l) during
  // block l's forward, as overlap work of its reduce-scatters, and any
  // still stale at backward by EnsureTransposes().
  void RefreshWeights();
  void RefreshTranspose(int p);
  void RefreshTransposes(std::initializer_list<int> ps);
  void EnsureTransposes();
  const void* W(int p) {
    if (dt == DType::kF32) return params[p].w;
    return cache[p].w.data();
  }
  const void* WT(int p) { return cache[p].wt.data(); }

  // Forward on the batch of `step`; the global loss is all-reduced in the
  // background: WaitLoss() returns it.
  void Forward(int step);
  double WaitLoss();
  void Backward();
  void ColumnParallel(const float* x, int p, float* out, std::vector<char>& gathered,
                      const std::function<void()>& independent = {});
  // `independent`: work that needs neither the call's transfers nor its
  // result, run under its transfers (FusedOptions::overlap_work).
  void RowParallel(const float* a, int p, float* y, const std::function<void()>& independent = {});
  void RowParallelDgrad(const float* dy, int p, float* da,
                        const std::function<void()>& independent = {});
  void ColumnParallelDgrad(const float* dy, int p, float* dx_shard,
                           const std::function<void()>& independent = {});
  void Wgrad(const void* a, const void* b, int p);
  // A block is two sublayers, each with its own forward and backward, its
  // own gradient bucket and the same overlap scheme (see the top of the
  // file). The MoE MLP (MoeForward / MoeBackward) has the dense MLP's
  // interface (acts[l].x1 in, block output out; backward: dout in, dx1
  // out), its experts in a bucket all-reduced over grid.edp, issued
  // through pending_bucket.
  void AttentionSublayerForward(size_t l, const float* x);
  void MlpForward(size_t l, float* out);
  void MlpBackward(size_t l, const float* dout);
  void MoeForward(size_t l, float* out);
  void MoeBackward(size_t l, const float* dout);
  void ExpertWgrad(const MoeRouting& r, const void* a, size_t k, const void* b, size_t n, int p);
  void AttentionSublayerBackward(size_t l, float* dxio);
  void IssueSync(int bucket);
  double WaitSync();
  FusedOptions Fused() const { return cfg.fused; }
};

Transformer::Impl::Impl(const ProcessGrid& g, const TransformerConfig& c) : grid(g), cfg(c) {
  tp = g.tp_size;
  dp = g.dp_size;
  ValidateConfig(c, tp, dp, g.ep_size);
  dt = c.gemm_dtype;
  esz = DTypeSize(dt);
  V = c.vocab;
  h = c.hidden;
  heads = c.heads;
  hl = heads / tp;
  d = h / heads;
  f = c.ffn;
  fl = f / tp;
  L = c.layers;
  T = c.seq_len;
  Bl = c.batch / dp;
  S = T * Bl;
  s = S / tp;
  grad_scale = 1.0f / static_cast<float>(static_cast<double>(c.batch) * T);
  rope = Rope(T, d, c.rope_base);
  E = c.moe_experts;
  El = E / g.ep_size;
  K = c.moe_topk;
  Fm = c.moe_ffn > 0 ? c.moe_ffn : c.ffn;
  is_moe.resize(L);
  moe_index.assign(L, -1);
  int n_moe = 0;
  for (size_t l = 0; l < L; ++l) {
    is_moe[l] = IsMoeLayer(c, static_cast<int>(l));
    if (is_moe[l]) moe_index[l] = n_moe++;
  }
  loss_local.assign(1 + 2 * E * n_moe, 0.0);
  loss_total = loss_local;

  buckets.resize(1 + 2 * L);
  buckets[0].sync = Sync::kWorld;
  AddParam("embed", V, h, true, false, 0, &p_embed);
  bp.resize(L);
  for (size_t l = 0; l < L; ++l) {
    std::string b = "block" + std::to_string(l);
    AddParam(b + ".norm1", 1, h, true, false, 0, &bp[l].norm1);
    AddParam(b + ".attn.qkv", h, 3 * hl * d, false, true, 1 + 2 * l, &bp[l].qkv);
    AddParam(b + ".attn.o", hl * d, h, false, true, 1 + 2 * l, &bp[l].o);
    AddParam(b + ".norm2", 1, h, true, false, 0, &bp[l].norm2);
    if (!is_moe[l]) {
      AddParam(b + ".mlp.gate_up", h, 2 * fl, false, true, 2 + 2 * l, &bp[l].gu);
      AddParam(b + ".mlp.down", fl, h, false, true, 2 + 2 * l, &bp[l].down);
    } else {
      // The router is replicated everywhere (its gradient summed over the
      // world, with the other replicated tensors); the experts live on
      // their EP rank, replicated over grid.edp.
      buckets[2 + 2 * l].sync = Sync::kExpert;
      AddParam(b + ".moe.router", h, E, true, true, 0, &bp[l].router);
      AddParam(b + ".moe.gate_up", El * h, 2 * Fm, true, true, 2 + 2 * l, &bp[l].egu);
      AddParam(b + ".moe.down", El * Fm, h, true, true, 2 + 2 * l, &bp[l].edown);
      params[bp[l].egu].experts = true;
      params[bp[l].edown].experts = true;
    }
  }
  for (size_t l = 0; l < L; ++l) {
    for (int pi : {bp[l].qkv, bp[l].gu}) {  // column parallel
      if (pi < 0) continue;
      params[pi].span_fwd = params[pi].name + ".all_gather_matmul";
      params[pi].span_dgrad = params[pi].name + ".dgrad.matmul_reduce_scatter";
    }
    for (int pi : {bp[l].o, bp[l].down}) {  // row parallel
      if (pi < 0) continue;
      params[pi].span_fwd = params[pi].name + ".matmul_reduce_scatter";
      params[pi].span_dgrad = params[pi].name + ".dgrad.all_gather_matmul";
    }
    if (is_moe[l]) {
      // Forward: dispatch + gate|up, down + combine; backward the reverse
      // operators (docs/models.md).
      Param& gu = params[bp[l].egu];
      gu.span_fwd = gu.name + ".all_to_all_matmul";
      gu.span_dgrad = gu.name + ".dgrad.matmul_all_to_all";
      Param& dn = params[bp[l].edown];
      dn.span_fwd = dn.name + ".matmul_all_to_all";
      dn.span_dgrad = dn.name + ".dgrad.all_to_all_matmul";
      gemm_params.push_back({bp[l].egu, El});
      gemm_params.push_back({bp[l].edown, El});
    } else {
      gemm_params.push_back({bp[l].gu, 1});
      gemm_params.push_back({bp[l].down, 1});
    }
    gemm_params.push_back({bp[l].qkv, 1});
    gemm_params.push_back({bp[l].o, 1});
  }
  AddParam("final_norm", 1, h, true, false, 0, &p_final_norm);
  AddParam("lm_head", h, V, true, true, 0, &p_lm_head);
  for (auto& b : buckets) {
    b.w.assign(b.w.size(), 0.0f);
    b.g.assign(b.w.size(), 0.0f);
    b.m.assign(b.w.size(), 0.0f);
    b.v.assign(b.w.size(), 0.0f);
  }
  for (auto& p : params) {
    p.w = buckets[p.bucket].w.data() + p.offset;
    p.g = buckets[p.bucket].g.data() + p.offset;
  }
  cache.resize(params.size());
  update_pending.assign(params.size(), 0);
  is_gemm_param.assign(params.size(), 0);
  for (auto [pi, blocks] : gemm_params) is_gemm_param[pi] = 1;
  InitParams();

  acts.resize(L);
  moe_acts.resize(L);
  block_fwd_s.assign(L, 0.0);
  for (size_t l = 0; l < L; ++l) {
    block_span_fwd.push_back("block" + std::to_string(l) + ".forward");
    block_span_bwd.push_back("block" + std::to_string(l) + ".backward");
  }
  block_bwd_s.assign(L, 0.0);
  for (size_t l = 0; l < L; ++l) {
    BlockActs& a = acts[l];
    a.x.resize(s * h);
    a.rstd1.resize(s);
    a.xn1_g.resize(S * h * esz);
    a.qkv.resize(S * 3 * hl * d);
    a.probs.resize(Bl * hl * T * T);
    a.ctx.resize(S * hl * d);
    a.x1.resize(s * h);
    a.rstd2.resize(s);
    if (!is_moe[l]) {
      a.xn2_g.resize(S * h * esz);
      a.gu.resize(S * 2 * fl);
      a.act.resize(S * fl);
      continue;
    }
    MoeActs& m = moe_acts[l];
    m.xn.resize(s * h);
    m.probs.resize(s * E);
    m.ids.resize(s * K);
    m.gates.resize(s * K);
    m.yslot.resize(s * K * h);
  }
  if (E > 0) {
    m_dys.resize(s * K * h);
    m_dxs.resize(s * K * h);
    m_dgates.resize(s * K);
    m_dlogits.resize(s * E);
    m_dprob.resize(E);
  }
  inputs.resize(s);
  targets.resize(s);
  x_final.resize(s * h);
  rstd_f.resize(s);
  xf.resize(s * h);
  logits.resize(s * V);
  dlogits.resize(s * V);
  tmp_s.resize(s * h);
  dx.resize(s * h);
  dx1.resize(s * h);
  dtmp.resize(s * h);
  dS3.resize(S * 3 * hl * d);
  dS2.resize(S * 2 * fl);
  dS1.resize(S * std::max(fl, hl * d));
  dy_g.resize(S * h * esz);
  att_scratch.resize(T * T);
}

void Transformer::Impl::AddParam(const std::string& name, size_t rows, size_t cols,
                                 bool replicated, bool decay, int bucket, int* index) {
  Param p;
  p.name = name;
  p.rows = rows;
  p.cols = cols;
  p.replicated = replicated;
  p.decay = decay;
  p.bucket = bucket;
  p.offset = buckets[bucket].w.size();
  buckets[bucket].w.resize(p.offset + rows * cols);
  *index = static_cast<int>(params.size());
  params.push_back(p);
}

void Transformer::Impl::InitParams() {
  // Every element is a function of (seed, tensor, GLOBAL index), so a shard
  // holds exactly its part of the model any grid would build. Linear layers
  // are uniform with std 1/sqrt(fan_in) (the output projections also
  // / sqrt(2 L), GPT-2 style, to keep the residual stream's scale); norms 1;
  // the embedding has std 1.
  const float k3 = 1.7320508f;  // uniform [-a, a) has std a / sqrt(3)
  auto fill = [&](int pi, uint64_t stream, float stdev, auto global_index) {
    Param& p = params[pi];
    for (size_t r = 0; r < p.rows; ++r) {
      for (size_t c = 0; c < p.cols; ++c) {
        p.w[r * p.cols + c] = k3 * stdev * HashUniform(cfg.seed, stream, global_index(r, c));
      }
    }
  };
  const size_t rank = grid.tp_rank;
  const float out_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(L));
  fill(p_embed, 1, 1.0f, [&](size_t r, size_t c) { return r * h + c; });
  for (size_t l = 0; l < L; ++l) {
    const uint64_t base = 16 + 8 * l;
    std::fill(params[bp[l].norm1].w, params[bp[l].norm1].w + h, 1.0f);
    std::fill(params[bp[l].norm2].w, params[bp[l].norm2].w + h, 1.0f);
    // Wqkv [h x 3h] globally: q | k | v, each heads x d columns; this rank
    // has heads [rank hl, (rank+1) hl) of each part.
    fill(bp[l].qkv, base + 0, 1.0f / std::sqrt(float(h)), [&](size_t r, size_t c) {
      size_t part = c / (hl * d), within = c % (hl * d);
      return r * 3 * h + part * h + rank * hl * d + within;
    });
    // Wo [h x h] globally: rows by input head; this rank has its heads' rows.
    fill(bp[l].o, base + 1, out_scale / std::sqrt(float(h)),
         [&](size_t r, size_t c) { return (rank * hl * d + r) * h + c; });
    if (is_moe[l]) {
      // Router [h x E]; expert e's gate|up [h x 2F] and down [F x h],
      // indexed by the GLOBAL expert e = ep_rank El + local one, so every
      // EP grid builds the same experts.
      const size_t e0 = static_cast<size_t>(grid.ep_rank) * El;
      fill(bp[l].router, base + 4, 1.0f / std::sqrt(float(h)),
           [&](size_t r, size_t c) { return r * E + c; });
      fill(bp[l].egu, base + 5, 1.0f / std::sqrt(float(h)),
           [&](size_t r, size_t c) { return (e0 * h + r) * 2 * Fm + c; });
      fill(bp[l].edown, base + 6, out_scale / std::sqrt(float(Fm)),
           [&](size_t r, size_t c) { return (e0 * Fm + r) * h + c; });
      continue;
    }
    // Wgu [h x 2f] globally: gate | up.
    fill(bp[l].gu, base + 2, 1.0f / std::sqrt(float(h)), [&](size_t r, size_t c) {
      size_t part = c / fl, within = c % fl;
      return r * 2 * f + part * f + rank * fl + within;
    });
    // Wdown [f x h] globally: this rank has rows [rank fl, (rank+1) fl).
    fill(bp[l].down, base + 3, out_scale / std::sqrt(float(f)),
         [&](size_t r, size_t c) { return (rank * fl + r) * h + c; });
  }
  std::fill(params[p_final_norm].w, params[p_final_norm].w + h, 1.0f);
  fill(p_lm_head, 2, 1.0f / std::sqrt(float(h)), [&](size_t r, size_t c) { return r * V + c; });
  ++version;
}

void Transformer::Impl::RefreshWeights() {
  trace::Scope span("convert_weights", trace::Category::kCompute);
  for (auto [pi, blocks] : gemm_params) {
    Cached& c = cache[pi];
    c.blocks = blocks;
    // A deferred update makes its tensor's copies when it is applied.
    if (update_pending[pi]) continue;
    const Param& p = params[pi];
    if (dt != DType::kF32 && c.w_version != version) {
      const size_t n = p.rows * p.cols;
      c.w.resize(n * esz);
      ConvertF32ToBF16(p.w, reinterpret_cast<bf16*>(c.w.data()), n);
      c.w_version = version;
    }
    if (p.experts) RefreshTranspose(pi);
  }
}

// W^T of one projection (each stacked matrix transposed), in the GEMM dtype.
void Transformer::Impl::RefreshTranspose(int pi) {
  ApplyUpdate(pi);
  Cached& c = cache[pi];
  if (c.wt_version == version) return;
  const Param& p = params[pi];
  const size_t n = p.rows * p.cols, rb = p.rows / c.blocks;
  // f32: transposed straight into the cache (a vector<char> from operator
  // new, aligned for floats); bf16: through an f32 scratch, then rounded.
  c.wt.resize(n * esz);
  if (dt != DType::kF32) transpose_scratch.resize(n);
  float* t =
      dt == DType::kF32 ? reinterpret_cast<float*>(c.wt.data()) : transpose_scratch.data();
  for (size_t b = 0; b < c.blocks; ++b) {
    Transpose(p.w + b * rb * p.cols, rb, p.cols, t + b * rb * p.cols);
  }
  if (dt != DType::kF32) ConvertF32ToBF16(t, reinterpret_cast<bf16*>(c.wt.data()), n);
  c.wt_version = version;
}

void Transformer::Impl::RefreshTransposes(std::initializer_list<int> ps) {
  trace::Scope span("convert_weights", trace::Category::kCompute);
  for (int pi : ps) RefreshTranspose(pi);
}

void Transformer::Impl::EnsureTransposes() {
  bool stale = false;
  for (auto [pi, blocks] : gemm_params) stale = stale || cache[pi].wt_version != version;
  if (!stale) return;
  trace::Scope span("convert_weights", trace::Category::kCompute);
  for (auto [pi, blocks] : gemm_params) RefreshTranspose(pi);
}

// --------------------------------------------------------- deferred AdamW

void Transformer::Impl::AdamWUpdate(int pi) {
  const Param& p = params[pi];
  Bucket& b = buckets[p.bucket];
  AdamW(p.w, p.g, b.m.data() + p.offset, b.v.data() + p.offset, p.rows * p.cols, opt_step,
        cfg.lr, cfg.beta1, cfg.beta2, cfg.adam_eps, p.decay ? cfg.weight_decay : 0.0f);
}

void Transformer::Impl::ApplyUpdate(int pi) {
  if (pi < 0 || !update_pending[pi]) return;
  trace::Scope span("adamw", trace::Category::kCompute);
  if (buckets[params[pi].bucket].sync == Sync::kWorld) {
    // Its gradient's all-reduce, left running by TrainStep (a no-op once
    // waited).
    trace::Scope wait("grad_sync.wait", trace::Category::kWait);
    world_sync.Wait();
    world_sync = Work();
  }
  AdamWUpdate(pi);
  update_pending[pi] = 0;
  // Its GEMM copies: the bf16 W now (the forward is about to use it), the
  // experts' W^T too (their forward uses it); a dense W^T when RefreshTranspose
  // next sees it stale (version moved on when the update was deferred).
  Cached& c = cache[pi];
  c.wt_version = ~0ull;
  if (!is_gemm_param[pi]) return;
  const Param& p = params[pi];
  if (dt != DType::kF32) {
    const size_t n = p.rows * p.cols;
    c.w.resize(n * esz);
    ConvertF32ToBF16(p.w, reinterpret_cast<bf16*>(c.w.data()), n);
    c.w_version = version;
  }
  if (p.experts) RefreshTranspose(pi);
}

void Transformer::Impl::ApplyAllUpdates() {
  for (size_t pi = 0; pi < params.size(); ++pi) ApplyUpdate(static_cast<int>(pi));
}

// ------------------------------------------------------------- projections
// With one TP rank there is nothing to gather or scatter: the projections
// are plain GEMMs (the fused operators would only add a shape handshake,
// which queues behind an in-flight gradient all-reduce).

void Transformer::Impl::ColumnParallel(const float* x, int p, float* out,
                                       std::vector<char>& gathered,
                                       const std::function<void()>& independent) {
  const size_t n = params[p].cols;
  const void* a = op_a.Set(x, s * h, dt);
  if (tp == 1) {
    std::memcpy(gathered.data(), a, S * h * esz);
    trace::Scope span("gemm", trace::Category::kCompute, GemmFlops(S, n, h));
    Gemm(S, n, h, dt, gathered.data(), W(p), DType::kF32, out);
    if (independent) independent();
    return;
  }
  trace::Scope span(params[p].span_fwd, trace::Category::kHost);
  FusedOptions o = Fused();
  o.overlap_work = independent;
  AllGatherMatmulSync(grid.tp, a, s, h, W(p), n, dt, out, gathered.data(), o);
}

void Transformer::Impl::RowParallel(const float* a_full, int p, float* y,
                                    const std::function<void()>& independent) {
  const size_t k = params[p].rows;
  const void* a = op_a.Set(a_full, S * k, dt);
  if (tp == 1) {
    {
      trace::Scope span("gemm", trace::Category::kCompute, GemmFlops(S, h, k));
      Gemm(S, h, k, dt, a, W(p), DType::kF32, y);
    }
    if (independent) independent();
    return;
  }
  trace::Scope span(params[p].span_fwd, trace::Category::kHost);
  FusedOptions o = Fused();
  o.overlap_work = independent;
  MatmulReduceScatterSync(grid.tp, a, S, k, W(p), h, dt, y, s, o);
}

// da [S x k] = gather(dy) W^T; the gathered dy stays in dy_g for the wgrad.
void Transformer::Impl::RowParallelDgrad(const float* dy, int p, float* da,
                                         const std::function<void()>& independent) {
  const size_t k = params[p].rows;
  const void* a = op_a.Set(dy, s * h, dt);
  if (tp == 1) {
    std::memcpy(dy_g.data(), a, S * h * esz);
    {
      trace::Scope span("gemm", trace::Category::kCompute, GemmFlops(S, k, h));
      Gemm(S, k, h, dt, dy_g.data(), WT(p), DType::kF32, da);
    }
    if (independent) independent();
    return;
  }
  trace::Scope span(params[p].span_dgrad, trace::Category::kHost);
  FusedOptions o = Fused();
  o.overlap_work = independent;
  AllGatherMatmulSync(grid.tp, a, s, h, WT(p), k, dt, da, dy_g.data(), o);
}

// dx shard [s x h] = rows of sum over TP of dy [S x n] W^T.
// `independent`: work that does not depend on this call (the sublayer's
// wgrads), hidden behind its reduce-scatter (FusedOptions::overlap_work).
void Transformer::Impl::ColumnParallelDgrad(const float* dy, int p, float* dx_shard,
                                            const std::function<void()>& independent) {
  const size_t n = params[p].cols;
  const void* a = op_a.Set(dy, S * n, dt);
  if (tp == 1) {
    {
      trace::Scope span("gemm", trace::Category::kCompute, GemmFlops(S, h, n));
      Gemm(S, h, n, dt, a, WT(p), DType::kF32, dx_shard);
    }
    if (independent) independent();
    return;
  }
  trace::Scope span(params[p].span_dgrad, trace::Category::kHost);
  FusedOptions o = Fused();
  o.overlap_work = independent;
  MatmulReduceScatterSync(grid.tp, a, S, n, WT(p), h, dt, dx_shard, s, o);
}

// grad(W) [rows x cols] = a^T b, a [S x rows] and b [S x cols] in the GEMM
// dtype (b: the output gradient, gathered for a row-parallel projection).
void Transformer::Impl::Wgrad(const void* a, const void* b, int p) {
  Param& P = params[p];
  trace::Scope span("wgrad", trace::Category::kCompute, GemmFlops(P.rows, P.cols, S));
  GemmOptions o;
  o.trans_a = true;
  Gemm(P.rows, P.cols, S, dt, a, b, DType::kF32, P.g, o);
}

// ------------------------------------------------------------------ forward

// x1 = x + attention(RMSNorm(x)), kept in acts[l].x1.
void Transformer::Impl::AttentionSublayerForward(size_t l, const float* x) {
  BlockActs& A = acts[l];
  const BlockParams& P = bp[l];
  const size_t hd = hl * d, ld_qkv = 3 * hd;
  std::memcpy(A.x.data(), x, s * h * sizeof(float));
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormForward(x, params[P.norm1].w, s, h, cfg.norm_eps, tmp_s.data(), A.rstd1.data());
  }
  // Deferred updates (update_pending): qkv is normally done under the
  // previous block's down reduce-scatter; o goes under qkv's all-gather.
  ApplyUpdate(P.qkv);
  ColumnParallel(tmp_s.data(), P.qkv, A.qkv.data(), A.xn1_g, [&] { ApplyUpdate(P.o); });
  {
    trace::Scope span("attention", trace::Category::kCompute,
                      4 * static_cast<uint64_t>(Bl * hl) * T * T * d);
    for (size_t row = 0; row < S; ++row) {
      const size_t t = row / Bl;
      float* q = A.qkv.data() + row * ld_qkv;
      for (size_t j = 0; j < hl; ++j) {
        RopeApply(rope, t, q + j * d, false);       // q
        RopeApply(rope, t, q + hd + j * d, false);  // k
      }
    }
    const size_t ld = Bl * ld_qkv;  // rows of one sequence are Bl apart
    for (size_t b = 0; b < Bl; ++b) {
      for (size_t j = 0; j < hl; ++j) {
        const float* q = A.qkv.data() + b * ld_qkv + j * d;
        AttentionForward(q, q + hd, q + 2 * hd, T, d, ld, ld, ld,
                         A.probs.data() + (b * hl + j) * T * T,
                         A.ctx.data() + b * hd + j * d, Bl * hd);
      }
    }
  }
  // Under the reduce-scatter, what the forward has independent of it: the
  // MLP's deferred updates and this block's attention W^T (for backward).
  ApplyUpdate(P.o);
  RowParallel(A.ctx.data(), P.o, tmp_s.data(), [&] {
    ApplyUpdates({P.gu, P.down, P.egu, P.edown});
    RefreshTransposes({P.qkv, P.o});
  });
  for (size_t i = 0; i < s * h; ++i) A.x1[i] = x[i] + tmp_s[i];
}

void Transformer::Impl::MlpForward(size_t l, float* out) {
  BlockActs& A = acts[l];
  const BlockParams& P = bp[l];
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormForward(A.x1.data(), params[P.norm2].w, s, h, cfg.norm_eps, tmp_s.data(),
                   A.rstd2.data());
  }
  ApplyUpdate(P.gu);
  ColumnParallel(tmp_s.data(), P.gu, A.gu.data(), A.xn2_g);
  {
    trace::Scope span("swiglu", trace::Category::kCompute);
    SwiGluForward(A.gu.data(), S, fl, A.act.data());
  }
  ApplyUpdate(P.down);
  // Under the reduce-scatter: the next block's attention updates and this
  // block's MLP W^T.
  RowParallel(A.act.data(), P.down, tmp_s.data(), [&] {
    if (l + 1 < L) ApplyUpdates({bp[l + 1].qkv, bp[l + 1].o});
    RefreshTransposes({P.gu, P.down});
  });
  for (size_t i = 0; i < s * h; ++i) out[i] = A.x1[i] + tmp_s[i];
}

// ------------------------------------------------------------------- MoE
//
// The MoE MLP works on this rank's s rows (its sequence-parallel shard; the
// experts are not split over TP) with expert parallelism over grid.ep:
//   xn = RMSNorm(x1); probs = softmax(xn Wr); top-k -> ids, gates  local
//   y1 = AllToAllMatmul(xn per slot, W13 of the experts)   dispatch + gate|up
//   act = silu(gate) * up                                  expert side
//   ys = MatmulAllToAll(act, W2)                           down + combine
//   x' = x1 + sum_j gates[t, j] ys[t k + j]                token side
// The routing is made per SLOT (token t's choice j is "token" t k + j of a
// top-1 routing). The dispatch then sends exactly the rows a top-k routing
// would (one per routed slot), and the combine returns each slot's expert
// output unweighted, which backward needs for the gate gradient
// (dgate = dout . ys); backward's dispatch likewise sends each slot its own
// gradient row (gate * dout). The gate weighting is a few multiply-adds per
// slot on the token side.

void Transformer::Impl::MoeForward(size_t l, float* out) {
  BlockActs& A = acts[l];
  MoeActs& M = moe_acts[l];
  const BlockParams& P = bp[l];
  ApplyUpdates({P.egu, P.edown});  // normally done under the o reduce-scatter
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormForward(A.x1.data(), params[P.norm2].w, s, h, cfg.norm_eps, M.xn.data(),
                   A.rstd2.data());
  }
  {
    trace::Scope span("router", trace::Category::kCompute, GemmFlops(s, E, h));
    float* logits = m_dlogits.data();
    Gemm(s, E, h, M.xn.data(), params[P.router].w, logits);
    RouterForward(logits, s, E, K, M.probs.data(), M.ids.data(), M.gates.data());
    // This rank's share of the load-balancing statistics (summed over the
    // world with the loss).
    double* st = loss_local.data() + 1 + 2 * E * moe_index[l];
    std::fill(st, st + 2 * E, 0.0);
    for (size_t i = 0; i < s * K; ++i) st[M.ids[i]] += 1.0;
    for (size_t t = 0; t < s; ++t) {
      for (size_t e = 0; e < E; ++e) st[E + e] += M.probs[t * E + e];
    }
  }
  M.routing = MoeRoute(grid.ep, M.ids.data(), s * K, /*topk=*/1, static_cast<int>(E),
                       cfg.fused.timeout);
  const size_t R = M.routing.num_received();
  M.xd.resize(R * h * esz);
  M.gu.resize(R * 2 * Fm);
  M.act.resize(R * Fm);
  float* xs = m_dxs.data();  // [s k x h]: each slot's token row
  for (size_t i = 0; i < s * K; ++i) std::memcpy(xs + i * h, &M.xn[(i / K) * h], h * sizeof(float));
  {
    trace::Scope span(params[P.egu].span_fwd, trace::Category::kHost);
    AllToAllMatmulSync(grid.ep, M.routing, op_a.Set(xs, s * K * h, dt), h, W(P.egu), 2 * Fm, dt,
                       M.gu.data(), M.xd.data(), Fused());
  }
  {
    trace::Scope span("swiglu", trace::Category::kCompute);
    SwiGluForward(M.gu.data(), R, Fm, M.act.data());
  }
  {
    trace::Scope span(params[P.edown].span_fwd, trace::Category::kHost);
    MatmulAllToAllSync(grid.ep, M.routing, op_a.Set(M.act.data(), R * Fm, dt), Fm, W(P.edown), h,
                       dt, M.yslot.data(), /*probs=*/nullptr, Fused());
  }
  {
    trace::Scope span("moe.combine", trace::Category::kCompute);
    for (size_t t = 0; t < s; ++t) {
      float* o = tmp_s.data() + t * h;
      std::fill(o, o + h, 0.0f);
      for (size_t j = 0; j < K; ++j) {  // j ascending: a fixed order
        const float g = M.gates[t * K + j];
        const float* y = M.yslot.data() + (t * K + j) * h;
        for (size_t c = 0; c < h; ++c) o[c] += g * y[c];
      }
    }
    for (size_t i = 0; i < s * h; ++i) out[i] = A.x1[i] + tmp_s[i];
  }
}

// grad(W) of stacked experts [El x k x n]: expert le's = a_le^T b_le over
// its rows (expert-grouped order; a [R x k], b [R x n], GEMM dtype).
void Transformer::Impl::ExpertWgrad(const MoeRouting& r, const void* a, size_t k, const void* b,
                                    size_t n, int p) {
  Param& P = params[p];
  const char* ac = static_cast<const char*>(a);
  const char* bc = static_cast<const char*>(b);
  size_t first = 0;
  for (size_t le = 0; le < El; ++le) {
    const size_t rows = r.expert_rows(static_cast<int>(le));
    float* g = P.g + le * k * n;
    if (rows == 0) {
      std::fill(g, g + k * n, 0.0f);  // an expert no token chose this step
      continue;
    }
    trace::Scope span("wgrad", trace::Category::kCompute, GemmFlops(k, n, rows));
    GemmOptions o;
    o.trans_a = true;
    Gemm(k, n, rows, dt, ac + first * k * esz, bc + first * n * esz, DType::kF32, g, o);
    first += rows;
  }
}

// dout: the gradient of the block's output -> member dx1.
void Transformer::Impl::MoeBackward(size_t l, const float* dout) {
  BlockActs& A = acts[l];
  MoeActs& M = moe_acts[l];
  const BlockParams& P = bp[l];
  const MoeRouting& r = M.routing;
  const size_t R = r.num_received();
  {
    // x' = x1 + sum_j g_tj ys_tj: dg_tj = dout_t . ys_tj, dys_tj = g_tj dout_t.
    trace::Scope span("moe.combine.backward", trace::Category::kCompute);
    for (size_t i = 0; i < s * K; ++i) {
      const float* dy = dout + (i / K) * h;
      const float* y = M.yslot.data() + i * h;
      const float g = M.gates[i];
      float dg = 0.0f;
      for (size_t c = 0; c < h; ++c) {
        dg += dy[c] * y[c];
        m_dys[i * h + c] = g * dy[c];
      }
      m_dgates[i] = dg;
    }
  }
  m_dyd.resize(R * h * esz);
  m_dact.resize(R * Fm);
  m_dgu.resize(R * 2 * Fm);
  // Down projection + combine, backward: dispatch dys, times W2^T (keeping
  // the dispatched dys for W2's gradient).
  {
    trace::Scope span(params[P.edown].span_dgrad, trace::Category::kHost);
    FusedOptions o = Fused();
    o.overlap_work = TakeDeferred();  // the attention above's qkv wgrad
    AllToAllMatmulSync(grid.ep, r, op_a.Set(m_dys.data(), s * K * h, dt), h, WT(P.edown), Fm, dt,
                       m_dact.data(), m_dyd.data(), o);
  }
  {
    trace::Scope span("swiglu", trace::Category::kCompute);
    SwiGluBackward(M.gu.data(), m_dact.data(), R, Fm, m_dgu.data());
  }
  // Dispatch + gate|up, backward: dgu times W13^T, combined back to the
  // slots. The experts' wgrads need neither its transfers nor its result:
  // they are its overlap work.
  {
    trace::Scope span(params[P.egu].span_dgrad, trace::Category::kHost);
    FusedOptions o = Fused();
    o.overlap_work = [&] {
      ExpertWgrad(r, op_c.Set(M.act.data(), R * Fm, dt), Fm, m_dyd.data(), h, P.edown);
      ExpertWgrad(r, M.xd.data(), h, op_b.Set(m_dgu.data(), R * 2 * Fm, dt), 2 * Fm, P.egu);
    };
    MatmulAllToAllSync(grid.ep, r, op_a.Set(m_dgu.data(), R * 2 * Fm, dt), 2 * Fm, WT(P.egu), h,
                       dt, m_dxs.data(), /*probs=*/nullptr, o);
  }
  {
    trace::Scope span("router.backward", trace::Category::kCompute, 2 * GemmFlops(s, E, h));
    const float* dprob_all = nullptr;
    if (cfg.moe_aux_loss_coef > 0.0f) {
      // d aux / d p_te = coef E f_e / N, from the global loads: the
      // forward's loss all-reduce carries them (it is ahead of this layer's
      // operators on the progress thread, so this wait costs nothing more).
      loss_work.Wait();
      const double N = static_cast<double>(cfg.batch) * static_cast<double>(T);
      const double* st = loss_total.data() + 1 + 2 * E * moe_index[l];
      for (size_t e = 0; e < E; ++e) {
        m_dprob[e] = static_cast<float>(cfg.moe_aux_loss_coef * static_cast<double>(E) *
                                        (st[e] / (N * K)) / N);
      }
      dprob_all = m_dprob.data();
    }
    RouterBackward(M.probs.data(), M.ids.data(), m_dgates.data(), dprob_all, s, E, K,
                   m_dlogits.data());
    // dxn = sum_j dxs_tj + dlogits Wr^T; grad(Wr) = xn^T dlogits.
    GemmOptions od;
    od.trans_b = true;
    Gemm(s, h, E, m_dlogits.data(), params[P.router].w, dtmp.data(), od);
    for (size_t t = 0; t < s; ++t) {
      for (size_t j = 0; j < K; ++j) {
        const float* dxs = m_dxs.data() + (t * K + j) * h;
        for (size_t c = 0; c < h; ++c) dtmp[t * h + c] += dxs[c];
      }
    }
    GemmOptions ow;
    ow.trans_a = true;
    Gemm(h, E, s, M.xn.data(), m_dlogits.data(), params[P.router].g, ow);
  }
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormBackward(A.x1.data(), params[P.norm2].w, A.rstd2.data(), dtmp.data(), s, h,
                    dx1.data(), params[P.norm2].g);
    for (size_t i = 0; i < s * h; ++i) dx1[i] += dout[i];
  }
  if (pending_bucket >= 0) IssueSync(pending_bucket);
  pending_bucket = 2 + 2 * static_cast<int>(l);
}

void Transformer::Impl::Forward(int step) {
  // Deferred updates: the replicated tensors' now (small, and the
  // embedding is needed first); the projections' as the blocks come.
  for (size_t pi = 0; pi < params.size(); ++pi) {
    if (buckets[params[pi].bucket].sync == Sync::kWorld) ApplyUpdate(static_cast<int>(pi));
  }
  RefreshWeights();
  // This rank's rows of its DP slice of the global batch.
  MakeBatch(cfg, step, static_cast<int64_t>(grid.dp_rank) * Bl, static_cast<int>(Bl),
            static_cast<int64_t>(grid.tp_rank * s), static_cast<int64_t>((grid.tp_rank + 1) * s),
            inputs.data(), targets.data());
  std::vector<float> x(s * h), y(s * h);
  {
    trace::Scope span("embedding", trace::Category::kCompute);
    for (size_t i = 0; i < s; ++i) {
      std::memcpy(&x[i * h], params[p_embed].w + static_cast<size_t>(inputs[i]) * h,
                  h * sizeof(float));
    }
  }
  for (size_t l = 0; l < L; ++l) {
    trace::Scope span(block_span_fwd[l], trace::Category::kHost);
    auto t0 = Clock::now();
    AttentionSublayerForward(l, x.data());
    if (is_moe[l]) {
      MoeForward(l, y.data());
    } else {
      MlpForward(l, y.data());
    }
    block_fwd_s[l] = Since(t0);
    std::swap(x, y);
  }
  double local;
  {
    trace::Scope span("lm_head", trace::Category::kCompute, GemmFlops(s, V, h));
    x_final = x;
    RmsNormForward(x.data(), params[p_final_norm].w, s, h, cfg.norm_eps, xf.data(),
                   rstd_f.data());
    Gemm(s, V, h, xf.data(), params[p_lm_head].w, logits.data());
    local = CrossEntropy(logits.data(), targets.data(), s, V, grad_scale, dlogits.data());
  }
  ApplyAllUpdates();  // any left (none when every block ran): backward writes the gradients
  // The global mean: a sum over every rank's rows (f64, deterministic
  // order), in the background: backward does not need it, and a blocking
  // call here would make every rank wait for the slowest one's forward.
  // (The MoE layers' load statistics ride along: loss_local[1..].)
  loss_local[0] = local;
  loss_total = loss_local;
  if (grid.world.size() > 1) {
    CollectiveOptions o;
    o.may_run_inline = false;
    loss_work = AllReduce(grid.world, loss_local.data(), loss_total.data(), loss_local.size(),
                          DType::kF64, ReduceOp::kSum, o);
  }
}

double Transformer::Impl::WaitLoss() {
  loss_work.Wait();
  loss_work = Work();
  const double N = static_cast<double>(cfg.batch) * static_cast<double>(T);
  // Per MoE layer: coef * E * sum_e f_e P_e, f_e = slots_e / (N k),
  // P_e = (sum of p_e over the N tokens) / N; from the global sums, so the
  // same on every rank and every grid.
  aux_loss = 0;
  for (size_t m = 0; 1 + 2 * E * m < loss_total.size(); ++m) {
    const double* st = loss_total.data() + 1 + 2 * E * m;
    double sum = 0;
    for (size_t e = 0; e < E; ++e) sum += st[e] / (N * K) * (st[E + e] / N);
    aux_loss += cfg.moe_aux_loss_coef * static_cast<double>(E) * sum;
  }
  return loss_total[0] / N + aux_loss;
}

// ----------------------------------------------------------------- backward

void Transformer::Impl::IssueSync(int bucket) {
  Bucket& b = buckets[bucket];
  const Group& g = b.sync == Sync::kWorld ? grid.world
                   : b.sync == Sync::kDp  ? grid.dp
                                          : grid.edp;
  if (g.size() == 1 || b.g.empty()) return;
  // In the background even if small: it is meant to run under the wgrads.
  CollectiveOptions o;
  o.may_run_inline = false;
  Work w = AllReduce(g, b.g.data(), b.g.data(), b.g.size(), DType::kF32, ReduceOp::kSum, o);
  if (b.sync == Sync::kWorld) world_sync = w;
  else sync_works.push_back(w);
}

double Transformer::Impl::WaitSync() {
  auto t0 = Clock::now();
  trace::Scope span("grad_sync.wait", trace::Category::kWait);
  for (auto& w : sync_works) w.Wait();
  sync_works.clear();
  if (!defer_world_sync) {
    world_sync.Wait();
    world_sync = Work();
  }
  return Since(t0);
}

// dout: the gradient of the block's output -> member dx1, the gradient at
// the attention residual x1.
void Transformer::Impl::MlpBackward(size_t l, const float* dxio) {
  BlockActs& A = acts[l];
  const BlockParams& P = bp[l];
  // ---- MLP: dgrad chain.
  float* dact = dS1.data();
  // dy_g = gathered dxio; under its transfers, the deferred wgrad of the
  // attention above (qkv of block l + 1).
  RowParallelDgrad(dxio, P.down, dact, TakeDeferred());
  {
    trace::Scope span("swiglu", trace::Category::kCompute);
    SwiGluBackward(A.gu.data(), dact, S, fl, dS2.data());
  }
  // The wgrads need neither the reduce-scatter nor its result: down's runs
  // under it; gate_up's under the attention's o dgrad all-gather, which
  // has little compute of its own to hide its transfers (its dS2 and xn2_g
  // are not touched before).
  ColumnParallelDgrad(dS2.data(), P.gu, dtmp.data(), [&] {
    Wgrad(op_c.Set(A.act.data(), S * fl, dt), dy_g.data(), P.down);
  });
  deferred_wgrad = [this, l] {
    Wgrad(acts[l].xn2_g.data(), op_b.Set(dS2.data(), S * 2 * fl, dt), bp[l].gu);
  };
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormBackward(A.x1.data(), params[P.norm2].w, A.rstd2.data(), dtmp.data(), s, h,
                    dx1.data(), params[P.norm2].g);
    for (size_t i = 0; i < s * h; ++i) dx1[i] += dxio[i];
  }
  // Issued after this sublayer's operators (the progress thread runs tasks
  // in order: earlier, it would hold back their collectives): the previous
  // sublayer's gradients travel under the next sublayer's compute.
  if (pending_bucket >= 0) IssueSync(pending_bucket);
  pending_bucket = 2 + 2 * static_cast<int>(l);
}

// dx1 (the gradient at the attention residual, in member dx1) -> dxio.
void Transformer::Impl::AttentionSublayerBackward(size_t l, float* dxio) {
  BlockActs& A = acts[l];
  const BlockParams& P = bp[l];
  const size_t hd = hl * d, ld_qkv = 3 * hd;
  // ---- Attention: dgrad chain.
  float* dctx = dS1.data();
  // Under its transfers: the MLP's deferred gate_up wgrad.
  RowParallelDgrad(dx1.data(), P.o, dctx, TakeDeferred());
  {
    trace::Scope span("attention", trace::Category::kCompute,
                      8 * static_cast<uint64_t>(Bl * hl) * T * T * d);
    const size_t ld = Bl * ld_qkv;
    for (size_t b = 0; b < Bl; ++b) {
      for (size_t j = 0; j < hl; ++j) {
        const float* q = A.qkv.data() + b * ld_qkv + j * d;
        float* dq = dS3.data() + b * ld_qkv + j * d;
        AttentionBackward(q, q + hd, q + 2 * hd, A.probs.data() + (b * hl + j) * T * T,
                          dctx + b * hd + j * d, T, d, ld, ld, ld, Bl * hd, dq, dq + hd,
                          dq + 2 * hd, att_scratch.data());
      }
    }
    for (size_t row = 0; row < S; ++row) {
      const size_t t = row / Bl;
      float* dq = dS3.data() + row * ld_qkv;
      for (size_t j = 0; j < hl; ++j) {
        RopeApply(rope, t, dq + j * d, true);
        RopeApply(rope, t, dq + hd + j * d, true);
      }
    }
  }
  // o's wgrad under the reduce-scatter; qkv's too in the first block, else
  // it is deferred to the next block's first dgrad operator (the down
  // projection's all-gather, whose own GEMM is too small to hide its
  // transfers); dS3 and xn1_g are not touched before.
  ColumnParallelDgrad(dS3.data(), P.qkv, dtmp.data(), [&] {
    Wgrad(op_c.Set(A.ctx.data(), S * hd, dt), dy_g.data(), P.o);
    if (l == 0) Wgrad(A.xn1_g.data(), op_b.Set(dS3.data(), S * ld_qkv, dt), P.qkv);
  });
  if (l > 0) {
    deferred_wgrad = [this, l, ld_qkv] {
      Wgrad(acts[l].xn1_g.data(), op_b.Set(dS3.data(), S * ld_qkv, dt), bp[l].qkv);
    };
  }
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormBackward(A.x.data(), params[P.norm1].w, A.rstd1.data(), dtmp.data(), s, h, dxio,
                    params[P.norm1].g);
    for (size_t i = 0; i < s * h; ++i) dxio[i] += dx1[i];
  }
  IssueSync(pending_bucket);
  pending_bucket = 1 + 2 * static_cast<int>(l);
}

void Transformer::Impl::Backward() {
  // Replicated gradients accumulate (norms, embedding); the projections'
  // are written by their wgrad GEMM.
  std::fill(buckets[0].g.begin(), buckets[0].g.end(), 0.0f);
  pending_bucket = -1;
  deferred_wgrad = nullptr;
  EnsureTransposes();  // normally made during the forward (RefreshTransposes)
  {
    trace::Scope span("lm_head.backward", trace::Category::kCompute, 2 * GemmFlops(s, V, h));
    GemmOptions ow;
    ow.trans_a = true;  // dW = xf^T dlogits
    Gemm(h, V, s, xf.data(), dlogits.data(), params[p_lm_head].g, ow);
    GemmOptions od;
    od.trans_b = true;  // dxf = dlogits W^T
    Gemm(s, h, V, dlogits.data(), params[p_lm_head].w, tmp_s.data(), od);
    RmsNormBackward(x_final.data(), params[p_final_norm].w, rstd_f.data(), tmp_s.data(), s, h,
                    dx.data(), params[p_final_norm].g);
  }
  for (size_t l = L; l-- > 0;) {
    trace::Scope span(block_span_bwd[l], trace::Category::kHost);
    auto t0 = Clock::now();
    if (is_moe[l]) {
      MoeBackward(l, dx.data());
    } else {
      MlpBackward(l, dx.data());
    }
    AttentionSublayerBackward(l, dx.data());
    block_bwd_s[l] = Since(t0);
  }
  {
    trace::Scope span("embedding.backward", trace::Category::kCompute);
    float* ge = params[p_embed].g;
    for (size_t i = 0; i < s; ++i) {
      float* row = ge + static_cast<size_t>(inputs[i]) * h;
      for (size_t c = 0; c < h; ++c) row[c] += dx[i * h + c];
    }
  }
  if (deferred_wgrad) TakeDeferred()();  // (block 0 defers nothing)
  if (pending_bucket >= 0) IssueSync(pending_bucket);
  IssueSync(0);
  pending_bucket = -1;
}

// ------------------------------------------------------------------ public

Transformer::Transformer(const ProcessGrid& grid, const TransformerConfig& config)
    : impl_(std::make_unique<Impl>(grid, config)) {}

Transformer::~Transformer() {
  // Never leave an all-reduce running on buffers that are about to go.
  impl_->sync_works.push_back(impl_->loss_work);
  impl_->sync_works.push_back(impl_->world_sync);
  for (auto& w : impl_->sync_works) {
    try {
      w.Wait();
    } catch (...) {
    }
  }
}

double Transformer::Loss(int step) {
  trace::Scope span("forward", trace::Category::kHost);
  impl_->Forward(step);
  return impl_->WaitLoss();
}

double Transformer::ForwardBackward(int step, StepStats* stats) {
  Impl& m = *impl_;
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
  double wait = m.WaitSync();
  loss = m.WaitLoss();
  m.has_grads = true;
  if (stats != nullptr) {
    stats->step = step;
    stats->loss = loss;
    stats->aux_loss = m.aux_loss;
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
  Impl& m = *impl_;
  if (!m.has_grads) {
    throw Error(ErrorCode::kInvalidArgument,
                "Transformer::OptimizerStep: no gradients (call ForwardBackward first)");
  }
  auto t0 = Clock::now();
  trace::Scope span("optimizer", trace::Category::kHost);
  ++m.opt_step;
  if (m.updates_deferred) {
    // TrainStep: the next forward applies the updates (Impl::update_pending),
    // and waits for the world all-reduce before the first it needs.
    std::fill(m.update_pending.begin(), m.update_pending.end(), 1);
    ++m.version;
    m.has_grads = false;
    if (stats != nullptr) stats->optimizer_seconds = Since(t0);
    return;
  }
  // Each tensor's update is independent of the others': the world-reduced
  // ones (bucket 0) go last, after their all-reduce, which the others'
  // updates hide when TrainStep left it running (defer_world_sync).
  auto adamw = [&](bool world) {
    trace::Scope adam("adamw", trace::Category::kCompute);
    for (size_t pi = 0; pi < m.params.size(); ++pi) {
      if ((m.buckets[m.params[pi].bucket].sync == Sync::kWorld) != world) continue;
      m.AdamWUpdate(static_cast<int>(pi));
    }
  };
  adamw(false);
  double world_wait = 0;  // counted as gradient-sync wait, not optimizer time
  {
    auto w0 = Clock::now();
    trace::Scope wait("grad_sync.wait", trace::Category::kWait);
    m.world_sync.Wait();
    m.world_sync = Work();
    world_wait = Since(w0);
  }
  adamw(true);
  ++m.version;
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
  impl_->defer_world_sync = true;
  try {
    ForwardBackward(step, &st);
  } catch (...) {
    impl_->defer_world_sync = false;
    throw;
  }
  impl_->defer_world_sync = false;
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
  impl_->ApplyAllUpdates();  // the values TrainStep's optimizer left deferred
  std::vector<ParamView> out;
  for (const Param& p : impl_->params) {
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
  impl_->ApplyAllUpdates();
  ++impl_->version;
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
