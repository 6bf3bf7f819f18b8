// mc2/tensor.h: the element types and reduction operators that the
// collectives and operators take, with their names.
#ifndef MC2_TENSOR_H_
#define MC2_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace mc2 {

enum class DType : uint8_t {
  kF32 = 0,
  kF64,
  kF16,   // IEEE half; reduced in f32, rounded to nearest even on store
  kBF16,  // bfloat16; reduced in f32, rounded to nearest even on store
  kI8,
  kU8,
  kI32,
  kI64,
};
inline constexpr int kNumDTypes = 8;

enum class ReduceOp : uint8_t {
  kSum = 0,
  kProd,
  kMin,
  kMax,
  kAvg,   // sum divided by the group size (integers: truncating division)
  kBand,  // integers only
  kBor,   // integers only
  kBxor,  // integers only
};
inline constexpr int kNumReduceOps = 8;

// Size of one element in bytes.
size_t DTypeSize(DType t);
// "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64".
const char* DTypeName(DType t);
// "sum", "prod", "min", "max", "avg", "band", "bor", "bxor".
const char* ReduceOpName(ReduceOp op);
bool IsFloat(DType t);
// Whether `op` is defined for `t` (bitwise ops need integers).
bool IsValidReduction(DType t, ReduceOp op);
// Inverse of DTypeName / ReduceOpName (also accepts "float", "half",
// "bfloat16", "int32", ...); nullopt for unknown names.
std::optional<DType> ParseDType(std::string_view name);
std::optional<ReduceOp> ParseReduceOp(std::string_view name);

// 16-bit float storage types. Arithmetic happens in f32.
struct f16 {
  uint16_t bits;
};
struct bf16 {
  uint16_t bits;
};

}  // namespace mc2

#endif  // MC2_TENSOR_H_
