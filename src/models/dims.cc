#include "models/dims.h"

namespace mc2::models {

Dims::Dims(const ProcessGrid& g, const TransformerConfig& c, const StageSpec& st) {
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
  stage = st;
  L_model = c.layers;
  L0 = st.first_layer;
  L = st.layers < 0 ? L_model : st.layers;
  T = c.seq_len;
  Bl = c.batch / dp / st.micro_batches;
  S = T * Bl;
  s = S / tp;
  grad_scale = 1.0f / static_cast<float>(static_cast<double>(c.batch) * T);
  E = c.moe_experts;
  El = E / g.ep_size;
  K = c.moe_topk;
  Fm = c.moe_ffn > 0 ? c.moe_ffn : c.ffn;
  is_moe.resize(L);
  moe_index.assign(L, -1);
  for (size_t l = 0; l < L; ++l) {
    is_moe[l] = IsMoeLayer(c, static_cast<int>(L0 + l));
    if (is_moe[l]) moe_index[l] = n_moe++;
  }
}

}  // namespace mc2::models
