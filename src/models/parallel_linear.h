// The tensor-parallel projections of the transformer (Megatron's column-
// and row-parallel linear layers with sequence parallelism), forward and
// backward, each one fused operator on the TP group, whatever its size.
//
// With the notation of transformer.cc (S rows in the TP group, s = S / p
// on this rank, hidden h):
//   column parallel  out [S x n_local] = AllGatherMatmul(x [s x h], W_r)
//     dgrad          dx [s x h] = MatmulReduceScatter(dy [S x n_local], W_r^T)
//   row parallel     y [s x h] = MatmulReduceScatter(a [S x k_local], W_r)
//     dgrad          da [S x k_local] = AllGatherMatmul(dy [s x h], W_r^T)
// (the dgrads read W_r as B^T, args.trans_b: no transposed copy)
//   wgrad            grad(W_r) = a^T b (a plain GEMM, no communication)
// `independent` (FusedOptions::overlap_work): work that needs neither the
// call's transfers nor its result, run under its transfers.
#ifndef MC2_MODELS_PARALLEL_LINEAR_H_
#define MC2_MODELS_PARALLEL_LINEAR_H_

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "mc2/group.h"
#include "mc2/ops.h"
#include "models/dims.h"
#include "models/parameters.h"

namespace mc2::models {

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

// Thread safety: one thread per rank (the Transformer's contract).
class ParallelLinear {
 public:
  ParallelLinear(const Dims& dims, const Group& tp, ParamStore& params, const FusedOptions& fused);

  // out [S x n] = gather(x [s x h]) W_p; the gathered x (GEMM dtype) goes
  // to `gathered` [S x h], for the weight gradient.
  void ColumnParallel(const float* x, int p, float* out, std::vector<char>& gathered,
                      const std::function<void()>& independent = {});
  // y [s x h] = this rank's rows of the sum over TP of a [S x k] W_p.
  void RowParallel(const float* a, int p, float* y, const std::function<void()>& independent = {});
  // da [S x k] = gather(dy [s x h]) W_p^T; the gathered dy stays in
  // gathered_dy() for the wgrad.
  void RowParallelDgrad(const float* dy, int p, float* da,
                        const std::function<void()>& independent = {});
  // dx shard [s x h] = rows of the sum over TP of dy [S x n] W_p^T.
  void ColumnParallelDgrad(const float* dy, int p, float* dx_shard,
                           const std::function<void()>& independent = {});
  // grad(W_p) [rows x cols] = a^T b, a [S x rows] and b [S x cols] in the
  // GEMM dtype (b: the output gradient, gathered for a row-parallel one).
  void Wgrad(const void* a, const void* b, int p);

  const char* gathered_dy() const { return dy_g_.data(); }

  // The operators' A (op_a) and the wgrads' operands (op_b, op_c), which
  // may be converted inside an operator, as its overlap work, while op_a is
  // in use.
  Operand op_a, op_b, op_c;

 private:
  // out [S x n] = gather(x [s x h]) B [h x n], the gathered x to `gathered`;
  // b holds B, or B^T [n x h] if trans_b.
  void GatherMatmul(const float* x, const void* b, bool trans_b, size_t n, float* out,
                    char* gathered, const std::string& span_name,
                    const std::function<void()>& independent);
  // out [s x h] = this rank's rows of the sum over TP of x [S x k] B [k x h]
  // (b: B, or B^T [h x k] if trans_b).
  void MatmulScatter(const float* x, const void* b, bool trans_b, size_t k, float* out,
                     const std::string& span_name, const std::function<void()>& independent);

  const Dims& dims_;
  const Group& tp_;
  ParamStore& params_;
  const FusedOptions& fused_;
  std::vector<char> dy_g_;  // [S x h] gathered dy, GEMM dtype
};

}  // namespace mc2::models

#endif  // MC2_MODELS_PARALLEL_LINEAR_H_
