#include "models/parameters.h"

#include <algorithm>
#include <cmath>

#include "mc2/ops.h"
#include "mc2/trace.h"
#include "models/kernels.h"

namespace mc2::models {

ParamStore::ParamStore(const Dims& dims, const ProcessGrid& grid, const TransformerConfig& cfg,
                       std::function<void()> wait_world_grads)
    : dims_(dims), grid_(grid), cfg_(cfg), wait_world_grads_(std::move(wait_world_grads)) {
  Layout();
  for (auto& b : buckets) {
    b.w.assign(b.w.size(), 0.0f);
    b.m.assign(b.w.size(), 0.0f);
    b.v.assign(b.w.size(), 0.0f);
  }
  for (auto& p : list_) {
    p.w = buckets[p.bucket].w.data() + p.offset;
  }
  cache_.resize(list_.size());
  update_pending_.assign(list_.size(), 0);
  is_gemm_param_.assign(list_.size(), 0);
  for (auto [pi, blocks] : gemm_params_) is_gemm_param_[pi] = 1;
  Init();
}

void ParamStore::Add(const std::string& name, size_t rows, size_t cols, bool replicated, bool decay,
                     int bucket, int* index) {
  Param p;
  p.name = name;
  p.rows = rows;
  p.cols = cols;
  p.replicated = replicated;
  p.decay = decay;
  p.bucket = bucket;
  p.offset = buckets[bucket].w.size();
  buckets[bucket].w.resize(p.offset + rows * cols);
  *index = static_cast<int>(list_.size());
  list_.push_back(p);
}

// The tensors in a fixed order (the order of Transformer::Parameters), their
// buckets, the span names of their fused calls and which have GEMM copies.
void ParamStore::Layout() {
  const size_t L = dims_.L, h = dims_.h, hl = dims_.hl, d = dims_.d, fl = dims_.fl;
  const size_t E = dims_.E, El = dims_.El, Fm = dims_.Fm;
  buckets.resize(1 + 2 * L);
  buckets[0].sync = Sync::kWorld;
  Add("embed", dims_.V, h, true, false, 0, &p_embed);
  bp.resize(L);
  for (size_t l = 0; l < L; ++l) {
    std::string b = "block" + std::to_string(dims_.L0 + l);
    Add(b + ".norm1", 1, h, true, false, 0, &bp[l].norm1);
    Add(b + ".attn.qkv", h, 3 * hl * d, false, true, 1 + 2 * l, &bp[l].qkv);
    Add(b + ".attn.o", hl * d, h, false, true, 1 + 2 * l, &bp[l].o);
    Add(b + ".norm2", 1, h, true, false, 0, &bp[l].norm2);
    if (!dims_.is_moe[l]) {
      Add(b + ".mlp.gate_up", h, 2 * fl, false, true, 2 + 2 * l, &bp[l].gu);
      Add(b + ".mlp.down", fl, h, false, true, 2 + 2 * l, &bp[l].down);
    } else {
      // The router is replicated everywhere (its gradient summed over the
      // world, with the other replicated tensors); the experts live on
      // their EP rank, replicated over grid.edp.
      buckets[2 + 2 * l].sync = Sync::kExpert;
      Add(b + ".moe.router", h, E, true, true, 0, &bp[l].router);
      Add(b + ".moe.gate_up", El * h, 2 * Fm, true, true, 2 + 2 * l, &bp[l].egu);
      Add(b + ".moe.down", El * Fm, h, true, true, 2 + 2 * l, &bp[l].edown);
      list_[bp[l].egu].experts = true;
      list_[bp[l].edown].experts = true;
    }
  }
  for (size_t l = 0; l < L; ++l) {
    for (int pi : {bp[l].qkv, bp[l].gu}) {  // column parallel
      if (pi < 0) continue;
      list_[pi].span_fwd = list_[pi].name + ".all_gather_matmul";
      list_[pi].span_dgrad = list_[pi].name + ".dgrad.matmul_reduce_scatter";
    }
    for (int pi : {bp[l].o, bp[l].down}) {  // row parallel
      if (pi < 0) continue;
      list_[pi].span_fwd = list_[pi].name + ".matmul_reduce_scatter";
      list_[pi].span_dgrad = list_[pi].name + ".dgrad.all_gather_matmul";
    }
    if (dims_.is_moe[l]) {
      // Forward: dispatch + gate|up, down + combine; backward the reverse
      // operators (docs/models.md).
      Param& gu = list_[bp[l].egu];
      gu.span_fwd = gu.name + ".all_to_all_matmul";
      gu.span_dgrad = gu.name + ".dgrad.matmul_all_to_all";
      Param& dn = list_[bp[l].edown];
      dn.span_fwd = dn.name + ".matmul_all_to_all";
      dn.span_dgrad = dn.name + ".dgrad.all_to_all_matmul";
      gemm_params_.push_back({bp[l].egu, El});
      gemm_params_.push_back({bp[l].edown, El});
    } else {
      gemm_params_.push_back({bp[l].gu, 1});
      gemm_params_.push_back({bp[l].down, 1});
    }
    gemm_params_.push_back({bp[l].qkv, 1});
    gemm_params_.push_back({bp[l].o, 1});
  }
  Add("final_norm", 1, h, true, false, 0, &p_final_norm);
  Add("lm_head", h, dims_.V, true, true, 0, &p_lm_head);
}

void ParamStore::Init() {
  // Every element is a function of (seed, tensor, GLOBAL index), so a shard
  // holds exactly its part of the model any grid would build. Linear layers
  // are uniform with std 1/sqrt(fan_in) (the output projections also
  // / sqrt(2 L), GPT-2 style, to keep the residual stream's scale); norms 1;
  // the embedding has std 1.
  const size_t L = dims_.L, h = dims_.h, hl = dims_.hl, d = dims_.d, f = dims_.f, fl = dims_.fl,
               E = dims_.E, El = dims_.El, Fm = dims_.Fm, V = dims_.V;
  const float k3 = 1.7320508f;  // uniform [-a, a) has std a / sqrt(3)
  auto fill = [&](int pi, uint64_t stream, float stdev, auto global_index) {
    Param& p = list_[pi];
    for (size_t r = 0; r < p.rows; ++r) {
      for (size_t c = 0; c < p.cols; ++c) {
        p.w[r * p.cols + c] = k3 * stdev * HashUniform(cfg_.seed, stream, global_index(r, c));
      }
    }
  };
  const size_t rank = grid_.tp_rank;
  const float out_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(dims_.L_model));
  fill(p_embed, 1, 1.0f, [&](size_t r, size_t c) { return r * h + c; });
  for (size_t l = 0; l < L; ++l) {
    const uint64_t base = 16 + 8 * (dims_.L0 + l);  // the model's block
    std::fill(list_[bp[l].norm1].w, list_[bp[l].norm1].w + h, 1.0f);
    std::fill(list_[bp[l].norm2].w, list_[bp[l].norm2].w + h, 1.0f);
    // Wqkv [h x 3h] globally: q | k | v, each heads x d columns; this rank
    // has heads [rank hl, (rank+1) hl) of each part.
    fill(bp[l].qkv, base + 0, 1.0f / std::sqrt(float(h)), [&](size_t r, size_t c) {
      size_t part = c / (hl * d), within = c % (hl * d);
      return r * 3 * h + part * h + rank * hl * d + within;
    });
    // Wo [h x h] globally: rows by input head; this rank has its heads' rows.
    fill(bp[l].o, base + 1, out_scale / std::sqrt(float(h)),
         [&](size_t r, size_t c) { return (rank * hl * d + r) * h + c; });
    if (dims_.is_moe[l]) {
      // Router [h x E]; expert e's gate|up [h x 2F] and down [F x h],
      // indexed by the GLOBAL expert e = ep_rank El + local one, so every
      // EP grid builds the same experts.
      const size_t e0 = static_cast<size_t>(grid_.ep_rank) * El;
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
  std::fill(list_[p_final_norm].w, list_[p_final_norm].w + h, 1.0f);
  fill(p_lm_head, 2, 1.0f / std::sqrt(float(h)), [&](size_t r, size_t c) { return r * V + c; });
  ++version_;
}

// ------------------------------------------------------------ GEMM copies

void ParamStore::RefreshWeights() {
  trace::Scope span("convert_weights", trace::Category::kCompute);
  for (auto [pi, blocks] : gemm_params_) {
    Cached& c = cache_[pi];
    c.blocks = blocks;
    // A deferred update makes its tensor's copies when it is applied.
    if (update_pending_[pi]) continue;
    const Param& p = list_[pi];
    if (dims_.dt != DType::kF32 && c.w_version != version_) {
      const size_t n = p.rows * p.cols;
      c.w.resize(n * dims_.esz);
      ConvertF32ToBF16(p.w, reinterpret_cast<bf16*>(c.w.data()), n);
      c.w_version = version_;
    }
    if (p.experts) RefreshTranspose(pi);
  }
}

// W^T of one projection (each stacked matrix transposed), in the GEMM dtype.
void ParamStore::RefreshTranspose(int pi) {
  ApplyUpdate(pi);
  Cached& c = cache_[pi];
  if (c.wt_version == version_) return;
  const DType dt = dims_.dt;
  const Param& p = list_[pi];
  const size_t n = p.rows * p.cols, rb = p.rows / c.blocks;
  // f32: transposed straight into the cache (a vector<char> from operator
  // new, aligned for floats); bf16: through an f32 scratch, then rounded.
  c.wt.resize(n * dims_.esz);
  if (dt != DType::kF32) transpose_scratch_.resize(n);
  float* t = dt == DType::kF32 ? reinterpret_cast<float*>(c.wt.data()) : transpose_scratch_.data();
  for (size_t b = 0; b < c.blocks; ++b) {
    Transpose(p.w + b * rb * p.cols, rb, p.cols, t + b * rb * p.cols);
  }
  if (dt != DType::kF32) ConvertF32ToBF16(t, reinterpret_cast<bf16*>(c.wt.data()), n);
  c.wt_version = version_;
}

// ------------------------------------------------------------------ AdamW
// TrainStep leaves the updates of step t to the forward of step t+1, which
// applies each tensor's just before it is used, and the projection
// matrices' earlier, as the overlap work of the forward's reduce-scatters
// and all-gathers: the forward has nothing else independent of them to hide
// their transfers behind. Every update is the same elementwise AdamW on the
// same gradient and moments, so the weights (and the losses) are bitwise
// those of updating at once.

void ParamStore::AdamWUpdate(int pi) {
  const Param& p = list_[pi];
  Bucket& b = buckets[p.bucket];
  AdamW(p.w, p.g, b.m.data() + p.offset, b.v.data() + p.offset, p.rows * p.cols, opt_step_, cfg_.lr,
        cfg_.beta1, cfg_.beta2, cfg_.adam_eps, p.decay ? cfg_.weight_decay : 0.0f);
}

void ParamStore::UpdateAll(bool world) {
  trace::Scope adam("adamw", trace::Category::kCompute);
  for (size_t pi = 0; pi < list_.size(); ++pi) {
    if (world_synced(static_cast<int>(pi)) != world) continue;
    AdamWUpdate(static_cast<int>(pi));
  }
}

void ParamStore::DeferUpdates() {
  std::fill(update_pending_.begin(), update_pending_.end(), 1);
  ++version_;
}

void ParamStore::ApplyUpdate(int pi) {
  if (pi < 0 || !update_pending_[pi]) return;
  trace::Scope span("adamw", trace::Category::kCompute);
  if (world_synced(pi)) wait_world_grads_();
  AdamWUpdate(pi);
  update_pending_[pi] = 0;
  // Its GEMM copies: the bf16 W now (the forward is about to use it), the
  // experts' W^T too (their forward uses it).
  Cached& c = cache_[pi];
  c.wt_version = ~0ull;
  if (!is_gemm_param_[pi]) return;
  const Param& p = list_[pi];
  if (dims_.dt != DType::kF32) {
    const size_t n = p.rows * p.cols;
    c.w.resize(n * dims_.esz);
    ConvertF32ToBF16(p.w, reinterpret_cast<bf16*>(c.w.data()), n);
    c.w_version = version_;
  }
  if (p.experts) RefreshTranspose(pi);
}

void ParamStore::ApplyAllUpdates() {
  for (size_t pi = 0; pi < list_.size(); ++pi) ApplyUpdate(static_cast<int>(pi));
}

}  // namespace mc2::models
