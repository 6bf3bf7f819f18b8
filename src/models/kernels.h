// The transformer's local (communication-free) kernels, forward and
// backward, in plain f32 on the calling thread: RMSNorm, RoPE, causal
// attention over one (sequence, head), SwiGLU, cross-entropy, AdamW, and the
// seeded initialiser. The projections are GEMMs through mc2::Gemm or the
// fused operators (transformer.cc).
//
// Every kernel is deterministic: the same inputs give the same bits (fixed
// loop orders, fixed GEMM calls), which the bitwise pipeline-equality
// guarantee of the model relies on.
#ifndef MC2_MODELS_KERNELS_H_
#define MC2_MODELS_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mc2::models {

// A uniform value in [-1, 1) from a counter-based hash of (seed, stream,
// index): the same value for the same global element on every rank, so a
// shard initialises itself without the rest of the tensor.
float HashUniform(uint64_t seed, uint64_t stream, uint64_t index);
// A uniform integer in [0, n) from the same hash.
uint32_t HashInt(uint64_t seed, uint64_t stream, uint64_t index, uint32_t n);

// y[r] = x[r] * rstd[r] * gamma, rstd[r] = 1 / sqrt(mean(x[r]^2) + eps).
void RmsNormForward(const float* x, const float* gamma, size_t rows, size_t cols, float eps,
                    float* y, float* rstd);
// dx = d/dx of the above given dy (written, not accumulated); dgamma += the
// gamma gradient of these rows.
void RmsNormBackward(const float* x, const float* gamma, const float* rstd, const float* dy,
                     size_t rows, size_t cols, float* dx, float* dgamma);

// Rotary tables for positions [0, seq_len) and head_dim: cos/sin of
// pos * base^(-2i/head_dim), [seq_len x head_dim/2] each.
struct Rope {
  size_t seq_len = 0, half = 0;
  std::vector<float> cos, sin;
  Rope() = default;
  Rope(size_t seq_len, size_t head_dim, float base);
};
// Rotates the pairs (2i, 2i+1) of `x` (head_dim values at position `pos`)
// by +angle (forward) or -angle (backward: the transpose of the rotation).
void RopeApply(const Rope& rope, size_t pos, float* x, bool inverse);

// Causal attention of one (sequence, head). Q, K, V and the output are T x d
// with row strides (in floats) ldq, ldk, ldv, ldo, e.g. columns of the
// gathered QKV matrix. P (T x T, tight) receives the attention
// probabilities (0 above the diagonal), kept for backward.
void AttentionForward(const float* q, const float* k, const float* v, size_t T, size_t d,
                      size_t ldq, size_t ldk, size_t ldv, float* p, float* out, size_t ldo);
// Given dout, writes dq, dk, dv (same layout and strides as q, k, v).
// `scratch` holds T x T floats.
void AttentionBackward(const float* q, const float* k, const float* v, const float* p,
                       const float* dout, size_t T, size_t d, size_t ldq, size_t ldk,
                       size_t ldv, size_t ldo, float* dq, float* dk, float* dv, float* scratch);

// The attention of H heads of d over a batch of Bl sequences of T
// positions, rows ordered position-major (row = position * Bl + sequence):
// qkv holds per row the heads' q, then k, then v (3 H d floats). Forward
// applies the rotary embedding to q and k in place, then writes the
// probabilities (Bl H x T x T) and the context (per row, H d floats).
// Backward writes dqkv (the layout of qkv) from dctx, the rotary
// embedding undone on dq and dk; `scratch` holds T x T floats.
void HeadsAttentionForward(const Rope& rope, float* qkv, size_t Bl, size_t T, size_t H, size_t d,
                           float* probs, float* ctx);
void HeadsAttentionBackward(const Rope& rope, const float* qkv, const float* probs,
                            const float* dctx, size_t Bl, size_t T, size_t H, size_t d,
                            float* dqkv, float* scratch);

// gu = [gate | up], rows x 2w: a = silu(gate) * up (rows x w).
void SwiGluForward(const float* gu, size_t rows, size_t w, float* a);
// dgu = [dgate | dup] given da.
void SwiGluBackward(const float* gu, const float* da, size_t rows, size_t w, float* dgu);

// MoE router of `rows` tokens over E experts: probs = softmax(logits) (rows x
// E); ids and gates (rows x k): the k experts of highest probability in
// descending order (ties: the lower index first) and their probabilities
// (not renormalised).
void RouterForward(const float* logits, size_t rows, size_t E, size_t k, float* probs,
                   int32_t* ids, float* gates);
// dlogits (rows x E) given the gates' gradient dgates (rows x k) and a
// per-expert gradient dprob_all[e] (null: none) of every row's probability
// of e (the load-balancing loss's): the softmax backward of
//   dp[t, e] = dprob_all[e] + dgates[t, j] if ids[t, j] == e.
void RouterBackward(const float* probs, const int32_t* ids, const float* dgates,
                    const float* dprob_all, size_t rows, size_t E, size_t k, float* dlogits);

// Cross-entropy of `rows` logit rows (vocab wide) against targets: returns
// the sum over rows of -log softmax[target] (in double); dlogits (optional)
// = (softmax - onehot) * grad_scale.
double CrossEntropy(const float* logits, const int32_t* targets, size_t rows, size_t vocab,
                    float grad_scale, float* dlogits);

// out [cols x rows] = in [rows x cols] transposed. Tiled (32 x 32) so that
// both the reads and the writes stay within a few cache lines per tile: a
// plain loop over rows writes with a stride of `rows` floats, a cache miss
// per element once the matrix outgrows the cache (the transformer
// transposes every expert weight once per optimizer step).
void Transpose(const float* in, size_t rows, size_t cols, float* out);

// One AdamW step (step >= 1, bias-corrected) over n elements. The four
// arrays must not overlap (the loop is vectorized on that promise). On CPUs
// with AVX-512 a 16-wide build of the same loop runs; the operations are
// the same IEEE ones (no contraction into FMA), so the results are bitwise
// those of the baseline build.
void AdamW(float* w, const float* g, float* m, float* v, size_t n, int step, float lr,
           float beta1, float beta2, float eps, float weight_decay);

}  // namespace mc2::models

#endif  // MC2_MODELS_KERNELS_H_
