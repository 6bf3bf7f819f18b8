// The dense MLP sublayer of a block, forward and backward:
//   x' = x1 + RowParallel(SwiGLU(ColumnParallel(RMSNorm(x1), Wgu)), Wdown)
// with fl = ffn / p inner columns per TP rank (the notation of
// transformer.cc).
#include "mc2/trace.h"
#include "models/model.h"

namespace mc2::models {

void TransformerImpl::MlpForward(size_t l, float* out) {
  const size_t s = dims.s, S = dims.S, h = dims.h, fl = dims.fl;
  BlockActs& A = acts.block[l];
  const BlockParams& P = params.bp[l];
  std::vector<float>& tmp_s = acts.tmp_s;
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormForward(A.x1.data(), params[P.norm2].w, s, h, cfg.norm_eps, tmp_s.data(),
                   A.rstd2.data());
  }
  params.ApplyUpdate(P.gu);
  linear.ColumnParallel(tmp_s.data(), P.gu, A.gu.data(), A.xn2_g);
  {
    trace::Scope span("swiglu", trace::Category::kCompute);
    SwiGluForward(A.gu.data(), S, fl, A.act.data());
  }
  params.ApplyUpdate(P.down);
  // Under the reduce-scatter: the next block's attention updates.
  linear.RowParallel(A.act.data(), P.down, tmp_s.data(), [&] {
    if (l + 1 < dims.L) params.ApplyUpdates({params.bp[l + 1].qkv, params.bp[l + 1].o});
  });
  for (size_t i = 0; i < s * h; ++i) out[i] = A.x1[i] + tmp_s[i];
}

// dxio: the gradient of the block's output -> acts.dx1, the gradient at
// the attention residual x1.
void TransformerImpl::MlpBackward(size_t l, const float* dxio) {
  const size_t s = dims.s, S = dims.S, h = dims.h, fl = dims.fl;
  const DType dt = dims.dt;
  BlockActs& A = acts.block[l];
  const BlockParams& P = params.bp[l];
  std::vector<float>& dS2 = acts.dS2;
  std::vector<float>& dx1 = acts.dx1;
  const bool dp_only = !backward_collectives;  // wgrads first (transformer.cc)
  // ---- dgrad chain.
  float* dact = acts.dS1.data();
  if (dp_only) WgradAndMark(linear.op_c.Set(A.act.data(), S * fl, dt), dxio, P.down);
  // The gathered dxio stays in the linear layers' gathered_dy(); under its
  // transfers, the deferred wgrad of the attention above (qkv of block l + 1).
  linear.RowParallelDgrad(dxio, P.down, dact, TakeDeferred());
  {
    trace::Scope span("swiglu", trace::Category::kCompute);
    SwiGluBackward(A.gu.data(), dact, S, fl, dS2.data());
  }
  if (dp_only) {
    WgradAndMark(A.xn2_g.data(), dS2.data(), P.gu);
    linear.ColumnParallelDgrad(dS2.data(), P.gu, acts.dtmp.data());
  } else {
    // The wgrads need neither the reduce-scatter nor its result: down's
    // runs under it; gate_up's under the attention's o dgrad all-gather,
    // which has little compute of its own to hide its transfers (its dS2
    // and xn2_g are not touched before).
    linear.ColumnParallelDgrad(dS2.data(), P.gu, acts.dtmp.data(), [&] {
      linear.Wgrad(linear.op_c.Set(A.act.data(), S * fl, dt), linear.gathered_dy(), P.down);
    });
    deferred_wgrad = [this, l, S, fl, dt] {
      linear.Wgrad(acts.block[l].xn2_g.data(), linear.op_b.Set(acts.dS2.data(), S * 2 * fl, dt),
                   params.bp[l].gu);
    };
  }
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormBackward(A.x1.data(), params[P.norm2].w, A.rstd2.data(), acts.dtmp.data(), s, h,
                    dx1.data(), params[P.norm2].g);
    for (size_t i = 0; i < s * h; ++i) dx1[i] += dxio[i];
  }
  // Issued after this sublayer's operators (see grad_sync.h): the previous
  // sublayer's gradients travel under the next sublayer's compute.
  EndSublayerBackward(2 + 2 * static_cast<int>(l));
}

}  // namespace mc2::models
