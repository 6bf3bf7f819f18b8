// The reference every result check uses (the collective tests, `mc2 soak`,
// `mc2 bench`): an independent restatement of what a reduction must produce,
// in plain loops over exact int64 arithmetic, with its own float
// conversions. The library never includes it, and it never calls the
// library's reduce kernels or conversions: a bug there cannot hide in the
// expected values.
//
// Inputs are small integers chosen by the caller so that every partial
// result is exact in the element type; the result is then the same in any
// order of reduction. What is stored follows the library's documented
// semantics (src/core/reduce.h): integer types wrap (two's complement),
// ReduceOp::kAvg divides in f64 for f64, in f32 for the other float types
// (rounded once to f16/bf16), and truncates toward zero for integers.
//
// A tools-level library (tools/lib, target mc2_reference), header-only and
// on the public API alone: the tools and the tests share it, and the
// library under test cannot reach it.
#ifndef MC2_REFERENCE_REFERENCE_REDUCE_H_
#define MC2_REFERENCE_REFERENCE_REDUCE_H_

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "mc2/tensor.h"

namespace mc2::reference {

// Reduces value(r) over ranks r = 0..n-1 (n >= 1), in rank order, in int64.
// Sums and products wrap as two's complement; kAvg yields the sum (see
// StoreReduction for the division).
template <typename ValueFn>
int64_t ReduceInts(ReduceOp op, int n, ValueFn&& value) {
  int64_t acc = value(0);
  for (int r = 1; r < n; ++r) {
    const int64_t v = value(r);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc = static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(v));
        break;
      case ReduceOp::kProd:
        acc = static_cast<int64_t>(static_cast<uint64_t>(acc) * static_cast<uint64_t>(v));
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kBand:
        acc &= v;
        break;
      case ReduceOp::kBor:
        acc |= v;
        break;
      case ReduceOp::kBxor:
        acc ^= v;
        break;
    }
  }
  return acc;
}

// IEEE binary16 from binary32, rounded to nearest even (NaN stays NaN).
inline uint16_t F32ToF16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t a = x & 0x7FFFFFFF;
  if (a >= 0x7F800000) return sign | 0x7C00 | (a > 0x7F800000 ? 0x200 : 0);
  if (a >= 0x477FF000) return sign | 0x7C00;                     // rounds to infinity
  if (a < 0x38800000) {                                          // subnormal: units of 2^-24
    const float scaled = std::bit_cast<float>(a) * 16777216.0f;  // exact
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t h = (((a >> 23) - 127 + 15) << 10) | ((a & 0x7FFFFF) >> 13);
  const uint32_t rest = a & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // a carry rounds the exponent up
  return static_cast<uint16_t>(sign | h);
}

// bfloat16 from binary32, rounded to nearest even (NaN stays NaN).
inline uint16_t F32ToBF16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7F800000) == 0x7F800000 && (x & 0x7FFFFF))
    return static_cast<uint16_t>((x >> 16) | 0x40);
  x += 0x7FFF + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

// Stores `v` as one element of a float type at `dst` (rounded to nearest;
// integer types: truncated toward zero, then wrapped).
inline void StoreDouble(DType t, double v, void* dst) {
  auto put = [dst](auto x) { std::memcpy(dst, &x, sizeof(x)); };
  switch (t) {
    case DType::kF32:
      put(static_cast<float>(v));
      break;
    case DType::kF64:
      put(v);
      break;
    case DType::kF16:
      put(F32ToF16(static_cast<float>(v)));
      break;
    case DType::kBF16:
      put(F32ToBF16(static_cast<float>(v)));
      break;
    case DType::kI8:
      put(static_cast<int8_t>(static_cast<int64_t>(v)));
      break;
    case DType::kU8:
      put(static_cast<uint8_t>(static_cast<int64_t>(v)));
      break;
    case DType::kI32:
      put(static_cast<int32_t>(static_cast<int64_t>(v)));
      break;
    case DType::kI64:
      put(static_cast<int64_t>(v));
      break;
  }
}

// Stores the integer `v` as one element of `t` at `dst`: integer types wrap
// (two's complement), float types take the nearest value (exact for the
// small integers the checks use).
inline void StoreInt(DType t, int64_t v, void* dst) {
  auto put = [dst](auto x) { std::memcpy(dst, &x, sizeof(x)); };
  switch (t) {
    case DType::kI8:
      put(static_cast<int8_t>(static_cast<uint8_t>(v)));
      break;
    case DType::kU8:
      put(static_cast<uint8_t>(v));
      break;
    case DType::kI32:
      put(static_cast<int32_t>(static_cast<uint32_t>(v)));
      break;
    case DType::kI64:
      put(v);
      break;
    default:
      StoreDouble(t, static_cast<double>(v), dst);
  }
}

// `v` wrapped to the integer type `t` (other types: unchanged).
inline int64_t Wrap(DType t, int64_t v) {
  switch (t) {
    case DType::kI8:
      return static_cast<int8_t>(static_cast<uint8_t>(v));
    case DType::kU8:
      return static_cast<uint8_t>(v);
    case DType::kI32:
      return static_cast<int32_t>(static_cast<uint32_t>(v));
    default:
      return v;
  }
}

// Stores the result of reducing with `op` over `n` ranks, whose int64
// accumulation (ReduceInts) is `acc`, as one element of `t` at `dst`.
inline void StoreReduction(DType t, ReduceOp op, int n, int64_t acc, void* dst) {
  if (op != ReduceOp::kAvg) return StoreInt(t, IsFloat(t) ? acc : Wrap(t, acc), dst);
  if (t == DType::kF64) return StoreDouble(t, static_cast<double>(acc) / n, dst);
  if (IsFloat(t))  // f32 division; 16-bit types round that once
    return StoreDouble(t, static_cast<float>(acc) / static_cast<float>(n), dst);
  StoreInt(t, Wrap(t, acc) / n, dst);
}

}  // namespace mc2::reference

#endif  // MC2_REFERENCE_REFERENCE_REDUCE_H_
