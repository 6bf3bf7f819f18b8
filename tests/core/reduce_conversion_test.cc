// Tests for the 16-bit conversions the reduction kernels use (core/reduce.h):
// every f16 and bf16 value, and random f32 values, against brute-force
// references (the nearest value searched in double) and, on x86, against
// the F16C instructions the AVX-512 kernels use.
#include "core/reduce.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define MC2_TEST_X86 1
#else
#define MC2_TEST_X86 0
#endif

namespace mc2::core {
namespace {

double RefF16Value(uint16_t h) {  // finite only
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}

// Nearest of the two candidates (ties to the even encoding), in double.
uint16_t Nearest(double x, uint16_t lo, double vlo, uint16_t hi, double vhi) {
  const double dlo = std::fabs(x - vlo);
  const double dhi = std::fabs(vhi - x);
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

// Brute-force f32 -> f16: nearest representable magnitude by binary search
// over the positive encodings, with 65536 standing for the overflow point.
uint16_t RefF32ToF16(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double x = std::fabs(static_cast<double>(f));
  if (std::isinf(f)) return sign | 0x7C00;
  uint16_t lo = 0, hi = 0x7C00;  // f16 encodings are monotonic in value
  if (x >= 65536.0) return sign | 0x7C00;
  while (hi - lo > 1) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    if (RefF16Value(mid) <= x) lo = mid; else hi = mid;
  }
  const double vhi = hi == 0x7C00 ? 65536.0 : RefF16Value(hi);
  return sign | Nearest(x, lo, RefF16Value(lo), hi, vhi);
}

uint16_t RefF32ToBF16(float f) {
  const uint32_t b = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000);
  const uint16_t lo = static_cast<uint16_t>((b >> 16) & 0x7FFF);  // truncated
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  auto value = [](uint16_t e) {
    if (e == 0x7F80) {  // one ulp above max: the value rounding aims at
      return std::ldexp(1.0, 128);
    }
    return static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(e) << 16));
  };
  if (std::isinf(f)) return sign | 0x7F80;
  const double x = std::fabs(static_cast<double>(f));
  return sign | Nearest(x, lo, value(lo), hi, value(hi));
}

TEST(ReduceConversionTest, F16ToF32AllValues) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    const uint32_t fb = std::bit_cast<uint32_t>(f);
    EXPECT_EQ(fb >> 31, h >> 15) << std::hex << h;
    if ((h & 0x7C00) != 0x7C00) {
      EXPECT_EQ(static_cast<double>(f), RefF16Value(static_cast<uint16_t>(h)))
          << std::hex << h;
    } else if ((h & 0x3FF) == 0) {
      EXPECT_TRUE(std::isinf(f)) << std::hex << h;
    } else {
      // NaN: quiet, payload kept in the high mantissa bits.
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_EQ(fb & 0x7FFFFFFF, 0x7FC00000u | ((h & 0x3FFu) << 13))
          << std::hex << h;
    }
  }
}

TEST(ReduceConversionTest, F16RoundTripAllValues) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t back = F32ToF16(F16ToF32(static_cast<uint16_t>(h)));
    const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
    EXPECT_EQ(back, nan ? (h | 0x200) : h) << std::hex << h;
  }
}

TEST(ReduceConversionTest, BF16RoundTripAllValues) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = BF16ToF32(static_cast<uint16_t>(h));
    EXPECT_EQ(std::bit_cast<uint32_t>(f), h << 16);
    const bool nan = (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0;
    EXPECT_EQ(F32ToBF16(f), nan ? (h | 0x40) : h) << std::hex << h;
  }
}

// Midpoints between neighbouring encodings round to the even one; one f32
// ulp either side rounds to the nearer one.
TEST(ReduceConversionTest, F16Ties) {
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const double a = RefF16Value(static_cast<uint16_t>(h));
    const double b = h + 1 == 0x7C00 ? 65536.0 : RefF16Value(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((a + b) / 2);  // exact in f32
    ASSERT_EQ(static_cast<double>(mid), (a + b) / 2);
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    for (float s : {1.0f, -1.0f}) {
      const uint16_t sign = s < 0 ? 0x8000 : 0;
      EXPECT_EQ(F32ToF16(s * mid), sign | even) << std::hex << h;
      EXPECT_EQ(F32ToF16(s * std::nextafter(mid, 0.0f)), sign | h) << std::hex << h;
      EXPECT_EQ(F32ToF16(s * std::nextafter(mid, 1e30f)), sign | (h + 1))
          << std::hex << h;
    }
  }
  EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65519.996f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);
  EXPECT_EQ(F32ToF16(1e10f), 0x7C00);
  EXPECT_EQ(F32ToF16(-1e10f), 0xFC00);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(F32ToF16(0x1p-25f), 0x0000);  // tie between 0 and 2^-24: even
  EXPECT_EQ(F32ToF16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(F32ToF16(0x1.8p-24f), 0x0002);  // tie 1.5 ulp -> 2
  EXPECT_EQ(F32ToF16(1e-40f), 0x0000);      // f32 denormal
  EXPECT_EQ(F32ToF16(-1e-40f), 0x8000);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::quiet_NaN()) & 0x7E00, 0x7E00);
  EXPECT_EQ(F32ToF16(std::bit_cast<float>(0x7F800001u)), 0x7E00);  // sNaN
  EXPECT_EQ(F32ToF16(std::bit_cast<float>(0xFFA02000u)), 0xFF01);
}

TEST(ReduceConversionTest, BF16Ties) {
  for (uint32_t h = 0; h < 0x7F80; ++h) {
    const uint32_t mid = (h << 16) | 0x8000;  // exactly halfway
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint16_t s16 = static_cast<uint16_t>(sign >> 16);
      EXPECT_EQ(F32ToBF16(std::bit_cast<float>(sign | mid)), s16 | even) << h;
      EXPECT_EQ(F32ToBF16(std::bit_cast<float>(sign | (mid - 1))), s16 | h) << h;
      EXPECT_EQ(F32ToBF16(std::bit_cast<float>(sign | (mid + 1))), s16 | (h + 1))
          << h;
    }
  }
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(F32ToBF16(std::bit_cast<float>(0x7F800001u)), 0x7FC0);  // sNaN
  EXPECT_EQ(F32ToBF16(std::bit_cast<float>(0xFFFFFFFFu)), 0xFFFF);
  EXPECT_EQ(F32ToBF16(std::bit_cast<float>(0x00008000u)), 0x0000);  // denormal tie
  EXPECT_EQ(F32ToBF16(std::bit_cast<float>(0x00018000u)), 0x0002);
}

TEST(ReduceConversionTest, RandomF32AgainstBruteForce) {
  std::mt19937 rng(7);
  for (int i = 0; i < 400000; ++i) {
    uint32_t b = rng();
    if (i % 2 == 0) {  // concentrate on the f16 range (incl. denormals)
      b = (b & 0x807FFFFF) | ((98 + rng() % 48) << 23);
    }
    const float f = std::bit_cast<float>(b);
    if (std::isnan(f)) continue;
    ASSERT_EQ(F32ToF16(f), RefF32ToF16(f)) << std::hex << b;
    ASSERT_EQ(F32ToBF16(f), RefF32ToBF16(f)) << std::hex << b;
  }
}

#if MC2_TEST_X86
__attribute__((target("f16c"))) uint16_t HwF32ToF16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float HwF16ToF32(uint16_t h) {
  return _cvtsh_ss(h);
}

// The AVX-512 kernels use the same instructions, so the portable code must
// match them exactly, NaNs included.
TEST(ReduceConversionTest, MatchesF16CHardware) {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_F16C)) {
    GTEST_SKIP() << "no F16C";
  }
  for (uint32_t h = 0; h < 0x10000; ++h) {
    ASSERT_EQ(std::bit_cast<uint32_t>(F16ToF32(static_cast<uint16_t>(h))),
              std::bit_cast<uint32_t>(HwF16ToF32(static_cast<uint16_t>(h))))
        << std::hex << h;
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t b = rng();
    if (i % 2 == 0) b = (b & 0x807FFFFF) | ((98 + rng() % 48) << 23);
    if (i % 16 == 1) b |= 0x7F800000;  // NaNs and infinities
    const float f = std::bit_cast<float>(b);
    ASSERT_EQ(F32ToF16(f), HwF32ToF16(f)) << std::hex << b;
  }
}
#endif


}  // namespace
}  // namespace mc2::core
