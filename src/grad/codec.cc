#include "grad/codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "core/reduce.h"
#include "mc2/error.h"
#include "mc2/gemm.h"

namespace mc2::grad {

void ToHalf(DType t, const float* src, uint16_t* dst, size_t n) {
  if (t == DType::kBF16) {
    ConvertF32ToBF16(src, reinterpret_cast<bf16*>(dst), n);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = core::F32ToF16(src[i]);
  }
}

void FromHalf(DType t, const uint16_t* src, float* dst, size_t n) {
  if (t == DType::kBF16) {
    ConvertBF16ToF32(reinterpret_cast<const bf16*>(src), dst, n);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = core::F16ToF32(src[i]);
  }
}

namespace {

// g + residual (the value error feedback sends); the residual is left as is.
inline float Accumulated(const float* g, std::span<float> residual, size_t i) {
  return residual.empty() ? g[i] : g[i] + residual[i];
}

// The magnitude top-k ranks by: NaN above everything, so that a NaN
// gradient is sent (and seen) rather than hidden in a residual.
inline float Key(float v) {
  return std::isnan(v) ? std::numeric_limits<float>::infinity() : std::fabs(v);
}

}  // namespace

std::vector<Pair> SelectThreshold(const float* g, std::span<float> residual, size_t n,
                                  float threshold) {
  std::vector<Pair> out;
  out.reserve(n / 4);
  for (size_t i = 0; i < n; ++i) {
    const float v = Accumulated(g, residual, i);
    // !(|v| < t) also selects NaN.
    const bool send = !(std::fabs(v) < threshold);
    if (send) out.push_back({static_cast<uint32_t>(i), v});
    if (!residual.empty()) residual[i] = send ? 0.0f : v;
  }
  return out;
}

size_t TopKCount(size_t n, double ratio) {
  if (n == 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(n));
  if (!(k >= 1)) return 1;
  return k >= static_cast<double>(n) ? n : static_cast<size_t>(k);
}

std::vector<Pair> SelectTopK(const float* g, std::span<float> residual, size_t n,
                             std::span<const size_t> starts, double ratio) {
  // The accumulated values go straight into the residual (or a copy).
  std::vector<float> own;
  float* acc = residual.data();
  if (residual.empty()) {
    own.assign(g, g + n);
    acc = own.data();
  } else {
    for (size_t i = 0; i < n; ++i) acc[i] += g[i];
  }
  // (key, index) records in a strict weak order (larger key first, then
  // the lower index): the selection is a function of the values.
  struct Rec {
    float key;
    uint32_t index;
  };
  auto before = [](const Rec& a, const Rec& b) {
    return a.key > b.key || (a.key == b.key && a.index < b.index);
  };
  std::vector<Pair> out;
  std::vector<Rec> recs;
  for (size_t s = 0; s < starts.size(); ++s) {
    const size_t lo = starts[s], hi = s + 1 < starts.size() ? starts[s + 1] : n;
    const size_t len = hi - lo, k = TopKCount(len, ratio);
    recs.resize(len);
    for (size_t i = 0; i < len; ++i) recs[i] = {Key(acc[lo + i]), static_cast<uint32_t>(lo + i)};
    if (k < len) {
      std::nth_element(recs.begin(), recs.begin() + static_cast<ptrdiff_t>(k), recs.end(), before);
    }
    recs.resize(k);
    std::sort(recs.begin(), recs.end(),
              [](const Rec& a, const Rec& b) { return a.index < b.index; });
    for (const Rec& r : recs) {
      out.push_back({r.index, acc[r.index]});
      acc[r.index] = 0.0f;  // sent: nothing left behind
    }
  }
  return out;
}

namespace {

// T(lo, hi) of core/reduce.h over sparse lists. An element present on one
// side only is x + (+0), as the dense sum computes it (-0 becomes +0).
std::vector<Pair> Tree(std::span<const std::span<const Pair>> lists, int lo, int hi) {
  if (hi - lo == 1) return {lists[lo].begin(), lists[lo].end()};
  int p = 1;
  while (p * 2 < hi - lo) p *= 2;
  std::vector<Pair> a = Tree(lists, lo, lo + p), b = Tree(lists, lo + p, hi);
  std::vector<Pair> out;
  out.reserve(a.size() + b.size());
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    if (j == b.size() || (i < a.size() && a[i].index < b[j].index)) {
      out.push_back({a[i].index, a[i].value + 0.0f});
      ++i;
    } else if (i == a.size() || b[j].index < a[i].index) {
      out.push_back({b[j].index, 0.0f + b[j].value});
      ++j;
    } else {
      out.push_back({a[i].index, a[i].value + b[j].value});
      ++i;
      ++j;
    }
  }
  return out;
}

}  // namespace

void MergeSparse(std::span<const std::span<const Pair>> lists, float* out, size_t n, bool average) {
  std::fill(out, out + n, 0.0f);
  const int N = static_cast<int>(lists.size());
  if (N == 0) return;
  const float div = static_cast<float>(N);
  for (const Pair& p : Tree(lists, 0, N)) {
    if (p.index >= n) {
      throw Error(ErrorCode::kInternal, "sparse gradient: index " + std::to_string(p.index) +
                                            " outside a bucket of " + std::to_string(n));
    }
    out[p.index] = average ? p.value / div : p.value;
  }
}

}  // namespace mc2::grad
