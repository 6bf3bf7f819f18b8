// The attention sublayer of a block, forward and backward:
//   x1 = x + RowParallel(attention(RoPE(ColumnParallel(RMSNorm(x), Wqkv))), Wo)
// with hl local heads of width d per TP rank (the notation of
// transformer.cc).
#include <cstring>

#include "mc2/trace.h"
#include "models/model.h"

namespace mc2::models {

// x1 = x + attention(RMSNorm(x)), kept in acts.block[l].x1.
void TransformerImpl::AttentionSublayerForward(size_t l, const float* x) {
  const size_t s = dims.s, S = dims.S, h = dims.h, hl = dims.hl, d = dims.d, Bl = dims.Bl,
               T = dims.T;
  BlockActs& A = acts.block[l];
  const BlockParams& P = params.bp[l];
  std::vector<float>& tmp_s = acts.tmp_s;
  const size_t hd = hl * d, ld_qkv = 3 * hd;
  std::memcpy(A.x.data(), x, s * h * sizeof(float));
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormForward(x, params[P.norm1].w, s, h, cfg.norm_eps, tmp_s.data(), A.rstd1.data());
  }
  // Deferred updates (ParamStore::ApplyUpdate): qkv is normally done under
  // the previous block's down reduce-scatter; o goes under qkv's all-gather.
  params.ApplyUpdate(P.qkv);
  linear.ColumnParallel(tmp_s.data(), P.qkv, A.qkv.data(), A.xn1_g,
                        [&] { params.ApplyUpdate(P.o); });
  {
    // (With CP the ring records its own compute and transfers inside.)
    trace::Scope span("attention",
                      ring.empty() ? trace::Category::kCompute : trace::Category::kHost,
                      4 * static_cast<uint64_t>(Bl * hl) * T * T * d);
    for (size_t row = 0; row < S; ++row) {
      const size_t t = Position(row / Bl);
      float* q = A.qkv.data() + row * ld_qkv;
      for (size_t j = 0; j < hl; ++j) {
        RopeApply(rope, t, q + j * d, false);       // q
        RopeApply(rope, t, q + hd + j * d, false);  // k
      }
    }
    const size_t ld = Bl * ld_qkv;  // rows of one sequence are Bl apart
    if (!ring.empty()) {
      // Context parallelism: the sequence's other positions are on the
      // other CP ranks; the ring brings their keys and values.
      const float* q = A.qkv.data();
      ring[l]->Forward(q, ld_qkv, q + hd, ld_qkv, q + 2 * hd, ld_qkv, A.ctx.data(), hd);
    }
    for (size_t b = 0; b < Bl && ring.empty(); ++b) {
      for (size_t j = 0; j < hl; ++j) {
        const float* q = A.qkv.data() + b * ld_qkv + j * d;
        AttentionForward(q, q + hd, q + 2 * hd, T, d, ld, ld, ld,
                         A.probs.data() + (b * hl + j) * T * T, A.ctx.data() + b * hd + j * d,
                         Bl * hd);
      }
    }
  }
  // Under the reduce-scatter, what the forward has independent of it: the
  // MLP's deferred updates.
  params.ApplyUpdate(P.o);
  linear.RowParallel(A.ctx.data(), P.o, tmp_s.data(),
                     [&] { params.ApplyUpdates({P.gu, P.down, P.egu, P.edown}); });
  for (size_t i = 0; i < s * h; ++i) A.x1[i] = x[i] + tmp_s[i];
}

// acts.dx1 (the gradient at the attention residual) -> dxio.
void TransformerImpl::AttentionSublayerBackward(size_t l, float* dxio) {
  const size_t s = dims.s, S = dims.S, h = dims.h, hl = dims.hl, d = dims.d, Bl = dims.Bl,
               T = dims.T;
  const DType dt = dims.dt;
  BlockActs& A = acts.block[l];
  const BlockParams& P = params.bp[l];
  std::vector<float>& dS3 = acts.dS3;
  std::vector<float>& dx1 = acts.dx1;
  const size_t hd = hl * d, ld_qkv = 3 * hd;
  const bool dp_only = !backward_collectives;  // wgrads first (transformer.cc)
  // ---- dgrad chain.
  float* dctx = acts.dS1.data();
  if (dp_only) WgradAndMark(linear.op_c.Set(A.ctx.data(), S * hd, dt), dx1.data(), P.o);
  // Under its transfers: the MLP's deferred gate_up wgrad.
  linear.RowParallelDgrad(dx1.data(), P.o, dctx, TakeDeferred());
  {
    trace::Scope span("attention",
                      ring.empty() ? trace::Category::kCompute : trace::Category::kHost,
                      8 * static_cast<uint64_t>(Bl * hl) * T * T * d);
    const size_t ld = Bl * ld_qkv;
    if (!ring.empty()) {
      float* dq = dS3.data();
      ring[l]->Backward(dctx, hd, dq, ld_qkv, dq + hd, ld_qkv, dq + 2 * hd, ld_qkv);
    }
    for (size_t b = 0; b < Bl && ring.empty(); ++b) {
      for (size_t j = 0; j < hl; ++j) {
        const float* q = A.qkv.data() + b * ld_qkv + j * d;
        float* dq = dS3.data() + b * ld_qkv + j * d;
        AttentionBackward(q, q + hd, q + 2 * hd, A.probs.data() + (b * hl + j) * T * T,
                          dctx + b * hd + j * d, T, d, ld, ld, ld, Bl * hd, dq, dq + hd,
                          dq + 2 * hd, acts.att_scratch.data());
      }
    }
    for (size_t row = 0; row < S; ++row) {
      const size_t t = Position(row / Bl);
      float* dq = dS3.data() + row * ld_qkv;
      for (size_t j = 0; j < hl; ++j) {
        RopeApply(rope, t, dq + j * d, true);
        RopeApply(rope, t, dq + hd + j * d, true);
      }
    }
  }
  if (dp_only) {
    // In block 0 the last gradient to travel: under this dgrad GEMM.
    WgradAndMark(A.xn1_g.data(), dS3.data(), P.qkv);
    linear.ColumnParallelDgrad(dS3.data(), P.qkv, acts.dtmp.data());
  } else {
    // o's wgrad under the reduce-scatter; qkv's too in the first block,
    // else it is deferred to the next block's first dgrad operator (the
    // down projection's all-gather, whose own GEMM is too small to hide
    // its transfers); dS3 and xn1_g are not touched before.
    linear.ColumnParallelDgrad(dS3.data(), P.qkv, acts.dtmp.data(), [&] {
      linear.Wgrad(linear.op_c.Set(A.ctx.data(), S * hd, dt), linear.gathered_dy(), P.o);
      if (l == 0)
        linear.Wgrad(A.xn1_g.data(), linear.op_b.Set(dS3.data(), S * ld_qkv, dt), P.qkv);
    });
  }
  if (l > 0 && !dp_only) {
    deferred_wgrad = [this, l, S, ld_qkv, dt] {
      linear.Wgrad(acts.block[l].xn1_g.data(), linear.op_b.Set(acts.dS3.data(), S * ld_qkv, dt),
                   params.bp[l].qkv);
    };
  }
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormBackward(A.x.data(), params[P.norm1].w, A.rstd1.data(), acts.dtmp.data(), s, h, dxio,
                    params[P.norm1].g);
    for (size_t i = 0; i < s * h; ++i) dxio[i] += dx1[i];
  }
  EndSublayerBackward(1 + 2 * static_cast<int>(l));
}

}  // namespace mc2::models
