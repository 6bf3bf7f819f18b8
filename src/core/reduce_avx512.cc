// AVX-512 reduction kernels (avx512f/bw/dq/vl). Only reached through the
// run-time dispatch in reduce.cc, which checks the CPU first; the rest of the
// build stays portable because only this file's functions are compiled for
// AVX-512 (target pragmas below, no global -m flags).
//
// Semantics are those of the portable kernels in reduce.cc, bit for bit:
//  * f16/bf16 are converted to f32 on load; sums/products are rounded back to
//    the 16-bit type at every tree node (f16 through vcvtps2ph/vcvtph2ps,
//    bf16 with integer round-to-nearest-even, which unlike vcvtneps2bf16
//    keeps denormals and quiets NaNs exactly like F32ToBF16).
//  * Float min/max: NaN from the left operand, else from the right, else the
//    smaller/larger value, with OR/AND of the bits for equal values (so -0
//    is below +0).
//  * Integer avg divides in double, which is exact for 8- and 32-bit
//    integers (see DivTrunc32); i64 divides with scalar code.
#include "core/reduce.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

// GCC 12's intrinsics trip -W(maybe-)uninitialized on their own
// _mm*_undefined_* helpers (GCC bug 105593); silence it for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

// Everything below is compiled for AVX-512. Standard headers are included
// above so that no inline library code (which could be merged with other
// translation units' copies) gets AVX-512 instructions; all code here has
// internal linkage except the one entry point.
#if defined(__clang__)
#pragma clang attribute push(                                      \
    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl")
#endif

namespace mc2::core::internal {
namespace {

constexpr int kMaxDepth = 32;  // see reduce.cc
constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// With many sources the hardware prefetchers lose track of the streams:
// from kPrefetchMinSources on, each block also prefetches the same source
// kPrefetchBytes ahead; with fewer sources the prefetchers keep up alone.
constexpr size_t kPrefetchBytes = 2048;
constexpr int kPrefetchMinSources = 8;
// Results at least this large are written with non-temporal stores: they
// will not stay in cache anyway, and skipping the read-for-ownership of dst
// saves a quarter of the traffic of a 2-source reduction. Smaller results
// (pipelined chunks a peer reads next) stay in cache. Also when dst is one
// of the sources (in place): no RFO to save then, but the peers that read
// the result next get it from memory instead of out of this core's cache.
constexpr size_t kStreamMinBytes = size_t{8} << 20;
// The same for results other cores read next (ResultUse::kPeers, reduce.h).
constexpr size_t kPeerStreamMinBytes = size_t{64} << 10;

// --- Float helpers --------------------------------------------------------

inline __m512 MinPs(__m512 a, __m512 b) {
  // vminps(b, a) = b < a ? b : a, i.e. a for ties and whenever one is NaN.
  __m512 r = _mm512_min_ps(b, a);
  const __mmask16 eq = _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ);
  r = _mm512_castsi512_ps(_mm512_mask_or_epi32(
      _mm512_castps_si512(r), eq, _mm512_castps_si512(a),
      _mm512_castps_si512(b)));
  // a is not NaN but b is: take b.
  const __mmask16 a_ord = _mm512_cmp_ps_mask(a, a, _CMP_ORD_Q);
  const __mmask16 b_nan = _mm512_mask_cmp_ps_mask(a_ord, b, b, _CMP_UNORD_Q);
  return _mm512_mask_mov_ps(r, b_nan, b);
}

inline __m512 MaxPs(__m512 a, __m512 b) {
  __m512 r = _mm512_max_ps(b, a);  // b > a ? b : a
  const __mmask16 eq = _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ);
  r = _mm512_castsi512_ps(_mm512_mask_and_epi32(
      _mm512_castps_si512(r), eq, _mm512_castps_si512(a),
      _mm512_castps_si512(b)));
  const __mmask16 a_ord = _mm512_cmp_ps_mask(a, a, _CMP_ORD_Q);
  const __mmask16 b_nan = _mm512_mask_cmp_ps_mask(a_ord, b, b, _CMP_UNORD_Q);
  return _mm512_mask_mov_ps(r, b_nan, b);
}

inline __m512d MinPd(__m512d a, __m512d b) {
  __m512d r = _mm512_min_pd(b, a);
  const __mmask8 eq = _mm512_cmp_pd_mask(a, b, _CMP_EQ_OQ);
  r = _mm512_castsi512_pd(_mm512_mask_or_epi64(
      _mm512_castpd_si512(r), eq, _mm512_castpd_si512(a),
      _mm512_castpd_si512(b)));
  const __mmask8 a_ord = _mm512_cmp_pd_mask(a, a, _CMP_ORD_Q);
  const __mmask8 b_nan = _mm512_mask_cmp_pd_mask(a_ord, b, b, _CMP_UNORD_Q);
  return _mm512_mask_mov_pd(r, b_nan, b);
}

inline __m512d MaxPd(__m512d a, __m512d b) {
  __m512d r = _mm512_max_pd(b, a);
  const __mmask8 eq = _mm512_cmp_pd_mask(a, b, _CMP_EQ_OQ);
  r = _mm512_castsi512_pd(_mm512_mask_and_epi64(
      _mm512_castpd_si512(r), eq, _mm512_castpd_si512(a),
      _mm512_castpd_si512(b)));
  const __mmask8 a_ord = _mm512_cmp_pd_mask(a, a, _CMP_ORD_Q);
  const __mmask8 b_nan = _mm512_mask_cmp_pd_mask(a_ord, b, b, _CMP_UNORD_Q);
  return _mm512_mask_mov_pd(r, b_nan, b);
}

// f32 -> bf16 round to nearest even, as f32 bits whose high half is the
// bf16 (low half cleared if kClearLow); identical to F32ToBF16 (NaN: quiet
// bit set, high payload kept).
template <bool kClearLow = true>
inline __m512i RoundBF16Bits(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16),
                                       _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(
      x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, x, _mm512_set1_epi32(0x00400000));
  if constexpr (!kClearLow) return r;
  return _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
}

// Truncating x / d for 16 int32 lanes (d = the divisor as double). Exact:
// if q = x/d is not an integer it is at least 1/|d| away from one, while
// double rounding moves it by at most |q| * 2^-53 <= 2^-22 / |d|.
inline __m512i DivTrunc32(__m512i x, __m512d d) {
  const __m512d lo = _mm512_cvtepi32_pd(_mm512_castsi512_si256(x));
  const __m512d hi = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(x, 1));
  const __m256i qlo = _mm512_cvttpd_epi32(_mm512_div_pd(lo, d));
  const __m256i qhi = _mm512_cvttpd_epi32(_mm512_div_pd(hi, d));
  return _mm512_inserti64x4(_mm512_castsi256_si512(qlo), qhi, 1);
}

// Byte multiply (low 8 bits of the product): two 16-bit multiplies for the
// even and odd bytes.
inline __m512i MulEpi8(__m512i a, __m512i b) {
  const __m512i even = _mm512_mullo_epi16(a, b);
  const __m512i odd = _mm512_mullo_epi16(_mm512_srli_epi16(a, 8),
                                         _mm512_srli_epi16(b, 8));
  return _mm512_mask_blend_epi8(0xAAAAAAAAAAAAAAAAull, even,
                                _mm512_slli_epi16(odd, 8));
}

// --- Per-dtype vector traits ------------------------------------------------
// S: storage element, V: register, M: lane mask, kLanes: elements per V,
// kUnroll: V per block (256 bytes of storage per source per block).

template <typename M>
inline M TailMask(size_t len, int lanes) {
  return static_cast<M>(len >= static_cast<size_t>(lanes)
                            ? ~0ull
                            : (1ull << len) - 1);
}

struct VF32 {
  using S = float;
  using V = __m512;
  using M = __mmask16;
  using AvgCtx = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kUnroll = 4;
  static constexpr bool kInteger = false;
  static constexpr bool kPairs = false;
  static V Load(const S* p) { return _mm512_loadu_ps(p); }
  static V LoadM(const S* p, M m) { return _mm512_maskz_loadu_ps(m, p); }
  static void Store(S* p, V v) { _mm512_storeu_ps(p, v); }
  static void StoreM(S* p, M m, V v) { _mm512_mask_storeu_ps(p, m, v); }
  static void StoreNT(S* p, V v) { _mm512_stream_ps(p, v); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Min(V a, V b) { return MinPs(a, b); }
  static V Max(V a, V b) { return MaxPs(a, b); }
  static V Round(V v) { return v; }
  static AvgCtx MakeAvg(int d) { return _mm512_set1_ps(static_cast<float>(d)); }
  static V Avg(V v, AvgCtx d) { return _mm512_div_ps(v, d); }
};

struct VF64 {
  using S = double;
  using V = __m512d;
  using M = __mmask8;
  using AvgCtx = __m512d;
  static constexpr int kLanes = 8;
  static constexpr int kUnroll = 4;
  static constexpr bool kInteger = false;
  static constexpr bool kPairs = false;
  static V Load(const S* p) { return _mm512_loadu_pd(p); }
  static V LoadM(const S* p, M m) { return _mm512_maskz_loadu_pd(m, p); }
  static void Store(S* p, V v) { _mm512_storeu_pd(p, v); }
  static void StoreM(S* p, M m, V v) { _mm512_mask_storeu_pd(p, m, v); }
  static void StoreNT(S* p, V v) { _mm512_stream_pd(p, v); }
  static V Add(V a, V b) { return _mm512_add_pd(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static V Min(V a, V b) { return MinPd(a, b); }
  static V Max(V a, V b) { return MaxPd(a, b); }
  static V Round(V v) { return v; }
  static AvgCtx MakeAvg(int d) { return _mm512_set1_pd(static_cast<double>(d)); }
  static V Avg(V v, AvgCtx d) { return _mm512_div_pd(v, d); }
};

// 16-bit floats: 16 lanes of f32 per register, holding representable values.
struct VHalfBase {
  using S = uint16_t;
  using V = __m512;
  using M = __mmask16;
  using AvgCtx = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kUnroll = 8;
  static constexpr bool kInteger = false;
  static constexpr bool kPairs = false;
  static __m256i LoadRaw(const S* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static __m256i LoadRawM(const S* p, M m) {
    return _mm256_maskz_loadu_epi16(m, p);
  }
  static void StoreRaw(S* p, __m256i h) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
  }
  static void StoreRawM(S* p, M m, __m256i h) {
    _mm256_mask_storeu_epi16(p, m, h);
  }
  static void StoreRawNT(S* p, __m256i h) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h);
  }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Min(V a, V b) { return MinPs(a, b); }
  static V Max(V a, V b) { return MaxPs(a, b); }
  static AvgCtx MakeAvg(int d) { return _mm512_set1_ps(static_cast<float>(d)); }
  static V Avg(V v, AvgCtx d) { return _mm512_div_ps(v, d); }  // rounded on store
};

struct VF16 : VHalfBase {
  static V Cvt(__m256i h) { return _mm512_cvtph_ps(h); }
  static __m256i Narrow(V v) { return _mm512_cvtps_ph(v, kRne); }
  static V Load(const S* p) { return Cvt(LoadRaw(p)); }
  static V LoadM(const S* p, M m) { return Cvt(LoadRawM(p, m)); }
  static void Store(S* p, V v) { StoreRaw(p, Narrow(v)); }
  static void StoreM(S* p, M m, V v) { StoreRawM(p, m, Narrow(v)); }
  static void StoreNT(S* p, V v) { StoreRawNT(p, Narrow(v)); }
  static V Round(V v) { return Cvt(Narrow(v)); }
};

struct VBF16 : VHalfBase {
  // Full blocks convert 32 elements (64 bytes) at a time into two registers
  // with unpack/pack, which is cheaper than widening moves. The two
  // registers hold the elements in a shuffled order, undone by StorePair;
  // elementwise operations do not care.
  static constexpr bool kPairs = true;
  static void LoadPair(const S* p, V& a, V& b) {
    const __m512i x = _mm512_loadu_si512(p);
    const __m512i zero = _mm512_setzero_si512();
    a = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, x));
    b = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, x));
  }
  template <bool kStream>
  static void StorePair(S* p, V a, V b) {
    const __m512i h = _mm512_packus_epi32(
        _mm512_srli_epi32(RoundBF16Bits<false>(a), 16),
        _mm512_srli_epi32(RoundBF16Bits<false>(b), 16));
    if constexpr (kStream) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(p), h);
    } else {
      _mm512_storeu_si512(p, h);
    }
  }
  static V Cvt(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m256i Narrow(V v) {
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(RoundBF16Bits<false>(v), 16));
  }
  static V Load(const S* p) { return Cvt(LoadRaw(p)); }
  static V LoadM(const S* p, M m) { return Cvt(LoadRawM(p, m)); }
  static void Store(S* p, V v) { StoreRaw(p, Narrow(v)); }
  static void StoreM(S* p, M m, V v) { StoreRawM(p, m, Narrow(v)); }
  static void StoreNT(S* p, V v) { StoreRawNT(p, Narrow(v)); }
  static V Round(V v) { return _mm512_castsi512_ps(RoundBF16Bits(v)); }
};

template <typename Elem, typename Mask, int kLanesV>
struct VIntBase {
  using S = Elem;
  using V = __m512i;
  using M = Mask;
  static constexpr int kLanes = kLanesV;
  static constexpr int kUnroll = 4;
  static constexpr bool kInteger = true;
  static constexpr bool kPairs = false;
  static V Load(const S* p) { return _mm512_loadu_si512(p); }
  static void Store(S* p, V v) { _mm512_storeu_si512(p, v); }
  static void StoreNT(S* p, V v) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(p), v);
  }
  static V And(V a, V b) { return _mm512_and_si512(a, b); }
  static V Or(V a, V b) { return _mm512_or_si512(a, b); }
  static V Xor(V a, V b) { return _mm512_xor_si512(a, b); }
  static V Round(V v) { return v; }
};

struct VI8 : VIntBase<int8_t, __mmask64, 64> {
  using AvgCtx = __m512d;
  static V LoadM(const S* p, M m) { return _mm512_maskz_loadu_epi8(m, p); }
  static void StoreM(S* p, M m, V v) { _mm512_mask_storeu_epi8(p, m, v); }
  static V Add(V a, V b) { return _mm512_add_epi8(a, b); }
  static V Mul(V a, V b) { return MulEpi8(a, b); }
  static V Min(V a, V b) { return _mm512_min_epi8(a, b); }
  static V Max(V a, V b) { return _mm512_max_epi8(a, b); }
  static AvgCtx MakeAvg(int d) { return _mm512_set1_pd(d); }
  static V Avg(V v, AvgCtx d) {
    __m512i r = _mm512_setzero_si512();
    __m128i q[4];
    q[0] = _mm512_cvtepi32_epi8(
        DivTrunc32(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 0)), d));
    q[1] = _mm512_cvtepi32_epi8(
        DivTrunc32(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 1)), d));
    q[2] = _mm512_cvtepi32_epi8(
        DivTrunc32(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 2)), d));
    q[3] = _mm512_cvtepi32_epi8(
        DivTrunc32(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 3)), d));
    r = _mm512_inserti32x4(r, q[0], 0);
    r = _mm512_inserti32x4(r, q[1], 1);
    r = _mm512_inserti32x4(r, q[2], 2);
    return _mm512_inserti32x4(r, q[3], 3);
  }
};

struct VU8 : VIntBase<uint8_t, __mmask64, 64> {
  using AvgCtx = __m512d;
  static V LoadM(const S* p, M m) { return _mm512_maskz_loadu_epi8(m, p); }
  static void StoreM(S* p, M m, V v) { _mm512_mask_storeu_epi8(p, m, v); }
  static V Add(V a, V b) { return _mm512_add_epi8(a, b); }
  static V Mul(V a, V b) { return MulEpi8(a, b); }
  static V Min(V a, V b) { return _mm512_min_epu8(a, b); }
  static V Max(V a, V b) { return _mm512_max_epu8(a, b); }
  static AvgCtx MakeAvg(int d) { return _mm512_set1_pd(d); }
  static V Avg(V v, AvgCtx d) {
    __m512i r = _mm512_setzero_si512();
    __m128i q[4];
    q[0] = _mm512_cvtepi32_epi8(
        DivTrunc32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 0)), d));
    q[1] = _mm512_cvtepi32_epi8(
        DivTrunc32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 1)), d));
    q[2] = _mm512_cvtepi32_epi8(
        DivTrunc32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 2)), d));
    q[3] = _mm512_cvtepi32_epi8(
        DivTrunc32(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 3)), d));
    r = _mm512_inserti32x4(r, q[0], 0);
    r = _mm512_inserti32x4(r, q[1], 1);
    r = _mm512_inserti32x4(r, q[2], 2);
    return _mm512_inserti32x4(r, q[3], 3);
  }
};

struct VI32 : VIntBase<int32_t, __mmask16, 16> {
  using AvgCtx = __m512d;
  static V LoadM(const S* p, M m) { return _mm512_maskz_loadu_epi32(m, p); }
  static void StoreM(S* p, M m, V v) { _mm512_mask_storeu_epi32(p, m, v); }
  static V Add(V a, V b) { return _mm512_add_epi32(a, b); }
  static V Mul(V a, V b) { return _mm512_mullo_epi32(a, b); }
  static V Min(V a, V b) { return _mm512_min_epi32(a, b); }
  static V Max(V a, V b) { return _mm512_max_epi32(a, b); }
  static AvgCtx MakeAvg(int d) { return _mm512_set1_pd(d); }
  static V Avg(V v, AvgCtx d) { return DivTrunc32(v, d); }
};

struct VI64 : VIntBase<int64_t, __mmask8, 8> {
  using AvgCtx = int;
  static V LoadM(const S* p, M m) { return _mm512_maskz_loadu_epi64(m, p); }
  static void StoreM(S* p, M m, V v) { _mm512_mask_storeu_epi64(p, m, v); }
  static V Add(V a, V b) { return _mm512_add_epi64(a, b); }
  static V Mul(V a, V b) { return _mm512_mullo_epi64(a, b); }
  static V Min(V a, V b) { return _mm512_min_epi64(a, b); }
  static V Max(V a, V b) { return _mm512_max_epi64(a, b); }
  static AvgCtx MakeAvg(int d) { return d; }
  static V Avg(V v, AvgCtx d) {
    // No exact vector path for 64-bit division; scalar is fine for a rare op.
    alignas(64) int64_t x[8];
    _mm512_store_si512(x, v);
    for (int64_t& e : x) e /= d;
    return _mm512_load_si512(x);
  }
};

template <class K, ReduceOp O, bool kRound = true>
inline typename K::V Apply(typename K::V a, typename K::V b) {
  if constexpr (O == ReduceOp::kSum || O == ReduceOp::kAvg) {
    const typename K::V r = K::Add(a, b);
    return kRound ? K::Round(r) : r;
  } else if constexpr (O == ReduceOp::kProd) {
    const typename K::V r = K::Mul(a, b);
    return kRound ? K::Round(r) : r;
  } else if constexpr (O == ReduceOp::kMin) {
    return K::Min(a, b);
  } else if constexpr (O == ReduceOp::kMax) {
    return K::Max(a, b);
  } else if constexpr (O == ReduceOp::kBand) {
    return K::And(a, b);
  } else if constexpr (O == ReduceOp::kBor) {
    return K::Or(a, b);
  } else {
    return K::Xor(a, b);
  }
}

template <class K, int U, bool kMasked>
inline void LoadBlock(const typename K::S* s, typename K::M m,
                      typename K::V (&v)[U]) {
  if constexpr (kMasked) {
    v[0] = K::LoadM(s, m);
  } else if constexpr (K::kPairs) {
    for (int u = 0; u < U; u += 2) K::LoadPair(s + u * K::kLanes, v[u], v[u + 1]);
  } else {
    for (int u = 0; u < U; ++u) v[u] = K::Load(s + u * K::kLanes);
  }
}

// One block of U registers per source at element offset `off`; kMasked
// blocks are a single register with lane mask `m` (head and tail). kStream
// writes dst with non-temporal stores (dst must be 64-byte aligned).
template <class K, ReduceOp O, int U, bool kMasked, bool kStream>
inline void Block(typename K::S* dst, const void* const* srcs, int n,
                  size_t off, typename K::M m, typename K::AvgCtx avg,
                  bool prefetch, typename K::V (*stack)[U]) {
  using S = typename K::S;
  using V = typename K::V;
  V v[U];
  int depth = 0;
  // Leaves 0..n-2: push, then merge the complete subtrees this leaf closes.
  for (int j = 0; j + 1 < n; ++j) {
    const S* s = static_cast<const S*>(srcs[j]) + off;
    LoadBlock<K, U, kMasked>(s, m, v);
    if constexpr (!kMasked) {
      if (prefetch) {
        const char* pf = reinterpret_cast<const char*>(s) + kPrefetchBytes;
        for (size_t b = 0; b < U * K::kLanes * sizeof(S); b += 64) {
          _mm_prefetch(pf + b, _MM_HINT_T0);
        }
      }
    }
    for (unsigned b = static_cast<unsigned>(j) + 1; (b & 1u) == 0; b >>= 1) {
      --depth;
      for (int u = 0; u < U; ++u) v[u] = Apply<K, O>(stack[depth][u], v[u]);
    }
    for (int u = 0; u < U; ++u) stack[depth][u] = v[u];
    ++depth;
  }
  // The last leaf: its merges and the final right-to-left fold are the same
  // thing, popping the whole stack.
  LoadBlock<K, U, kMasked>(static_cast<const S*>(srcs[n - 1]) + off, m, v);
  while (depth > 1) {
    --depth;
    for (int u = 0; u < U; ++u) v[u] = Apply<K, O>(stack[depth][u], v[u]);
  }
  if (depth == 1) {
    // The root. Storing rounds to the storage type anyway, so the root of a
    // 16-bit sum/product skips Round -- except for kAvg, which divides the
    // rounded sum.
    constexpr bool kRoundRoot = O == ReduceOp::kAvg;
    for (int u = 0; u < U; ++u) {
      v[u] = Apply<K, O, kRoundRoot>(stack[0][u], v[u]);
    }
  }
  if constexpr (O == ReduceOp::kAvg) {
    for (int u = 0; u < U; ++u) v[u] = K::Avg(v[u], avg);
  }
  S* d = dst + off;
  if constexpr (kMasked) {
    K::StoreM(d, m, v[0]);
  } else if constexpr (K::kPairs) {
    for (int u = 0; u < U; u += 2) {
      K::template StorePair<kStream>(d + u * K::kLanes, v[u], v[u + 1]);
    }
  } else {
    for (int u = 0; u < U; ++u) {
      if constexpr (kStream) {
        K::StoreNT(d + u * K::kLanes, v[u]);
      } else {
        K::Store(d + u * K::kLanes, v[u]);
      }
    }
  }
}

template <class K, ReduceOp O>
void Tree(void* dst_v, const void* const* srcs, int n, size_t count, int divisor, ResultUse use) {
  using S = typename K::S;
  using V = typename K::V;
  using M = typename K::M;
  constexpr int U = K::kUnroll;
  constexpr size_t kBlockElems = static_cast<size_t>(U) * K::kLanes;
  auto* dst = static_cast<S*>(dst_v);
  const typename K::AvgCtx avg = K::MakeAvg(divisor);
  alignas(64) V stack[kMaxDepth][U];
  alignas(64) V masked_stack[kMaxDepth][1];
  // Elements [from, to) one masked register at a time: masked-off lanes are
  // not touched in memory, so nothing outside the range is read or written.
  auto masked = [&](size_t from, size_t to) {
    for (size_t off = from; off < to; off += K::kLanes) {
      const M m = TailMask<M>(to - off, K::kLanes);
      Block<K, O, 1, true, false>(dst, srcs, n, off, m, avg, false,
                                  masked_stack);
    }
  };
  const bool prefetch = n >= kPrefetchMinSources;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(dst);
  const size_t stream_min = use == ResultUse::kPeers ? kPeerStreamMinBytes : kStreamMinBytes;
  bool stream = count * sizeof(S) >= stream_min && addr % sizeof(S) == 0;
  size_t off = 0;
  if (stream) {
    const size_t head = std::min(count, ((64 - addr % 64) % 64) / sizeof(S));
    masked(0, head);
    for (off = head; off + kBlockElems <= count; off += kBlockElems) {
      Block<K, O, U, false, true>(dst, srcs, n, off, M(), avg, prefetch, stack);
    }
    masked(off, count);
    // Non-temporal stores are weakly ordered: without the fence a later
    // plain store (e.g. a release flag telling a peer the data is ready)
    // could become visible before them.
    _mm_sfence();
    return;
  }
  for (; off + kBlockElems <= count; off += kBlockElems) {
    Block<K, O, U, false, false>(dst, srcs, n, off, M(), avg, prefetch, stack);
  }
  masked(off, count);
}

template <class K>
void TreeOps(ReduceOp op, void* dst, const void* const* srcs, int n, size_t count, int divisor,
             ResultUse use) {
  switch (op) {
    case ReduceOp::kSum:
      return Tree<K, ReduceOp::kSum>(dst, srcs, n, count, divisor, use);
    case ReduceOp::kProd:
      return Tree<K, ReduceOp::kProd>(dst, srcs, n, count, divisor, use);
    case ReduceOp::kMin:
      return Tree<K, ReduceOp::kMin>(dst, srcs, n, count, divisor, use);
    case ReduceOp::kMax:
      return Tree<K, ReduceOp::kMax>(dst, srcs, n, count, divisor, use);
    case ReduceOp::kAvg:
      return Tree<K, ReduceOp::kAvg>(dst, srcs, n, count, divisor, use);
    case ReduceOp::kBand:
      if constexpr (K::kInteger) {
        return Tree<K, ReduceOp::kBand>(dst, srcs, n, count, divisor, use);
      }
      return;
    case ReduceOp::kBor:
      if constexpr (K::kInteger) {
        return Tree<K, ReduceOp::kBor>(dst, srcs, n, count, divisor, use);
      }
      return;
    case ReduceOp::kBxor:
      if constexpr (K::kInteger) {
        return Tree<K, ReduceOp::kBxor>(dst, srcs, n, count, divisor, use);
      }
      return;
  }
}

}  // namespace

void ReduceTreeAvx512(DType t, ReduceOp op, void* dst, const void* const* srcs, int n, size_t count,
                      int divisor, ResultUse use) {
  switch (t) {
    case DType::kF32:
      return TreeOps<VF32>(op, dst, srcs, n, count, divisor, use);
    case DType::kF64:
      return TreeOps<VF64>(op, dst, srcs, n, count, divisor, use);
    case DType::kF16:
      return TreeOps<VF16>(op, dst, srcs, n, count, divisor, use);
    case DType::kBF16:
      return TreeOps<VBF16>(op, dst, srcs, n, count, divisor, use);
    case DType::kI8:
      return TreeOps<VI8>(op, dst, srcs, n, count, divisor, use);
    case DType::kU8:
      return TreeOps<VU8>(op, dst, srcs, n, count, divisor, use);
    case DType::kI32:
      return TreeOps<VI32>(op, dst, srcs, n, count, divisor, use);
    case DType::kI64:
      return TreeOps<VI64>(op, dst, srcs, n, count, divisor, use);
  }
}

}  // namespace mc2::core::internal

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#pragma GCC diagnostic pop
#endif

#endif  // x86 with GCC/clang
