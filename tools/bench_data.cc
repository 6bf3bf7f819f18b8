// `mc2 bench`: names, sizes, sweep geometry and checkable data.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <limits>

#include "bench.h"
#include "reference/reference_reduce.h"

namespace mc2::tools::bench {

namespace {

struct CollInfo {
  Coll coll;
  const char* name;
};
constexpr CollInfo kColls[] = {
    {Coll::kAllReduce, "all_reduce"},     {Coll::kAllGather, "all_gather"},
    {Coll::kReduceScatter, "reduce_scatter"}, {Coll::kAllToAll, "all_to_all"},
    {Coll::kBroadcast, "broadcast"},      {Coll::kReduce, "reduce"},
    {Coll::kSendRecv, "send_recv"},
};

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The largest integer magnitude every partial result may reach and stay
// exact in `t`.
int64_t ExactLimit(DType t) {
  switch (t) {
    case DType::kF32: return int64_t{1} << 24;
    case DType::kF64: return int64_t{1} << 53;
    case DType::kF16: return 2048;
    case DType::kBF16: return 256;
    case DType::kI8: return 127;
    case DType::kU8: return 255;
    case DType::kI32: return std::numeric_limits<int32_t>::max();
    case DType::kI64: return std::numeric_limits<int64_t>::max();
  }
  return 127;
}

int FloorLog2(int64_t v) {
  int k = 0;
  while (v > 1) v >>= 1, ++k;
  return k;
}

// Calls f(T*) with the buffer as its storage type (f16/bf16 as uint16_t).
template <typename F>
void WithType(DType t, void* buf, F&& f) {
  switch (t) {
    case DType::kF32: f(static_cast<float*>(buf)); break;
    case DType::kF64: f(static_cast<double*>(buf)); break;
    case DType::kF16:
    case DType::kBF16: f(static_cast<uint16_t*>(buf)); break;
    case DType::kI8: f(static_cast<int8_t*>(buf)); break;
    case DType::kU8: f(static_cast<uint8_t*>(buf)); break;
    case DType::kI32: f(static_cast<int32_t*>(buf)); break;
    case DType::kI64: f(static_cast<int64_t*>(buf)); break;
  }
}

template <typename T>
T Convert(DType t, int64_t v) {
  if constexpr (std::is_same_v<T, uint16_t>) {
    return t == DType::kF16 ? reference::F32ToF16(static_cast<float>(v))
                            : reference::F32ToBF16(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

}  // namespace

std::optional<Coll> ParseColl(std::string_view name) {
  for (const auto& c : kColls)
    if (name == c.name) return c.coll;
  // nccl-tests spellings.
  if (name == "allreduce") return Coll::kAllReduce;
  if (name == "allgather") return Coll::kAllGather;
  if (name == "reducescatter") return Coll::kReduceScatter;
  if (name == "alltoall") return Coll::kAllToAll;
  if (name == "sendrecv") return Coll::kSendRecv;
  return std::nullopt;
}

const char* CollName(Coll c) {
  for (const auto& i : kColls)
    if (i.coll == c) return i.name;
  return "?";
}

std::string CollNames() {
  std::string s;
  for (const auto& c : kColls) s += fmt::format("{}{}", s.empty() ? "" : ", ", c.name);
  return s;
}

bool IsReducing(Coll c) {
  return c == Coll::kAllReduce || c == Coll::kReduceScatter || c == Coll::kReduce;
}

bool IsRooted(Coll c) { return c == Coll::kBroadcast || c == Coll::kReduce; }

double BusFactor(Coll c, int n) {
  switch (c) {
    case Coll::kAllReduce: return 2.0 * (n - 1) / n;
    case Coll::kAllGather:
    case Coll::kReduceScatter:
    case Coll::kAllToAll: return static_cast<double>(n - 1) / n;
    case Coll::kBroadcast:
    case Coll::kReduce:
    case Coll::kSendRecv: return 1.0;
  }
  return 1.0;
}

std::string FormatSize(size_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && b >= 1024 && b % 1024 == 0) b /= 1024, ++u;
  return fmt::format("{} {}", b, units[u]);
}

Shape ShapeFor(Coll c, size_t requested, size_t esize, int n) {
  Shape s;
  const size_t elems = std::max<size_t>(1, requested / esize);
  switch (c) {
    case Coll::kAllReduce:
    case Coll::kBroadcast:
    case Coll::kReduce:
    case Coll::kSendRecv:
      s.count = elems;
      s.elements = elems;
      s.send_bytes = s.recv_bytes = s.bytes = elems * esize;
      break;
    case Coll::kAllGather:
      s.count = std::max<size_t>(1, elems / n);
      s.elements = s.count * n;
      s.send_bytes = s.count * esize;
      s.recv_bytes = s.bytes = s.elements * esize;
      break;
    case Coll::kReduceScatter:
      s.count = std::max<size_t>(1, elems / n);
      s.elements = s.count * n;
      s.send_bytes = s.bytes = s.elements * esize;
      s.recv_bytes = s.count * esize;
      break;
    case Coll::kAllToAll:
      s.count = std::max<size_t>(1, elems / n);
      s.elements = s.count * n;
      s.send_bytes = s.recv_bytes = s.bytes = s.elements * esize;
      break;
  }
  return s;
}

std::vector<Shape> SweepShapes(Coll c, size_t min_bytes, size_t max_bytes, int factor,
                               size_t esize, int n) {
  std::vector<Shape> out;
  for (size_t s = min_bytes; s <= max_bytes;) {
    Shape sh = ShapeFor(c, s, esize, n);
    if (out.empty() || sh.bytes != out.back().bytes) out.push_back(sh);
    if (s > max_bytes / static_cast<size_t>(factor)) break;
    s *= static_cast<size_t>(factor);
  }
  return out;
}

size_t HeapBytesFor(const Config& cfg, int n) {
  size_t send = 0, recv = 0;
  for (const Shape& s : SweepShapes(cfg.coll, cfg.min_bytes, cfg.max_bytes, cfg.factor,
                                    DTypeSize(cfg.dtype), n)) {
    send = std::max(send, s.send_bytes);
    recv = std::max(recv, s.recv_bytes);
  }
  constexpr size_t kSlack = size_t{64} << 20, kRound = size_t{2} << 20;
  size_t bytes = send + recv + kSlack + 2 * 4096;
  return (bytes + kRound - 1) / kRound * kRound;
}

Pattern::Pattern(Coll c, DType t, ReduceOp op, int n)
    : coll_(c), dtype_(t), op_(op), nranks_(std::max(1, n)), esize_(DTypeSize(t)) {
  constexpr int64_t kCap = int64_t{1} << 20;
  const int64_t limit = ExactLimit(t);
  if (!IsReducing(c)) {
    modulus_ = std::min(limit, kCap);
    return;
  }
  switch (op) {
    case ReduceOp::kSum: modulus_ = std::clamp<int64_t>(limit / nranks_, 1, kCap); break;
    case ReduceOp::kAvg:
      // Multiples of the rank count, so that the average is exact too.
      modulus_ = std::clamp<int64_t>(limit / nranks_ / nranks_, 1, kCap);
      break;
    case ReduceOp::kMin:
    case ReduceOp::kMax: modulus_ = std::min(limit, kCap); break;
    case ReduceOp::kProd:
      modulus_ = 2;
      prod_ranks_ = std::min(nranks_, FloorLog2(limit));
      break;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      // A power of two: bitwise results stay below it.
    {
      int k = FloorLog2(limit);  // limit is 2^(k+1) - 1 for every integer type
      if (k < 62 && limit == (int64_t{1} << (k + 1)) - 1) ++k;
      modulus_ = int64_t{1} << std::min(20, k);
      break;
    }
  }
}

int64_t Pattern::Value(int rank, size_t i) const {
  const uint64_t h = Mix(static_cast<uint64_t>(i) * 0x100000001B3ull ^
                         (static_cast<uint64_t>(rank + 1) << 44) ^ static_cast<uint64_t>(coll_));
  if (!IsReducing(coll_)) return static_cast<int64_t>(h % static_cast<uint64_t>(modulus_));
  switch (op_) {
    case ReduceOp::kProd: return (rank < prod_ranks_ && (h & 1)) ? 2 : 1;
    case ReduceOp::kAvg: return nranks_ * static_cast<int64_t>(h % static_cast<uint64_t>(modulus_));
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor: return static_cast<int64_t>(h & static_cast<uint64_t>(modulus_ - 1));
    default: return static_cast<int64_t>(h % static_cast<uint64_t>(modulus_));
  }
}

int64_t Pattern::Reduced(size_t i) const {
  const int64_t acc = reference::ReduceInts(op_, nranks_, [&](int r) { return Value(r, i); });
  // Averages of multiples of the rank count: the division is exact.
  return op_ == ReduceOp::kAvg ? acc / nranks_ : acc;
}

void Pattern::Store(void* buf, size_t i, int64_t v) const {
  WithType(dtype_, buf, [&](auto* p) { p[i] = Convert<std::remove_pointer_t<decltype(p)>>(dtype_, v); });
}

void Pattern::Fill(void* buf, size_t n, int rank, size_t first) const {
  WithType(dtype_, buf, [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    for (size_t k = 0; k < n; ++k) p[k] = Convert<T>(dtype_, Value(rank, first + k));
  });
}

void Pattern::FillReduced(void* buf, size_t n, size_t first) const {
  WithType(dtype_, buf, [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    for (size_t k = 0; k < n; ++k) p[k] = Convert<T>(dtype_, Reduced(first + k));
  });
}

size_t CountWrong(const void* a, const void* b, size_t n, size_t esize) {
  if (n == 0 || std::memcmp(a, b, n * esize) == 0) return 0;
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(x + i * esize, y + i * esize, esize) != 0) ++wrong;
  return wrong;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  double m = v[mid];
  if (v.size() % 2 == 0) m = (m + *std::max_element(v.begin(), v.begin() + mid)) / 2;
  return m;
}

}  // namespace mc2::tools::bench
