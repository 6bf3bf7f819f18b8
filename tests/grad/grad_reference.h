// Independent references for the GradSync tests: every rank's gradients are
// a function of (seed, step, rank, parameter, element), so each rank can
// compute what every other rank contributed and reduce it itself, in the
// canonical order of core/reduce.h, written out again here as a scalar
// recursion.
#ifndef MC2_TESTS_GRAD_GRAD_REFERENCE_H_
#define MC2_TESTS_GRAD_GRAD_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "core/reduce.h"
#include "mc2/tensor.h"

namespace mc2::gradtest {

inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A gradient value: sign and magnitude spread over 1e-9 .. 1, so that a
// threshold of 1e-6 drops some and keeps most.
inline float Value(uint64_t seed, int step, int rank, int param, size_t i) {
  uint64_t h =
      Mix(seed ^ Mix(static_cast<uint64_t>(step) << 40 ^ static_cast<uint64_t>(rank) << 32 ^
                     static_cast<uint64_t>(param) << 24 ^ i));
  const double u = static_cast<double>(h >> 11) / 9007199254740992.0;  // [0, 1)
  const int exponent = static_cast<int>(h & 15);                       // 0..15
  const double mag = (0.25 + u) * std::pow(10.0, -(exponent < 10 ? exponent % 3 : exponent - 6));
  return static_cast<float>((h & 16) ? -mag : mag);
}

// The canonical tree over ranks [lo, hi) of x(r), in type T.
template <typename T>
T Tree(const std::function<T(int)>& x, int lo, int hi) {
  if (hi - lo == 1) return x(lo);
  int p = 1;
  while (p * 2 < hi - lo) p *= 2;
  return Tree<T>(x, lo, lo + p) + Tree<T>(x, lo + p, hi);
}

inline bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Rounds f32 to the 16-bit type and back.
inline float Round16(DType t, float v) {
  return t == DType::kBF16 ? core::BF16ToF32(core::F32ToBF16(v))
                           : core::F16ToF32(core::F32ToF16(v));
}

}  // namespace mc2::gradtest

#endif  // MC2_TESTS_GRAD_GRAD_REFERENCE_H_
