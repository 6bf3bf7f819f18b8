#include "models/parallel_linear.h"

#include "mc2/trace.h"

namespace mc2::models {

ParallelLinear::ParallelLinear(const Dims& dims, const Group& tp, ParamStore& params,
                               const FusedOptions& fused)
    : dims_(dims), tp_(tp), params_(params), fused_(fused) {
  dy_g_.resize(dims.S * dims.h * dims.esz);
}

void ParallelLinear::ColumnParallel(const float* x, int p, float* out,
                                    std::vector<char>& gathered,
                                    const std::function<void()>& independent) {
  const size_t n = params_[p].cols;
  const void* a = op_a.Set(x, dims_.s * dims_.h, dims_.dt);
  trace::Scope span(params_[p].span_fwd, trace::Category::kHost);
  FusedOptions o = fused_;
  o.overlap_work = independent;
  AllGatherMatmulSync(tp_, a, dims_.s, dims_.h, params_.W(p), n, dims_.dt, out, gathered.data(),
                      o);
}

void ParallelLinear::RowParallel(const float* a_full, int p, float* y,
                                 const std::function<void()>& independent) {
  const size_t k = params_[p].rows;
  const void* a = op_a.Set(a_full, dims_.S * k, dims_.dt);
  trace::Scope span(params_[p].span_fwd, trace::Category::kHost);
  FusedOptions o = fused_;
  o.overlap_work = independent;
  MatmulReduceScatterSync(tp_, a, dims_.S, k, params_.W(p), dims_.h, dims_.dt, y, dims_.s, o);
}

void ParallelLinear::RowParallelDgrad(const float* dy, int p, float* da,
                                      const std::function<void()>& independent) {
  const size_t k = params_[p].rows;
  const void* a = op_a.Set(dy, dims_.s * dims_.h, dims_.dt);
  trace::Scope span(params_[p].span_dgrad, trace::Category::kHost);
  FusedOptions o = fused_;
  o.overlap_work = independent;
  AllGatherMatmulSync(tp_, a, dims_.s, dims_.h, params_.WT(p), k, dims_.dt, da, dy_g_.data(), o);
}

void ParallelLinear::ColumnParallelDgrad(const float* dy, int p, float* dx_shard,
                                         const std::function<void()>& independent) {
  const size_t n = params_[p].cols;
  const void* a = op_a.Set(dy, dims_.S * n, dims_.dt);
  trace::Scope span(params_[p].span_dgrad, trace::Category::kHost);
  FusedOptions o = fused_;
  o.overlap_work = independent;
  MatmulReduceScatterSync(tp_, a, dims_.S, n, params_.WT(p), dims_.h, dims_.dt, dx_shard,
                          dims_.s, o);
}

void ParallelLinear::Wgrad(const void* a, const void* b, int p) {
  Param& P = params_[p];
  trace::Scope span("wgrad", trace::Category::kCompute, GemmFlops(P.rows, P.cols, dims_.S));
  GemmOptions o;
  o.trans_a = true;
  Gemm(P.rows, P.cols, dims_.S, dims_.dt, a, b, DType::kF32, P.g, o);
}

}  // namespace mc2::models
