#include "common/collective_cases.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "reference/reference_reduce.h"

namespace mc2::testing {
namespace {

constexpr size_t kCanary = 64;
constexpr unsigned char kCanaryByte = 0x5A;
constexpr unsigned char kUnwritten = 0x77;

// Integer test value of element `i` of rank `r` for `op` (exact in any type).
int64_t Value(ReduceOp op, DType t, int r, size_t i) {
  bool unsig = t == DType::kU8;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return unsig ? static_cast<int64_t>((i * 7 + r * 13) % 9)
                   : static_cast<int64_t>((i * 7 + r * 13) % 9) - 4;
    case ReduceOp::kProd:
      return ((i + r) % 3 == 0) ? 2 : 1;
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return unsig ? static_cast<int64_t>((i * 31 + r * 17) % 23)
                   : static_cast<int64_t>((i * 31 + r * 17) % 23) - 11;
    default:  // bitwise
      return unsig ? static_cast<int64_t>((i * 37 + r * 101) % 256)
                   : static_cast<int64_t>((i * 37 + r * 101) % 128);
  }
}

// A pseudo-random float in [-1, 1) for order-sensitive (bitwise) checks.
double RandomValue(int r, size_t i) {
  uint64_t x = (static_cast<uint64_t>(r) << 40) ^ (i * 0x9E3779B97F4A7C15ull) ^ 0xD1B54A32D192ED03ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<double>(x >> 11) / static_cast<double>(1ull << 53) * 2.0 - 1.0;
}

// Stores element `idx` of a buffer of `t` (the shared reference's
// conversions, independent of the library's).
void Store(DType t, void* base, size_t idx, double v) {
  reference::StoreDouble(t, v, static_cast<char*>(base) + idx * DTypeSize(t));
}

// Stores the expected reduction over ranks 0..n-1 of Value(op, t, r, elem).
void StoreReduced(DType t, ReduceOp op, void* base, size_t idx, int n, size_t elem) {
  const int64_t acc = reference::ReduceInts(op, n, [&](int r) { return Value(op, t, r, elem); });
  reference::StoreReduction(t, op, n, acc, static_cast<char*>(base) + idx * DTypeSize(t));
}

struct Layout {
  size_t send_elems = 0, recv_elems = 0;
  std::vector<size_t> counts, displs;          // V blocks (gathers, reduce-scatter)
  std::vector<size_t> scounts, sdispls, rcounts, rdispls;  // all-to-all
};

size_t VCount(const Case& c, int r) { return c.count ? c.count + r % 3 : static_cast<size_t>(r % 2); }
size_t A2ACount(const Case& c, int from, int to) {
  if (c.coll == Coll::kAllToAll) return c.count;
  return c.count ? c.count + (from + 2 * to) % 3 : static_cast<size_t>((from + to) % 2);
}

Layout MakeLayout(const Case& c, int n, int me) {
  Layout l;
  auto packed = [](const std::vector<size_t>& v) {
    std::vector<size_t> d(v.size());
    std::exclusive_scan(v.begin(), v.end(), d.begin(), size_t{0});
    return d;
  };
  switch (c.coll) {
    case Coll::kAllReduce: case Coll::kReduce: case Coll::kBroadcast:
      l.send_elems = l.recv_elems = c.count;
      break;
    case Coll::kAllGather: case Coll::kGather: case Coll::kScatter: case Coll::kReduceScatter:
      l.counts.assign(n, c.count);
      break;
    case Coll::kAllGatherV: case Coll::kReduceScatterV:
      for (int r = 0; r < n; ++r) l.counts.push_back(VCount(c, r));
      break;
    case Coll::kAllToAll: case Coll::kAllToAllV:
      for (int p = 0; p < n; ++p) {
        l.scounts.push_back(A2ACount(c, me, p));
        l.rcounts.push_back(A2ACount(c, p, me));
      }
      l.sdispls = packed(l.scounts);
      l.rdispls = packed(l.rcounts);
      l.send_elems = l.sdispls.back() + l.scounts.back();
      l.recv_elems = l.rdispls.back() + l.rcounts.back();
      break;
    default: break;
  }
  if (!l.counts.empty()) {
    l.displs = packed(l.counts);
    size_t total = l.displs.back() + l.counts.back();
    switch (c.coll) {
      case Coll::kAllGather: case Coll::kAllGatherV: case Coll::kGather:
        l.send_elems = l.counts[me];
        l.recv_elems = total;
        break;
      case Coll::kScatter:
        l.send_elems = total;
        l.recv_elems = c.count;
        break;
      default:  // reduce-scatter
        l.send_elems = total;
        l.recv_elems = l.counts[me];
    }
  }
  return l;
}

// Fills `send` (this rank's input) and `expect` (its expected output).
void FillCase(const Case& c, const Layout& l, int n, int me, char* send, char* expect,
              bool* has_output) {
  DType t = c.dtype;
  auto val = [&](int r, size_t i) -> double {
    return c.random_values && IsFloat(t) ? RandomValue(r, i)
                                         : static_cast<double>(Value(c.op, t, r, i));
  };
  *has_output = true;
  switch (c.coll) {
    case Coll::kAllReduce:
    case Coll::kReduce:
      for (size_t i = 0; i < c.count; ++i) {
        Store(t, send, i, val(me, i));
        StoreReduced(t, c.op, expect, i, n, i);
      }
      *has_output = c.coll == Coll::kAllReduce || me == c.root;
      break;
    case Coll::kBroadcast:
      for (size_t i = 0; i < c.count; ++i) {
        if (me == c.root) Store(t, send, i, val(c.root, i));
        Store(t, expect, i, val(c.root, i));
      }
      break;
    case Coll::kAllGather: case Coll::kAllGatherV: case Coll::kGather:
      for (size_t i = 0; i < l.counts[me]; ++i) Store(t, send, i, val(me, i));
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < l.counts[r]; ++i) Store(t, expect, l.displs[r] + i, val(r, i));
      *has_output = c.coll != Coll::kGather || me == c.root;
      break;
    case Coll::kScatter:
      if (me == c.root)
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < c.count; ++i) Store(t, send, r * c.count + i, val(r, i));
      for (size_t i = 0; i < c.count; ++i) Store(t, expect, i, val(me, i));
      break;
    case Coll::kReduceScatter: case Coll::kReduceScatterV: {
      size_t total = l.displs.back() + l.counts.back();
      for (size_t j = 0; j < total; ++j) Store(t, send, j, val(me, j));
      for (size_t i = 0; i < l.counts[me]; ++i)
        StoreReduced(t, c.op, expect, i, n, l.displs[me] + i);
      break;
    }
    case Coll::kAllToAll: case Coll::kAllToAllV:
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < l.scounts[p]; ++i)
          Store(t, send, l.sdispls[p] + i, val(me, 1000 * p + i));
      for (int s = 0; s < n; ++s)
        for (size_t i = 0; i < l.rcounts[s]; ++i)
          Store(t, expect, l.rdispls[s] + i, val(s, 1000 * me + i));
      break;
    default: break;
  }
}

struct Buffers {
  SymmetricBuffer sym_send, sym_recv;
  std::vector<char> priv_send, priv_recv;
  char* send = nullptr;
  char* recv = nullptr;
};

// Runs the case; returns recv (or the in-place buffer) and its element count.
std::vector<char> Execute(const Group& g, const Case& c, const Layout& l, size_t* wrong) {
  const int n = g.size(), me = g.rank();
  const size_t e = DTypeSize(c.dtype);
  std::vector<char> input(l.send_elems * e + 1), expect(l.recv_elems * e + 1);
  bool has_output;
  FillCase(c, l, n, me, input.data(), expect.data(), &has_output);

  // Sizes must agree across ranks for AllocSymmetric: take the maximum.
  size_t max_send = 0, max_recv = 0;
  for (int r = 0; r < n; ++r) {
    Layout lr = MakeLayout(c, n, r);
    max_send = std::max(max_send, lr.send_elems);
    max_recv = std::max(max_recv, lr.recv_elems);
  }
  size_t io_elems = std::max(max_send, max_recv);
  Buffers b;
  size_t send_bytes = (c.in_place ? io_elems : max_send) * e + kCanary;
  size_t recv_bytes = (c.in_place ? io_elems : max_recv) * e + kCanary;
  if (c.symmetric) {
    b.sym_recv = g.AllocSymmetric(recv_bytes);
    b.recv = b.sym_recv.as<char>();
    if (!c.in_place) {
      b.sym_send = g.AllocSymmetric(send_bytes);
      b.send = b.sym_send.as<char>();
    }
  } else {
    b.priv_recv.resize(recv_bytes);
    b.recv = b.priv_recv.data();
    if (!c.in_place) {
      b.priv_send.resize(send_bytes);
      b.send = b.priv_send.data();
    }
  }
  std::memset(b.recv, kUnwritten, recv_bytes);
  std::memset(b.recv + l.recv_elems * e, kCanaryByte, recv_bytes - l.recv_elems * e);

  CollectiveOptions opts{.algorithm = c.algo};
  const char* s = b.send;
  char* r = b.recv;
  // In-place forms: the input sits where the collective expects it.
  if (c.in_place) {
    switch (c.coll) {
      case Coll::kAllGather: case Coll::kAllGatherV: case Coll::kGather:
        if (c.coll != Coll::kGather || me == c.root) {
          s = r + l.displs[me] * e;
          std::memcpy(const_cast<char*>(s), input.data(), l.send_elems * e);
        } else {
          b.priv_send.assign(input.begin(), input.end());
          s = b.priv_send.data();
        }
        break;
      case Coll::kScatter:
        if (me == c.root) {
          // The root's buffer is the whole send; its block is the output.
          std::vector<char> big(l.send_elems * e + kCanary, static_cast<char>(kCanaryByte));
          std::memcpy(big.data(), input.data(), l.send_elems * e);
          b.priv_send.swap(big);
          s = b.priv_send.data();
          r = b.priv_send.data() + me * c.count * e;
        } else {
          s = nullptr;
        }
        break;
      case Coll::kReduceScatter: case Coll::kReduceScatterV:
        // Output lands in this rank's block of the input buffer.
        std::memcpy(r, input.data(), l.send_elems * e);
        std::memset(r + l.send_elems * e, kCanaryByte, recv_bytes - l.send_elems * e);
        s = r;
        r = r + l.displs[me] * e;
        break;
      default:
        std::memcpy(r, input.data(), l.send_elems * e);
        s = r;
    }
  } else if (l.send_elems) {
    std::memcpy(b.send, input.data(), l.send_elems * e);
  }

  Work w;
  switch (c.coll) {
    case Coll::kAllReduce: w = AllReduce(g, s, r, c.count, c.dtype, c.op, opts); break;
    case Coll::kReduce: w = Reduce(g, s, r, c.count, c.dtype, c.op, c.root, opts); break;
    case Coll::kBroadcast:
      w = Broadcast(g, me == c.root ? s : nullptr, r, c.count, c.dtype, c.root, opts);
      break;
    case Coll::kAllGather: w = AllGather(g, s, r, c.count, c.dtype, opts); break;
    case Coll::kAllGatherV: w = AllGatherV(g, s, r, l.counts, {}, c.dtype, opts); break;
    case Coll::kGather: w = Gather(g, s, r, c.count, c.dtype, c.root, opts); break;
    case Coll::kScatter: w = Scatter(g, s, r, c.count, c.dtype, c.root, opts); break;
    case Coll::kReduceScatter: w = ReduceScatter(g, s, r, c.count, c.dtype, c.op, opts); break;
    case Coll::kReduceScatterV: w = ReduceScatterV(g, s, r, l.counts, c.dtype, c.op, opts); break;
    case Coll::kAllToAll: w = AllToAll(g, s, r, c.count, c.dtype, opts); break;
    case Coll::kAllToAllV:
      w = AllToAllV(g, s, l.scounts, l.sdispls, r, l.rcounts, l.rdispls, c.dtype, opts);
      break;
    default: break;
  }
  w.Wait();

  std::vector<char> out(r, r + (has_output ? l.recv_elems * e : 0));
  *wrong = 0;
  if (has_output) {
    for (size_t i = 0; i < l.recv_elems; ++i)
      if (std::memcmp(r + i * e, expect.data() + i * e, e) != 0) ++*wrong;
    // Nothing may be written past the output. (In place, the output of some
    // collectives is a block inside the input, followed by other blocks.)
    const char* end = r + l.recv_elems * e;
    for (size_t i = 0; i < (c.in_place ? 0 : kCanary); ++i)
      if (static_cast<unsigned char>(end[i]) != kCanaryByte) {
        ++*wrong;
        break;
      }
  }
  return out;
}

}  // namespace

const char* CollName(Coll c) {
  static const char* const kNames[] = {"all_reduce", "reduce", "broadcast", "all_gather",
                                       "all_gatherv", "gather", "scatter", "reduce_scatter",
                                       "reduce_scatterv", "all_to_all", "all_to_allv"};
  return kNames[static_cast<int>(c)];
}

bool IsReducing(Coll c) {
  return c == Coll::kAllReduce || c == Coll::kReduce || c == Coll::kReduceScatter ||
         c == Coll::kReduceScatterV;
}

std::string Describe(const Case& c) {
  return fmt::format("{} {} {} count={} algo={} {} {} root={}", CollName(c.coll),
                     DTypeName(c.dtype), ReduceOpName(c.op), c.count, AlgorithmName(c.algo),
                     c.in_place ? "in-place" : "out-of-place",
                     c.symmetric ? "symmetric" : "private", c.root);
}

size_t RunCase(const Group& g, const Case& c) {
  Layout l = MakeLayout(c, g.size(), g.rank());
  size_t wrong;
  Execute(g, c, l, &wrong);
  return wrong;
}

std::vector<char> RunCaseOutput(const Group& g, const Case& c) {
  Layout l = MakeLayout(c, g.size(), g.rank());
  size_t wrong;
  return Execute(g, c, l, &wrong);
}

std::vector<Case> SweepCases(int n, const std::vector<size_t>& sizes, size_t stride,
                             size_t offset) {
  std::vector<Case> out;
  size_t k = 0;
  for (int ci = 0; ci < static_cast<int>(Coll::kCount); ++ci) {
    Coll coll = static_cast<Coll>(ci);
    std::vector<DType> dtypes;
    if (IsReducing(coll)) {
      for (int t = 0; t < kNumDTypes; ++t) dtypes.push_back(static_cast<DType>(t));
    } else {
      dtypes = {DType::kI8, DType::kBF16, DType::kF32, DType::kF64};
    }
    for (int a = 0; a < kNumAlgorithms; ++a)
      for (DType t : dtypes)
        for (int o = 0; o < (IsReducing(coll) ? kNumReduceOps : 1); ++o) {
          ReduceOp op = static_cast<ReduceOp>(o);
          if (!IsValidReduction(t, op)) continue;
          for (size_t count : sizes)
            for (int ip = 0; ip < 2; ++ip)
              for (int sym = 0; sym < 2; ++sym) {
                if (coll == Coll::kAllToAllV && ip) continue;  // layouts differ
                Case c{coll, t, op, count, static_cast<Algorithm>(a), ip == 1, sym == 1,
                       static_cast<int>((count + a) % n)};
                if (k++ % stride == offset % stride) out.push_back(c);
              }
        }
  }
  return out;
}

}  // namespace mc2::testing
