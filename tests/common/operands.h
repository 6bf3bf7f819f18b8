// Operands of the fused-operator tests: random matrices generated alike on
// every rank from a seed, with their exact values as doubles for the
// independent references, and the comparisons the tests make.
#ifndef MC2_TESTS_COMMON_OPERANDS_H_
#define MC2_TESTS_COMMON_OPERANDS_H_

#include <cstdint>
#include <vector>

#include "mc2/mc2.h"

namespace mc2::test {

// Bitwise equality of two float vectors (memcmp, but defined for empty ones).
bool SameBits(const std::vector<float>& a, const std::vector<float>& b);

// `count` values uniform in [-1, 1) from `seed`, stored as `dtype` (f32 or
// bf16) bytes, with the exact stored values as doubles.
struct Mat {
  std::vector<char> bytes;
  std::vector<double> value;
};
Mat Random(size_t count, DType dtype, uint64_t seed);

// |c - ref| small against the sum of |products| (f32 accumulation).
bool Close(float c, double ref, double abs_sum);

// serial, auto, and chunked and fused with 1, 2, 3, 4, 7 and 16 chunks.
std::vector<FusedOptions> AllPipelines();

}  // namespace mc2::test

#endif  // MC2_TESTS_COMMON_OPERANDS_H_
