// The dense transformer's units for FsdpTransformer (fsdp_layers.h): the
// reference model's block at tp = 1,
//   x1 = x + Wo(attention(RoPE(Wqkv RMSNorm(x))))
//   x' = x1 + Wdown(SwiGLU(Wgu RMSNorm(x1)))
// with plain GEMMs on the gathered weights.
#include "models/fsdp_layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mc2/gemm.h"
#include "mc2/trace.h"
#include "models/data.h"

namespace mc2::models {

size_t FsdpTensor::GlobalIndex(size_t index) const {
  const size_t i = index / cols, j = index % cols;
  const size_t gc = part == 0 ? j : (j / part) * part_global + part_offset + j % part;
  return (row0 + i) * (global_cols == 0 ? cols : global_cols) + gc;
}

std::vector<FsdpUnit> FsdpLayout(const TransformerConfig& c, int ranks, int tp, int tp_rank) {
  const size_t h = c.hidden, f = c.ffn, V = c.vocab, L = c.layers;
  const size_t p = static_cast<size_t>(tp), r = static_cast<size_t>(tp_rank);
  const size_t hd = h / p, fl = f / p;  // this TP rank's heads x head_dim, ffn columns
  const float out_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(L));
  std::vector<FsdpUnit> units(L + 2);
  auto add = [](FsdpUnit& u, std::string name, size_t rows, size_t cols, bool decay, bool ones,
                uint64_t stream, float stdev) -> FsdpTensor& {
    FsdpTensor t{std::move(name), rows, cols, u.numel, decay, ones, stream, stdev};
    u.numel += t.size();
    u.tensors.push_back(std::move(t));
    return u.tensors.back();
  };
  add(units[0], "embed", V, h, false, false, 1, 1.0f);
  for (size_t l = 0; l < L; ++l) {
    FsdpUnit& u = units[1 + l];
    const std::string b = "block" + std::to_string(l);
    const uint64_t base = 16 + 8 * l;
    add(u, b + ".norm1", 1, h, false, true, 0, 0);
    // Wqkv [h x 3h]: q | k | v, this rank's heads of each part. (Each
    // slice's fields are set before the next add: it may move the vector.)
    FsdpTensor* t =
        &add(u, b + ".attn.qkv", h, 3 * hd, true, false, base + 0, 1.0f / std::sqrt(float(h)));
    t->global_cols = 3 * h, t->part = hd, t->part_global = h, t->part_offset = r * hd;
    t->tp_replicated = p == 1;
    // Wo [h x h]: the rows of this rank's heads.
    t = &add(u, b + ".attn.o", hd, h, true, false, base + 1, out_scale / std::sqrt(float(h)));
    t->row0 = r * hd;
    t->tp_replicated = p == 1;
    add(u, b + ".norm2", 1, h, false, true, 0, 0);
    // Wgu [h x 2f]: gate | up, this rank's columns of each.
    t = &add(u, b + ".mlp.gate_up", h, 2 * fl, true, false, base + 2, 1.0f / std::sqrt(float(h)));
    t->global_cols = 2 * f, t->part = fl, t->part_global = f, t->part_offset = r * fl;
    t->tp_replicated = p == 1;
    // Wdown [f x h]: rows [r fl, (r+1) fl).
    t = &add(u, b + ".mlp.down", fl, h, true, false, base + 3, out_scale / std::sqrt(float(f)));
    t->row0 = r * fl;
    t->tp_replicated = p == 1;
  }
  add(units[L + 1], "final_norm", 1, h, false, true, 0, 0);
  add(units[L + 1], "lm_head", h, V, true, false, 2, 1.0f / std::sqrt(float(h)));
  for (FsdpUnit& u : units) u.shard = (u.numel + ranks - 1) / ranks;
  return units;
}

float FsdpInitValue(const TransformerConfig& c, const FsdpTensor& t, size_t index) {
  if (t.ones) return 1.0f;
  const float k3 = 1.7320508f;  // uniform [-a, a) has std a / sqrt(3)
  return k3 * t.stdev * HashUniform(c.seed, t.stream, t.GlobalIndex(index));
}

FsdpLayers::FsdpLayers(const TransformerConfig& c, int dp, int dp_rank, const Group& tp)
    : cfg_(c),
      tp_(tp),
      p_(static_cast<size_t>(tp.size())),
      tp_rank_(static_cast<size_t>(tp.rank())),
      V_(c.vocab),
      h_(c.hidden),
      heads_(c.heads),
      d_(c.hidden / c.heads),
      f_(c.ffn),
      T_(c.seq_len),
      Bl_(c.batch / dp),
      S_(T_ * Bl_),
      hl_(heads_ / p_),
      fl_(f_ / p_),
      s_(S_ / p_),
      dp_rank_(dp_rank),
      grad_scale_(1.0f / static_cast<float>(static_cast<double>(c.batch) * c.seq_len)),
      rope_(T_, d_, c.rope_base) {
  const size_t S = S_, s = s_, h = h_, hd = hl_ * d_, fl = fl_;
  inputs_.resize(s);
  targets_.resize(s);
  acts_.resize(c.layers);
  for (Acts& a : acts_) {
    a.x.resize(s * h);
    a.rstd1.resize(s);
    a.xn1.resize(S * h);
    a.qkv.resize(S * 3 * hd);
    a.probs.resize(Bl_ * hl_ * T_ * T_);
    a.ctx.resize(S * hd);
    a.x1.resize(s * h);
    a.rstd2.resize(s);
    a.xn2.resize(S * h);
    a.gu.resize(S * 2 * fl);
    a.act.resize(S * fl);
  }
  xL_.resize(s * h);
  rstdf_.resize(s);
  xf_.resize(s * h);
  logits_.resize(s * V_);
  dx_.resize(s * h);
  dx1_.resize(s * h);
  dtmp_.resize(S * h);
  dS_.resize(S * std::max({fl, V_}));
  gu_grad_.resize(S * 2 * fl);
  dqkv_.resize(S * 3 * hd);
  scratch_.resize(T_ * T_);
  if (p_ > 1) {
    xn_rows_.resize(s * h);
    dyg_.resize(S * h);
  }
}

void FsdpLayers::SetBatch(int step) {
  MakeBatch(cfg_, step, static_cast<int64_t>(dp_rank_) * static_cast<int64_t>(Bl_),
            static_cast<int>(Bl_), static_cast<int64_t>(tp_rank_ * s_),
            static_cast<int64_t>((tp_rank_ + 1) * s_), inputs_.data(), targets_.data());
}

uint64_t FsdpLayers::BlockFlops() const {
  const uint64_t S = S_, h = h_, hd = hl_ * d_, f = fl_;
  return 2 * S * (h * 3 * hd + hd * h + h * 2 * f + f * h) +
         4 * static_cast<uint64_t>(Bl_ * hl_) * T_ * T_ * d_;
}

// y [m x n] = a [m x k] w [k x n].
void FsdpLayers::Linear(const float* a, const float* w, size_t m, size_t k, size_t n, float* y) {
  trace::Scope span("matmul", trace::Category::kCompute, GemmFlops(m, n, k));
  Gemm(m, n, k, a, w, y);
}

// da = dy w^T (if da), dw = a^T dy (overwritten).
void FsdpLayers::LinearBackward(const float* a, const float* w, const float* dy, size_t m,
                                size_t k, size_t n, float* da, float* dw) {
  trace::Scope span("matmul", trace::Category::kCompute, 2 * GemmFlops(m, n, k));
  if (da != nullptr) {
    GemmOptions o;
    o.trans_b = true;
    Gemm(m, k, n, dy, w, da, o);
  }
  GemmOptions o;
  o.trans_a = true;
  Gemm(k, n, m, a, dy, dw, o);
}

void FsdpLayers::EmbedForward(const float* w) {
  trace::Scope span("embedding", trace::Category::kCompute);
  for (size_t row = 0; row < s_; ++row) {
    std::memcpy(xL_.data() + row * h_, w + static_cast<size_t>(inputs_[row]) * h_,
                h_ * sizeof(float));
  }
}

template <typename T>
FsdpLayers::BlockTensors<T> FsdpLayers::Block(T* base) const {
  const size_t h = h_, hd = hl_ * d_;
  BlockTensors<T> b;
  b.norm1 = base;
  b.qkv = b.norm1 + h;
  b.o = b.qkv + h * 3 * hd;
  b.norm2 = b.o + hd * h;
  b.gu = b.norm2 + h;
  b.down = b.gu + h * 2 * fl_;
  return b;
}
template FsdpLayers::BlockTensors<float> FsdpLayers::Block(float*) const;
template FsdpLayers::BlockTensors<const float> FsdpLayers::Block(const float*) const;

void FsdpLayers::BlockForward(size_t l, const float* w) {
  if (p_ > 1) {
    BlockForwardTp(l, w);
    return;
  }
  const size_t S = S_, h = h_, f = f_, T = T_, Bl = Bl_, d = d_, H = heads_;
  const BlockTensors<const float> W = Block(w);
  Acts& A = acts_[l];
  float* tmp = dtmp_.data();
  std::memcpy(A.x.data(), xL_.data(), S * h * sizeof(float));
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormForward(A.x.data(), W.norm1, S, h, cfg_.norm_eps, A.xn1.data(), A.rstd1.data());
  }
  Linear(A.xn1.data(), W.qkv, S, h, 3 * h, A.qkv.data());
  {
    trace::Scope span("attention", trace::Category::kCompute,
                      4 * static_cast<uint64_t>(Bl * H) * T * T * d);
    HeadsAttentionForward(rope_, A.qkv.data(), Bl, T, H, d, A.probs.data(), A.ctx.data());
  }
  Linear(A.ctx.data(), W.o, S, h, h, tmp);
  for (size_t i = 0; i < S * h; ++i) A.x1[i] = A.x[i] + tmp[i];
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormForward(A.x1.data(), W.norm2, S, h, cfg_.norm_eps, A.xn2.data(), A.rstd2.data());
  }
  Linear(A.xn2.data(), W.gu, S, h, 2 * f, A.gu.data());
  {
    trace::Scope span("swiglu", trace::Category::kCompute);
    SwiGluForward(A.gu.data(), S, f, A.act.data());
  }
  Linear(A.act.data(), W.down, S, f, h, tmp);
  for (size_t i = 0; i < S * h; ++i) xL_[i] = A.x1[i] + tmp[i];
}

double FsdpLayers::HeadForward(const float* w) {
  const size_t S = s_, h = h_, V = V_;
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormForward(xL_.data(), w, S, h, cfg_.norm_eps, xf_.data(), rstdf_.data());
  }
  Linear(xf_.data(), w + h, S, h, V, logits_.data());
  trace::Scope span("cross_entropy", trace::Category::kCompute);
  // The logits' gradient is kept in dS_ for HeadBackward.
  return CrossEntropy(logits_.data(), targets_.data(), S, V, grad_scale_, dS_.data());
}

void FsdpLayers::HeadBackward(const float* w, float* g) {
  const size_t S = s_, h = h_, V = V_;
  LinearBackward(xf_.data(), w + h, dS_.data(), S, h, V, dtmp_.data(), g + h);
  trace::Scope span("rmsnorm", trace::Category::kCompute);
  std::fill(g, g + h, 0.0f);
  RmsNormBackward(xL_.data(), w, rstdf_.data(), dtmp_.data(), S, h, dx_.data(), g);
}

void FsdpLayers::BlockBackward(size_t l, const float* w, float* g) {
  if (p_ > 1) {
    BlockBackwardTp(l, w, g);
    return;
  }
  const size_t S = S_, h = h_, f = f_, T = T_, Bl = Bl_, d = d_, H = heads_;
  const BlockTensors<const float> W = Block(w);
  const BlockTensors<float> G = Block(g);
  Acts& A = acts_[l];
  float* dout = dx_.data();  // in: the block output's gradient; out: its input's
  float* dact = dS_.data();
  float* dtmp = dtmp_.data();
  float* dx1 = dx1_.data();
  // MLP.
  LinearBackward(A.act.data(), W.down, dout, S, f, h, dact, G.down);
  {
    trace::Scope span("swiglu", trace::Category::kCompute);
    SwiGluBackward(A.gu.data(), dact, S, f, gu_grad_.data());
  }
  LinearBackward(A.xn2.data(), W.gu, gu_grad_.data(), S, h, 2 * f, dtmp, G.gu);
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    std::fill(G.norm2, G.norm2 + h, 0.0f);
    RmsNormBackward(A.x1.data(), W.norm2, A.rstd2.data(), dtmp, S, h, dx1, G.norm2);
    for (size_t i = 0; i < S * h; ++i) dx1[i] += dout[i];
  }
  // Attention.
  float* dctx = dtmp;
  LinearBackward(A.ctx.data(), W.o, dx1, S, h, h, dctx, G.o);
  {
    trace::Scope span("attention", trace::Category::kCompute,
                      8 * static_cast<uint64_t>(Bl * H) * T * T * d);
    HeadsAttentionBackward(rope_, A.qkv.data(), A.probs.data(), dctx, Bl, T, H, d, dqkv_.data(),
                           scratch_.data());
  }
  LinearBackward(A.xn1.data(), W.qkv, dqkv_.data(), S, h, 3 * h, dtmp, G.qkv);
  trace::Scope span("rmsnorm", trace::Category::kCompute);
  std::fill(G.norm1, G.norm1 + h, 0.0f);
  RmsNormBackward(A.x.data(), W.norm1, A.rstd1.data(), dtmp, S, h, dout, G.norm1);
  for (size_t i = 0; i < S * h; ++i) dout[i] += dx1[i];
}

void FsdpLayers::EmbedBackward(float* g) {
  trace::Scope span("embedding", trace::Category::kCompute);
  std::fill(g, g + V_ * h_, 0.0f);
  for (size_t row = 0; row < s_; ++row) {
    float* gr = g + static_cast<size_t>(inputs_[row]) * h_;
    const float* dr = dx_.data() + row * h_;
    for (size_t c = 0; c < h_; ++c) gr[c] += dr[c];
  }
}

}  // namespace mc2::models
