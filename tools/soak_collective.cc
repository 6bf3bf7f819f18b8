// `mc2 soak`: one collective of a step: its random plan, its inputs and
// expected output, the call and the check (see soak_cases.h).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "reference/reference_reduce.h"
#include "soak_cases.h"

namespace mc2::tools::soak {

namespace {

// ---------------------------------------------------------------------------
// Element values and the reference.

enum class Role { kSum, kProd, kMinMax, kBits, kCopy };

Role RoleOf(bool reducing, ReduceOp op) {
  if (!reducing) return Role::kCopy;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return Role::kSum;
    case ReduceOp::kProd:
      return Role::kProd;
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return Role::kMinMax;
    default:
      return Role::kBits;
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
    case Role::kSum:
      return uns ? static_cast<int64_t>(h % 9) : static_cast<int64_t>(h % 17) - 8;
    case Role::kProd: {
      static constexpr int64_t kSigned[4] = {1, 1, 2, -1};
      return uns ? 1 + static_cast<int64_t>(h % 2) : kSigned[h % 4];
    }
    case Role::kMinMax:
      return uns ? static_cast<int64_t>(h % 41) : static_cast<int64_t>(h % 41) - 20;
    case Role::kBits:
    case Role::kCopy:
      if (fl) return static_cast<int64_t>(h % 255) - 127;
      switch (t) {
        case DType::kI8:
          return static_cast<int8_t>(h);
        case DType::kU8:
          return static_cast<uint8_t>(h);
        case DType::kI32:
          return static_cast<int32_t>(h);
        default:
          return static_cast<int64_t>(h);
      }
  }
  return 0;
}

// IEEE half from float, round to nearest even (the soak's own, independent

// Stores the reduction over group ranks 0..n-1 of element `j` at `p`.
void StoreReduced(DType t, ReduceOp op, uint64_t s, int n, size_t j, unsigned char* p) {
  const Role role = RoleOf(true, op);
  const int64_t acc = reference::ReduceInts(op, n, [&](int q) { return Val(s, q, j, t, role); });
  reference::StoreReduction(t, op, n, acc, p);
}

const char* KindName(Kind k) {
  static const char* const kNames[] = {
      "all_reduce", "reduce",         "broadcast",       "all_gather", "all_gatherv", "gather",
      "scatter",    "reduce_scatter", "reduce_scatterv", "all_to_all", "all_to_allv", "barrier"};
  return kNames[static_cast<int>(k)];
}

bool Reducing(Kind k) {
  return k == Kind::kAllReduce || k == Kind::kReduce || k == Kind::kReduceScatter ||
         k == Kind::kReduceScatterV;
}

// The algorithms that implement each collective (docs/running.md, MC2_ALGO), besides
// kAuto. Asking for one of these must never be rejected.
std::vector<Algorithm> Implementations(Kind k) {
  using A = Algorithm;
  switch (k) {
    case Kind::kAllReduce:
      return {A::kRing, A::kRecursiveDoubling, A::kRabenseifner, A::kBinomialTree, A::kDirect};
    case Kind::kReduce:
      return {A::kBinomialTree, A::kDirect};
    case Kind::kBroadcast:
      return {A::kRing, A::kBinomialTree, A::kDirect};
    case Kind::kAllGather:
    case Kind::kAllGatherV:
      return {A::kRing, A::kRecursiveDoubling, A::kDirect};
    case Kind::kGather:
    case Kind::kScatter:
      return {A::kBinomialTree, A::kDirect};
    case Kind::kReduceScatter:
    case Kind::kReduceScatterV:
      return {A::kRing, A::kDirect};
    case Kind::kBarrier:
      return {A::kBinomialTree, A::kDirect};
    default:
      return {A::kDirect};
  }
}

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

}  // namespace

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
  const size_t per_block = (kMaxBufferBytes - kCanaryBytes) / e / static_cast<size_t>(n + 1) - 8;
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
    default:
      p.count = RandomCount(rng, per_block);
      break;
  }
  return p;
}

std::string CollPlan::Describe(int n) const {
  return fmt::format("{} n={} dtype={} op={} count={} root={} algo={} {} {}", KindName(kind), n,
                     DTypeName(t), ReduceOpName(op), count, root, AlgorithmName(algo),
                     in_place ? "in-place" : "out-of-place", symmetric ? "symmetric" : "private");
}

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
    default:
      return std::memcmp(a, b, DTypeSize(t)) == 0;
  }
}

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
      if (p.symmetric)
        b.Symmetric(s, elems * e);
      else
        b.Private(elems * e);
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
      reference::StoreInt(t, Val(p.s, me, j0 + i, t, role), base + (pos + i) * e);
  };
  // The expected output starts as the output buffer as it is now (what must
  // not change), then the defined elements are overwritten.
  auto snapshot = [&] { run.expected.assign(run.recv.p, run.recv.p + run.recv.bytes); };
  auto at = [&](size_t pos) { return run.expected.data() + pos * e; };
  auto copy_of = [&](int q, size_t j, size_t pos) {
    reference::StoreInt(t, Val(p.s, q, j, t, role), at(pos));
  };

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
      for (size_t i = 0; i < p.count; ++i)
        copy_of(p.root, static_cast<size_t>(me) * p.count + i, base + i);
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
    case Kind::kAllReduce:
      return AllReduce(g, s, r, p.count, p.t, p.op, o);
    case Kind::kReduce:
      return Reduce(g, s, r, p.count, p.t, p.op, p.root, o);
    case Kind::kBroadcast:
      return Broadcast(g, s, r, p.count, p.t, p.root, o);
    case Kind::kAllGather:
      return AllGather(g, s, r, p.count, p.t, o);
    case Kind::kAllGatherV:
      return AllGatherV(g, s, r, p.counts, p.displs, p.t, o);
    case Kind::kGather:
      return Gather(g, s, r, p.count, p.t, p.root, o);
    case Kind::kScatter:
      return Scatter(g, s, r, p.count, p.t, p.root, o);
    case Kind::kReduceScatter:
      return ReduceScatter(g, s, r, p.count, p.t, p.op, o);
    case Kind::kReduceScatterV:
      return ReduceScatterV(g, s, r, p.counts, p.t, p.op, o);
    case Kind::kAllToAll:
      return AllToAll(g, s, r, p.count, p.t, o);
    case Kind::kAllToAllV: {
      std::vector<size_t> out(n), in(n);
      for (int q = 0; q < n; ++q) out[q] = p.c2c[me][q], in[q] = p.c2c[q][me];
      return AllToAllV(g, s, out, p.sd[me], r, in, p.rd[me], p.t, o);
    }
    default:
      return Barrier(g, o);
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

}  // namespace mc2::tools::soak
