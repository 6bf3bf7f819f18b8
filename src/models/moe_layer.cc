// The MoE MLP sublayer of a block, forward and backward.
//
// It works on this rank's s rows (its sequence-parallel shard; the experts
// are not split over TP) with expert parallelism over grid.ep:
//   xn = RMSNorm(x1); probs = softmax(xn Wr); top-k -> ids, gates  local
//   y1 = AllToAllMatmul(xn per slot, W13 of the experts)   dispatch + gate|up
//   act = silu(gate) * up                                  expert side
//   ys = MatmulAllToAll(act, W2)                           down + combine
//   x' = x1 + sum_j gates[t, j] ys[t k + j]                token side
// The routing is made per SLOT (token t's choice j is "token" t k + j of a
// top-1 routing). The dispatch then sends exactly the rows a top-k routing
// would (one per routed slot), and the combine returns each slot's expert
// output unweighted, which backward needs for the gate gradient
// (dgate = dout . ys); backward's dispatch likewise sends each slot its own
// gradient row (gate * dout). The gate weighting is a few multiply-adds per
// slot on the token side.
#include <algorithm>
#include <cstring>

#include "mc2/trace.h"
#include "models/model.h"

namespace mc2::models {

namespace {

// grad(W) of stacked experts [El x k x n]: expert le's = a_le^T b_le over
// its rows (expert-grouped order; a [R x k], b [R x n], GEMM dtype).
void ExpertWgrad(const Dims& dims, const MoeRouting& r, const void* a, size_t k, const void* b,
                 size_t n, Param& P) {
  const size_t esz = dims.esz;
  const char* ac = static_cast<const char*>(a);
  const char* bc = static_cast<const char*>(b);
  size_t first = 0;
  for (size_t le = 0; le < dims.El; ++le) {
    const size_t rows = r.expert_rows(static_cast<int>(le));
    float* g = P.g + le * k * n;
    if (rows == 0) {
      std::fill(g, g + k * n, 0.0f);  // an expert no token chose this step
      continue;
    }
    trace::Scope span("wgrad", trace::Category::kCompute, GemmFlops(k, n, rows));
    GemmOptions o;
    o.trans_a = true;
    Gemm(k, n, rows, dims.dt, ac + first * k * esz, bc + first * n * esz, DType::kF32, g, o);
    first += rows;
  }
}

}  // namespace

void TransformerImpl::MoeForward(size_t l, float* out) {
  const size_t s = dims.s, h = dims.h, E = dims.E, K = dims.K, Fm = dims.Fm, esz = dims.esz;
  const DType dt = dims.dt;
  BlockActs& A = acts.block[l];
  MoeActs& M = acts.moe[l];
  const BlockParams& P = params.bp[l];
  std::vector<float>& tmp_s = acts.tmp_s;
  params.ApplyUpdates({P.egu, P.edown});  // normally done under the o reduce-scatter
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormForward(A.x1.data(), params[P.norm2].w, s, h, cfg.norm_eps, M.xn.data(), A.rstd2.data());
  }
  {
    trace::Scope span("router", trace::Category::kCompute, GemmFlops(s, E, h));
    float* logits = acts.m_dlogits.data();
    Gemm(s, E, h, M.xn.data(), params[P.router].w, logits);
    RouterForward(logits, s, E, K, M.probs.data(), M.ids.data(), M.gates.data());
    // This rank's share of the load-balancing statistics (summed over the
    // world with the loss).
    double* st = loss.local.data() + 1 + 2 * E * dims.moe_index[l];
    std::fill(st, st + 2 * E, 0.0);
    for (size_t i = 0; i < s * K; ++i) st[M.ids[i]] += 1.0;
    for (size_t t = 0; t < s; ++t) {
      for (size_t e = 0; e < E; ++e) st[E + e] += M.probs[t * E + e];
    }
  }
  M.routing =
      MoeRoute(grid.ep, M.ids.data(), s * K, /*topk=*/1, static_cast<int>(E), cfg.fused.timeout);
  const size_t R = M.routing.num_received();
  M.xd.resize(R * h * esz);
  M.gu.resize(R * 2 * Fm);
  M.act.resize(R * Fm);
  float* xs = acts.m_dxs.data();  // [s k x h]: each slot's token row
  for (size_t i = 0; i < s * K; ++i) std::memcpy(xs + i * h, &M.xn[(i / K) * h], h * sizeof(float));
  {
    trace::Scope span(params[P.egu].span_fwd, trace::Category::kHost);
    AllToAllMatmul(grid.ep, M.routing,
                   {.a = linear.op_a.Set(xs, s * K * h, dt),
                    .b = params.W(P.egu),
                    .c = M.gu.data(),
                    .k = h,
                    .n = 2 * Fm,
                    .dtype = dt,
                    .dispatched_a = M.xd.data()},
                   cfg.fused);
  }
  {
    trace::Scope span("swiglu", trace::Category::kCompute);
    SwiGluForward(M.gu.data(), R, Fm, M.act.data());
  }
  {
    trace::Scope span(params[P.edown].span_fwd, trace::Category::kHost);
    MatmulAllToAll(grid.ep, M.routing,
                   {.a = linear.op_a.Set(M.act.data(), R * Fm, dt),
                    .b = params.W(P.edown),
                    .c = M.yslot.data(),
                    .k = Fm,
                    .n = h,
                    .dtype = dt},
                   cfg.fused);
  }
  {
    trace::Scope span("moe.combine", trace::Category::kCompute);
    for (size_t t = 0; t < s; ++t) {
      float* o = tmp_s.data() + t * h;
      std::fill(o, o + h, 0.0f);
      for (size_t j = 0; j < K; ++j) {  // j ascending: a fixed order
        const float g = M.gates[t * K + j];
        const float* y = M.yslot.data() + (t * K + j) * h;
        for (size_t c = 0; c < h; ++c) o[c] += g * y[c];
      }
    }
    for (size_t i = 0; i < s * h; ++i) out[i] = A.x1[i] + tmp_s[i];
  }
}

// dout: the gradient of the block's output -> acts.dx1.
void TransformerImpl::MoeBackward(size_t l, const float* dout) {
  const size_t s = dims.s, h = dims.h, E = dims.E, K = dims.K, Fm = dims.Fm, esz = dims.esz;
  const DType dt = dims.dt;
  BlockActs& A = acts.block[l];
  MoeActs& M = acts.moe[l];
  const BlockParams& P = params.bp[l];
  Activations& W = acts;
  const MoeRouting& r = M.routing;
  const size_t R = r.num_received();
  {
    // x' = x1 + sum_j g_tj ys_tj: dg_tj = dout_t . ys_tj, dys_tj = g_tj dout_t.
    trace::Scope span("moe.combine.backward", trace::Category::kCompute);
    for (size_t i = 0; i < s * K; ++i) {
      const float* dy = dout + (i / K) * h;
      const float* y = M.yslot.data() + i * h;
      const float g = M.gates[i];
      float dg = 0.0f;
      for (size_t c = 0; c < h; ++c) {
        dg += dy[c] * y[c];
        W.m_dys[i * h + c] = g * dy[c];
      }
      W.m_dgates[i] = dg;
    }
  }
  W.m_dyd.resize(R * h * esz);
  W.m_dact.resize(R * Fm);
  W.m_dgu.resize(R * 2 * Fm);
  // Down projection + combine, backward: dispatch dys, times W2^T (keeping
  // the dispatched dys for W2's gradient).
  {
    trace::Scope span(params[P.edown].span_dgrad, trace::Category::kHost);
    FusedOptions o = cfg.fused;
    o.overlap_work = TakeDeferred();  // the attention above's qkv wgrad
    AllToAllMatmul(grid.ep, r,
                   {.a = linear.op_a.Set(W.m_dys.data(), s * K * h, dt),
                    .b = params.WT(P.edown),
                    .c = W.m_dact.data(),
                    .k = h,
                    .n = Fm,
                    .dtype = dt,
                    .dispatched_a = W.m_dyd.data()},
                   o);
  }
  {
    trace::Scope span("swiglu", trace::Category::kCompute);
    SwiGluBackward(M.gu.data(), W.m_dact.data(), R, Fm, W.m_dgu.data());
  }
  // Dispatch + gate|up, backward: dgu times W13^T, combined back to the
  // slots. The experts' wgrads need neither its transfers nor its result:
  // they are its overlap work.
  {
    trace::Scope span(params[P.egu].span_dgrad, trace::Category::kHost);
    FusedOptions o = cfg.fused;
    o.overlap_work = [&] {
      ExpertWgrad(dims, r, linear.op_c.Set(M.act.data(), R * Fm, dt), Fm, W.m_dyd.data(), h,
                  params[P.edown]);
      ExpertWgrad(dims, r, M.xd.data(), h, linear.op_b.Set(W.m_dgu.data(), R * 2 * Fm, dt), 2 * Fm,
                  params[P.egu]);
    };
    MatmulAllToAll(grid.ep, r,
                   {.a = linear.op_a.Set(W.m_dgu.data(), R * 2 * Fm, dt),
                    .b = params.WT(P.egu),
                    .c = W.m_dxs.data(),
                    .k = 2 * Fm,
                    .n = h,
                    .dtype = dt},
                   o);
  }
  {
    trace::Scope span("router.backward", trace::Category::kCompute, 2 * GemmFlops(s, E, h));
    const float* dprob_all = nullptr;
    if (cfg.moe_aux_loss_coef > 0.0f) {
      // d aux / d p_te = coef E f_e / N, from the global loads: the
      // forward's loss all-reduce carries them (it is ahead of this layer's
      // operators on the progress thread, so this wait costs nothing more).
      // With m micro-batches (a pipeline chunk) the loss is the mean of the
      // micro-batches' aux losses, each over its Nm = N / m tokens: f_e is
      // the micro-batch's, and d (aux_mb / m) / d p_te = coef E f_e / (m Nm)
      // = coef E f_e / N again (exactly the whole-batch expression at m = 1).
      loss.work.Wait();
      const double N = static_cast<double>(cfg.batch) * static_cast<double>(cfg.seq_len);
      const double Nm = N / dims.stage.micro_batches;
      const double* st = loss.total.data() + 1 + 2 * E * dims.moe_index[l];
      for (size_t e = 0; e < E; ++e) {
        W.m_dprob[e] = static_cast<float>(cfg.moe_aux_loss_coef * static_cast<double>(E) *
                                          (st[e] / (Nm * K)) / N);
      }
      dprob_all = W.m_dprob.data();
    }
    RouterBackward(M.probs.data(), M.ids.data(), W.m_dgates.data(), dprob_all, s, E, K,
                   W.m_dlogits.data());
    // dxn = sum_j dxs_tj + dlogits Wr^T; grad(Wr) = xn^T dlogits.
    GemmOptions od;
    od.trans_b = true;
    Gemm(s, h, E, W.m_dlogits.data(), params[P.router].w, W.dtmp.data(), od);
    for (size_t t = 0; t < s; ++t) {
      for (size_t j = 0; j < K; ++j) {
        const float* dxs = W.m_dxs.data() + (t * K + j) * h;
        for (size_t c = 0; c < h; ++c) W.dtmp[t * h + c] += dxs[c];
      }
    }
    GemmOptions ow;
    ow.trans_a = true;
    Gemm(h, E, s, M.xn.data(), W.m_dlogits.data(), params[P.router].g, ow);
  }
  {
    trace::Scope span("rmsnorm", trace::Category::kCompute);
    RmsNormBackward(A.x1.data(), params[P.norm2].w, A.rstd2.data(), W.dtmp.data(), s, h,
                    W.dx1.data(), params[P.norm2].g);
    for (size_t i = 0; i < s * h; ++i) W.dx1[i] += dout[i];
  }
  sync.IssuePendingThen(2 + 2 * static_cast<int>(l));
}

}  // namespace mc2::models
