// Checked size arithmetic for argument validation: the byte sizes, sums and
// products that public entry points derive from caller-supplied counts.
//
// Every helper either returns the exact result or throws
// mc2::Error(kInvalidArgument) whose message names the operands, so that an
// entry point rejects a size whose arithmetic wraps before it allocates,
// forms a pointer or waits for a peer. The description is formatted only on
// failure, so a check costs one overflow test on the fast path.
//
// Usage:
//   size_t bytes = core::CheckedBytes("all_reduce", "count", count, dtype);
//   size_t total = core::CheckedMul(bytes, n, "reduce_scatter: {} bytes x {} ranks", bytes, n);
//   size_t end = core::CheckedAdd(displ, count, "all_gatherv: displs[{}] {} + counts[{}] {}",
//                                 r, displ, r, count);
#ifndef MC2_CORE_CHECKED_H_
#define MC2_CORE_CHECKED_H_

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "mc2/error.h"
#include "mc2/tensor.h"

namespace mc2::core {

// The largest size of one buffer: no object exceeds PTRDIFF_MAX bytes, and
// pointer differences within a buffer must stay representable.
inline constexpr size_t kMaxBufferBytes = static_cast<size_t>(PTRDIFF_MAX);

// a * b, or throws kInvalidArgument "<what> overflows size_t".
template <typename... Args>
size_t CheckedMul(size_t a, size_t b, fmt::format_string<Args...> what, Args&&... args) {
  size_t r;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]]
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format(what, std::forward<Args>(args)...) + " overflows size_t");
  return r;
}

// a + b, or throws kInvalidArgument "<what> overflows size_t".
template <typename... Args>
size_t CheckedAdd(size_t a, size_t b, fmt::format_string<Args...> what, Args&&... args) {
  size_t r;
  if (__builtin_add_overflow(a, b, &r)) [[unlikely]]
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format(what, std::forward<Args>(args)...) + " overflows size_t");
  return r;
}

// a * b, or SIZE_MAX when it overflows: for estimates (e.g. an algorithm
// choice) where a saturated value is as good as the exact one.
inline size_t SaturatingMul(size_t a, size_t b) {
  size_t r;
  return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

// Throws kInvalidArgument unless `bytes` fits in one buffer
// (kMaxBufferBytes). `op` names the call, `what` the size.
inline void CheckBufferBytes(std::string_view op, std::string_view what, size_t bytes) {
  if (bytes > kMaxBufferBytes) [[unlikely]]
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: {} of {} bytes exceeds the largest possible buffer ({} bytes)", op,
                            what, bytes, kMaxBufferBytes));
}

// The bytes of `count` elements of `dtype` (a valid DType), at most
// kMaxBufferBytes. Throws kInvalidArgument otherwise, e.g.
// "all_reduce: count 9223372036854775807 x 4 bytes (f32) overflows size_t".
inline size_t CheckedBytes(std::string_view op, std::string_view what, size_t count, DType dtype) {
  const size_t e = DTypeSize(dtype);
  const size_t bytes =
      CheckedMul(count, e, "{}: {} {} x {} bytes ({})", op, what, count, e, DTypeName(dtype));
  if (bytes > kMaxBufferBytes) [[unlikely]]
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: {} {} x {} bytes ({}) = {} bytes exceeds the largest possible "
                            "buffer ({} bytes)",
                            op, what, count, e, DTypeName(dtype), bytes, kMaxBufferBytes));
  return bytes;
}

// Throws kInvalidArgument when [p, p + bytes) wraps around the address
// space or exceeds kMaxBufferBytes: no buffer can be that large, and
// forming its end pointer would be undefined.
inline void CheckBufferRange(std::string_view op, std::string_view what, const void* p,
                             size_t bytes) {
  CheckBufferBytes(op, what, bytes);
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a > UINTPTR_MAX - bytes) [[unlikely]]
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("{}: {} at {} + {} bytes wraps around the address space", op, what, p, bytes));
}

// The packed displacements of `counts` (an exclusive prefix sum) and, in
// *total, their sum. Throws kInvalidArgument when the sum overflows.
inline std::vector<size_t> CheckedPackedDispls(std::string_view op, std::string_view what,
                                               std::span<const size_t> counts,
                                               size_t* total = nullptr) {
  std::vector<size_t> d(counts.size());
  size_t sum = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    d[r] = sum;
    sum = CheckedAdd(sum, counts[r], "{}: the sum of {} up to [{}] ({} + {})", op, what, r, sum,
                     counts[r]);
  }
  if (total) *total = sum;
  return d;
}

}  // namespace mc2::core

#endif  // MC2_CORE_CHECKED_H_
