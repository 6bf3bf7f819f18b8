// What the transformer keeps from its forward for its backward, and its
// scratch buffers, all sized once from the dims (the MoE experts' side per
// step, by the tokens they receive).
#ifndef MC2_MODELS_ACTIVATIONS_H_
#define MC2_MODELS_ACTIVATIONS_H_

#include <cstdint>
#include <vector>

#include "mc2/ops.h"
#include "models/dims.h"

namespace mc2::models {

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
  MoeRouting routing;        // of the slots (topk 1, see moe_layer.cc)
  std::vector<float> xn;     // [s x h] RMSNorm(x1)
  std::vector<float> probs;  // [s x E] router softmax
  std::vector<int32_t> ids;  // [s x k] chosen experts
  std::vector<float> gates;  // [s x k] their probabilities
  std::vector<char> xd;      // [R x h] dispatched xn, expert-grouped, GEMM dtype
  std::vector<float> gu;     // [R x 2 F] expert gate | up
  std::vector<float> act;    // [R x F]
  std::vector<float> yslot;  // [s k x h] each slot's expert output, unweighted
};

// The activations of the last forward (kept until the next one) and the
// scratch of forward and backward.
struct Activations {
  explicit Activations(const Dims& dims);

  std::vector<BlockActs> block;  // per block
  std::vector<MoeActs> moe;      // per block (used by MoE blocks)
  // MoE backward scratch (expert-side ones resized per step).
  std::vector<float> m_dys, m_dxs, m_dact, m_dgu, m_dgates, m_dlogits, m_dprob;
  std::vector<char> m_dyd;  // [R x h] dispatched dys, GEMM dtype
  std::vector<int32_t> inputs, targets;
  std::vector<float> x_final, rstd_f, xf, logits, dlogits;
  std::vector<float> tmp_s, dx, dx1, dtmp;  // [s x h]
  std::vector<float> dS3, dS2, dS1;         // [S x 3hld], [S x 2fl], [S x max(fl,hld)]
  std::vector<float> att_scratch;           // [T x T]
};

}  // namespace mc2::models

#endif  // MC2_MODELS_ACTIVATIONS_H_
