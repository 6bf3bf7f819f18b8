#include "common/reference_model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/data.h"

namespace mc2::models {

PipelineConfig Pipe(int m, PipelineSchedule s, int v) {
  PipelineConfig p;
  p.micro_batches = m;
  p.schedule = s;
  p.virtual_stages = v;
  return p;
}

TransformerConfig TinyConfig() {
  TransformerConfig c;
  c.vocab = 16;
  c.hidden = 16;
  c.heads = 4;
  c.ffn = 32;
  c.layers = 2;
  c.seq_len = 8;
  c.batch = 4;
  c.task = Task::kModAdd;
  c.task_param = 3;
  c.seed = 7;
  c.fused.pipeline = Pipeline::kSerial;
  return c;
}

// A double-precision forward of the whole model on ONE rank's parameters
// (tp = ep = 1), written independently of src/models: per sequence, per
// position, textbook formulas; MoE: softmax router, top-k by probability
// (ties to the lower index), gates = the chosen probabilities, SwiGLU
// experts, and the loss coef * E * sum_e f_e P_e over the sequences the
// loss is of. `aux_out` receives the load-balancing part.
double ReferenceLoss(Transformer& model, int step, double* aux_out) {
  return ReferenceLoss(model, step, 0, model.config().batch, aux_out);
}

double ReferenceLoss(Transformer& model, int step, int first_sequence, int sequences,
                     double* aux_out) {
  const TransformerConfig& c = model.config();
  std::vector<ParamView> ps = model.Parameters();
  auto P = [&](const std::string& name) -> const ParamView& {
    for (auto& p : ps)
      if (p.name == name) return p;
    throw std::runtime_error("ReferenceLoss: the model has no parameter " + name);
  };
  const int h = c.hidden, nh = c.heads, d = h / nh, f = c.ffn, T = c.seq_len;
  const int E = c.moe_experts, K = c.moe_topk, F = c.moe_ffn > 0 ? c.moe_ffn : c.ffn;
  auto rmsnorm = [&](const std::vector<double>& x, const ParamView& g) {
    double ss = 0;
    for (double v : x) ss += v * v;
    double r = 1.0 / std::sqrt(ss / h + c.norm_eps);
    std::vector<double> y(h);
    for (int i = 0; i < h; ++i) y[i] = x[i] * r * g.value[i];
    return y;
  };
  // x [rows] times rows [r0, r0 + x.size()) of W, columns [c0, c0 + n).
  auto matvec = [](const std::vector<double>& x, const ParamView& w, size_t r0 = 0, size_t c0 = 0,
                   size_t n = 0) {
    if (n == 0) n = w.cols;
    std::vector<double> y(n, 0.0);
    for (size_t r = 0; r < x.size(); ++r)
      for (size_t k = 0; k < n; ++k) y[k] += x[r] * w.value[(r0 + r) * w.cols + c0 + k];
    return y;
  };
  auto rope = [&](double* v, int pos) {
    for (int i = 0; i < d / 2; ++i) {
      double th = pos * std::pow(static_cast<double>(c.rope_base), -2.0 * i / d);
      double a = v[2 * i], b = v[2 * i + 1];
      v[2 * i] = a * std::cos(th) - b * std::sin(th);
      v[2 * i + 1] = a * std::sin(th) + b * std::cos(th);
    }
  };
  auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  // Per layer: slots per expert and summed probabilities over the batch.
  std::vector<std::vector<double>> count(c.layers, std::vector<double>(E, 0.0));
  std::vector<std::vector<double>> psum(c.layers, std::vector<double>(E, 0.0));
  double total = 0;
  for (int seq = first_sequence; seq < first_sequence + sequences; ++seq) {
    std::vector<std::vector<double>> x(T, std::vector<double>(h));
    for (int t = 0; t < T; ++t) {
      int tok = SequenceToken(c, step, seq, t);
      for (int i = 0; i < h; ++i) x[t][i] = P("embed").value[tok * h + i];
    }
    for (int l = 0; l < c.layers; ++l) {
      std::string b = "block" + std::to_string(l);
      std::vector<std::vector<double>> qkv(T);
      for (int t = 0; t < T; ++t) {
        qkv[t] = matvec(rmsnorm(x[t], P(b + ".norm1")), P(b + ".attn.qkv"));
        for (int j = 0; j < nh; ++j) {
          rope(&qkv[t][j * d], t);
          rope(&qkv[t][h + j * d], t);
        }
      }
      for (int t = 0; t < T; ++t) {
        std::vector<double> ctx(h, 0.0);
        for (int j = 0; j < nh; ++j) {
          std::vector<double> sc(t + 1);
          double mx = -1e300;
          for (int u = 0; u <= t; ++u) {
            double dot = 0;
            for (int e = 0; e < d; ++e) dot += qkv[t][j * d + e] * qkv[u][h + j * d + e];
            sc[u] = dot / std::sqrt(static_cast<double>(d));
            mx = std::max(mx, sc[u]);
          }
          double z = 0;
          for (auto& v : sc) z += (v = std::exp(v - mx));
          for (int u = 0; u <= t; ++u)
            for (int e = 0; e < d; ++e) ctx[j * d + e] += sc[u] / z * qkv[u][2 * h + j * d + e];
        }
        std::vector<double> o = matvec(ctx, P(b + ".attn.o"));
        for (int i = 0; i < h; ++i) x[t][i] += o[i];
        std::vector<double> xn = rmsnorm(x[t], P(b + ".norm2"));
        if (!IsMoeLayer(c, l)) {
          std::vector<double> gu = matvec(xn, P(b + ".mlp.gate_up"));
          std::vector<double> a(f);
          for (int i = 0; i < f; ++i) a[i] = silu(gu[i]) * gu[f + i];
          std::vector<double> dn = matvec(a, P(b + ".mlp.down"));
          for (int i = 0; i < h; ++i) x[t][i] += dn[i];
          continue;
        }
        std::vector<double> logit = matvec(xn, P(b + ".moe.router"));
        double mx = *std::max_element(logit.begin(), logit.end()), z = 0;
        std::vector<double> p(E);
        for (int e = 0; e < E; ++e) z += (p[e] = std::exp(logit[e] - mx));
        for (int e = 0; e < E; ++e) psum[l][e] += (p[e] /= z);
        std::vector<int> order(E);
        for (int e = 0; e < E; ++e) order[e] = e;
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
        std::vector<double> y(h, 0.0);
        for (int j = 0; j < K; ++j) {
          const int e = order[j];
          count[l][e] += 1;
          std::vector<double> gu = matvec(xn, P(b + ".moe.gate_up"), size_t(e) * h);
          std::vector<double> a(F);
          for (int i = 0; i < F; ++i) a[i] = silu(gu[i]) * gu[F + i];
          std::vector<double> dn = matvec(a, P(b + ".moe.down"), size_t(e) * F);
          for (int i = 0; i < h; ++i) y[i] += p[e] * dn[i];
        }
        for (int i = 0; i < h; ++i) x[t][i] += y[i];
      }
    }
    for (int t = 0; t < T; ++t) {
      std::vector<double> logits = matvec(rmsnorm(x[t], P("final_norm")), P("lm_head"));
      double mx = *std::max_element(logits.begin(), logits.end()), z = 0;
      for (double v : logits) z += std::exp(v - mx);
      total += mx + std::log(z) - logits[SequenceToken(c, step, seq, t + 1)];
    }
  }
  const double N = static_cast<double>(sequences) * T;
  double aux = 0;
  for (int l = 0; l < c.layers; ++l) {
    if (!IsMoeLayer(c, l)) continue;
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += count[l][e] / (N * K) * (psum[l][e] / N);
    aux += c.moe_aux_loss_coef * E * sum;
  }
  if (aux_out) *aux_out = aux;
  return total / N + aux;
}

}  // namespace mc2::models
