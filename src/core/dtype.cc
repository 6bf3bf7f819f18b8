#include <algorithm>
#include <cctype>
#include <string>

#include "mc2/tensor.h"

namespace mc2 {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kI8: case DType::kU8: return 1;
  }
  return 0;
}

const char* DTypeName(DType t) {
  static const char* const kNames[] = {"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64"};
  auto i = static_cast<size_t>(t);
  return i < std::size(kNames) ? kNames[i] : "?";
}

const char* ReduceOpName(ReduceOp op) {
  static const char* const kNames[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};
  auto i = static_cast<size_t>(op);
  return i < std::size(kNames) ? kNames[i] : "?";
}

bool IsFloat(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kF16 || t == DType::kBF16;
}

bool IsValidReduction(DType t, ReduceOp op) {
  if (static_cast<int>(t) >= kNumDTypes || static_cast<int>(op) >= kNumReduceOps) return false;
  bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  return !(bitwise && IsFloat(t));
}

namespace {
std::string Lower(std::string_view s) {
  std::string r(s);
  std::transform(r.begin(), r.end(), r.begin(), [](unsigned char c) { return std::tolower(c); });
  return r;
}
}  // namespace

std::optional<DType> ParseDType(std::string_view name) {
  struct Alias { const char* name; DType t; };
  static const Alias kAliases[] = {
      {"f32", DType::kF32},  {"float", DType::kF32},    {"float32", DType::kF32},
      {"f64", DType::kF64},  {"double", DType::kF64},   {"float64", DType::kF64},
      {"f16", DType::kF16},  {"half", DType::kF16},     {"float16", DType::kF16},
      {"bf16", DType::kBF16}, {"bfloat16", DType::kBF16},
      {"i8", DType::kI8},    {"int8", DType::kI8},
      {"u8", DType::kU8},    {"uint8", DType::kU8},
      {"i32", DType::kI32},  {"int32", DType::kI32},    {"int", DType::kI32},
      {"i64", DType::kI64},  {"int64", DType::kI64},
  };
  std::string n = Lower(name);
  for (const auto& a : kAliases)
    if (n == a.name) return a.t;
  return std::nullopt;
}

std::optional<ReduceOp> ParseReduceOp(std::string_view name) {
  std::string n = Lower(name);
  for (int i = 0; i < kNumReduceOps; ++i)
    if (n == ReduceOpName(static_cast<ReduceOp>(i))) return static_cast<ReduceOp>(i);
  if (n == "mean") return ReduceOp::kAvg;
  return std::nullopt;
}

}  // namespace mc2
