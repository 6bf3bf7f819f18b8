#include "models/kernels.h"

#include <algorithm>
#include <cmath>

#include "mc2/ops.h"

namespace mc2::models {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t Hash(uint64_t seed, uint64_t stream, uint64_t index) {
  return Mix(Mix(Mix(seed) ^ stream) ^ index);
}

}  // namespace

float HashUniform(uint64_t seed, uint64_t stream, uint64_t index) {
  // 24 random bits: exact in a float.
  return static_cast<float>(Hash(seed, stream, index) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

uint32_t HashInt(uint64_t seed, uint64_t stream, uint64_t index, uint32_t n) {
  return static_cast<uint32_t>((Hash(seed, stream, index) >> 32) % n);
}

void RmsNormForward(const float* x, const float* gamma, size_t rows, size_t cols, float eps,
                    float* y, float* rstd) {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float ss = 0.0f;
    for (size_t c = 0; c < cols; ++c) ss += xr[c] * xr[c];
    float s = 1.0f / std::sqrt(ss / static_cast<float>(cols) + eps);
    rstd[r] = s;
    float* yr = y + r * cols;
    for (size_t c = 0; c < cols; ++c) yr[c] = xr[c] * s * gamma[c];
  }
}

void RmsNormBackward(const float* x, const float* gamma, const float* rstd, const float* dy,
                     size_t rows, size_t cols, float* dx, float* dgamma) {
  // With xhat = x * s and s = (mean(x^2) + eps)^-1/2:
  //   dx = s * (g - xhat * mean(g * xhat)),  g = dy * gamma.
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    const float s = rstd[r];
    float dot = 0.0f;
    for (size_t c = 0; c < cols; ++c) {
      float xhat = xr[c] * s;
      dgamma[c] += dyr[c] * xhat;
      dot += dyr[c] * gamma[c] * xhat;
    }
    dot /= static_cast<float>(cols);
    float* dxr = dx + r * cols;
    for (size_t c = 0; c < cols; ++c) dxr[c] = s * (dyr[c] * gamma[c] - xr[c] * s * dot);
  }
}

Rope::Rope(size_t seq_len_in, size_t head_dim, float base)
    : seq_len(seq_len_in), half(head_dim / 2), cos(seq_len_in * (head_dim / 2)),
      sin(seq_len_in * (head_dim / 2)) {
  for (size_t t = 0; t < seq_len; ++t) {
    for (size_t i = 0; i < half; ++i) {
      double theta = std::pow(static_cast<double>(base),
                              -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      double a = static_cast<double>(t) * theta;
      cos[t * half + i] = static_cast<float>(std::cos(a));
      sin[t * half + i] = static_cast<float>(std::sin(a));
    }
  }
}

void RopeApply(const Rope& rope, size_t pos, float* x, bool inverse) {
  const float* c = rope.cos.data() + pos * rope.half;
  const float* s = rope.sin.data() + pos * rope.half;
  for (size_t i = 0; i < rope.half; ++i) {
    float x0 = x[2 * i], x1 = x[2 * i + 1];
    float si = inverse ? -s[i] : s[i];
    x[2 * i] = x0 * c[i] - x1 * si;
    x[2 * i + 1] = x0 * si + x1 * c[i];
  }
}

void AttentionForward(const float* q, const float* k, const float* v, size_t T, size_t d,
                      size_t ldq, size_t ldk, size_t ldv, float* p, float* out, size_t ldo) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // S = scale * Q K^T (the whole square; the masked half is overwritten).
  GemmOptions o;
  o.trans_b = true;
  o.alpha = scale;
  o.lda = ldq;
  o.ldb = ldk;
  Gemm(T, T, d, q, k, p, o);
  for (size_t i = 0; i < T; ++i) {
    float* row = p + i * T;
    float mx = row[0];
    for (size_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
    float sum = 0.0f;
    for (size_t j = 0; j <= i; ++j) {
      row[j] = std::exp(row[j] - mx);
      sum += row[j];
    }
    float inv = 1.0f / sum;
    for (size_t j = 0; j <= i; ++j) row[j] *= inv;
    for (size_t j = i + 1; j < T; ++j) row[j] = 0.0f;
  }
  GemmOptions ov;
  ov.ldb = ldv;
  ov.ldc = ldo;
  Gemm(T, d, T, p, v, out, ov);
}

void AttentionBackward(const float* q, const float* k, const float* v, const float* p,
                       const float* dout, size_t T, size_t d, size_t ldq, size_t ldk,
                       size_t ldv, size_t ldo, float* dq, float* dk, float* dv, float* scratch) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // dV = P^T dOut.
  GemmOptions o1;
  o1.trans_a = true;
  o1.ldb = ldo;
  o1.ldc = ldv;
  Gemm(T, d, T, p, dout, dv, o1);
  // dP = dOut V^T, then dS = P * (dP - rowsum(dP * P)) * scale (softmax
  // backward; masked entries have P = 0 and get dS = 0).
  GemmOptions o2;
  o2.trans_b = true;
  o2.lda = ldo;
  o2.ldb = ldv;
  float* ds = scratch;
  Gemm(T, T, d, dout, v, ds, o2);
  for (size_t i = 0; i < T; ++i) {
    float* row = ds + i * T;
    const float* pr = p + i * T;
    float dot = 0.0f;
    for (size_t j = 0; j <= i; ++j) dot += row[j] * pr[j];
    for (size_t j = 0; j <= i; ++j) row[j] = pr[j] * (row[j] - dot) * scale;
    for (size_t j = i + 1; j < T; ++j) row[j] = 0.0f;
  }
  // dQ = dS K, dK = dS^T Q.
  GemmOptions o3;
  o3.ldb = ldk;
  o3.ldc = ldq;
  Gemm(T, d, T, ds, k, dq, o3);
  GemmOptions o4;
  o4.trans_a = true;
  o4.ldb = ldq;
  o4.ldc = ldk;
  Gemm(T, d, T, ds, q, dk, o4);
}

namespace {
inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
}  // namespace

void SwiGluForward(const float* gu, size_t rows, size_t w, float* a) {
  for (size_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * w;
    const float* u = g + w;
    float* ar = a + r * w;
    for (size_t c = 0; c < w; ++c) ar[c] = g[c] * Sigmoid(g[c]) * u[c];
  }
}

void SwiGluBackward(const float* gu, const float* da, size_t rows, size_t w, float* dgu) {
  for (size_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * w;
    const float* u = g + w;
    const float* dar = da + r * w;
    float* dg = dgu + r * 2 * w;
    float* du = dg + w;
    for (size_t c = 0; c < w; ++c) {
      float s = Sigmoid(g[c]);
      float silu = g[c] * s;
      du[c] = dar[c] * silu;
      dg[c] = dar[c] * u[c] * s * (1.0f + g[c] * (1.0f - s));
    }
  }
}

void RouterForward(const float* logits, size_t rows, size_t E, size_t k, float* probs,
                   int32_t* ids, float* gates) {
  for (size_t t = 0; t < rows; ++t) {
    const float* l = logits + t * E;
    float* p = probs + t * E;
    float mx = l[0];
    for (size_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
    float z = 0.0f;
    for (size_t e = 0; e < E; ++e) z += (p[e] = std::exp(l[e] - mx));
    const float inv = 1.0f / z;
    for (size_t e = 0; e < E; ++e) p[e] *= inv;
    // Top-k by selection (k and E are small): the largest not yet taken,
    // the lower index on ties (strict >), so the choice is a function of
    // the probabilities alone.
    int32_t* id = ids + t * k;
    for (size_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (size_t e = 0; e < E; ++e) {
        bool taken = false;
        for (size_t i = 0; i < j; ++i) taken = taken || id[i] == static_cast<int32_t>(e);
        if (!taken && (best < 0 || p[e] > p[best])) best = static_cast<int32_t>(e);
      }
      id[j] = best;
      gates[t * k + j] = p[best];
    }
  }
}

void RouterBackward(const float* probs, const int32_t* ids, const float* dgates,
                    const float* dprob_all, size_t rows, size_t E, size_t k, float* dlogits) {
  std::vector<float> dp(E);
  for (size_t t = 0; t < rows; ++t) {
    const float* p = probs + t * E;
    for (size_t e = 0; e < E; ++e) dp[e] = dprob_all ? dprob_all[e] : 0.0f;
    for (size_t j = 0; j < k; ++j) dp[ids[t * k + j]] += dgates[t * k + j];
    // Softmax backward: dl_e = p_e (dp_e - sum_i p_i dp_i).
    float dot = 0.0f;
    for (size_t e = 0; e < E; ++e) dot += p[e] * dp[e];
    for (size_t e = 0; e < E; ++e) dlogits[t * E + e] = p[e] * (dp[e] - dot);
  }
}

double CrossEntropy(const float* logits, const int32_t* targets, size_t rows, size_t vocab,
                    float grad_scale, float* dlogits) {
  double total = 0.0;
  for (size_t r = 0; r < rows; ++r) {
    const float* l = logits + r * vocab;
    float mx = l[0];
    for (size_t c = 1; c < vocab; ++c) mx = std::max(mx, l[c]);
    double sum = 0.0;
    for (size_t c = 0; c < vocab; ++c) sum += std::exp(static_cast<double>(l[c] - mx));
    const double lse = static_cast<double>(mx) + std::log(sum);
    total += lse - static_cast<double>(l[targets[r]]);
    if (dlogits != nullptr) {
      float* dl = dlogits + r * vocab;
      for (size_t c = 0; c < vocab; ++c) {
        dl[c] = static_cast<float>(std::exp(static_cast<double>(l[c]) - lse)) * grad_scale;
      }
      dl[targets[r]] -= grad_scale;
    }
  }
  return total;
}

// Elementwise, with a division and a square root per element: the
// baseline (SSE2) build spends on them about as long as the memory
// traffic takes; 16 lanes halve that. The loop is compiled twice, for the
// baseline and for AVX-512, and AdamW picks one by the CPU (a plain branch,
// not an ifunc: a sanitizer-instrumented ifunc resolver would run before
// the sanitizer's runtime is up). fp-contract=off: an FMA would round
// differently from the baseline's separate multiply and add.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
namespace {

inline __attribute__((always_inline)) void AdamWLoop(float* __restrict w,
                                                     const float* __restrict g,
                                                     float* __restrict m, float* __restrict v,
                                                     size_t n, float c1, float c2, float lr,
                                                     float beta1, float beta2, float eps,
                                                     float weight_decay) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  for (size_t i = 0; i < n; ++i) {
    m[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
    v[i] = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
    float mhat = m[i] / c1;
    float vhat = v[i] / c2;
    w[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * w[i]);
  }
}

__attribute__((target("avx512f"))) void AdamWAvx512(float* __restrict w,
                                                    const float* __restrict g,
                                                    float* __restrict m, float* __restrict v,
                                                    size_t n, float c1, float c2, float lr,
                                                    float beta1, float beta2, float eps,
                                                    float weight_decay) {
  AdamWLoop(w, g, m, v, n, c1, c2, lr, beta1, beta2, eps, weight_decay);
}

void AdamWBaseline(float* __restrict w, const float* __restrict g, float* __restrict m,
                   float* __restrict v, size_t n, float c1, float c2, float lr, float beta1,
                   float beta2, float eps, float weight_decay) {
  AdamWLoop(w, g, m, v, n, c1, c2, lr, beta1, beta2, eps, weight_decay);
}

}  // namespace
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

void AdamW(float* __restrict w, const float* __restrict g, float* __restrict m,
           float* __restrict v, size_t n, int step, float lr,
           float beta1, float beta2, float eps, float weight_decay) {
  const float c1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float c2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  (avx512 ? AdamWAvx512 : AdamWBaseline)(w, g, m, v, n, c1, c2, lr, beta1, beta2, eps,
                                          weight_decay);
}

void Transpose(const float* in, size_t rows, size_t cols, float* out) {
  constexpr size_t kTile = 32;
  for (size_t r0 = 0; r0 < rows; r0 += kTile) {
    const size_t r1 = std::min(rows, r0 + kTile);
    for (size_t c0 = 0; c0 < cols; c0 += kTile) {
      const size_t c1 = std::min(cols, c0 + kTile);
      for (size_t c = c0; c < c1; ++c) {
        for (size_t r = r0; r < r1; ++r) out[c * rows + r] = in[r * cols + c];
      }
    }
  }
}

void HeadsAttentionForward(const Rope& rope, float* qkv, size_t Bl, size_t T, size_t H, size_t d,
                           float* probs, float* ctx) {
  const size_t hd = H * d, ld = Bl * 3 * hd;
  for (size_t row = 0; row < Bl * T; ++row) {
    float* q = qkv + row * 3 * hd;
    for (size_t j = 0; j < H; ++j) {
      RopeApply(rope, row / Bl, q + j * d, false);
      RopeApply(rope, row / Bl, q + hd + j * d, false);
    }
  }
  for (size_t b = 0; b < Bl; ++b) {
    for (size_t j = 0; j < H; ++j) {
      const float* q = qkv + b * 3 * hd + j * d;
      AttentionForward(q, q + hd, q + 2 * hd, T, d, ld, ld, ld, probs + (b * H + j) * T * T,
                       ctx + b * hd + j * d, Bl * hd);
    }
  }
}

void HeadsAttentionBackward(const Rope& rope, const float* qkv, const float* probs,
                            const float* dctx, size_t Bl, size_t T, size_t H, size_t d,
                            float* dqkv, float* scratch) {
  const size_t hd = H * d, ld = Bl * 3 * hd;
  for (size_t b = 0; b < Bl; ++b) {
    for (size_t j = 0; j < H; ++j) {
      const float* q = qkv + b * 3 * hd + j * d;
      float* dq = dqkv + b * 3 * hd + j * d;
      AttentionBackward(q, q + hd, q + 2 * hd, probs + (b * H + j) * T * T, dctx + b * hd + j * d,
                        T, d, ld, ld, ld, Bl * hd, dq, dq + hd, dq + 2 * hd, scratch);
    }
  }
  for (size_t row = 0; row < Bl * T; ++row) {
    float* dq = dqkv + row * 3 * hd;
    for (size_t j = 0; j < H; ++j) {
      RopeApply(rope, row / Bl, dq + j * d, true);
      RopeApply(rope, row / Bl, dq + hd + j * d, true);
    }
  }
}

}  // namespace mc2::models
