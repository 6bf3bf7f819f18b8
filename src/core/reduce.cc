// Reduction kernels: conversions, the portable (plain C++) kernels and the
// run-time dispatch to the AVX-512 kernels in reduce_avx512.cc.
//
// Both paths evaluate the canonical tree of reduce.h the same way, one block
// of elements at a time: the block of every source is loaded once, combined
// in tree order in a small stack of partial results (registers / L1) and the
// result written to dst once. So a reduction over n sources reads each source
// once and writes dst once, whatever n, which is what makes it run at memory
// speed.
//
// The tree is walked as a binary counter: after leaf j is pushed, the top
// tz(j + 1) entries (tz = trailing zeros) are merged pairwise, which builds
// the complete subtrees T(k*2^m, (k+1)*2^m); what is left on the stack at the
// end are the complete subtrees for the binary digits of n, largest first,
// and folding them from the top down (right to left) gives exactly
// T(0, n) = T(0, p) (+) T(p, n).
//
// Elementwise semantics shared by both paths (the SIMD path must agree with
// this file bit for bit):
//  * f16/bf16 are computed in f32; sums and products are rounded back to the
//    storage type (nearest even) at every tree node. Partial results are kept
//    in f32 but always hold a representable 16-bit value.
//  * min/max of floats propagate NaN: if the left operand is NaN it is the
//    result, else if the right one is NaN it is. Otherwise the smaller
//    (larger) value; for equal values the bitwise OR (AND) of the two, which
//    only matters for -0/+0 and makes min(-0, +0) = -0 and max(-0, +0) = +0
//    in either order (IEEE 754-2019 minimum/maximum).
//  * NaN payloads of sums/products are whatever the hardware produces (the
//    compiler may swap the operands of +), so only "is NaN" is portable there.
//  * Integer sums and products wrap (computed in unsigned arithmetic).
//  * kAvg: the tree sum divided by `divisor`, in f32 for f16/bf16 (then
//    rounded once), in the type for f32/f64 (divisor converted to it),
//    truncating for integers. For integers a divisor < 1 leaves the sum (a
//    division by zero would be undefined; callers pass the group size).
#include "core/reduce.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MC2_REDUCE_HAVE_AVX512 1
#else
#define MC2_REDUCE_HAVE_AVX512 0
#endif

namespace mc2::core {

// ---------------------------------------------------------------------------
// Conversions. They define the rounding every path must reproduce; x86's
// vcvtph2ps/vcvtps2ph behave identically (checked in tests): NaNs are quieted
// with their payload kept (high bits of it when narrowing). They assume the
// default floating-point environment (round to nearest, no flush-to-zero),
// as does all f32 arithmetic here.

// All four are branch-free so that the portable kernels' loops over them
// vectorise: every case is computed and the result picked with Select (GCC
// will not if-convert ?: over floating-point operations, which might trap).

namespace {

// Forced inline: the kernels call these per element from dozens of template
// instances, and a call per element would stop the loops vectorising.
#if defined(__GNUC__) || defined(__clang__)
#define MC2_REDUCE_INLINE inline __attribute__((always_inline))
#else
#define MC2_REDUCE_INLINE inline
#endif

template <typename U>
MC2_REDUCE_INLINE U Select(bool c, U a, U b) {
  const U m = static_cast<U>(U{0} - static_cast<U>(c));
  return static_cast<U>((a & m) | (b & ~m));
}

MC2_REDUCE_INLINE float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;  // exponent and mantissa
  const uint32_t man = h & 0x3FFu;
  // Normal: rebias the exponent.
  const uint32_t normal = (em << 13) + ((127u - 15u) << 23);
  // Zero/denormal: man * 2^-24, computed exactly as (2^-14 + man * 2^-24)
  // - 2^-14 (the FPU renormalises).
  const uint32_t denormal = std::bit_cast<uint32_t>(
      std::bit_cast<float>((man << 13) + (113u << 23)) - 0x1p-14f);
  // Inf, or NaN made quiet (bit 22) with its payload kept.
  const uint32_t special =
      0x7F800000u | (man << 13) | Select(man != 0, 0x00400000u, 0u);
  const uint32_t bits = Select(em >= 0x7C00u, special,
                               Select(em >= 0x0400u, normal, denormal));
  return std::bit_cast<float>(sign | bits);
}

MC2_REDUCE_INLINE uint16_t FloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  // NaN: quiet, keep the high payload bits.
  const uint32_t nan = 0x7E00u | ((ax >> 13) & 0x3FFu);
  // Normal f16 (>= 2^-14): rebias, round off 13 bits to nearest even; a
  // carry into the exponent is the correct result.
  const uint32_t r = ax - ((127u - 15u) << 23);
  const uint32_t normal = (r + 0xFFFu + ((r >> 13) & 1u)) >> 13;
  // Denormal f16 (or zero): adding 0.5, whose ulp is 2^-24, makes the FPU
  // round |f| to a multiple of 2^-24 (nearest even); the mantissa then
  // counts those units, a carry out of the denormal range correctly
  // producing the smallest normal.
  const uint32_t denormal =
      std::bit_cast<uint32_t>(std::bit_cast<float>(ax) + 0.5f) - 0x3F000000u;
  // 65520 = 65504 (max f16) + half an ulp: ties to even round it (and all
  // above it) to infinity.
  const uint32_t h =
      Select(ax > 0x7F800000u, nan,
             Select(ax >= 0x477FF000u, 0x7C00u,
                    Select(ax >= 0x38800000u, normal, denormal)));
  return static_cast<uint16_t>(sign | h);
}

MC2_REDUCE_INLINE float BFloatToFloat(uint16_t h) {
  // A signalling NaN is quieted on the way back (FloatToBFloat).
  return BF16ToF32(h);
}

MC2_REDUCE_INLINE uint16_t FloatToBFloat(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  // NaN: quiet, keep the high payload bits.
  const uint32_t nan = (x >> 16) | 0x40u;
  // Round to nearest even on the raw encoding: carries propagate into the
  // exponent, so denormals, binade changes and overflow to inf fall out.
  const uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(
      Select((x & 0x7FFFFFFFu) > 0x7F800000u, nan, rounded));
}

}  // namespace

float F16ToF32(uint16_t h) { return HalfToFloat(h); }
uint16_t F32ToF16(float f) { return FloatToHalf(f); }
uint16_t F32ToBF16(float f) { return FloatToBFloat(f); }

namespace internal {

#if MC2_REDUCE_HAVE_AVX512
// Defined in reduce_avx512.cc (compiled for AVX-512 by target pragmas).
// Same contract as PortableTree below; only called when the CPU has
// avx512f/bw/dq/vl.
void ReduceTreeAvx512(DType t, ReduceOp op, void* dst, const void* const* srcs, int n, size_t count,
                      int divisor, ResultUse use);
#endif

void SetReduceIsaForTest(bool portable);

}  // namespace internal

namespace {

// ---------------------------------------------------------------------------
// Portable kernels.

// Max stack depth of the tree walk: popcount(j + 1) <= 31 for int n.
constexpr int kMaxDepth = 32;
// Elements per block: small enough that the stack of partials stays in L1,
// large enough that loops over it vectorise and loop overhead vanishes.
constexpr size_t kBlock = 64;

bool IsFloatType(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kF16 ||
         t == DType::kBF16;
}

size_t ElemSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI8: return 1;
    case DType::kU8: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
  }
  return 0;
}

bool Valid(DType t, ReduceOp op) {
  if (static_cast<int>(t) >= kNumDTypes) return false;
  if (static_cast<int>(op) >= kNumReduceOps) return false;
  if (IsFloatType(t)) {
    return op != ReduceOp::kBand && op != ReduceOp::kBor &&
           op != ReduceOp::kBxor;
  }
  return true;
}

// Branch-free like the conversions (same order of precedence as the
// comments in the file header: NaN in a, NaN in b, smaller/larger, OR/AND).
template <typename F, typename U>
F MinFloat(F a, F b) {
  const U ab = std::bit_cast<U>(a);
  const U bb = std::bit_cast<U>(b);
  U r = Select(b < a, bb, ab);
  r = Select(a == b, static_cast<U>(ab | bb), r);
  r = Select(b != b, bb, r);
  return std::bit_cast<F>(Select(a != a, ab, r));
}

template <typename F, typename U>
F MaxFloat(F a, F b) {
  const U ab = std::bit_cast<U>(a);
  const U bb = std::bit_cast<U>(b);
  U r = Select(b > a, bb, ab);
  r = Select(a == b, static_cast<U>(ab & bb), r);
  r = Select(b != b, bb, r);
  return std::bit_cast<F>(Select(a != a, ab, r));
}

// Per-dtype scalar traits: S is the storage type, C the compute type.
template <DType T>
struct Traits;

template <typename F, typename U>
struct NativeFloat {
  using S = F;
  using C = F;
  using Bits = U;
  static constexpr bool kFloat = true;
  static C Load(S s) { return s; }
  static S Store(C c) { return c; }
  static C Round(C c) { return c; }
  static C Div(C c, int divisor) { return c / static_cast<C>(divisor); }
};
template <>
struct Traits<DType::kF32> : NativeFloat<float, uint32_t> {};
template <>
struct Traits<DType::kF64> : NativeFloat<double, uint64_t> {};

template <>
struct Traits<DType::kF16> {
  using S = uint16_t;
  using C = float;
  using Bits = uint32_t;
  static constexpr bool kFloat = true;
  static C Load(S s) { return HalfToFloat(s); }
  static S Store(C c) { return FloatToHalf(c); }
  static C Round(C c) { return HalfToFloat(FloatToHalf(c)); }
  static C Div(C c, int divisor) { return c / static_cast<float>(divisor); }
};

template <>
struct Traits<DType::kBF16> {
  using S = uint16_t;
  using C = float;
  using Bits = uint32_t;
  static constexpr bool kFloat = true;
  static C Load(S s) { return BFloatToFloat(s); }
  static S Store(C c) { return FloatToBFloat(c); }
  static C Round(C c) { return BFloatToFloat(FloatToBFloat(c)); }
  static C Div(C c, int divisor) { return c / static_cast<float>(divisor); }
};

template <typename I>
struct Integer {
  using S = I;
  using C = I;
  using U = std::make_unsigned_t<I>;
  static constexpr bool kFloat = false;
  static C Load(S s) { return s; }
  static S Store(C c) { return c; }
  // Wrapping arithmetic: unsigned operands (promoted to int for 8-bit
  // types, where the product of two bytes cannot overflow), converted back
  // modulo 2^bits (well defined since C++20).
  static C Add(C a, C b) {
    return static_cast<C>(static_cast<U>(static_cast<U>(a) +
                                         static_cast<U>(b)));
  }
  static C Mul(C a, C b) {
    return static_cast<C>(static_cast<U>(static_cast<U>(a) *
                                         static_cast<U>(b)));
  }
  // Truncating; divisor >= 1 here, so the result fits.
  static C Div(C c, int divisor) { return static_cast<C>(c / divisor); }
};
template <>
struct Traits<DType::kI8> : Integer<int8_t> {};
template <>
struct Traits<DType::kU8> : Integer<uint8_t> {};
template <>
struct Traits<DType::kI32> : Integer<int32_t> {};
template <>
struct Traits<DType::kI64> : Integer<int64_t> {};

template <DType T, ReduceOp O>
inline typename Traits<T>::C Apply(typename Traits<T>::C a,
                                   typename Traits<T>::C b) {
  using K = Traits<T>;
  if constexpr (K::kFloat) {
    using C = typename K::C;
    using Bits = typename K::Bits;
    if constexpr (O == ReduceOp::kSum || O == ReduceOp::kAvg) {
      return K::Round(a + b);
    } else if constexpr (O == ReduceOp::kProd) {
      return K::Round(a * b);
    } else if constexpr (O == ReduceOp::kMin) {
      return MinFloat<C, Bits>(a, b);  // no rounding: selects an input
    } else if constexpr (O == ReduceOp::kMax) {
      return MaxFloat<C, Bits>(a, b);
    } else {
      static_assert(O != O, "bitwise ops are integer-only");
    }
  } else {
    if constexpr (O == ReduceOp::kSum || O == ReduceOp::kAvg) {
      return K::Add(a, b);
    } else if constexpr (O == ReduceOp::kProd) {
      return K::Mul(a, b);
    } else if constexpr (O == ReduceOp::kMin) {
      return b < a ? b : a;
    } else if constexpr (O == ReduceOp::kMax) {
      return b > a ? b : a;
    } else if constexpr (O == ReduceOp::kBand) {
      return static_cast<typename K::C>(a & b);
    } else if constexpr (O == ReduceOp::kBor) {
      return static_cast<typename K::C>(a | b);
    } else {
      return static_cast<typename K::C>(a ^ b);
    }
  }
}

// One block of `len` elements starting at `base`. kLen is len when known at
// compile time (full blocks, so the loops vectorise), 0 otherwise.
template <DType T, ReduceOp O, size_t kLen>
void PortableBlock(void* dst, const void* const* srcs, int n, size_t base,
                   size_t len, int divisor,
                   typename Traits<T>::C (*stack)[kBlock]) {
  using K = Traits<T>;
  using S = typename K::S;
  using C = typename K::C;
  if constexpr (kLen != 0) len = kLen;
  C v[kBlock];
  int depth = 0;
  for (int j = 0; j < n; ++j) {
    const S* s = static_cast<const S*>(srcs[j]) + base;
    for (size_t i = 0; i < len; ++i) v[i] = K::Load(s[i]);
    for (unsigned m = static_cast<unsigned>(j) + 1; (m & 1u) == 0; m >>= 1) {
      --depth;
      for (size_t i = 0; i < len; ++i) v[i] = Apply<T, O>(stack[depth][i], v[i]);
    }
    if (j + 1 < n) {
      std::copy(v, v + len, stack[depth]);
      ++depth;
    }
  }
  while (depth > 0) {
    --depth;
    for (size_t i = 0; i < len; ++i) v[i] = Apply<T, O>(stack[depth][i], v[i]);
  }
  if constexpr (O == ReduceOp::kAvg) {
    for (size_t i = 0; i < len; ++i) v[i] = K::Div(v[i], divisor);
  }
  S* d = static_cast<S*>(dst) + base;
  for (size_t i = 0; i < len; ++i) d[i] = K::Store(v[i]);
}

template <DType T, ReduceOp O>
void PortableTreeTyped(void* dst, const void* const* srcs, int n,
                       size_t count, int divisor) {
  typename Traits<T>::C stack[kMaxDepth][kBlock];
  size_t base = 0;
  for (; base + kBlock <= count; base += kBlock) {
    PortableBlock<T, O, kBlock>(dst, srcs, n, base, kBlock, divisor, stack);
  }
  if (base < count) {
    PortableBlock<T, O, 0>(dst, srcs, n, base, count - base, divisor, stack);
  }
}

template <DType T>
void PortableTreeOps(ReduceOp op, void* dst, const void* const* srcs, int n,
                     size_t count, int divisor) {
  switch (op) {
    case ReduceOp::kSum:
      return PortableTreeTyped<T, ReduceOp::kSum>(dst, srcs, n, count, divisor);
    case ReduceOp::kProd:
      return PortableTreeTyped<T, ReduceOp::kProd>(dst, srcs, n, count,
                                                   divisor);
    case ReduceOp::kMin:
      return PortableTreeTyped<T, ReduceOp::kMin>(dst, srcs, n, count, divisor);
    case ReduceOp::kMax:
      return PortableTreeTyped<T, ReduceOp::kMax>(dst, srcs, n, count, divisor);
    case ReduceOp::kAvg:
      return PortableTreeTyped<T, ReduceOp::kAvg>(dst, srcs, n, count, divisor);
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      if constexpr (!Traits<T>::kFloat) {
        if (op == ReduceOp::kBand) {
          return PortableTreeTyped<T, ReduceOp::kBand>(dst, srcs, n, count,
                                                       divisor);
        }
        if (op == ReduceOp::kBor) {
          return PortableTreeTyped<T, ReduceOp::kBor>(dst, srcs, n, count,
                                                      divisor);
        }
        return PortableTreeTyped<T, ReduceOp::kBxor>(dst, srcs, n, count,
                                                     divisor);
      }
      return;
  }
}

// Evaluates T(0, n) over srcs into dst (plus the division for kAvg).
// Preconditions (checked by the callers): (t, op) valid, n >= 1, and for
// integer kAvg divisor >= 1.
void PortableTree(DType t, ReduceOp op, void* dst, const void* const* srcs,
                  int n, size_t count, int divisor) {
  switch (t) {
    case DType::kF32:
      return PortableTreeOps<DType::kF32>(op, dst, srcs, n, count, divisor);
    case DType::kF64:
      return PortableTreeOps<DType::kF64>(op, dst, srcs, n, count, divisor);
    case DType::kF16:
      return PortableTreeOps<DType::kF16>(op, dst, srcs, n, count, divisor);
    case DType::kBF16:
      return PortableTreeOps<DType::kBF16>(op, dst, srcs, n, count, divisor);
    case DType::kI8:
      return PortableTreeOps<DType::kI8>(op, dst, srcs, n, count, divisor);
    case DType::kU8:
      return PortableTreeOps<DType::kU8>(op, dst, srcs, n, count, divisor);
    case DType::kI32:
      return PortableTreeOps<DType::kI32>(op, dst, srcs, n, count, divisor);
    case DType::kI64:
      return PortableTreeOps<DType::kI64>(op, dst, srcs, n, count, divisor);
  }
}

// ---------------------------------------------------------------------------
// Dispatch.

enum class Isa : int { kPortable = 0, kAvx512 = 1 };

Isa DetectBestIsa() {
#if MC2_REDUCE_HAVE_AVX512
  __builtin_cpu_init();
  // libgcc/compiler-rt also check that the OS saves the zmm state.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return Isa::kAvx512;
  }
#endif
  return Isa::kPortable;
}

Isa DetectIsa() {
  const char* env = std::getenv("MC2_KERNELS");
  if (env != nullptr && std::strcmp(env, "portable") == 0) {
    return Isa::kPortable;
  }
  return DetectBestIsa();
}

// -1 until first use. Detection is idempotent, so racing first uses agree.
std::atomic<int> g_isa{-1};

Isa CurrentIsa() {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v < 0) {
    v = static_cast<int>(DetectIsa());
    g_isa.store(v, std::memory_order_relaxed);
  }
  return static_cast<Isa>(v);
}

// Reads MC2_KERNELS at load time, as documented ("once at start-up"), rather
// than at the first reduction.
[[maybe_unused]] const bool g_isa_initialized = (CurrentIsa(), true);

void Run(DType t, ReduceOp op, void* dst, const void* const* srcs, int n, size_t count, int divisor,
         ResultUse use = ResultUse::kLocal) {
#if MC2_REDUCE_HAVE_AVX512
  if (CurrentIsa() == Isa::kAvx512) {
    internal::ReduceTreeAvx512(t, op, dst, srcs, n, count, divisor, use);
    return;
  }
#endif
  PortableTree(t, op, dst, srcs, n, count, divisor);
}

}  // namespace

namespace internal {

// Test hook: portable = true forces the portable kernels, false selects the
// best kernels the CPU supports (ignoring MC2_KERNELS).
void SetReduceIsaForTest(bool portable) {
  g_isa.store(static_cast<int>(portable ? Isa::kPortable : DetectBestIsa()),
              std::memory_order_relaxed);
}

}  // namespace internal

// ---------------------------------------------------------------------------
// Public entry points. Invalid (dtype, op) pairs are ignored: callers
// validate arguments before reaching the kernels.

void Combine(DType t, ReduceOp op, void* dst, const void* a, const void* b,
             size_t count) {
  if (!Valid(t, op) || count == 0) return;
  // A chain of Combines builds the sum; FinishAvg divides at the end.
  if (op == ReduceOp::kAvg) op = ReduceOp::kSum;
  const void* srcs[2] = {a, b};
  Run(t, op, dst, srcs, 2, count, 1);
}

void ReduceTree(DType t, ReduceOp op, void* dst, const void* const* srcs, int n, size_t count,
                int divisor, ResultUse use) {
  if (!Valid(t, op) || n < 1 || count == 0) return;
  if (op == ReduceOp::kAvg && !IsFloatType(t) && divisor < 1) {
    op = ReduceOp::kSum;
  }
  if (n == 1 && op != ReduceOp::kAvg) {
    // T(0, 1) is x_0 itself, bit for bit (no conversion, sNaNs untouched).
    if (dst != srcs[0]) std::memmove(dst, srcs[0], count * ElemSize(t));
    return;
  }
  Run(t, op, dst, srcs, n, count, divisor, use);
}

void FinishAvg(DType t, ReduceOp op, void* dst, size_t count, int divisor) {
  if (op != ReduceOp::kAvg || !Valid(t, op) || count == 0) return;
  if (!IsFloatType(t) && divisor < 1) return;
  // The kAvg tree over one source is exactly "load, divide, store".
  const void* srcs[1] = {dst};
  Run(t, ReduceOp::kAvg, dst, srcs, 1, count, divisor);
}

const char* ReduceKernelIsa() {
  return CurrentIsa() == Isa::kAvx512 ? "avx512" : "portable";
}

}  // namespace mc2::core
