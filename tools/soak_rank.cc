// `mc2 soak`, one rank of a job: random collectives and fused operators,
// each result compared with a reference this rank computes by itself.
//
// How the ranks stay in step without talking: every rank draws the same
// sequence from the job's seed. At each step that sequence picks a group
// (the world or one of three Split families) and a per-step seed; the
// members of one subgroup then draw the operation itself (kind, dtype, op,
// sizes, algorithm, pipeline, in/out of place, buffer kind, batching) from
// that seed and their subgroup's color, so they agree with each other while
// other subgroups do something else at the same step.
//
// How results are checked: every input element is a function of (step
// seed, group rank, index) that any rank can evaluate, so each rank computes
// the expected output of its own buffers from the definition of the
// collective, in int64. The values are small integers, chosen per reduction
// so that every partial result is exact in every dtype (bf16 included) and
// the result is the same in any order of reduction: no tolerance is needed
// and a single wrong element is caught. Averages are divided the way the
// library documents (src/core/reduce.cc: f32 division, then one rounding for
// 16-bit floats; truncation for integers). Fused operators use entries in
// [-2, 2], whose products are exact in f32. Bytes after every output buffer
// (canaries), gaps between V-blocks and the output of non-root ranks must
// stay untouched.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "mc2/mc2.h"
#include "soak.h"

namespace mc2::tools::soak {

namespace {

int64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr unsigned char kSentinel = 0xA5;  // output bytes nobody may write
constexpr unsigned char kCanary = 0xC3;    // bytes after every buffer
constexpr size_t kCanaryBytes = 64;
// Largest buffer of one collective, per rank (the symmetric ones hold it).
constexpr size_t kMaxBufferBytes = size_t{3} << 20;

// ---------------------------------------------------------------------------
// Element values and the reference.

enum class Role { kSum, kProd, kMinMax, kBits, kCopy };

Role RoleOf(bool reducing, ReduceOp op) {
  if (!reducing) return Role::kCopy;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return Role::kSum;
    case ReduceOp::kProd: return Role::kProd;
    case ReduceOp::kMin:
    case ReduceOp::kMax: return Role::kMinMax;
    default: return Role::kBits;
  }
}

// Element `i` of group rank `q`'s input of the operation seeded `s`. Sums:
// |x| <= 8, so a sum over up to 16 ranks stays within bf16's 8 exact bits;
// products: 1, 2 or -1 (powers of two, exact in every float type);
// integer types take their whole range where only bits are moved.
int64_t Val(uint64_t s, int q, size_t i, DType t, Role role) {
  const uint64_t h = Mix(s ^ Mix(static_cast<uint64_t>(q) + 0x51ED) ^ (i * 0xD6E8FEB86659FD93ull));
  const bool uns = t == DType::kU8;
  const bool fl = IsFloat(t);
  switch (role) {
    case Role::kSum: return uns ? static_cast<int64_t>(h % 9) : static_cast<int64_t>(h % 17) - 8;
    case Role::kProd: {
      static constexpr int64_t kSigned[4] = {1, 1, 2, -1};
      return uns ? 1 + static_cast<int64_t>(h % 2) : kSigned[h % 4];
    }
    case Role::kMinMax: return uns ? static_cast<int64_t>(h % 41) : static_cast<int64_t>(h % 41) - 20;
    case Role::kBits:
    case Role::kCopy:
      if (fl) return static_cast<int64_t>(h % 255) - 127;
      switch (t) {
        case DType::kI8: return static_cast<int8_t>(h);
        case DType::kU8: return static_cast<uint8_t>(h);
        case DType::kI32: return static_cast<int32_t>(h);
        default: return static_cast<int64_t>(h);
      }
  }
  return 0;
}

// IEEE half from float, round to nearest even (the soak's own, independent
// of the library's).
uint16_t F32ToF16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t a = x & 0x7FFFFFFF;
  if (a >= 0x7F800000) return sign | 0x7C00 | (a > 0x7F800000 ? 0x200 : 0);
  if (a >= 0x477FF000) return sign | 0x7C00;  // rounds to infinity
  if (a < 0x38800000) {                        // f16 subnormal: units of 2^-24
    const float scaled = std::bit_cast<float>(a) * 16777216.0f;  // exact
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t h = ((((a >> 23) - 127 + 15) << 10) | ((a & 0x7FFFFF) >> 13));
  const uint32_t rest = a & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

void StoreFloat(DType t, unsigned char* p, double v) {
  switch (t) {
    case DType::kF32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case DType::kF64: std::memcpy(p, &v, 8); break;
    case DType::kF16: {
      const uint16_t h = F32ToF16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kBF16: {
      const float f = static_cast<float>(v);
      bf16 b;
      ConvertF32ToBF16(&f, &b, 1);
      std::memcpy(p, &b, 2);
      break;
    }
    default: break;
  }
}

// Stores the integer `v` (exact in the type, or wrapped for integers).
void StoreInt(DType t, unsigned char* p, int64_t v) {
  switch (t) {
    case DType::kI8: { const int8_t x = static_cast<int8_t>(v); std::memcpy(p, &x, 1); break; }
    case DType::kU8: { const uint8_t x = static_cast<uint8_t>(v); std::memcpy(p, &x, 1); break; }
    case DType::kI32: { const int32_t x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); break; }
    case DType::kI64: std::memcpy(p, &v, 8); break;
    default: StoreFloat(t, p, static_cast<double>(v));
  }
}

// Wraps an integer result to the type (two's complement), as the library's
// unsigned-arithmetic integer reductions do.
int64_t Wrap(DType t, int64_t v) {
  switch (t) {
    case DType::kI8: return static_cast<int8_t>(static_cast<uint8_t>(v));
    case DType::kU8: return static_cast<uint8_t>(v);
    case DType::kI32: return static_cast<int32_t>(static_cast<uint32_t>(v));
    default: return v;
  }
}

// Stores the reduction over group ranks 0..n-1 of element `j`.
void StoreReduced(DType t, ReduceOp op, uint64_t s, int n, size_t j, unsigned char* p) {
  const Role role = RoleOf(true, op);
  int64_t acc = Val(s, 0, j, t, role);
  for (int q = 1; q < n; ++q) {
    const int64_t v = Val(s, q, j, t, role);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc = static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(v)); break;
      case ReduceOp::kProd: acc = static_cast<int64_t>(static_cast<uint64_t>(acc) * static_cast<uint64_t>(v)); break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kBand: acc &= v; break;
      case ReduceOp::kBor: acc |= v; break;
      case ReduceOp::kBxor: acc ^= v; break;
    }
  }
  if (op == ReduceOp::kAvg) {
    if (t == DType::kF64) return StoreFloat(t, p, static_cast<double>(acc) / n);
    if (IsFloat(t))  // f32 division; 16-bit types round that once
      return StoreFloat(t, p, static_cast<float>(acc) / static_cast<float>(n));
    return StoreInt(t, p, Wrap(t, acc) / n);
  }
  StoreInt(t, p, IsFloat(t) ? acc : Wrap(t, acc));
}

// Element equality: floats by value (+0 == -0; NaN is never right),
// integers by bits.
bool SameElement(DType t, const unsigned char* a, const unsigned char* b) {
  switch (t) {
    case DType::kF32: {
      float x, y;
      std::memcpy(&x, a, 4);
      std::memcpy(&y, b, 4);
      return x == y;
    }
    case DType::kF64: {
      double x, y;
      std::memcpy(&x, a, 8);
      std::memcpy(&y, b, 8);
      return x == y;
    }
    case DType::kF16:
    case DType::kBF16: {
      uint16_t x, y;
      std::memcpy(&x, a, 2);
      std::memcpy(&y, b, 2);
      const uint16_t exp_mask = t == DType::kF16 ? 0x7C00 : 0x7F80;
      const bool nan = (x & exp_mask) == exp_mask && (x & ~exp_mask & 0x7FFF) != 0;
      return !nan && (x == y || ((x & 0x7FFF) == 0 && (y & 0x7FFF) == 0));
    }
    default: return std::memcmp(a, b, DTypeSize(t)) == 0;
  }
}

// ---------------------------------------------------------------------------
// Buffers.

// A buffer of `bytes` plus canary bytes, private (heap) or carved from a
// symmetric buffer.
struct Buf {
  std::vector<unsigned char> own;
  unsigned char* p = nullptr;
  size_t bytes = 0;

  void Private(size_t n) {
    own.assign(n + kCanaryBytes, kSentinel);
    p = own.data();
    bytes = n;
    std::memset(p + n, kCanary, kCanaryBytes);
  }
  void Symmetric(const SymmetricBuffer& s, size_t n) {
    p = s.as<unsigned char>();
    bytes = n;
    std::memset(p, kSentinel, n);
    std::memset(p + n, kCanary, kCanaryBytes);
  }
  size_t CanaryDamage() const {
    size_t bad = 0;
    for (size_t i = 0; i < kCanaryBytes; ++i) bad += p[bytes + i] != kCanary;
    return bad;
  }
};

struct SoakGroup {
  Group g;           // invalid when this rank is in no group of the family
  int color = 0;     // which subgroup of the family this rank is in
  SymmetricBuffer a, b;
};

// ---------------------------------------------------------------------------
// One collective.

enum class Kind {
  kAllReduce, kReduce, kBroadcast, kAllGather, kAllGatherV, kGather, kScatter,
  kReduceScatter, kReduceScatterV, kAllToAll, kAllToAllV, kBarrier, kCount
};

const char* KindName(Kind k) {
  static const char* const kNames[] = {"all_reduce", "reduce", "broadcast", "all_gather",
                                       "all_gatherv", "gather", "scatter", "reduce_scatter",
                                       "reduce_scatterv", "all_to_all", "all_to_allv", "barrier"};
  return kNames[static_cast<int>(k)];
}

bool Reducing(Kind k) {
  return k == Kind::kAllReduce || k == Kind::kReduce || k == Kind::kReduceScatter ||
         k == Kind::kReduceScatterV;
}

// The algorithms that implement each collective (README, MC2_ALGO), besides
// kAuto. Asking for one of these must never be rejected.
std::vector<Algorithm> Implementations(Kind k) {
  using A = Algorithm;
  switch (k) {
    case Kind::kAllReduce:
      return {A::kRing, A::kRecursiveDoubling, A::kRabenseifner, A::kBinomialTree, A::kDirect};
    case Kind::kReduce: return {A::kBinomialTree, A::kDirect};
    case Kind::kBroadcast: return {A::kRing, A::kBinomialTree, A::kDirect};
    case Kind::kAllGather:
    case Kind::kAllGatherV: return {A::kRing, A::kRecursiveDoubling, A::kDirect};
    case Kind::kGather:
    case Kind::kScatter: return {A::kBinomialTree, A::kDirect};
    case Kind::kReduceScatter:
    case Kind::kReduceScatterV: return {A::kRing, A::kDirect};
    case Kind::kBarrier: return {A::kBinomialTree, A::kDirect};
    default: return {A::kDirect};
  }
}

struct CollPlan {
  Kind kind = Kind::kBarrier;
  DType t = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  Algorithm algo = Algorithm::kAuto;
  int root = 0;
  bool in_place = false;
  bool symmetric = false;
  uint64_t s = 0;                           // value seed
  size_t count = 0;                         // uniform collectives
  std::vector<size_t> counts, displs;       // V collectives (displs may be empty)
  std::vector<std::vector<size_t>> c2c;     // all_to_allv counts [from][to]
  std::vector<std::vector<size_t>> sd, rd;  // all_to_allv displs per rank

  std::string Describe(int n) const {
    return fmt::format("{} n={} dtype={} op={} count={} root={} algo={} {} {}", KindName(kind), n,
                       DTypeName(t), ReduceOpName(op), count, root, AlgorithmName(algo),
                       in_place ? "in-place" : "out-of-place",
                       symmetric ? "symmetric" : "private");
  }
};


size_t Sum(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t{0}); }

size_t Span(const std::vector<size_t>& counts, const std::vector<size_t>& displs) {
  size_t s = 0;
  for (size_t i = 0; i < counts.size(); ++i) s = std::max(s, displs[i] + counts[i]);
  return s;
}

std::vector<size_t> Packed(const std::vector<size_t>& counts) {
  std::vector<size_t> d(counts.size());
  std::exclusive_scan(counts.begin(), counts.end(), d.begin(), size_t{0});
  return d;
}

// Displacements for `counts` with a random gap (0-4 elements) before each
// block: the gaps must stay untouched.
std::vector<size_t> GappedDispls(const std::vector<size_t>& counts, std::mt19937_64& rng) {
  std::vector<size_t> d(counts.size());
  size_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    at += rng() % 5;
    d[i] = at;
    at += counts[i];
  }
  return d;
}

// Element count with sizes spread log-uniformly up to `max_elems`, and the
// edge cases (0, 1, small primes) often.
size_t RandomCount(std::mt19937_64& rng, size_t max_elems) {
  const unsigned pick = rng() % 10;
  size_t c;
  if (pick == 0) {
    c = 0;
  } else if (pick == 1) {
    c = std::array<size_t, 6>{1, 2, 3, 7, 13, 4099}[rng() % 6];
  } else {
    const int bits = 1 + static_cast<int>(rng() % 19);
    c = (size_t{1} << bits) / 2 + rng() % (size_t{1} << bits);
  }
  return std::min(c, max_elems);
}

CollPlan PlanCollective(std::mt19937_64& rng, int n, bool symmetric_ok) {
  CollPlan p;
  p.kind = static_cast<Kind>(rng() % static_cast<int>(Kind::kCount));
  p.t = static_cast<DType>(rng() % kNumDTypes);
  do {
    p.op = static_cast<ReduceOp>(rng() % kNumReduceOps);
  } while (!IsValidReduction(p.t, p.op));
  const auto impls = Implementations(p.kind);
  p.algo = rng() % 3 == 0 ? Algorithm::kAuto : impls[rng() % impls.size()];
  p.root = static_cast<int>(rng() % n);
  p.in_place = rng() % 3 == 0;
  p.symmetric = symmetric_ok && rng() % 2 == 0;
  p.s = rng();
  const size_t e = DTypeSize(p.t);
  // Every buffer of the op (at most n + 1 blocks with gaps) must fit
  // kMaxBufferBytes with its canary.
  const size_t per_block =
      (kMaxBufferBytes - kCanaryBytes) / e / static_cast<size_t>(n + 1) - 8;
  switch (p.kind) {
    case Kind::kAllGatherV:
    case Kind::kReduceScatterV: {
      const size_t base = RandomCount(rng, per_block / 2);
      for (int q = 0; q < n; ++q)
        p.counts.push_back(rng() % 4 == 0 ? 0 : base + rng() % (base / 2 + 2));
      // reduce_scatterv takes packed blocks; all_gatherv may have gaps.
      if (p.kind == Kind::kAllGatherV && rng() % 2) p.displs = GappedDispls(p.counts, rng);
      break;
    }
    case Kind::kAllToAllV: {
      const size_t base = RandomCount(rng, per_block / 2);
      p.c2c.assign(n, std::vector<size_t>(n));
      for (auto& row : p.c2c)
        for (auto& c : row) c = rng() % 4 == 0 ? 0 : base + rng() % (base / 2 + 2);
      const bool gaps = rng() % 2;
      for (int q = 0; q < n; ++q) {
        std::vector<size_t> out(n), in(n);
        for (int r = 0; r < n; ++r) out[r] = p.c2c[q][r], in[r] = p.c2c[r][q];
        p.sd.push_back(gaps ? GappedDispls(out, rng) : Packed(out));
        p.rd.push_back(gaps ? GappedDispls(in, rng) : Packed(in));
      }
      break;
    }
    default: p.count = RandomCount(rng, per_block); break;
  }
  return p;
}

// The buffers of one collective on this rank, filled with the inputs, and
// the expected content of the output buffer after the call.
struct CollRun {
  CollPlan plan;
  int n = 0, me = 0;
  Buf send, recv;  // in place only `recv` is used
  const void* send_ptr = nullptr;
  void* recv_ptr = nullptr;
  std::vector<unsigned char> expected;  // the whole of `recv` after the call
};

// Prepares `run` (buffers, inputs, expected output) for its plan on `sg`.
void Prepare(CollRun& run, const SoakGroup& sg) {
  const CollPlan& p = run.plan;
  const int n = run.n = sg.g.size();
  const int me = run.me = sg.g.rank();
  const DType t = p.t;
  const size_t e = DTypeSize(t);
  const Role role = RoleOf(Reducing(p.kind), p.op);
  const bool is_root = me == p.root;
  // Allocates send and recv; in place `recv` is the one buffer and send_ptr
  // points `send_at` elements into it.
  auto setup = [&](size_t send_elems, size_t recv_elems, size_t send_at) {
    auto alloc = [&](Buf& b, size_t elems, const SymmetricBuffer& s) {
      if (p.symmetric) b.Symmetric(s, elems * e);
      else b.Private(elems * e);
    };
    if (p.in_place) {
      alloc(run.recv, recv_elems, sg.a);
      run.send_ptr = run.recv.p + send_at * e;
    } else {
      alloc(run.send, send_elems, sg.a);
      alloc(run.recv, recv_elems, sg.b);
      run.send_ptr = run.send.p;
    }
    run.recv_ptr = run.recv.p;
  };
  // Writes this rank's input elements j0.. at element `pos` of the input.
  auto fill = [&](size_t pos, size_t j0, size_t len) {
    unsigned char* base = static_cast<unsigned char*>(const_cast<void*>(run.send_ptr));
    for (size_t i = 0; i < len; ++i)
      StoreInt(t, base + (pos + i) * e, Val(p.s, me, j0 + i, t, role));
  };
  // The expected output starts as the output buffer as it is now (what must
  // not change), then the defined elements are overwritten.
  auto snapshot = [&] { run.expected.assign(run.recv.p, run.recv.p + run.recv.bytes); };
  auto at = [&](size_t pos) { return run.expected.data() + pos * e; };
  auto copy_of = [&](int q, size_t j, size_t pos) { StoreInt(t, at(pos), Val(p.s, q, j, t, role)); };

  switch (p.kind) {
    case Kind::kAllReduce:
    case Kind::kReduce:
      setup(p.count, p.count, 0);
      fill(0, 0, p.count);
      snapshot();
      if (p.kind == Kind::kAllReduce || is_root)
        for (size_t i = 0; i < p.count; ++i) StoreReduced(t, p.op, p.s, n, i, at(i));
      break;
    case Kind::kBroadcast:
      setup(p.count, p.count, 0);
      // Only the root's input is read; in place the others' buffer is output.
      if (is_root || !p.in_place) fill(0, 0, p.count);
      snapshot();
      for (size_t i = 0; i < p.count; ++i) copy_of(p.root, i, i);
      break;
    case Kind::kAllGather:
    case Kind::kAllGatherV:
    case Kind::kGather: {
      const std::vector<size_t> counts =
          p.kind == Kind::kAllGatherV ? p.counts : std::vector<size_t>(n, p.count);
      const std::vector<size_t> displs = p.displs.empty() ? Packed(counts) : p.displs;
      const bool receives = p.kind != Kind::kGather || is_root;
      // A non-root of gather has no output: out of place it gets a small
      // recv that must stay untouched; in place there is no such form.
      const bool in_place = p.in_place && receives;
      CollPlan& mp = run.plan;
      mp.in_place = in_place;
      setup(counts[me], receives ? Span(counts, displs) : 1, displs[me]);
      fill(0, 0, counts[me]);
      snapshot();
      if (receives)
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < counts[q]; ++i) copy_of(q, i, displs[q] + i);
      break;
    }
    case Kind::kScatter: {
      // Root's input: n blocks of count; rank r receives block r.
      const bool in_place = p.in_place && is_root;
      run.plan.in_place = in_place;
      if (in_place) {
        // recv = send + root * count: the buffer is the root's whole input.
        setup(0, n * p.count, 0);
        fill(0, 0, n * p.count);
        run.recv_ptr = run.recv.p + static_cast<size_t>(me) * p.count * e;
      } else {
        setup(is_root ? n * p.count : 1, p.count, 0);
        if (is_root) fill(0, 0, n * p.count);
      }
      snapshot();
      const size_t base = in_place ? static_cast<size_t>(me) * p.count : 0;
      for (size_t i = 0; i < p.count; ++i) copy_of(p.root, static_cast<size_t>(me) * p.count + i, base + i);
      break;
    }
    case Kind::kReduceScatter:
    case Kind::kReduceScatterV: {
      const std::vector<size_t> counts =
          p.kind == Kind::kReduceScatterV ? p.counts : std::vector<size_t>(n, p.count);
      const std::vector<size_t> displs = Packed(counts);
      const size_t total = Sum(counts);
      if (p.in_place) {
        // recv = send + displs[me]: the one buffer holds the whole input.
        setup(0, total, 0);
        fill(0, 0, total);
        run.recv_ptr = run.recv.p + displs[me] * e;
      } else {
        setup(total, counts[me], 0);
        fill(0, 0, total);
      }
      snapshot();
      const size_t base = p.in_place ? displs[me] : 0;
      for (size_t i = 0; i < counts[me]; ++i)
        StoreReduced(t, p.op, p.s, n, displs[me] + i, at(base + i));
      break;
    }
    case Kind::kAllToAll:
    case Kind::kAllToAllV: {
      std::vector<std::vector<size_t>> c2c = p.c2c, sd = p.sd, rd = p.rd;
      if (p.kind == Kind::kAllToAll) {
        c2c.assign(n, std::vector<size_t>(n, p.count));
        sd.assign(n, Packed(c2c[0]));
        rd = sd;
      }
      std::vector<size_t> my_out(n), my_in(n);
      for (int r = 0; r < n; ++r) my_out[r] = c2c[me][r], my_in[r] = c2c[r][me];
      const size_t sspan = Span(my_out, sd[me]), rspan = Span(my_in, rd[me]);
      // In place the one buffer holds the input (send layout), then the
      // output (recv layout); elements outside the received blocks keep
      // the input.
      setup(sspan, p.in_place ? std::max(sspan, rspan) : rspan, 0);
      fill(0, 0, sspan);
      snapshot();
      for (int s = 0; s < n; ++s)
        for (size_t i = 0; i < c2c[s][me]; ++i) copy_of(s, sd[s][me] + i, rd[me][s] + i);
      // Keep what the call needs.
      run.plan.c2c = std::move(c2c);
      run.plan.sd = std::move(sd);
      run.plan.rd = std::move(rd);
      break;
    }
    case Kind::kBarrier:
    case Kind::kCount:
      setup(0, 0, 0);
      snapshot();
      break;
  }
}

Work Issue(CollRun& run, const Group& g) {
  const CollPlan& p = run.plan;
  CollectiveOptions o;
  o.algorithm = p.algo;
  const int n = run.n, me = run.me;
  const void* s = run.send_ptr;
  void* r = run.recv_ptr;
  switch (p.kind) {
    case Kind::kAllReduce: return AllReduce(g, s, r, p.count, p.t, p.op, o);
    case Kind::kReduce: return Reduce(g, s, r, p.count, p.t, p.op, p.root, o);
    case Kind::kBroadcast: return Broadcast(g, s, r, p.count, p.t, p.root, o);
    case Kind::kAllGather: return AllGather(g, s, r, p.count, p.t, o);
    case Kind::kAllGatherV: return AllGatherV(g, s, r, p.counts, p.displs, p.t, o);
    case Kind::kGather: return Gather(g, s, r, p.count, p.t, p.root, o);
    case Kind::kScatter: return Scatter(g, s, r, p.count, p.t, p.root, o);
    case Kind::kReduceScatter: return ReduceScatter(g, s, r, p.count, p.t, p.op, o);
    case Kind::kReduceScatterV: return ReduceScatterV(g, s, r, p.counts, p.t, p.op, o);
    case Kind::kAllToAll: return AllToAll(g, s, r, p.count, p.t, o);
    case Kind::kAllToAllV: {
      std::vector<size_t> out(n), in(n);
      for (int q = 0; q < n; ++q) out[q] = p.c2c[me][q], in[q] = p.c2c[q][me];
      return AllToAllV(g, s, out, p.sd[me], r, in, p.rd[me], p.t, o);
    }
    default: return Barrier(g, o);
  }
}

// Wrong elements of the output (and damaged canary bytes).
size_t Check(const CollRun& run, size_t* checked) {
  const DType t = run.plan.t;
  const size_t e = DTypeSize(t);
  size_t wrong = 0;
  const size_t elems = run.recv.bytes / e;
  for (size_t i = 0; i < elems; ++i)
    wrong += !SameElement(t, run.recv.p + i * e, run.expected.data() + i * e);
  *checked += elems;
  wrong += run.recv.CanaryDamage();
  if (!run.plan.in_place && run.send.p) wrong += run.send.CanaryDamage();
  return wrong;
}

// ---------------------------------------------------------------------------
// Fused operators.

enum class FusedKind { kAllGatherMatmul, kMatmulReduceScatter, kMatmulAllReduce };

struct FusedPlan {
  FusedKind kind = FusedKind::kMatmulAllReduce;
  DType t = DType::kF32;
  FusedOptions opts;
  bool gathered = false;
  uint64_t s = 0;
  std::vector<size_t> m, k, n;  // per group rank (what each kind lets differ)

  std::string Describe() const {
    static const char* const kNames[] = {"all_gather_matmul", "matmul_reduce_scatter",
                                         "matmul_all_reduce"};
    auto list = [](const std::vector<size_t>& v) {
      std::string out;
      for (size_t x : v) out += fmt::format("{}{}", out.empty() ? "" : ",", x);
      return out;
    };
    return fmt::format("{} dtype={} pipeline={} splits={} m=[{}] k=[{}] n=[{}]{}",
                       kNames[static_cast<int>(kind)], DTypeName(t), PipelineName(opts.pipeline),
                       opts.splits, list(m), list(k), list(n), gathered ? " gathered_a" : "");
  }
};

FusedPlan PlanFused(std::mt19937_64& rng, int n) {
  FusedPlan p;
  p.kind = static_cast<FusedKind>(rng() % 3);
  p.t = rng() % 2 ? DType::kF32 : DType::kBF16;
  p.opts.pipeline = static_cast<Pipeline>(rng() % kNumPipelines);
  p.opts.splits = 1 + static_cast<int>(rng() % 8);
  p.gathered = rng() % 2;
  p.s = rng();
  auto dim = [&](size_t max) { return rng() % 8 == 0 ? size_t{0} : 1 + rng() % max; };
  p.m.resize(n);
  p.k.resize(n);
  p.n.resize(n);
  switch (p.kind) {
    case FusedKind::kAllGatherMatmul: {  // m and n per rank, k common
      const size_t k = 1 + rng() % 64;
      for (int q = 0; q < n; ++q) p.m[q] = dim(48), p.k[q] = k, p.n[q] = dim(64);
      break;
    }
    case FusedKind::kMatmulReduceScatter: {  // m_local per rank, k per rank, n common
      const size_t nn = dim(64);
      for (int q = 0; q < n; ++q) p.m[q] = dim(32), p.k[q] = dim(64), p.n[q] = nn;
      break;
    }
    case FusedKind::kMatmulAllReduce: {  // M and n common, k per rank
      const size_t mm = dim(64), nn = dim(64);
      for (int q = 0; q < n; ++q) p.m[q] = mm, p.k[q] = dim(64), p.n[q] = nn;
      break;
    }
  }
  return p;
}

// Entry `i` of matrix `which` (0 = A, 1 = B) of group rank q: in [-2, 2].
int64_t MatVal(uint64_t s, int q, int which, size_t i) {
  return static_cast<int64_t>(Mix(s ^ Mix(static_cast<uint64_t>(q) * 2 + which) ^ (i * 0x9FB21C651E98DF25ull)) % 5) - 2;
}

// The matrix `which` of rank q (rows x cols), as int64 and in dtype `t`.
std::vector<int64_t> MatInts(uint64_t s, int q, int which, size_t count) {
  std::vector<int64_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = MatVal(s, q, which, i);
  return v;
}

std::vector<unsigned char> Encode(const std::vector<int64_t>& v, DType t) {
  std::vector<unsigned char> out(std::max<size_t>(v.size(), 1) * DTypeSize(t));
  for (size_t i = 0; i < v.size(); ++i) StoreInt(t, out.data() + i * DTypeSize(t), v[i]);
  return out;
}

// acc[M x n] += a[M x k] * b[k x n] in exact integers.
void MatAcc(std::vector<int64_t>& acc, const int64_t* a, const int64_t* b, size_t m, size_t k,
            size_t n) {
  for (size_t i = 0; i < m; ++i)
    for (size_t l = 0; l < k; ++l) {
      const int64_t x = a[i * k + l];
      if (x == 0) continue;
      for (size_t j = 0; j < n; ++j) acc[i * n + j] += x * b[l * n + j];
    }
}

// Runs the fused operator of `p` on `g` and returns its wrong elements.
size_t RunFused(const FusedPlan& p, const Group& g, size_t* checked, std::string* what) {
  const int n = g.size(), me = g.rank();
  const size_t e = DTypeSize(p.t);
  std::vector<float> c;
  std::vector<int64_t> expected;
  std::vector<unsigned char> gathered, gathered_expected;
  FusedReport report;
  Work w;
  switch (p.kind) {
    case FusedKind::kAllGatherMatmul: {
      const size_t k = p.k[0], nn = p.n[me];
      size_t M = 0;
      for (int q = 0; q < n; ++q) M += p.m[q];
      const auto a_ints = MatInts(p.s, me, 0, p.m[me] * k);
      const auto b_ints = MatInts(p.s, me, 1, k * nn);
      const auto a = Encode(a_ints, p.t), b = Encode(b_ints, p.t);
      c.assign(std::max<size_t>(M * nn, 1) + 16, -7.0f);
      expected.assign(M * nn, 0);
      std::vector<int64_t> all_a;
      for (int q = 0; q < n; ++q) {
        const auto aq = MatInts(p.s, q, 0, p.m[q] * k);
        all_a.insert(all_a.end(), aq.begin(), aq.end());
      }
      MatAcc(expected, all_a.data(), b_ints.data(), M, k, nn);
      if (p.gathered) {
        gathered.assign(std::max<size_t>(M * k, 1) * e + 64, kSentinel);
        gathered_expected = Encode(all_a, p.t);
        gathered_expected.resize(M * k * e);
      }
      w = AllGatherMatmul(g, a.data(), p.m[me], k, b.data(), nn, p.t, c.data(),
                          p.gathered ? gathered.data() : nullptr, p.opts, &report);
      break;
    }
    case FusedKind::kMatmulReduceScatter: {
      size_t M = 0, off = 0;
      for (int q = 0; q < n; ++q) {
        if (q < me) off += p.m[q];
        M += p.m[q];
      }
      const size_t nn = p.n[0];
      const auto a = Encode(MatInts(p.s, me, 0, M * p.k[me]), p.t);
      const auto b = Encode(MatInts(p.s, me, 1, p.k[me] * nn), p.t);
      std::vector<int64_t> full(M * nn, 0);
      for (int q = 0; q < n; ++q) {
        const auto aq = MatInts(p.s, q, 0, M * p.k[q]);
        const auto bq = MatInts(p.s, q, 1, p.k[q] * nn);
        MatAcc(full, aq.data(), bq.data(), M, p.k[q], nn);
      }
      expected.assign(full.begin() + off * nn, full.begin() + (off + p.m[me]) * nn);
      c.assign(std::max<size_t>(p.m[me] * nn, 1) + 16, -7.0f);
      w = MatmulReduceScatter(g, a.data(), M, p.k[me], b.data(), nn, p.t, c.data(), p.m[me],
                              p.opts, &report);
      break;
    }
    case FusedKind::kMatmulAllReduce: {
      const size_t M = p.m[0], nn = p.n[0];
      const auto a = Encode(MatInts(p.s, me, 0, M * p.k[me]), p.t);
      const auto b = Encode(MatInts(p.s, me, 1, p.k[me] * nn), p.t);
      expected.assign(M * nn, 0);
      for (int q = 0; q < n; ++q) {
        const auto aq = MatInts(p.s, q, 0, M * p.k[q]);
        const auto bq = MatInts(p.s, q, 1, p.k[q] * nn);
        MatAcc(expected, aq.data(), bq.data(), M, p.k[q], nn);
      }
      c.assign(std::max<size_t>(M * nn, 1) + 16, -7.0f);
      w = MatmulAllReduce(g, a.data(), M, p.k[me], b.data(), nn, p.t, c.data(), p.opts, &report);
      break;
    }
  }
  w.Wait();
  size_t wrong = 0;
  for (size_t i = 0; i < expected.size(); ++i)
    wrong += c[i] != static_cast<float>(expected[i]);
  // Nothing past the output (16 floats) and gathered_a exactly the shards.
  for (size_t i = expected.size(); i < c.size(); ++i)
    if (i >= std::max<size_t>(expected.size(), 1)) wrong += c[i] != -7.0f;
  *checked += expected.size();
  if (p.gathered) {
    for (size_t i = 0; i < gathered_expected.size() / e; ++i)
      wrong += !SameElement(p.t, gathered.data() + i * e, gathered_expected.data() + i * e);
    for (size_t i = gathered_expected.size(); i < gathered.size(); ++i)
      wrong += gathered[i] != kSentinel;
    *checked += gathered_expected.size() / e;
  }
  if (p.opts.pipeline != Pipeline::kAuto && report.pipeline != p.opts.pipeline) {
    ++wrong;
    *what = fmt::format("asked for pipeline {} but {} ran", PipelineName(p.opts.pipeline),
                        PipelineName(report.pipeline));
  }
  return wrong;
}

// ---------------------------------------------------------------------------
// The rank.

struct Outcome {
  uint64_t ops = 0, checked = 0, wrong = 0;
  std::vector<std::string> bad;
  std::string error;  // "CODE T_NS WHAT", empty if none
  bool noerror = false;

  void Bad(std::string text) {
    if (bad.size() < 8) bad.push_back(std::move(text));
  }
};

std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

void WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
  }
  std::rename(tmp.c_str(), path.c_str());
}

void WriteOutcome(const std::string& dir, int rank, const Outcome& o) {
  std::string text = fmt::format("ops {}\nchecked {}\nwrong {}\n", o.ops, o.checked, o.wrong);
  if (!o.error.empty()) text += "error " + o.error + "\n";
  if (o.noerror) text += "noerror\n";
  for (const auto& b : o.bad) text += "bad " + OneLine(b) + "\n";
  text += "end\n";
  WriteFileAtomically(fmt::format("{}/rank-{}.out", dir, rank), text);
}

// The victim's fault: note it for the driver, then signal ourselves.
void InjectFault(const RankArgs& a) {
  const int sig = a.fault == "stop" ? SIGSTOP : SIGKILL;
  WriteFileAtomically(a.dir + "/victim",
                      fmt::format("{} {} {}\n", a.fault, getpid(), MonoNs()));
  kill(getpid(), sig);
}

// The four group families: the world, then three Split families (parity
// with reversed order, halves, everyone but the last rank).
std::vector<SoakGroup> MakeGroups(const Group& world) {
  const int n = world.size(), r = world.rank();
  std::vector<SoakGroup> groups(4);
  groups[0].g = world;
  groups[1].color = r % 2;
  groups[1].g = world.Split(groups[1].color, -r);
  groups[2].color = r < n / 2 ? 0 : 1;
  groups[2].g = world.Split(groups[2].color, r);
  groups[3].color = (n > 2 && r == n - 1) ? -1 : 0;
  groups[3].g = world.Split(groups[3].color, r);
  for (auto& sg : groups) {
    if (!sg.g.valid()) continue;
    sg.a = sg.g.AllocSymmetric(kMaxBufferBytes);
    sg.b = sg.g.AllocSymmetric(kMaxBufferBytes);
  }
  return groups;
}

// One step on this rank's group of `sg`'s family: a batch of 1-3
// collectives issued before any is waited for, or one fused operator.
void Step(SoakGroup& sg, uint64_t step_seed, int corrupt_every, Outcome& o) {
  std::mt19937_64 rng(step_seed ^ Mix(static_cast<uint64_t>(sg.color) + 77));
  const int n = sg.g.size();
  if (rng() % 6 == 0) {
    const FusedPlan p = PlanFused(rng, n);
    std::string what;
    const size_t wrong = RunFused(p, sg.g, &o.checked, &what);
    ++o.ops;
    if (wrong) {
      o.wrong += wrong;
      o.Bad(fmt::format("{} wrong: {} {}", wrong, p.Describe(), what));
    }
    return;
  }
  const int batch = 1 + static_cast<int>(rng() % 3);
  std::vector<CollRun> runs(batch);
  for (int i = 0; i < batch; ++i) {
    // Only the first of a batch may use the group's symmetric buffers.
    runs[i].plan = PlanCollective(rng, n, i == 0);
    Prepare(runs[i], sg);
  }
  std::vector<Work> works;
  std::exception_ptr first;
  for (auto& run : runs) {
    try {
      works.push_back(Issue(run, sg.g));
    } catch (...) {
      first = std::current_exception();
      break;
    }
  }
  // Wait for every issued operation before the buffers go away, even after
  // an error (a failed world fails the rest quickly).
  for (auto& w : works) {
    try {
      w.Wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  for (auto& run : runs) {
    ++o.ops;
    if (corrupt_every > 0 && sg.g.world_rank() == 0 && o.ops % corrupt_every == 0 &&
        run.recv.bytes > 0)
      run.recv.p[run.recv.bytes / 2] ^= 0x40;
    const size_t wrong = Check(run, &o.checked);
    if (wrong) {
      o.wrong += wrong;
      o.Bad(fmt::format("{} wrong: {} (rank {} of {})", wrong, run.plan.Describe(run.n), run.me,
                        run.n));
    }
  }
}

}  // namespace

int RunSoakRank(const RankArgs& a) {
  const char* env_rank = std::getenv("MC2_RANK");
  const int rank = env_rank ? std::atoi(env_rank) : 0;
  WriteFileAtomically(fmt::format("{}/rank-{}.pid", a.dir, rank), fmt::format("{}\n", getpid()));
  const bool faults = !a.fault.empty();
  if (faults && rank == a.victim) {
    if (a.delay_ms <= 0) {
      InjectFault(a);  // during set-up: before the world exists
    } else {
      std::thread([a] {
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(a.delay_ms));
        InjectFault(a);
      }).detach();
    }
  }
  Outcome o;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  int status = 0;
  try {
    Group world = Group::FromEnv();
    std::vector<SoakGroup> groups = MakeGroups(world);
    std::mt19937_64 rng(a.seed);
    for (uint64_t step = 0;; ++step) {
      if (faults) {
        if (elapsed() > a.max_seconds) {
          o.noerror = true;
          break;
        }
      } else if (step % 16 == 0) {
        // Stop together: any rank past the run time stops everyone.
        int32_t stop = elapsed() >= a.seconds ? 1 : 0;
        AllReduce(world, &stop, &stop, 1, DType::kI32, ReduceOp::kMax).Wait();
        if (stop) break;
      }
      SoakGroup& sg = groups[rng() % groups.size()];
      const uint64_t step_seed = rng();
      if (!sg.g.valid()) continue;  // not a member of this family
      Step(sg, step_seed, a.corrupt_every, o);
    }
    if (!faults) Barrier(world).Wait();  // nobody frees memory a peer reads
  } catch (const Error& e) {
    o.error = fmt::format("{} {} {}", ErrorCodeName(e.code()), MonoNs(), OneLine(e.what()));
  } catch (const std::exception& e) {
    o.error = fmt::format("exception {} {}", MonoNs(), OneLine(e.what()));
  }
  if (!o.error.empty() || o.wrong || o.noerror) status = faults && !o.error.empty() ? 3 : 1;
  if (faults && o.error.empty()) status = 1;
  WriteOutcome(a.dir, rank, o);
  return status;
}

}  // namespace mc2::tools::soak
