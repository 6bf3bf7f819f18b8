// FsdpLayers' blocks with tensor parallelism (fsdp_layers.h, tp > 1): the
// reference transformer's tensor + sequence parallel block (transformer.cc),
// on the weights FSDP gathered over the DP group (this TP rank's slices):
//   xn1 = RMSNorm(x)                    x: this rank's s rows
//   qkv = AllGatherMatmul(xn1, Wqkv_r)  all S rows, the local heads
//   x1  = x + MatmulReduceScatter(attention(RoPE(qkv)), Wo_r)
//   gu  = AllGatherMatmul(RMSNorm(x1), Wgu_r)
//   x'  = x1 + MatmulReduceScatter(SwiGLU(gu), Wdown_r)
// and backward the reverse (a column-parallel dgrad is a
// MatmulReduceScatter with W^T, a row-parallel one an AllGatherMatmul
// with W^T, each reading the gathered slice W as B^T: args.trans_b; the
// weight gradients local GEMMs on the gathered operands).
#include <cstring>

#include "mc2/gemm.h"
#include "mc2/ops.h"
#include "mc2/trace.h"
#include "models/fsdp_layers.h"

namespace mc2::models {

void FsdpLayers::ColumnParallel(const float* x, const float* w, size_t n, float* y, float* xg) {
  trace::Scope span("all_gather_matmul", trace::Category::kHost);
  AllGatherMatmul(tp_,
                  {.a = x,
                   .b = w,
                   .c = y,
                   .m = s_,
                   .k = h_,
                   .n = n,
                   .dtype = DType::kF32,
                   .gathered_a = xg},
                  cfg_.fused);
}

void FsdpLayers::RowParallel(const float* a, const float* w, size_t k, float* y) {
  trace::Scope span("matmul_reduce_scatter", trace::Category::kHost);
  MatmulReduceScatter(tp_,
                      {.a = a,
                       .b = w,
                       .c = y,
                       .m = S_,
                       .k = k,
                       .n = h_,
                       .dtype = DType::kF32,
                       .m_local = s_},
                      cfg_.fused);
}

// dx [s x h] = this rank's rows of the sum over TP of dy [S x n] w^T (w [h x n]).
void FsdpLayers::ColumnParallelDgrad(const float* dy, const float* w, size_t n, float* dx) {
  trace::Scope span("dgrad.matmul_reduce_scatter", trace::Category::kHost);
  MatmulReduceScatter(tp_,
                      {.a = dy,
                       .b = w,
                       .c = dx,
                       .m = S_,
                       .k = n,
                       .n = h_,
                       .dtype = DType::kF32,
                       .m_local = s_,
                       .trans_b = true},
                      cfg_.fused);
}

// da [S x k] = gather(dy [s x h]) w^T (w [k x h]), the gathered dy to dyg.
void FsdpLayers::RowParallelDgrad(const float* dy, const float* w, size_t k, float* da,
                                  float* dyg) {
  trace::Scope span("dgrad.all_gather_matmul", trace::Category::kHost);
  AllGatherMatmul(tp_,
                  {.a = dy,
                   .b = w,
                   .c = da,
                   .m = s_,
                   .k = h_,
                   .n = k,
                   .dtype = DType::kF32,
                   .gathered_a = dyg,
                   .trans_b = true},
                  cfg_.fused);
}

// dw [k x n] = a^T b, a [S x k], b [S x n] (overwritten).
void FsdpLayers::Wgrad(const float* a, const float* b, size_t k, size_t n, float* dw) {
  trace::Scope span("wgrad", trace::Category::kCompute, GemmFlops(k, n, S_));
  GemmOptions o;
  o.trans_a = true;
  Gemm(k, n, S_, a, b, dw, o);
}

void FsdpLayers::BlockForwardTp(size_t l, const float* w) {
  const size_t S = S_, s = s_, h = h_, fl = fl_, T = T_, Bl = Bl_, d = d_, H = hl_, hd = H * d;
  const BlockTensors<const float> W = Block(w);
  Acts& A = acts_[l];
  float* tmp = dtmp_.data();
  std::memcpy(A.x.data(), xL_.data(), s * h * sizeof(float));
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormForward(A.x.data(), W.norm1, s, h, cfg_.norm_eps, xn_rows_.data(), A.rstd1.data());
  }
  ColumnParallel(xn_rows_.data(), W.qkv, 3 * hd, A.qkv.data(), A.xn1.data());
  {
    trace::Scope span("attention", trace::Category::kCompute,
                      4 * static_cast<uint64_t>(Bl * H) * T * T * d);
    HeadsAttentionForward(rope_, A.qkv.data(), Bl, T, H, d, A.probs.data(), A.ctx.data());
  }
  RowParallel(A.ctx.data(), W.o, hd, tmp);
  for (size_t i = 0; i < s * h; ++i) A.x1[i] = A.x[i] + tmp[i];
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormForward(A.x1.data(), W.norm2, s, h, cfg_.norm_eps, xn_rows_.data(), A.rstd2.data());
  }
  ColumnParallel(xn_rows_.data(), W.gu, 2 * fl, A.gu.data(), A.xn2.data());
  {
    trace::Scope span("swiglu", trace::Category::kCompute);
    SwiGluForward(A.gu.data(), S, fl, A.act.data());
  }
  RowParallel(A.act.data(), W.down, fl, tmp);
  for (size_t i = 0; i < s * h; ++i) xL_[i] = A.x1[i] + tmp[i];
}

void FsdpLayers::BlockBackwardTp(size_t l, const float* w, float* g) {
  const size_t S = S_, s = s_, h = h_, fl = fl_, T = T_, Bl = Bl_, d = d_, H = hl_, hd = H * d;
  const BlockTensors<const float> W = Block(w);
  const BlockTensors<float> G = Block(g);
  Acts& A = acts_[l];
  float* dout = dx_.data();  // in: the block output's gradient (s rows); out: its input's
  float* dact = dS_.data();
  float* dtmp = dtmp_.data();
  float* dx1 = dx1_.data();
  // MLP.
  RowParallelDgrad(dout, W.down, fl, dact, dyg_.data());
  Wgrad(A.act.data(), dyg_.data(), fl, h, G.down);
  {
    trace::Scope span("swiglu", trace::Category::kCompute);
    SwiGluBackward(A.gu.data(), dact, S, fl, gu_grad_.data());
  }
  ColumnParallelDgrad(gu_grad_.data(), W.gu, 2 * fl, dtmp);
  Wgrad(A.xn2.data(), gu_grad_.data(), h, 2 * fl, G.gu);
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    std::fill(G.norm2, G.norm2 + h, 0.0f);
    RmsNormBackward(A.x1.data(), W.norm2, A.rstd2.data(), dtmp, s, h, dx1, G.norm2);
    for (size_t i = 0; i < s * h; ++i) dx1[i] += dout[i];
  }
  // Attention.
  float* dctx = dtmp;  // [S x hd]
  RowParallelDgrad(dx1, W.o, hd, dctx, dyg_.data());
  Wgrad(A.ctx.data(), dyg_.data(), hd, h, G.o);
  {
    trace::Scope span("attention", trace::Category::kCompute,
                      8 * static_cast<uint64_t>(Bl * H) * T * T * d);
    HeadsAttentionBackward(rope_, A.qkv.data(), A.probs.data(), dctx, Bl, T, H, d, dqkv_.data(),
                           scratch_.data());
  }
  float* dxn1 = xn_rows_.data();  // [s x h]
  ColumnParallelDgrad(dqkv_.data(), W.qkv, 3 * hd, dxn1);
  Wgrad(A.xn1.data(), dqkv_.data(), h, 3 * hd, G.qkv);
  trace::Scope span("rmsnorm", trace::Category::kCompute);
  std::fill(G.norm1, G.norm1 + h, 0.0f);
  RmsNormBackward(A.x.data(), W.norm1, A.rstd1.data(), dxn1, s, h, dout, G.norm1);
  for (size_t i = 0; i < s * h; ++i) dout[i] += dx1[i];
}

}  // namespace mc2::models
