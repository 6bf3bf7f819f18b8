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
  GatherMatmul(x, params_.W(p), false, params_[p].cols, out, gathered.data(),
               params_[p].span_fwd, independent);
}

void ParallelLinear::RowParallel(const float* a_full, int p, float* y,
                                 const std::function<void()>& independent) {
  MatmulScatter(a_full, params_.W(p), false, params_[p].rows, y, params_[p].span_fwd,
                independent);
}

void ParallelLinear::RowParallelDgrad(const float* dy, int p, float* da,
                                      const std::function<void()>& independent) {
  GatherMatmul(dy, params_.W(p), true, params_[p].rows, da, dy_g_.data(),
               params_[p].span_dgrad, independent);
}

void ParallelLinear::ColumnParallelDgrad(const float* dy, int p, float* dx_shard,
                                         const std::function<void()>& independent) {
  MatmulScatter(dy, params_.W(p), true, params_[p].cols, dx_shard, params_[p].span_dgrad,
                independent);
}

void ParallelLinear::GatherMatmul(const float* x, const void* b, bool trans_b, size_t n,
                                  float* out,
                                  char* gathered, const std::string& span_name,
                                  const std::function<void()>& independent) {
  const void* a = op_a.Set(x, dims_.s * dims_.h, dims_.dt);
  trace::Scope span(span_name, trace::Category::kHost);
  FusedOptions o = fused_;
  o.overlap_work = independent;
  AllGatherMatmul(tp_,
                  {.a = a,
                   .b = b,
                   .c = out,
                   .m = dims_.s,
                   .k = dims_.h,
                   .n = n,
                   .dtype = dims_.dt,
                   .gathered_a = gathered,
                   .trans_b = trans_b},
                  o);
}

void ParallelLinear::MatmulScatter(const float* x, const void* b, bool trans_b, size_t k,
                                   float* out,
                                   const std::string& span_name,
                                   const std::function<void()>& independent) {
  const void* a = op_a.Set(x, dims_.S * k, dims_.dt);
  trace::Scope span(span_name, trace::Category::kHost);
  FusedOptions o = fused_;
  o.overlap_work = independent;
  MatmulReduceScatter(tp_,
                      {.a = a,
                       .b = b,
                       .c = out,
                       .m = dims_.S,
                       .k = k,
                       .n = dims_.h,
                       .dtype = dims_.dt,
                       .m_local = dims_.s,
                       .trans_b = trans_b},
                      o);
}

void ParallelLinear::Wgrad(const void* a, const void* b, int p) {
  Param& P = params_[p];
  trace::Scope span("wgrad", trace::Category::kCompute, GemmFlops(P.rows, P.cols, dims_.S));
  GemmOptions o;
  o.trans_a = true;
  Gemm(P.rows, P.cols, dims_.S, dims_.dt, a, b, DType::kF32, P.g, o);
}

}  // namespace mc2::models
