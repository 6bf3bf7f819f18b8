// KvCache (kv_cache.h).
//
// Attend works as follows, per (sequence, head): scores s_t = q . k_t /
// sqrt(d) for t = 0..pos, p = softmax(s) (minus the maximum first, as the
// training kernel AttentionForward does), out = sum_t p_t v_t. Cost per
// decode step and block: 4 (pos + 1) d flops per (sequence, head), reading
// the whole cache of the block once: decode attention is bound by memory,
// not by arithmetic.
#include "models/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "mc2/error.h"

namespace mc2::models {

KvCache::KvCache(size_t layers, size_t batch, size_t heads, size_t head_dim, size_t capacity)
    : layers_(layers), batch_(batch), heads_(heads), d_(head_dim), capacity_(capacity) {
  const size_t per_block = batch * heads * capacity * head_dim;
  k_.assign(layers, std::vector<float>(per_block, 0.0f));
  v_.assign(layers, std::vector<float>(per_block, 0.0f));
  scores_.resize(capacity);
}

void KvCache::SetLength(size_t n) {
  if (n > capacity_) {
    throw Error(ErrorCode::kInvalidArgument, "KvCache: " + std::to_string(n) +
                                                 " positions exceed its capacity of " +
                                                 std::to_string(capacity_));
  }
  length_ = n;
}

void KvCache::Store(size_t l, size_t pos0, size_t len, const float* qkv, size_t ld) {
  if (pos0 + len > capacity_) {
    throw Error(ErrorCode::kInvalidArgument,
                "KvCache::Store: positions up to " + std::to_string(pos0 + len) +
                    " exceed its capacity of " + std::to_string(capacity_));
  }
  const size_t hd = heads_ * d_;
  float* K = k_[l].data();
  float* V = v_[l].data();
  for (size_t i = 0; i < len; ++i) {
    const size_t t = pos0 + i;
    for (size_t b = 0; b < batch_; ++b) {
      const float* row = qkv + (i * batch_ + b) * ld;
      for (size_t j = 0; j < heads_; ++j) {
        const size_t at = ((b * heads_ + j) * capacity_ + t) * d_;
        std::memcpy(K + at, row + hd + j * d_, d_ * sizeof(float));
        std::memcpy(V + at, row + 2 * hd + j * d_, d_ * sizeof(float));
      }
    }
  }
}

void KvCache::Attend(size_t l, size_t pos, const float* q, size_t ldq, float* out,
                     size_t ldo) const {
  const float scale = 1.0f / std::sqrt(static_cast<float>(d_));
  const size_t n = pos + 1;
  float* s = scores_.data();
  for (size_t b = 0; b < batch_; ++b) {
    for (size_t j = 0; j < heads_; ++j) {
      const float* qv = q + b * ldq + j * d_;
      const float* K = k_[l].data() + (b * heads_ + j) * capacity_ * d_;
      const float* V = v_[l].data() + (b * heads_ + j) * capacity_ * d_;
      float mx = -INFINITY;
      for (size_t t = 0; t < n; ++t) {
        float dot = 0.0f;
        for (size_t c = 0; c < d_; ++c) dot += qv[c] * K[t * d_ + c];
        s[t] = dot * scale;
        mx = std::max(mx, s[t]);
      }
      float sum = 0.0f;
      for (size_t t = 0; t < n; ++t) {
        s[t] = std::exp(s[t] - mx);
        sum += s[t];
      }
      const float inv = 1.0f / sum;
      float* o = out + b * ldo + j * d_;
      std::fill(o, o + d_, 0.0f);
      for (size_t t = 0; t < n; ++t) {
        const float w = s[t] * inv;
        for (size_t c = 0; c < d_; ++c) o[c] += w * V[t * d_ + c];
      }
    }
  }
}

}  // namespace mc2::models
