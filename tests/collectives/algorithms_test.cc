// Ring, recursive doubling and binomial-tree algorithms, checked against
// kDirect (whose reductions are core::ReduceTree: the canonical order, so
// deterministic results must match bit for bit), against scalar references
// for integer reductions, and against the inputs for data movement.
//
// The scratch space is made small (WorldOptions::scratch_bytes = 8192) so that every
// algorithm runs its multi-round paths; buffers are private, symmetric or
// mixed (odd ranks symmetric), in and out of place.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/reduce.h"
#include "mc2/mc2.h"

namespace mc2 {
namespace {

constexpr size_t kBig = 65536 + 5;

enum class Mem { kPrivate, kSymmetric, kMixed };
const char* MemName(Mem m) {
  return m == Mem::kPrivate ? "private" : m == Mem::kSymmetric ? "symmetric" : "mixed";
}

uint64_t Hash(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full;
  h ^= c * 0x165667B19E3779F9ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return h;
}

bool IsInt(DType t) { return t == DType::kI32; }

// Element i of `rank`'s input. Deterministic-mode floats mix magnitudes and
// signs so that the combination order shows in the low bits; "exact" inputs
// (non-deterministic mode) are small integers whose sums and products are
// exact in any order, even in bf16.
void Fill(char* p, DType t, ReduceOp op, bool exact, int rank, size_t count, uint64_t salt) {
  for (size_t i = 0; i < count; ++i) {
    const uint64_t h = Hash(rank, i, salt);
    double v;
    if (exact) {
      if (op == ReduceOp::kProd) v = (const double[]){1, 2, -1, 1}[h % 4];
      else if (op == ReduceOp::kMin || op == ReduceOp::kMax) v = static_cast<double>(h % 200) - 100;
      else v = static_cast<double>(h % 16);
    } else if (op == ReduceOp::kProd) {
      v = 1 + (static_cast<double>(h % 2001) - 1000) / 8000.0;
    } else {
      static const double kScale[] = {1, 1.0 / 1024, 1024};
      v = (static_cast<double>(h % 20001) - 10000) / 64.0 * kScale[(h >> 20) % 3];
    }
    switch (t) {
      case DType::kF32: reinterpret_cast<float*>(p)[i] = static_cast<float>(v); break;
      case DType::kF64: reinterpret_cast<double*>(p)[i] = v; break;
      case DType::kBF16:
        reinterpret_cast<uint16_t*>(p)[i] = core::F32ToBF16(static_cast<float>(v));
        break;
      case DType::kI32:
        reinterpret_cast<int32_t*>(p)[i] =
            exact ? static_cast<int32_t>(v) : static_cast<int32_t>(static_cast<uint32_t>(h >> 7));
        break;
      default: FAIL() << "unsupported dtype";
    }
  }
}

// Scalar reference of an i32 reduction over n ranks' inputs (order-free).
std::vector<int32_t> IntReference(ReduceOp op, bool exact, int n, size_t count, size_t first,
                                  uint64_t salt, size_t total) {
  std::vector<std::vector<char>> in(n, std::vector<char>(total * 4));
  for (int r = 0; r < n; ++r) Fill(in[r].data(), DType::kI32, op, exact, r, total, salt);
  std::vector<int32_t> out(count);
  for (size_t i = 0; i < count; ++i) {
    uint32_t acc = 0;
    int32_t mn = INT32_MAX, mx = INT32_MIN;
    for (int r = 0; r < n; ++r) {
      int32_t x = reinterpret_cast<const int32_t*>(in[r].data())[first + i];
      uint32_t u = static_cast<uint32_t>(x);
      if (r == 0) {
        acc = u;
      } else {
        switch (op) {
          case ReduceOp::kSum:
          case ReduceOp::kAvg: acc += u; break;
          case ReduceOp::kProd: acc *= u; break;
          case ReduceOp::kBand: acc &= u; break;
          case ReduceOp::kBor: acc |= u; break;
          case ReduceOp::kBxor: acc ^= u; break;
          default: break;
        }
      }
      mn = std::min(mn, x);
      mx = std::max(mx, x);
    }
    int32_t v = static_cast<int32_t>(acc);
    if (op == ReduceOp::kMin) v = mn;
    if (op == ReduceOp::kMax) v = mx;
    if (op == ReduceOp::kAvg) v = v / n;
    out[i] = v;
  }
  return out;
}

// Per-rank state of one sweep: symmetric buffers (allocated once) and
// counters that make every call's inputs different.
class Harness {
 public:
  Harness(Group& g, size_t max_bytes, bool exact)
      : g_(g), exact_(exact), ssym_(g.AllocSymmetric(max_bytes)), rsym_(g.AllocSymmetric(max_bytes)) {}

  Group& g() { return g_; }
  int rank() const { return g_.rank(); }
  int size() const { return g_.size(); }
  bool exact() const { return exact_; }
  uint64_t NextSalt() { return ++salt_; }

  bool Sym(Mem m) const { return m == Mem::kSymmetric || (m == Mem::kMixed && rank() % 2 == 1); }
  char* Send(Mem m, size_t bytes) {
    EXPECT_LE(bytes, ssym_.size());
    if (Sym(m)) return ssym_.as<char>();
    spriv_.assign(bytes + 64, 0);
    return spriv_.data() + 64;  // never the same address as a previous vector's
  }
  char* Recv(Mem m, size_t bytes) {
    EXPECT_LE(bytes, rsym_.size());
    if (Sym(m)) return rsym_.as<char>();
    rpriv_.assign(bytes + 64, 0);
    return rpriv_.data() + 64;
  }

  // Reports the first difference between expected and actual bytes.
  void Expect(const std::string& what, const char* expected, const char* actual, size_t bytes,
              size_t esize) {
    if (bytes == 0 || std::memcmp(expected, actual, bytes) == 0) return;
    size_t i = 0;
    while (std::memcmp(expected + i * esize, actual + i * esize, esize) == 0) ++i;
    uint64_t x = 0, y = 0;
    std::memcpy(&x, expected + i * esize, esize);
    std::memcpy(&y, actual + i * esize, esize);
    ADD_FAILURE() << what << " rank " << rank() << " of " << size() << ": element " << i
                  << " is 0x" << std::hex << y << ", expected 0x" << x;
  }

 private:
  Group& g_;
  bool exact_;
  SymmetricBuffer ssym_, rsym_;
  std::vector<char> spriv_, rpriv_;
  uint64_t salt_ = 0;
};

std::string Describe(const char* kind, Algorithm algo, DType t, ReduceOp op, size_t count,
                     Mem m, bool in_place, bool with_op = true) {
  return fmt::format("{} {} {}{}{} count={} {}{}", kind, AlgorithmName(algo), DTypeName(t),
                     with_op ? " " : "", with_op ? ReduceOpName(op) : "", count, MemName(m),
                     in_place ? " in-place" : "");
}

// ---------------------------------------------------------------------------
// One call of each collective, compared with its reference.

void CheckAllReduce(Harness& h, Algorithm algo, DType t, ReduceOp op, size_t count, Mem m,
                    bool in_place) {
  const size_t e = DTypeSize(t), bytes = count * e;
  const uint64_t salt = h.NextSalt();
  std::vector<char> in(bytes), ref(bytes, 0x5A);
  Fill(in.data(), t, op, h.exact(), h.rank(), count, salt);
  AllReduce(h.g(), in.data(), ref.data(), count, t, op, {.algorithm = Algorithm::kDirect}).Wait();
  char* s = h.Send(m, bytes);
  char* r = in_place ? s : h.Recv(m, bytes);
  if (bytes) std::memcpy(s, in.data(), bytes);
  if (!in_place && bytes) std::memset(r, 0xCD, bytes);
  AllReduce(h.g(), s, r, count, t, op, {.algorithm = algo}).Wait();
  const std::string what = Describe("all_reduce", algo, t, op, count, m, in_place);
  h.Expect(what, ref.data(), r, bytes, e);
  if (IsInt(t)) {
    auto want = IntReference(op, h.exact(), h.size(), count, 0, salt, count);
    h.Expect(what + " (scalar reference)", reinterpret_cast<const char*>(want.data()), r, bytes, e);
  }
}

void CheckReduce(Harness& h, Algorithm algo, DType t, ReduceOp op, size_t count, Mem m,
                 bool in_place, int root) {
  const size_t e = DTypeSize(t), bytes = count * e;
  const bool is_root = h.rank() == root;
  const uint64_t salt = h.NextSalt();
  std::vector<char> in(bytes), ref(bytes, 0x5A);
  Fill(in.data(), t, op, h.exact(), h.rank(), count, salt);
  Reduce(h.g(), in.data(), ref.data(), count, t, op, root, {.algorithm = Algorithm::kDirect})
      .Wait();
  char* s = h.Send(m, bytes);
  char* r = in_place && is_root ? s : h.Recv(m, bytes);
  if (bytes) std::memcpy(s, in.data(), bytes);
  if (r != s && bytes) std::memset(r, 0xCD, bytes);
  Reduce(h.g(), s, is_root ? r : nullptr, count, t, op, root, {.algorithm = algo}).Wait();
  if (!is_root) return;
  const std::string what =
      Describe("reduce", algo, t, op, count, m, in_place) + fmt::format(" root={}", root);
  h.Expect(what, ref.data(), r, bytes, e);
  if (IsInt(t)) {
    auto want = IntReference(op, h.exact(), h.size(), count, 0, salt, count);
    h.Expect(what + " (scalar reference)", reinterpret_cast<const char*>(want.data()), r, bytes, e);
  }
}

// reduce_scatter (v = false: count per rank) or reduce_scatterv (counts
// vary, some zero).
void CheckReduceScatter(Harness& h, Algorithm algo, DType t, ReduceOp op, size_t count, Mem m,
                        bool in_place, bool v) {
  const int n = h.size(), me = h.rank();
  const size_t e = DTypeSize(t);
  std::vector<size_t> counts(n, count);
  if (v)
    for (int r = 0; r < n; ++r) counts[r] = r % 3 == 1 ? 0 : count + r;
  std::vector<size_t> displs(n);
  std::exclusive_scan(counts.begin(), counts.end(), displs.begin(), size_t{0});
  const size_t total = displs[n - 1] + counts[n - 1];
  const size_t mine = counts[me] * e;
  const uint64_t salt = h.NextSalt();
  std::vector<char> in(total * e), ref(mine, 0x5A);
  Fill(in.data(), t, op, h.exact(), me, total, salt);
  CollectiveOptions direct{.algorithm = Algorithm::kDirect}, opts{.algorithm = algo};
  if (v) ReduceScatterV(h.g(), in.data(), ref.data(), counts, t, op, direct).Wait();
  else ReduceScatter(h.g(), in.data(), ref.data(), count, t, op, direct).Wait();
  char* s = h.Send(m, total * e);
  char* r = in_place ? s + displs[me] * e : h.Recv(m, mine);
  if (total) std::memcpy(s, in.data(), total * e);
  if (!in_place && mine) std::memset(r, 0xCD, mine);
  if (v) ReduceScatterV(h.g(), s, r, counts, t, op, opts).Wait();
  else ReduceScatter(h.g(), s, r, count, t, op, opts).Wait();
  const std::string what =
      Describe(v ? "reduce_scatterv" : "reduce_scatter", algo, t, op, count, m, in_place);
  h.Expect(what, ref.data(), r, mine, e);
  if (IsInt(t)) {
    auto want = IntReference(op, h.exact(), n, counts[me], displs[me], salt, total);
    h.Expect(what + " (scalar reference)", reinterpret_cast<const char*>(want.data()), r, mine, e);
  }
}

void CheckBroadcast(Harness& h, Algorithm algo, DType t, size_t count, Mem m, bool in_place,
                    int root) {
  const size_t e = DTypeSize(t), bytes = count * e;
  const bool is_root = h.rank() == root;
  const uint64_t salt = h.NextSalt();
  std::vector<char> want(bytes);
  Fill(want.data(), t, ReduceOp::kSum, false, root, count, salt);
  char* s = h.Send(m, bytes);
  char* r = in_place && is_root ? s : h.Recv(m, bytes);
  if (is_root && bytes) std::memcpy(s, want.data(), bytes);
  if (r != s && bytes) std::memset(r, 0xCD, bytes);
  Broadcast(h.g(), is_root ? s : nullptr, r, count, t, root, {.algorithm = algo}).Wait();
  h.Expect(Describe("broadcast", algo, t, ReduceOp::kSum, count, m, in_place, false) +
               fmt::format(" root={}", root),
           want.data(), r, bytes, e);
}

// all_gather (v = false), all_gatherv (uneven counts, some zero, gaps
// between the blocks) or gather (root >= 0).
void CheckGather(Harness& h, Algorithm algo, DType t, size_t count, Mem m, bool in_place, bool v,
                 int root) {
  const int n = h.size(), me = h.rank();
  const size_t e = DTypeSize(t);
  std::vector<size_t> counts(n, count), displs(n);
  size_t span = 0;
  for (int r = 0; r < n; ++r) {
    if (v) counts[r] = r % 3 == 1 ? 0 : count + 2 * r;
    displs[r] = v ? span + 3 : span;  // all_gatherv: gaps between blocks
    span = displs[r] + counts[r];
  }
  const bool receives = root < 0 || me == root;
  const uint64_t salt = h.NextSalt();
  std::vector<char> want(span * e, 0);
  for (int r = 0; r < n; ++r)
    Fill(want.data() + displs[r] * e, t, ReduceOp::kSum, false, r, counts[r], salt);
  const size_t mine = counts[me] * e;
  char* rbuf = h.Recv(m, span * e);
  char* s = in_place && receives ? rbuf + displs[me] * e : h.Send(m, mine);
  if (receives && span) std::memset(rbuf, 0xCD, span * e);
  if (mine) std::memcpy(s, want.data() + displs[me] * e, mine);
  CollectiveOptions opts{.algorithm = algo};
  if (root >= 0) Gather(h.g(), s, rbuf, count, t, root, opts).Wait();
  else if (v) AllGatherV(h.g(), s, rbuf, counts, displs, t, opts).Wait();
  else AllGather(h.g(), s, rbuf, count, t, opts).Wait();
  if (!receives) return;
  std::string what = Describe(root >= 0 ? "gather" : v ? "all_gatherv" : "all_gather", algo, t,
                              ReduceOp::kSum, count, m, in_place, false);
  if (root >= 0) what += fmt::format(" root={}", root);
  for (int r = 0; r < n; ++r)
    h.Expect(what + fmt::format(" block {}", r), want.data() + displs[r] * e,
             rbuf + displs[r] * e, counts[r] * e, e);
  // The gaps between all_gatherv blocks are not written.
  if (v)
    for (int r = 0; r < n; ++r)
      for (size_t b = 0; b < 3 * e; ++b)
        if (static_cast<unsigned char>(rbuf[(displs[r] - 3) * e + b]) != 0xCD) {
          ADD_FAILURE() << what << ": gap before block " << r << " was written";
          break;
        }
}

void CheckScatter(Harness& h, Algorithm algo, DType t, size_t count, Mem m, bool in_place,
                  int root) {
  const int n = h.size(), me = h.rank();
  const size_t e = DTypeSize(t), bytes = count * e;
  const bool is_root = me == root;
  const uint64_t salt = h.NextSalt();
  std::vector<char> all(n * bytes);
  for (int r = 0; r < n; ++r) Fill(all.data() + r * bytes, t, ReduceOp::kSum, false, r, count, salt);
  char* s = h.Send(m, n * bytes);
  char* r = in_place && is_root ? s + root * bytes : h.Recv(m, bytes);
  if (is_root && bytes) std::memcpy(s, all.data(), n * bytes);
  if (!(in_place && is_root) && bytes) std::memset(r, 0xCD, bytes);
  Scatter(h.g(), is_root ? s : nullptr, r, count, t, root, {.algorithm = algo}).Wait();
  h.Expect(Describe("scatter", algo, t, ReduceOp::kSum, count, m, in_place, false) +
               fmt::format(" root={}", root),
           all.data() + me * bytes, r, bytes, e);
}

// ---------------------------------------------------------------------------
// Sweeps.

const DType kTypes[] = {DType::kF32, DType::kBF16, DType::kI32, DType::kF64};
const Mem kMems[] = {Mem::kPrivate, Mem::kSymmetric, Mem::kMixed};

std::vector<ReduceOp> Ops(DType t, bool reduced) {
  if (reduced)
    return IsInt(t) ? std::vector<ReduceOp>{ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kBxor,
                                            ReduceOp::kAvg}
                    : std::vector<ReduceOp>{ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg};
  std::vector<ReduceOp> ops;
  for (int o = 0; o < kNumReduceOps; ++o)
    if (IsValidReduction(t, static_cast<ReduceOp>(o))) ops.push_back(static_cast<ReduceOp>(o));
  return ops;
}

// Sizes of the sweep; the big one (many rounds) only with a few ops.
const size_t kSizes[] = {0, 1, 7, 4099};

size_t MaxBytes(int n) { return (static_cast<size_t>(n) * (kBig + 32) + 64) * 8; }

// An 8 KiB scratch: large messages stage in several windows.
WorldOptions Options(bool deterministic) {
  WorldOptions o;
  o.timeout = std::chrono::seconds(60);
  o.deterministic = deterministic ? 1 : 0;
  o.scratch_bytes = 8192;
  return o;
}

// Runs `check(h, dtype, op, count, mem, in_place)` over the sweep: every
// dtype x op x size x buffer kind x in/out of place; a representative subset
// (fewer ops, mixed buffers only for the multi-round size) for n = 8, for
// secondary sweeps (`reduced`) and for the big size.
template <class Check>
void SweepReductions(int n, bool deterministic, Check check, bool reduced = false) {
  Group::RunInProcess(
      n,
      [&](Group& g) {
        Harness h(g, MaxBytes(n), !deterministic);
        const bool subset = reduced || n >= 8;
        for (DType t : kTypes) {
          for (ReduceOp op : Ops(t, subset))
            for (size_t count : kSizes)
              for (Mem m : kMems)
                for (bool in_place : {false, true}) {
                  if (subset && count != 4099 && m == Mem::kMixed) continue;
                  check(h, t, op, count, m, in_place);
                }
          // Many rounds: one op per dtype, two buffer kinds.
          const ReduceOp op = t == DType::kBF16 ? ReduceOp::kAvg : ReduceOp::kSum;
          check(h, t, op, kBig, Mem::kPrivate, false);
          check(h, t, op, kBig, Mem::kMixed, true);
        }
      },
      Options(deterministic));
}

template <class Check>
void SweepMovement(int n, Check check) {
  Group::RunInProcess(
      n,
      [&](Group& g) {
        Harness h(g, MaxBytes(n), false);
        for (DType t : kTypes) {
          for (size_t count : kSizes)
            for (Mem m : kMems)
              for (bool in_place : {false, true}) check(h, t, count, m, in_place);
          if (t == DType::kF32 || t == DType::kF64) {
            check(h, t, kBig, Mem::kPrivate, false);
            check(h, t, kBig, Mem::kMixed, true);
          }
        }
      },
      Options(true));
}

std::vector<int> Roots(int n) {
  std::vector<int> r{0};
  if (n > 1) r.push_back(n - 1);
  if (n > 3) r.push_back(n / 2);
  return r;
}

class Algorithms : public ::testing::TestWithParam<int> {};

// ---- ring -----------------------------------------------------------------

TEST_P(Algorithms, RingAllReduce) {
  SweepReductions(GetParam(), true, [](Harness& h, DType t, ReduceOp op, size_t c, Mem m, bool ip) {
    CheckAllReduce(h, Algorithm::kRing, t, op, c, m, ip);
  });
}

TEST_P(Algorithms, RingAllReduceNonDeterministic) {
  SweepReductions(GetParam(), false, [](Harness& h, DType t, ReduceOp op, size_t c, Mem m, bool ip) {
    CheckAllReduce(h, Algorithm::kRing, t, op, c, m, ip);
  });
}

TEST_P(Algorithms, RingReduceScatter) {
  for (bool det : {true, false})
    SweepReductions(
        GetParam(), det,
        [](Harness& h, DType t, ReduceOp op, size_t c, Mem m, bool ip) {
          // The big size is per block here: keep it to a few blocks' worth.
          if (c == kBig) c = 9000;
          CheckReduceScatter(h, Algorithm::kRing, t, op, c, m, ip, false);
          CheckReduceScatter(h, Algorithm::kRing, t, op, c, m, ip, true);
        },
        /*reduced=*/!det);
}

TEST_P(Algorithms, RingAllGather) {
  SweepMovement(GetParam(), [](Harness& h, DType t, size_t c, Mem m, bool ip) {
    CheckGather(h, Algorithm::kRing, t, c, m, ip, false, -1);
    CheckGather(h, Algorithm::kRing, t, c, m, ip, true, -1);
  });
}

TEST_P(Algorithms, RingBroadcast) {
  SweepMovement(GetParam(), [](Harness& h, DType t, size_t c, Mem m, bool ip) {
    for (int root : Roots(h.size())) CheckBroadcast(h, Algorithm::kRing, t, c, m, ip, root);
  });
}

// ---- recursive doubling ---------------------------------------------------

TEST_P(Algorithms, RecursiveDoublingAllReduce) {
  // The schedule is the same in both modes: the second sweep is a subset.
  for (bool det : {true, false})
    SweepReductions(
        GetParam(), det,
        [](Harness& h, DType t, ReduceOp op, size_t c, Mem m, bool ip) {
          CheckAllReduce(h, Algorithm::kRecursiveDoubling, t, op, c, m, ip);
        },
        /*reduced=*/!det);
}

TEST_P(Algorithms, RecursiveDoublingAllGather) {
  SweepMovement(GetParam(), [](Harness& h, DType t, size_t c, Mem m, bool ip) {
    CheckGather(h, Algorithm::kRecursiveDoubling, t, c, m, ip, false, -1);
    CheckGather(h, Algorithm::kRecursiveDoubling, t, c, m, ip, true, -1);
  });
}

// ---- binomial tree --------------------------------------------------------

TEST_P(Algorithms, TreeAllReduce) {
  SweepReductions(GetParam(), true, [](Harness& h, DType t, ReduceOp op, size_t c, Mem m, bool ip) {
    CheckAllReduce(h, Algorithm::kBinomialTree, t, op, c, m, ip);
  });
}

TEST_P(Algorithms, TreeReduce) {
  SweepReductions(GetParam(), true, [](Harness& h, DType t, ReduceOp op, size_t c, Mem m, bool ip) {
    const int n = h.size();
    // Root 0 (no final hop) and a root elsewhere, alternating over cases.
    const int root = (op == ReduceOp::kSum || c == 7) ? 0 : (n - 1) - (ip ? 0 : n / 2);
    CheckReduce(h, Algorithm::kBinomialTree, t, op, c, m, ip, root);
  });
}

TEST_P(Algorithms, TreeBroadcast) {
  SweepMovement(GetParam(), [](Harness& h, DType t, size_t c, Mem m, bool ip) {
    for (int root : Roots(h.size())) CheckBroadcast(h, Algorithm::kBinomialTree, t, c, m, ip, root);
  });
}

TEST_P(Algorithms, TreeGather) {
  SweepMovement(GetParam(), [](Harness& h, DType t, size_t c, Mem m, bool ip) {
    for (int root : Roots(h.size())) CheckGather(h, Algorithm::kBinomialTree, t, c, m, ip, false, root);
  });
}

TEST_P(Algorithms, TreeScatter) {
  SweepMovement(GetParam(), [](Harness& h, DType t, size_t c, Mem m, bool ip) {
    for (int root : Roots(h.size())) CheckScatter(h, Algorithm::kBinomialTree, t, c, m, ip, root);
  });
}

TEST_P(Algorithms, TreeBarrier) {
  const int n = GetParam();
  // Every rank bumps its counter before the barrier; after it, all counters
  // must show the round.
  std::atomic<int> arrived[8] = {};
  Group::RunInProcess(
      n,
      [&](Group& g) {
        for (int round = 1; round <= 50; ++round) {
          arrived[g.rank()].store(round);
          Barrier(g, {.algorithm = Algorithm::kBinomialTree}).Wait();
          for (int r = 0; r < n; ++r) ASSERT_GE(arrived[r].load(), round) << "rank " << r;
          Barrier(g, {.algorithm = Algorithm::kBinomialTree}).Wait();
        }
      },
      Options(true));
}

INSTANTIATE_TEST_SUITE_P(Ranks, Algorithms, ::testing::Values(1, 2, 3, 4, 5, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return fmt::format("n{}", i.param);
                         });

// Group sizes with deeper non-power-of-two structure (7 = 4+2+1) and more
// ranks than the sweep: a light pass over the reductions of every
// algorithm and the recursive-doubling all_gatherv.
TEST(AlgorithmsOddSizes, ReductionsAndGathers) {
  for (int n : {6, 7, 13}) {
    Group::RunInProcess(
        n,
        [&](Group& g) {
          Harness h(g, MaxBytes(n), false);
          for (DType t : {DType::kBF16, DType::kF32, DType::kI32})
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
              for (size_t count : {size_t{7}, size_t{4099}})
                for (Mem m : {Mem::kPrivate, Mem::kMixed})
                  for (bool ip : {false, true}) {
                    for (Algorithm algo : {Algorithm::kRing, Algorithm::kRecursiveDoubling,
                                           Algorithm::kBinomialTree})
                      CheckAllReduce(h, algo, t, op, count, m, ip);
                    CheckReduce(h, Algorithm::kBinomialTree, t, op, count, m, ip, n - 2);
                    CheckReduceScatter(h, Algorithm::kRing, t, op, count, m, ip, true);
                    CheckGather(h, Algorithm::kRecursiveDoubling, t, count, m, ip, true, -1);
                  }
        },
        Options(true));
  }
}

// Several calls in flight at once (queued on the progress thread), mixing
// algorithms, on symmetric buffers.
TEST(AlgorithmsPipelined, BackToBack) {
  for (int n : {3, 4}) {
    Group::RunInProcess(
        n,
        [&](Group& g) {
          const size_t count = 5000;
          auto a = g.AllocSymmetric(count * 4), b = g.AllocSymmetric(count * 4),
               c = g.AllocSymmetric(count * 4), d = g.AllocSymmetric(count * 4 * n);
          for (size_t i = 0; i < count; ++i) {
            a.as<int32_t>()[i] = static_cast<int32_t>(i + g.rank());
            b.as<int32_t>()[i] = static_cast<int32_t>(2 * i + g.rank());
          }
          std::vector<int32_t> out1(count), out2(count);
          std::vector<Work> works;
          works.push_back(AllReduce(g, a.data(), out1.data(), count, DType::kI32, ReduceOp::kSum,
                                    {.algorithm = Algorithm::kRing}));
          works.push_back(AllReduce(g, b.data(), out2.data(), count, DType::kI32, ReduceOp::kMax,
                                    {.algorithm = Algorithm::kRecursiveDoubling}));
          works.push_back(Broadcast(g, g.rank() == 1 ? a.data() : nullptr, c.data(), count,
                                    DType::kI32, 1, {.algorithm = Algorithm::kBinomialTree}));
          works.push_back(AllGather(g, b.data(), d.data(), count, DType::kI32,
                                    {.algorithm = Algorithm::kRing}));
          for (auto& w : works) w.Wait();
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(out1[i], static_cast<int32_t>(n * i + n * (n - 1) / 2));
            ASSERT_EQ(out2[i], static_cast<int32_t>(2 * i + n - 1));
            ASSERT_EQ(c.as<int32_t>()[i], static_cast<int32_t>(i + 1));
            for (int r = 0; r < n; ++r)
              ASSERT_EQ(d.as<int32_t>()[r * count + i], static_cast<int32_t>(2 * i + r));
          }
          Barrier(g).Wait();
        },
        Options(true));
  }
}

// The deterministic checks have teeth: for these inputs the canonical tree
// and a left-to-right chain differ, in f32 and in bf16.
TEST(AlgorithmsInputs, OrderShowsInTheResult) {
  for (DType t : {DType::kF32, DType::kBF16}) {
    const int n = 5;
    const size_t count = 4099, e = DTypeSize(t);
    std::vector<std::vector<char>> in(n, std::vector<char>(count * e));
    std::vector<const void*> srcs;
    for (int r = 0; r < n; ++r) {
      Fill(in[r].data(), t, ReduceOp::kSum, false, r, count, 1);
      srcs.push_back(in[r].data());
    }
    std::vector<char> tree(count * e), chain(in[0]);
    core::ReduceTree(t, ReduceOp::kSum, tree.data(), srcs.data(), n, count, n);
    for (int r = 1; r < n; ++r)
      core::Combine(t, ReduceOp::kSum, chain.data(), chain.data(), in[r].data(), count);
    EXPECT_NE(std::memcmp(tree.data(), chain.data(), count * e), 0) << DTypeName(t);
  }
}

}  // namespace
}  // namespace mc2
