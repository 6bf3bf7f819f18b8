// The KV cache of inference (inference.cc): per block, the keys and values
// of this TP rank's heads at every position processed so far, and the
// attention of new queries against them.
#ifndef MC2_MODELS_KV_CACHE_H_
#define MC2_MODELS_KV_CACHE_H_

#include <cstddef>
#include <vector>

namespace mc2::models {

// Layout: for block l, sequence b, local head j, position t, the d values
// of K at k_[l][((b * heads + j) * capacity + t) * d] (V alike), so one
// (sequence, head) is a tight [capacity x d] matrix.
//
// Invariants: positions [0, length()) of every block, sequence and head
// hold the keys and values written by Store (RoPE applied to the keys).
// Thread safety: one thread (the rank's).
class KvCache {
 public:
  KvCache(size_t layers, size_t batch, size_t heads, size_t head_dim, size_t capacity);

  size_t capacity() const { return capacity_; }
  size_t length() const { return length_; }
  // Forgets every position (a new prefill starts).
  void Clear() { length_ = 0; }
  // Marks positions [0, n) as written (after Store of all blocks).
  void SetLength(size_t n);

  // Writes K and V of positions [pos0, pos0 + len) of block l from a QKV
  // matrix of len * batch rows (row = (t - pos0) * batch + b, sequence-
  // major) whose columns hold q | k | v, each heads x d wide, at row
  // stride ld floats. Requires pos0 + len <= capacity.
  void Store(size_t l, size_t pos0, size_t len, const float* qkv, size_t ld);

  // Attention of one new query per sequence at position `pos` (the
  // positions [0, pos] of block l must be stored): for every sequence b and
  // local head j, out[b * ldo + j * d ..] = softmax(q . K^T / sqrt(d)) V
  // over positions 0..pos, q at q[b * ldq + j * d ..].
  void Attend(size_t l, size_t pos, const float* q, size_t ldq, float* out, size_t ldo) const;

 private:
  size_t layers_, batch_, heads_, d_, capacity_, length_ = 0;
  std::vector<std::vector<float>> k_, v_;  // by block
  mutable std::vector<float> scores_;      // [capacity]
};

}  // namespace mc2::models

#endif  // MC2_MODELS_KV_CACHE_H_
