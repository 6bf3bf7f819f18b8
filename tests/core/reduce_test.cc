// Tests for the reduction kernels (core/reduce.h).
//
// Every kernel result is checked against a scalar reference written here: an
// element-at-a-time recursive evaluation of the canonical tree T(lo, hi) with
// the documented per-node semantics. The 16-bit conversions the reference
// uses are checked in reduce_conversion_test.cc. Both kernel
// paths (portable and AVX-512, when the CPU has it) are run and must agree
// bit for bit.
#include "core/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mc2/tensor.h"

namespace mc2::core::internal {
// Defined in reduce.cc: true forces the portable kernels, false the best the
// CPU supports.
void SetReduceIsaForTest(bool portable);
}  // namespace mc2::core::internal

namespace mc2::core {
namespace {

constexpr DType kAllTypes[] = {DType::kF32, DType::kF64, DType::kF16,
                               DType::kBF16, DType::kI8, DType::kU8,
                               DType::kI32, DType::kI64};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum,  ReduceOp::kProd,
                                ReduceOp::kMin,  ReduceOp::kMax,
                                ReduceOp::kAvg,  ReduceOp::kBand,
                                ReduceOp::kBor,  ReduceOp::kBxor};

const char* TypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI8: return "i8";
    case DType::kU8: return "u8";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
  }
  return "?";
}

const char* OpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kBand: return "band";
    case ReduceOp::kBor: return "bor";
    case ReduceOp::kBxor: return "bxor";
  }
  return "?";
}

size_t Size(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64: return 8;
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kI8:
    case DType::kU8: return 1;
  }
  return 0;
}

bool IsFloatT(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kF16 ||
         t == DType::kBF16;
}

bool IsBitwise(ReduceOp op) {
  return op == ReduceOp::kBand || op == ReduceOp::kBor ||
         op == ReduceOp::kBxor;
}

// Runs `fn` once per kernel path; restores the best path afterwards.
template <typename Fn>
void ForEachIsa(Fn fn) {
  for (bool portable : {true, false}) {
    internal::SetReduceIsaForTest(portable);
    SCOPED_TRACE(std::string("isa=") + ReduceKernelIsa());
    fn(portable);
  }
  internal::SetReduceIsaForTest(false);
}

// --- Raw element access (values as zero-extended bits) ---------------------

uint64_t Get(DType t, const void* base, size_t i) {
  uint64_t v = 0;
  std::memcpy(&v, static_cast<const uint8_t*>(base) + i * Size(t), Size(t));
  return v;
}

void Put(DType t, void* base, size_t i, uint64_t v) {
  std::memcpy(static_cast<uint8_t*>(base) + i * Size(t), &v, Size(t));
}

float AsF32(uint64_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b)); }
double AsF64(uint64_t b) { return std::bit_cast<double>(b); }
uint64_t BitsOf(float f) { return std::bit_cast<uint32_t>(f); }
uint64_t BitsOf(double d) { return std::bit_cast<uint64_t>(d); }

bool IsNaNBits(DType t, uint64_t b) {
  switch (t) {
    case DType::kF32: return std::isnan(AsF32(b));
    case DType::kF64: return std::isnan(AsF64(b));
    case DType::kF16: return (b & 0x7C00) == 0x7C00 && (b & 0x3FF) != 0;
    case DType::kBF16: return (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0;
    default: return false;
  }
}

// --- Scalar reference ---------------------------------------------------------

// min/max as documented: NaN wins (left first); -0 < +0.
template <typename F>
F RefMin(F a, F b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  if (a == b) return std::signbit(a) ? a : b;
  return a < b ? a : b;
}
template <typename F>
F RefMax(F a, F b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}

template <typename F>
F RefFloatOp(ReduceOp op, F a, F b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMin: return RefMin(a, b);
    case ReduceOp::kMax: return RefMax(a, b);
    default: ADD_FAILURE() << "bad float op"; return a;
  }
}

template <typename I>
uint64_t RefIntOp(ReduceOp op, uint64_t ab, uint64_t bb) {
  using U = std::make_unsigned_t<I>;
  const I a = static_cast<I>(static_cast<U>(ab));
  const I b = static_cast<I>(static_cast<U>(bb));
  // Sign-extended to 64 bits, the low bits of 64-bit wrapping arithmetic
  // are those of the narrow type's wrapping arithmetic.
  const uint64_t wa = static_cast<uint64_t>(static_cast<int64_t>(a));
  const uint64_t wb = static_cast<uint64_t>(static_cast<int64_t>(b));
  uint64_t r = 0;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: r = wa + wb; break;
    case ReduceOp::kProd: r = wa * wb; break;
    case ReduceOp::kMin: r = static_cast<uint64_t>(std::min(a, b)); break;
    case ReduceOp::kMax: r = static_cast<uint64_t>(std::max(a, b)); break;
    case ReduceOp::kBand: r = wa & wb; break;
    case ReduceOp::kBor: r = wa | wb; break;
    case ReduceOp::kBxor: r = wa ^ wb; break;
  }
  return static_cast<U>(r);
}

uint64_t RefCombine(DType t, ReduceOp op, uint64_t a, uint64_t b) {
  switch (t) {
    case DType::kF32: return BitsOf(RefFloatOp(op, AsF32(a), AsF32(b)));
    case DType::kF64: return BitsOf(RefFloatOp(op, AsF64(a), AsF64(b)));
    case DType::kF16:
      return F32ToF16(RefFloatOp(op, F16ToF32(static_cast<uint16_t>(a)),
                                 F16ToF32(static_cast<uint16_t>(b))));
    case DType::kBF16:
      return F32ToBF16(RefFloatOp(op, BF16ToF32(static_cast<uint16_t>(a)),
                                  BF16ToF32(static_cast<uint16_t>(b))));
    case DType::kI8: return RefIntOp<int8_t>(op, a, b);
    case DType::kU8: return RefIntOp<uint8_t>(op, a, b);
    case DType::kI32: return RefIntOp<int32_t>(op, a, b);
    case DType::kI64: return RefIntOp<int64_t>(op, a, b);
  }
  return 0;
}

uint64_t RefAvg(DType t, uint64_t s, int d) {
  switch (t) {
    case DType::kF32: return BitsOf(AsF32(s) / static_cast<float>(d));
    case DType::kF64: return BitsOf(AsF64(s) / static_cast<double>(d));
    case DType::kF16:
      return F32ToF16(F16ToF32(static_cast<uint16_t>(s)) / static_cast<float>(d));
    case DType::kBF16:
      return F32ToBF16(BF16ToF32(static_cast<uint16_t>(s)) /
                       static_cast<float>(d));
    case DType::kI8:
      return static_cast<uint8_t>(static_cast<int8_t>(s) / d);
    case DType::kU8: return static_cast<uint8_t>(static_cast<uint8_t>(s) / d);
    case DType::kI32:
      return static_cast<uint32_t>(static_cast<int32_t>(s) / d);
    case DType::kI64:
      return static_cast<uint64_t>(static_cast<int64_t>(s) / d);
  }
  return 0;
}

// T(lo, hi) for element i, straight from the definition in reduce.h.
uint64_t RefTree(DType t, ReduceOp op, const std::vector<const void*>& srcs,
                 int lo, int hi, size_t i) {
  if (hi - lo == 1) return Get(t, srcs[lo], i);
  int p = 1;
  while (2 * p < hi - lo) p *= 2;
  return RefCombine(t, op, RefTree(t, op, srcs, lo, lo + p, i),
                    RefTree(t, op, srcs, lo + p, hi, i));
}

std::vector<uint8_t> RefReduce(DType t, ReduceOp op,
                               const std::vector<const void*>& srcs,
                               size_t count, int divisor) {
  std::vector<uint8_t> out(count * Size(t) + 1);
  const int n = static_cast<int>(srcs.size());
  for (size_t i = 0; i < count; ++i) {
    uint64_t v = RefTree(t, op, srcs, 0, n, i);
    if (op == ReduceOp::kAvg) v = RefAvg(t, v, divisor);
    Put(t, out.data(), i, v);
  }
  return out;
}

// The same tree evaluated with the library's Combine (then FinishAvg).
std::vector<uint8_t> CombineTree(DType t, ReduceOp op,
                                 const std::vector<const void*>& srcs, int lo,
                                 int hi, size_t count) {
  if (hi - lo == 1) {
    const auto* p = static_cast<const uint8_t*>(srcs[lo]);
    std::vector<uint8_t> v(p, p + count * Size(t));
    v.push_back(0);  // never empty, so data() is valid
    return v;
  }
  int p = 1;
  while (2 * p < hi - lo) p *= 2;
  std::vector<uint8_t> left = CombineTree(t, op, srcs, lo, lo + p, count);
  const std::vector<uint8_t> right = CombineTree(t, op, srcs, lo + p, hi, count);
  Combine(t, op, left.data(), left.data(), right.data(), count);  // dst == a
  return left;
}

// Element-wise comparison; with nan_loose, any two NaNs match (NaN payloads
// of sums/products depend on operand order chosen by compiler/hardware).
::testing::AssertionResult SameElems(DType t, const void* want,
                                     const void* got, size_t count,
                                     bool nan_loose) {
  for (size_t i = 0; i < count; ++i) {
    const uint64_t w = Get(t, want, i);
    const uint64_t g = Get(t, got, i);
    if (w == g) continue;
    if (nan_loose && IsNaNBits(t, w) && IsNaNBits(t, g)) continue;
    return ::testing::AssertionFailure()
           << "element " << i << " of " << count << ": want 0x" << std::hex
           << w << " got 0x" << g;
  }
  return ::testing::AssertionSuccess();
}

// --- Input generation ------------------------------------------------------------

struct Gen {
  std::mt19937_64 rng{12345};

  double Uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  }
  // Dyadic values (k/64) so that sums hit ties and exact cancellations.
  double Dyadic() {
    return static_cast<double>(static_cast<int>(rng() % 2001) - 1000) / 64.0;
  }
  double Moderate(ReduceOp op) {
    if (op == ReduceOp::kProd) {
      const double m = Uniform(0.5, 2.0);
      return (rng() & 1) ? -m : m;
    }
    return (rng() & 1) ? Dyadic() : Uniform(-1000, 1000);
  }

  uint64_t Special(DType t) {
    // NaNs (quiet, negative, signalling, with payloads), infinities, signed
    // zeros, denormals, extremes.
    static const uint32_t f32[] = {
        0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA00005, 0xFFE12345,
        0x7F800000, 0xFF800000, 0x00000000, 0x80000000, 0x00000001,
        0x80000001, 0x007FFFFF, 0x00400000, 0x7F7FFFFF, 0xFF7FFFFF,
        0x3F800000, 0xBF800000};
    static const uint64_t f64[] = {
        0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001,
        0x7FF4000000000123, 0x7FF0000000000000, 0xFFF0000000000000, 0,
        0x8000000000000000, 1, 0x800FFFFFFFFFFFFF, 0x7FEFFFFFFFFFFFFF,
        0x3FF0000000000000};
    static const uint16_t f16[] = {0x7E00, 0xFE00, 0x7C01, 0x7D55, 0x7C00,
                                   0xFC00, 0x0000, 0x8000, 0x0001, 0x8001,
                                   0x03FF, 0x7BFF, 0xFBFF, 0x3C00, 0x0400};
    static const uint16_t bf16[] = {0x7FC0, 0xFFC0, 0x7F81, 0x7FA5, 0x7F80,
                                    0xFF80, 0x0000, 0x8000, 0x0001, 0x807F,
                                    0x7F7F, 0xFF7F, 0x3F80, 0x0080};
    switch (t) {
      case DType::kF32: return f32[rng() % std::size(f32)];
      case DType::kF64: return f64[rng() % std::size(f64)];
      case DType::kF16: return f16[rng() % std::size(f16)];
      case DType::kBF16: return bf16[rng() % std::size(bf16)];
      default: return rng();
    }
  }

  uint64_t Value(DType t, ReduceOp op, bool special) {
    if (special && IsFloatT(t) && rng() % 4 == 0) return Special(t);
    const bool raw = rng() % 3 == 0;  // random encodings: full range
    switch (t) {
      case DType::kF32:
        if (raw) {  // random sign/mantissa, exponent kept moderate
          return (rng() & 0x807FFFFFu) | ((100 + rng() % 55) << 23);
        }
        return BitsOf(static_cast<float>(Moderate(op)));
      case DType::kF64:
        if (raw) {
          return (rng() & 0x800FFFFFFFFFFFFFull) | ((900 + rng() % 250) << 52);
        }
        return BitsOf(Moderate(op));
      case DType::kF16:
        if (raw) {  // any finite encoding, denormals included
          uint64_t b;
          do b = rng() & 0xFFFF; while ((b & 0x7C00) == 0x7C00);
          return b;
        }
        return F32ToF16(static_cast<float>(Moderate(op)));
      case DType::kBF16:
        if (raw) {
          uint64_t b;
          do b = rng() & 0xFFFF; while ((b & 0x7F80) == 0x7F80);
          return b;
        }
        return F32ToBF16(static_cast<float>(Moderate(op)));
      case DType::kI8:
      case DType::kU8: return rng() & 0xFF;
      case DType::kI32: return rng() & 0xFFFFFFFF;
      case DType::kI64: return rng();
    }
    return 0;
  }
};

struct Inputs {
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<const void*> ptrs;
};

// `offset` elements of slack before each source, to test unaligned data.
Inputs MakeInputs(Gen& gen, DType t, ReduceOp op, int n, size_t count,
                  bool special, size_t offset = 0) {
  Inputs in;
  in.bufs.resize(n);
  for (int k = 0; k < n; ++k) {
    in.bufs[k].assign((count + offset) * Size(t) + 1, 0);
    for (size_t i = 0; i < count; ++i) {
      Put(t, in.bufs[k].data() + offset * Size(t), i, gen.Value(t, op, special));
    }
    in.ptrs.push_back(in.bufs[k].data() + offset * Size(t));
  }
  return in;
}

std::vector<uint8_t> RunTree(DType t, ReduceOp op, const Inputs& in,
                             size_t count, int divisor) {
  // Fill with a pattern so untouched elements would be noticed.
  std::vector<uint8_t> out(count * Size(t) + 1, 0xA5);
  ReduceTree(t, op, out.data(), in.ptrs.data(), static_cast<int>(in.ptrs.size()),
             count, divisor);
  return out;
}

// Every f16/bf16 encoding through both kernel paths: load, divide, round.
TEST(ReduceConversionTest, KernelConversionsAllValues) {
  for (DType t : {DType::kF16, DType::kBF16}) {
    std::vector<uint16_t> all(0x10000);
    for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
    for (int d : {1, 3, 7}) {
      ForEachIsa([&](bool) {
        std::vector<uint16_t> x = all;
        FinishAvg(t, ReduceOp::kAvg, x.data(), x.size(), d);
        for (uint32_t h = 0; h < 0x10000; ++h) {
          ASSERT_EQ(x[h], RefAvg(t, h, d))
              << TypeName(t) << " d=" << d << " h=" << std::hex << h;
        }
      });
    }
  }
}

// --- Kernels against the reference ---------------------------------------------

void CheckAll(bool special) {
  Gen gen;
  const int kNs[] = {1, 2, 3, 4, 5, 7, 8, 13};
  const size_t kCounts[] = {0, 1, 7, 63, 64, 65, 4099};
  for (DType t : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      if (IsFloatT(t) && IsBitwise(op)) continue;
      if (special && !IsFloatT(t)) continue;
      // NaN payloads of +/* are order dependent; min/max are exact.
      const bool loose = special && op != ReduceOp::kMin && op != ReduceOp::kMax;
      for (int n : kNs) {
        for (size_t count : kCounts) {
          SCOPED_TRACE(std::string(TypeName(t)) + " " + OpName(op) +
                       " n=" + std::to_string(n) +
                       " count=" + std::to_string(count));
          const Inputs in = MakeInputs(gen, t, op, n, count, special);
          const int divisor = n + (count % 3);  // not always the group size
          const std::vector<uint8_t> want =
              RefReduce(t, op, in.ptrs, count, divisor);
          std::vector<uint8_t> results[2];
          ForEachIsa([&](bool portable) {
            const std::vector<uint8_t> got = RunTree(t, op, in, count, divisor);
            EXPECT_TRUE(SameElems(t, want.data(), got.data(), count, loose));
            // Nothing written past the end.
            EXPECT_EQ(got[count * Size(t)], 0xA5);
            results[portable ? 0 : 1] = got;

            std::vector<uint8_t> chain = CombineTree(t, op, in.ptrs, 0, n, count);
            FinishAvg(t, op, chain.data(), count, divisor);
            EXPECT_TRUE(SameElems(t, got.data(), chain.data(), count, loose))
                << "Combine tree differs from ReduceTree";
          });
          EXPECT_TRUE(SameElems(t, results[0].data(), results[1].data(), count,
                                loose))
              << "portable and SIMD kernels differ";
        }
      }
    }
  }
}

TEST(ReduceTreeTest, MatchesReferenceAllTypesOpsSizes) { CheckAll(false); }

TEST(ReduceTreeTest, MatchesReferenceWithSpecialValues) { CheckAll(true); }

// Bitwise comparison of the two kernel paths on NaN-free random data at
// sizes that exercise whole blocks plus masked tails.
TEST(ReduceTreeTest, PortableAndSimdAgreeOnLargeInputs) {
  Gen gen;
  for (DType t : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      if (IsFloatT(t) && IsBitwise(op)) continue;
      for (int n : {2, 6, 16}) {
        const size_t count = 30011;
        SCOPED_TRACE(std::string(TypeName(t)) + " " + OpName(op) +
                     " n=" + std::to_string(n));
        const Inputs in = MakeInputs(gen, t, op, n, count, false, /*offset=*/1);
        std::vector<uint8_t> results[2];
        ForEachIsa([&](bool portable) {
          results[portable ? 0 : 1] = RunTree(t, op, in, count, n);
        });
        EXPECT_TRUE(SameElems(t, results[0].data(), results[1].data(), count,
                              false));
      }
    }
  }
}

// Results of 8 MiB and more are written with non-temporal stores after an
// unaligned head; check that path (and its head/tail) against the reference.
TEST(ReduceTreeTest, LargeResults) {
  Gen gen;
  for (DType t : {DType::kF32, DType::kBF16}) {
    const size_t count = (size_t{8} << 20) / Size(t) + 37;
    SCOPED_TRACE(TypeName(t));
    // offset 3: dst and sources not aligned to 64 bytes.
    const Inputs in = MakeInputs(gen, t, ReduceOp::kSum, 3, count, false, 3);
    const auto want = RefReduce(t, ReduceOp::kSum, in.ptrs, count, 3);
    ForEachIsa([&](bool) {
      std::vector<uint8_t> out((count + 3) * Size(t) + 1, 0xA5);
      uint8_t* dst = out.data() + 3 * Size(t);
      ReduceTree(t, ReduceOp::kSum, dst, in.ptrs.data(), 3, count, 3);
      EXPECT_TRUE(SameElems(t, want.data(), dst, count, false));
      EXPECT_EQ(out[0], 0xA5);
      EXPECT_EQ(out.back(), 0xA5);
    });
  }
}

TEST(ReduceTreeTest, ManySources) {
  Gen gen;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    for (int n : {31, 100, 256}) {
      const size_t count = 333;
      SCOPED_TRACE(std::string(TypeName(t)) + " n=" + std::to_string(n));
      const Inputs in = MakeInputs(gen, t, ReduceOp::kSum, n, count, false);
      const auto want = RefReduce(t, ReduceOp::kAvg, in.ptrs, count, n);
      ForEachIsa([&](bool) {
        const auto got = RunTree(t, ReduceOp::kAvg, in, count, n);
        EXPECT_TRUE(SameElems(t, want.data(), got.data(), count, false));
      });
    }
  }
}

TEST(ReduceTreeTest, DstMayAliasAnySource) {
  Gen gen;
  for (DType t : kAllTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
      const int n = 5;
      const size_t count = 1000;
      const Inputs in = MakeInputs(gen, t, op, n, count, false);
      const auto want = RefReduce(t, op, in.ptrs, count, n);
      ForEachIsa([&](bool) {
        for (int k = 0; k < n; ++k) {
          Inputs copy = in;
          for (int j = 0; j < n; ++j) copy.ptrs[j] = copy.bufs[j].data();
          ReduceTree(t, op, copy.bufs[k].data(), copy.ptrs.data(), n, count, n);
          EXPECT_TRUE(SameElems(t, want.data(), copy.bufs[k].data(), count,
                                false))
              << TypeName(t) << " " << OpName(op) << " dst=srcs[" << k << "]";
        }
      });
    }
  }
}

TEST(ReduceTreeTest, CombineAliasing) {
  Gen gen;
  const DType t = DType::kBF16;
  const size_t count = 77;
  const Inputs in = MakeInputs(gen, t, ReduceOp::kSum, 2, count, false);
  const auto want = RefReduce(t, ReduceOp::kSum, in.ptrs, count, 2);
  std::vector<const void*> same = {in.ptrs[0], in.ptrs[0]};
  const auto want_double = RefReduce(t, ReduceOp::kSum, same, count, 2);
  ForEachIsa([&](bool) {
    Inputs a = in;
    Combine(t, ReduceOp::kSum, a.bufs[0].data(), a.bufs[0].data(),
            a.bufs[1].data(), count);
    EXPECT_TRUE(SameElems(t, want.data(), a.bufs[0].data(), count, false));
    Inputs b = in;
    Combine(t, ReduceOp::kSum, b.bufs[1].data(), b.bufs[0].data(),
            b.bufs[1].data(), count);
    EXPECT_TRUE(SameElems(t, want.data(), b.bufs[1].data(), count, false));
    Inputs c = in;
    Combine(t, ReduceOp::kSum, c.bufs[0].data(), c.bufs[0].data(),
            c.bufs[0].data(), count);
    EXPECT_TRUE(SameElems(t, want_double.data(), c.bufs[0].data(), count, false));
  });
}

TEST(ReduceTreeTest, SingleSourceCopiesBitsExactly) {
  // A signalling NaN is not a result of any operation: n = 1 is x_0 itself.
  const uint16_t x[4] = {0x7C01, 0xFD00, 0x0001, 0x8000};
  for (DType t : {DType::kF16, DType::kBF16}) {
    ForEachIsa([&](bool) {
      uint16_t out[4] = {};
      const void* srcs[1] = {x};
      ReduceTree(t, ReduceOp::kSum, out, srcs, 1, 4, 1);
      EXPECT_EQ(0, std::memcmp(out, x, sizeof(x)));
    });
  }
}

TEST(ReduceTreeTest, FloatMinMaxPropagateNaN) {
  ForEachIsa([&](bool) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float a[3] = {nan, 1.0f, -0.0f};
    const float b[3] = {1.0f, nan, 0.0f};
    float out[3];
    Combine(DType::kF32, ReduceOp::kMin, out, a, b, 3);
    EXPECT_TRUE(std::isnan(out[0]));
    EXPECT_TRUE(std::isnan(out[1]));
    EXPECT_EQ(std::bit_cast<uint32_t>(out[2]), 0x80000000u);  // -0
    Combine(DType::kF32, ReduceOp::kMin, out, b, a, 3);
    EXPECT_TRUE(std::isnan(out[0]));
    EXPECT_TRUE(std::isnan(out[1]));
    EXPECT_EQ(std::bit_cast<uint32_t>(out[2]), 0x80000000u);
    Combine(DType::kF32, ReduceOp::kMax, out, a, b, 3);
    EXPECT_TRUE(std::isnan(out[0]));
    EXPECT_TRUE(std::isnan(out[1]));
    EXPECT_EQ(std::bit_cast<uint32_t>(out[2]), 0u);  // +0
    Combine(DType::kF32, ReduceOp::kMax, out, b, a, 3);
    EXPECT_EQ(std::bit_cast<uint32_t>(out[2]), 0u);

    // A NaN in any one of 7 sources reaches the result, for every float type
    // and at every position within a vector.
    for (DType t : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
      for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
        const size_t count = 100;
        Gen gen;
        Inputs in = MakeInputs(gen, t, op, 7, count, false);
        for (size_t i = 0; i < count; ++i) {
          const uint64_t nan_bits = t == DType::kF32   ? 0x7FC00000
                                    : t == DType::kF64 ? 0x7FF8000000000000
                                    : t == DType::kF16 ? 0x7E00
                                                       : 0x7FC0;
          Put(t, in.bufs[i % 7].data(), i, nan_bits);
        }
        const auto got = RunTree(t, op, in, count, 7);
        for (size_t i = 0; i < count; ++i) {
          EXPECT_TRUE(IsNaNBits(t, Get(t, got.data(), i)))
              << TypeName(t) << " " << OpName(op) << " i=" << i;
        }
      }
    }
  });
}

TEST(ReduceTreeTest, IntegerAvgTruncatesWrappedSum) {
  ForEachIsa([&](bool) {
    {
      const int32_t a[4] = {-7, 7, -1, 2147483647};
      const int32_t b[4] = {0, 0, 0, 1};  // last: wraps to INT32_MIN
      int32_t out[4];
      const void* srcs[2] = {a, b};
      ReduceTree(DType::kI32, ReduceOp::kAvg, out, srcs, 2, 4, 2);
      EXPECT_EQ(out[0], -3);
      EXPECT_EQ(out[1], 3);
      EXPECT_EQ(out[2], 0);
      EXPECT_EQ(out[3], -1073741824);
    }
    {
      const int8_t a[2] = {100, -128};
      const int8_t b[2] = {100, -1};
      int8_t out[2];
      const void* srcs[2] = {a, b};
      ReduceTree(DType::kI8, ReduceOp::kAvg, out, srcs, 2, 2, 2);
      EXPECT_EQ(out[0], -28);  // 200 wraps to -56
      EXPECT_EQ(out[1], 63);   // -129 wraps to 127
    }
    {
      const uint8_t a[1] = {200};
      const uint8_t b[1] = {100};
      uint8_t out[1];
      const void* srcs[2] = {a, b};
      ReduceTree(DType::kU8, ReduceOp::kAvg, out, srcs, 2, 1, 3);
      EXPECT_EQ(out[0], 14);  // 300 wraps to 44
    }
    {
      const int64_t a[1] = {INT64_MAX};
      const int64_t b[1] = {3};
      int64_t out[1];
      const void* srcs[2] = {a, b};
      ReduceTree(DType::kI64, ReduceOp::kAvg, out, srcs, 2, 1, 2);
      EXPECT_EQ(out[0], (INT64_MIN + 2) / 2);
    }
    {
      // Large divisors and every 32-bit sum sign (double-based division).
      std::mt19937 rng(3);
      std::vector<int32_t> x(4096);
      for (auto& v : x) v = static_cast<int32_t>(rng());
      x[0] = INT32_MIN;
      x[1] = INT32_MAX;
      for (int d : {1, 2, 3, 1000, 65537, 2147483647}) {
        std::vector<int32_t> y = x;
        FinishAvg(DType::kI32, ReduceOp::kAvg, y.data(), y.size(), d);
        for (size_t i = 0; i < x.size(); ++i) {
          ASSERT_EQ(y[i], x[i] / d) << "d=" << d << " x=" << x[i];
        }
      }
    }
    {
      // Divisor < 1 leaves the sum for integers.
      int32_t x[2] = {5, -5};
      FinishAvg(DType::kI32, ReduceOp::kAvg, x, 2, 0);
      EXPECT_EQ(x[0], 5);
      EXPECT_EQ(x[1], -5);
    }
  });
}

TEST(ReduceTreeTest, IntegerSumAndProdWrap) {
  ForEachIsa([&](bool) {
    const int8_t a[3] = {127, -128, 16};
    const int8_t b[3] = {1, -1, 16};
    int8_t out[3];
    Combine(DType::kI8, ReduceOp::kSum, out, a, b, 3);
    EXPECT_EQ(out[0], -128);
    EXPECT_EQ(out[1], 127);
    Combine(DType::kI8, ReduceOp::kProd, out, a, b, 3);
    EXPECT_EQ(out[0], 127);
    EXPECT_EQ(out[1], -128);
    EXPECT_EQ(out[2], 0);  // 256
    const int64_t c[1] = {INT64_MAX};
    const int64_t d[1] = {2};
    int64_t o64[1];
    Combine(DType::kI64, ReduceOp::kProd, o64, c, d, 1);
    EXPECT_EQ(o64[0], -2);
  });
}

TEST(ReduceTreeTest, SixteenBitRoundsAtEveryNode) {
  // 1 + 2^-11 (half an ulp of 1 in f16) twice: rounding at each node gives
  // 1 + 1 = 2 then 2 + 2^-11 = 2 (ties to even), whereas one rounding of the
  // exact sum (2 + 2^-10) would give 2.00195. Tree for n = 3: (x0 + x1) + x2.
  const uint16_t one = F32ToF16(1.0f);
  const uint16_t tiny = F32ToF16(0x1p-11f);
  const uint16_t x0[1] = {one}, x1[1] = {tiny}, x2[1] = {tiny};
  const void* srcs[3] = {x0, x1, x2};
  ForEachIsa([&](bool) {
    uint16_t out[1];
    ReduceTree(DType::kF16, ReduceOp::kSum, out, srcs, 3, 1, 1);
    EXPECT_EQ(F16ToF32(out[0]), 1.0f);  // 1 + 2^-11 ties to 1, then again
  });
}

TEST(ReduceTreeTest, InvalidCombinationsAreIgnored) {
  ForEachIsa([&](bool) {
    const float a[2] = {1, 2};
    float out[2] = {7, 7};
    Combine(DType::kF32, ReduceOp::kBxor, out, a, a, 2);
    EXPECT_EQ(out[0], 7);
    const void* srcs[1] = {a};
    ReduceTree(DType::kF16, ReduceOp::kBand, out, srcs, 1, 2, 1);
    ReduceTree(DType::kF32, ReduceOp::kSum, out, srcs, 0, 2, 1);
    EXPECT_EQ(out[1], 7);
  });
}

TEST(ReduceTreeTest, KernelIsaName) {
  internal::SetReduceIsaForTest(false);
  const std::string best = ReduceKernelIsa();
  EXPECT_TRUE(best == "avx512" || best == "avx2" || best == "portable") << best;
  internal::SetReduceIsaForTest(true);
  EXPECT_STREQ(ReduceKernelIsa(), "portable");
  internal::SetReduceIsaForTest(false);
  EXPECT_EQ(ReduceKernelIsa(), best);
  if (best == "portable") {
    GTEST_LOG_(INFO) << "no SIMD kernels on this CPU: only the portable "
                        "path was tested";
  }
}

}  // namespace
}  // namespace mc2::core
