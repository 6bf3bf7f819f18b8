#include "models/activations.h"

#include <algorithm>

namespace mc2::models {

Activations::Activations(const Dims& D) {
  const size_t s = D.s, S = D.S, h = D.h, hl = D.hl, d = D.d, fl = D.fl, E = D.E, K = D.K;
  block.resize(D.L);
  moe.resize(D.L);
  for (size_t l = 0; l < D.L; ++l) {
    BlockActs& a = block[l];
    a.x.resize(s * h);
    a.rstd1.resize(s);
    a.xn1_g.resize(S * h * D.esz);
    a.qkv.resize(S * 3 * hl * d);
    a.probs.resize(D.Bl * hl * D.T * D.T);
    a.ctx.resize(S * hl * d);
    a.x1.resize(s * h);
    a.rstd2.resize(s);
    if (!D.is_moe[l]) {
      a.xn2_g.resize(S * h * D.esz);
      a.gu.resize(S * 2 * fl);
      a.act.resize(S * fl);
      continue;
    }
    MoeActs& m = moe[l];
    m.xn.resize(s * h);
    m.probs.resize(s * E);
    m.ids.resize(s * K);
    m.gates.resize(s * K);
    m.yslot.resize(s * K * h);
  }
  if (E > 0) {
    m_dys.resize(s * K * h);
    m_dxs.resize(s * K * h);
    m_dgates.resize(s * K);
    m_dlogits.resize(s * E);
    m_dprob.resize(E);
  }
  inputs.resize(s);
  targets.resize(s);
  x_final.resize(s * h);
  rstd_f.resize(s);
  xf.resize(s * h);
  logits.resize(s * D.V);
  dlogits.resize(s * D.V);
  tmp_s.resize(s * h);
  dx.resize(s * h);
  dx1.resize(s * h);
  dtmp.resize(s * h);
  dS3.resize(S * 3 * hl * d);
  dS2.resize(S * 2 * fl);
  dS1.resize(S * std::max(fl, hl * d));
  att_scratch.resize(D.T * D.T);
}

}  // namespace mc2::models
