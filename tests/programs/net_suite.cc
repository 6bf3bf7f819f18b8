// The collective suite for groups that span hosts, run as one job (under
// `mc2 run -n N` on one host, or under mpirun across the cluster in a box).
//
//   test_prog_net_suite suite OUTDIR   every collective, Split, Send/Recv;
//                                       each rank writes OUTDIR/rank<R>.txt
//   test_prog_net_suite fault KILLRANK all_reduce in a loop; KILLRANK dies
//                                       by SIGKILL after a few calls
//   test_prog_net_suite batch_bad      a batch's errors on every rank
//
// suite: inputs are a pure function of (rank, case, index), so every rank
// knows every rank's input. Integer cases are checked exactly here against
// that reference (a wrong byte anywhere is reported, exit 1); every case's
// output bytes are hashed into the rank's file, and the test compares the
// files of a run across hosts with those of a run on one host: in
// deterministic mode floating-point results must match bit for bit.
//
// fault: the other ranks must raise an mc2::Error; each prints
// "rank R error: WHAT" and exits 3.
#include <mc2/mc2.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

namespace {

int g_failures = 0;

uint64_t Hash(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

// Values of varied magnitude, so that the order of a floating-point sum
// shows in its last bits.
float FloatInput(int rank, int kase, size_t i) {
  double x = std::sin(0.37 * static_cast<double>(i) + 1.7 * rank + 0.11 * kase);
  // (The exponent in int: in size_t it would wrap, and half the inputs
  // would be infinite.)
  return static_cast<float>(x * std::pow(10.0, static_cast<int>((rank * 3 + i) % 7) - 3));
}
int32_t IntInput(int rank, int kase, size_t i) {
  return static_cast<int32_t>((rank + 1) * 1000003 + kase * 7919 + static_cast<int64_t>(i) * 31);
}

struct Out {
  std::ofstream file;
  void Record(const std::string& name, const void* p, size_t bytes) {
    file << name << " " << std::hex << Hash(p, bytes) << std::dec << "\n";
  }
  void Check(const std::string& name, bool ok, const std::string& detail) {
    if (!ok) {
      ++g_failures;
      std::fprintf(stderr, "FAILED %s: %s\n", name.c_str(), detail.c_str());
    }
  }
};

std::vector<uint16_t> ToBf16(const std::vector<float>& f) {
  std::vector<uint16_t> out(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &f[i], 4);
    out[i] = static_cast<uint16_t>(u >> 16);
  }
  return out;
}

void AllReduceCases(const mc2::Group& g, Out& out, const std::string& prefix) {
  const int n = g.size(), r = g.rank();
  const size_t sizes[] = {1, 7, 1000, 65537, (size_t{1} << 20) + 3};
  int kase = 0;
  for (size_t count : sizes) {
    ++kase;
    // f32 sum, out of place and in place.
    std::vector<float> in(count), res(count);
    for (size_t i = 0; i < count; ++i) in[i] = FloatInput(r, kase, i);
    mc2::AllReduce(g, in.data(), res.data(), count, mc2::DType::kF32, mc2::ReduceOp::kSum).Wait();
    out.Record(prefix + "all_reduce_f32_sum_" + std::to_string(count), res.data(), count * 4);
    std::vector<float> inplace = in;
    mc2::AllReduce(g, inplace.data(), inplace.data(), count, mc2::DType::kF32,
                   mc2::ReduceOp::kSum)
        .Wait();
    out.Check(prefix + "all_reduce_in_place_" + std::to_string(count),
              std::memcmp(inplace.data(), res.data(), count * 4) == 0,
              "in place differs from out of place");
    // f32 average and max, bf16 sum.
    mc2::AllReduce(g, in.data(), res.data(), count, mc2::DType::kF32, mc2::ReduceOp::kAvg).Wait();
    out.Record(prefix + "all_reduce_f32_avg_" + std::to_string(count), res.data(), count * 4);
    mc2::AllReduce(g, in.data(), res.data(), count, mc2::DType::kF32, mc2::ReduceOp::kMax).Wait();
    out.Record(prefix + "all_reduce_f32_max_" + std::to_string(count), res.data(), count * 4);
    std::vector<uint16_t> b = ToBf16(in), bres(count);
    mc2::AllReduce(g, b.data(), bres.data(), count, mc2::DType::kBF16, mc2::ReduceOp::kSum).Wait();
    out.Record(prefix + "all_reduce_bf16_sum_" + std::to_string(count), bres.data(), count * 2);
    // i32 sum: exact, checked against the reference.
    std::vector<int32_t> iin(count), ires(count);
    for (size_t i = 0; i < count; ++i) iin[i] = IntInput(r, kase, i);
    mc2::AllReduce(g, iin.data(), ires.data(), count, mc2::DType::kI32, mc2::ReduceOp::kSum).Wait();
    bool ok = true;
    for (size_t i = 0; i < count && ok; ++i) {
      uint32_t want = 0;  // integers wrap
      for (int p = 0; p < n; ++p) want += static_cast<uint32_t>(IntInput(p, kase, i));
      ok = static_cast<uint32_t>(ires[i]) == want;
    }
    out.Check(prefix + "all_reduce_i32_" + std::to_string(count), ok, "wrong sum");
  }
}

void OtherCases(const mc2::Group& g, Out& out) {
  const int n = g.size(), r = g.rank();
  for (size_t count : {size_t{3}, size_t{70001}}) {
    const std::string c = "_" + std::to_string(count);
    // reduce (f32, root 1) and reduce_scatter (f32): hashed.
    std::vector<float> in(count * n), res(count * n, 0.f);
    for (size_t i = 0; i < in.size(); ++i) in[i] = FloatInput(r, 40, i);
    mc2::Reduce(g, in.data(), res.data(), count, mc2::DType::kF32, mc2::ReduceOp::kSum, 1 % n)
        .Wait();
    if (r == 1 % n) out.Record("reduce" + c, res.data(), count * 4);
    mc2::ReduceScatter(g, in.data(), res.data(), count, mc2::DType::kF32, mc2::ReduceOp::kSum)
        .Wait();
    out.Record("reduce_scatter" + c, res.data(), count * 4);
    // reduce_scatterv: rank p gets count + p elements.
    std::vector<size_t> counts(n);
    for (int p = 0; p < n; ++p) counts[p] = count + p;
    std::vector<float> vin(std::accumulate(counts.begin(), counts.end(), size_t{0}));
    for (size_t i = 0; i < vin.size(); ++i) vin[i] = FloatInput(r, 41, i);
    std::vector<float> vres(counts[r]);
    mc2::ReduceScatterV(g, vin.data(), vres.data(), counts, mc2::DType::kF32,
                        mc2::ReduceOp::kSum)
        .Wait();
    out.Record("reduce_scatterv" + c, vres.data(), vres.size() * 4);

    // The data movers, on i32, checked exactly.
    std::vector<int32_t> mine(count), all(count * n), want(count * n);
    for (size_t i = 0; i < count; ++i) mine[i] = IntInput(r, 50, i);
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count; ++i) want[p * count + i] = IntInput(p, 50, i);
    mc2::AllGather(g, mine.data(), all.data(), count, mc2::DType::kI32).Wait();
    out.Check("all_gather" + c, all == want, "wrong blocks");
    std::vector<int32_t> ip(count * n, 0);
    std::memcpy(ip.data() + r * count, mine.data(), count * 4);
    mc2::AllGather(g, ip.data() + r * count, ip.data(), count, mc2::DType::kI32).Wait();
    out.Check("all_gather_in_place" + c, ip == want, "wrong blocks");
    std::fill(all.begin(), all.end(), 0);
    mc2::Gather(g, mine.data(), all.data(), count, mc2::DType::kI32, 0).Wait();
    if (r == 0) out.Check("gather" + c, all == want, "wrong blocks");
    // broadcast from the last rank.
    std::vector<int32_t> bc(count);
    if (r == n - 1) bc = mine;
    mc2::Broadcast(g, bc.data(), bc.data(), count, mc2::DType::kI32, n - 1).Wait();
    bool ok = true;
    for (size_t i = 0; i < count; ++i) ok = ok && bc[i] == IntInput(n - 1, 50, i);
    out.Check("broadcast" + c, ok, "wrong data");
    // scatter from rank 0: rank p gets rank 0's block p.
    std::vector<int32_t> src(count * n), got(count);
    for (size_t i = 0; i < src.size(); ++i) src[i] = IntInput(0, 51, i);
    mc2::Scatter(g, src.data(), got.data(), count, mc2::DType::kI32, 0).Wait();
    ok = true;
    for (size_t i = 0; i < count; ++i) ok = ok && got[i] == IntInput(0, 51, r * count + i);
    out.Check("scatter" + c, ok, "wrong block");
    // all_to_all: block p of rank s is IntInput(s, 52, p * count + i).
    std::vector<int32_t> a2a(count * n), a2r(count * n);
    for (size_t i = 0; i < a2a.size(); ++i) a2a[i] = IntInput(r, 52, i);
    mc2::AllToAll(g, a2a.data(), a2r.data(), count, mc2::DType::kI32).Wait();
    ok = true;
    for (int s = 0; s < n; ++s)
      for (size_t i = 0; i < count; ++i)
        ok = ok && a2r[s * count + i] == IntInput(s, 52, r * count + i);
    out.Check("all_to_all" + c, ok, "wrong blocks");
    mc2::AllToAll(g, a2a.data(), a2a.data(), count, mc2::DType::kI32).Wait();
    out.Check("all_to_all_in_place" + c, a2a == a2r, "in place differs");
    // all_gatherv: rank p contributes count + p elements.
    std::vector<int32_t> gv(std::accumulate(counts.begin(), counts.end(), size_t{0}));
    std::vector<int32_t> mv(counts[r]);
    for (size_t i = 0; i < mv.size(); ++i) mv[i] = IntInput(r, 53, i);
    mc2::AllGatherV(g, mv.data(), gv.data(), counts, {}, mc2::DType::kI32).Wait();
    ok = true;
    size_t at = 0;
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < counts[p]; ++i) ok = ok && gv[at++] == IntInput(p, 53, i);
    out.Check("all_gatherv" + c, ok, "wrong blocks");
  }
  mc2::Barrier(g).Wait();
}

// A mixed batch (every kind; f32, f64, bf16, i32, u8; sum, avg, max, min,
// bxor; 1 element to 4 MiB; in and out of place; several entries per
// (dtype, op) so that they are packed together, and lone ones) run once as
// mc2::Batch and once as the separate collectives: the outputs must be the
// same bytes (in deterministic mode, also for floating point), integer
// outputs must equal the reference, and every output is hashed into the
// rank's file (so the batch across hosts is compared with the same batch
// on one host).
struct BatchSpec {
  mc2::BatchKind kind;
  mc2::DType dtype;
  mc2::ReduceOp op;
  size_t count;
  bool in_place;
  int root;  // broadcast
};

// Element i of rank `rank`'s input to entry `kase`, in `dtype`.
void BatchInput(mc2::DType dtype, int rank, int kase, size_t count, char* dst) {
  for (size_t i = 0; i < count; ++i) {
    const float f = FloatInput(rank, 100 + kase, i);
    const int32_t v = IntInput(rank, 100 + kase, i);
    switch (dtype) {
      case mc2::DType::kF32: std::memcpy(dst + 4 * i, &f, 4); break;
      case mc2::DType::kF64: {
        const double d = static_cast<double>(f) * (1.0 + 1e-9 * static_cast<double>(i));
        std::memcpy(dst + 8 * i, &d, 8);
        break;
      }
      case mc2::DType::kBF16: {
        const uint16_t h = ToBf16({f})[0];
        std::memcpy(dst + 2 * i, &h, 2);
        break;
      }
      case mc2::DType::kI32: std::memcpy(dst + 4 * i, &v, 4); break;
      default: dst[i] = static_cast<char>(v); break;  // u8 / i8
    }
  }
}

struct BatchBuffers {
  std::vector<char> send, recv;
  const void* in = nullptr;
  void* out = nullptr;
  const char* result = nullptr;  // where the entry's output is
  size_t result_bytes = 0;
};

// The buffers of spec `k` on rank `me` of `n`, filled with its input.
BatchBuffers MakeBatchBuffers(const BatchSpec& s, int k, int n, int me) {
  const size_t e = mc2::DTypeSize(s.dtype), b = s.count * e;
  BatchBuffers x;
  switch (s.kind) {
    case mc2::BatchKind::kAllReduce:
      x.send.resize(b);
      BatchInput(s.dtype, me, k, s.count, x.send.data());
      x.recv.assign(b, 0x5A);
      x.in = x.send.data();
      x.out = s.in_place ? x.send.data() : x.recv.data();
      x.result = static_cast<char*>(x.out);
      x.result_bytes = b;
      break;
    case mc2::BatchKind::kAllGather:
      x.send.resize(b);
      BatchInput(s.dtype, me, k, s.count, x.send.data());
      x.recv.assign(b * n, 0x5A);
      if (s.in_place) std::memcpy(x.recv.data() + me * b, x.send.data(), b);
      x.in = s.in_place ? x.recv.data() + me * b : x.send.data();
      x.out = x.recv.data();
      x.result = x.recv.data();
      x.result_bytes = b * n;
      break;
    case mc2::BatchKind::kReduceScatter:
      x.send.resize(b * n);
      BatchInput(s.dtype, me, k, s.count * n, x.send.data());
      x.recv.assign(b, 0x5A);
      x.in = x.send.data();
      x.out = s.in_place ? x.send.data() + me * b : x.recv.data();
      x.result = static_cast<char*>(x.out);
      x.result_bytes = b;
      break;
    case mc2::BatchKind::kBroadcast:
      x.send.resize(b);
      BatchInput(s.dtype, me, k, s.count, x.send.data());
      x.recv.assign(b, 0x5A);
      x.in = x.send.data();
      x.out = s.in_place && me == s.root ? x.send.data() : x.recv.data();
      x.result = static_cast<char*>(x.out);
      x.result_bytes = b;
      break;
  }
  return x;
}

// `big`: entries up to 4 MiB (the packed f32 sums then cross the span
// all-reduce's 4 MiB chunk size, which the separate ones do not); else up
// to 400 KB.
std::vector<BatchSpec> MixedBatch(int n, bool big) {
  const size_t large = big ? (size_t{1} << 20) + 3 : 4099;
  using K = mc2::BatchKind;
  using D = mc2::DType;
  using O = mc2::ReduceOp;
  return {
      // f32 sums of 1 element to 4 MiB, packed into one all_reduce.
      {K::kAllReduce, D::kF32, O::kSum, 1, false, 0},
      {K::kAllGather, D::kI32, O::kSum, 3, false, 0},
      {K::kAllReduce, D::kF32, O::kSum, 4096, true, 0},
      {K::kReduceScatter, D::kF32, O::kSum, big ? size_t{70001} : size_t{7001}, false, 0},
      {K::kAllReduce, D::kF32, O::kSum, large, false, 0},
      {K::kBroadcast, D::kI32, O::kSum, 7, true, n - 1},
      {K::kAllReduce, D::kF32, O::kSum, 65537, true, 0},
      {K::kAllReduce, D::kBF16, O::kSum, 1000, false, 0},
      {K::kAllReduce, D::kF32, O::kAvg, 333, false, 0},
      {K::kAllReduce, D::kBF16, O::kSum, 5, true, 0},
      {K::kReduceScatter, D::kBF16, O::kSum, 100, true, 0},
      {K::kAllGather, D::kF32, O::kSum, big ? size_t{70001} : size_t{7001}, true, 0},
      {K::kReduceScatter, D::kF32, O::kSum, 3, true, 0},
      {K::kAllReduce, D::kI32, O::kSum, 12345, true, 0},
      {K::kBroadcast, D::kF32, O::kSum, big ? size_t{100000} : size_t{10000}, false, 0},
      {K::kAllReduce, D::kF64, O::kMin, big ? (size_t{1} << 18) + 1 : 1001, false, 0},
      {K::kReduceScatter, D::kI32, O::kMax, 9, false, 0},
      {K::kAllGather, D::kBF16, O::kSum, 17, false, 0},
      {K::kBroadcast, D::kBF16, O::kSum, 1, false, 1 % n},
      {K::kAllReduce, D::kU8, O::kBxor, 13, false, 0},
      {K::kAllReduce, D::kI32, O::kSum, 0, false, 0},
      {K::kBroadcast, D::kI32, O::kSum, 64, false, 1 % n},
  };
}

void BatchCases(const mc2::Group& g, Out& out, const std::string& prefix, bool big) {
  const int n = g.size(), me = g.rank();
  const std::vector<BatchSpec> specs = MixedBatch(n, big);
  std::vector<BatchBuffers> fused, separate;
  std::vector<mc2::BatchEntry> entries;
  for (size_t k = 0; k < specs.size(); ++k) {
    const BatchSpec& s = specs[k];
    fused.push_back(MakeBatchBuffers(s, static_cast<int>(k), n, me));
    separate.push_back(MakeBatchBuffers(s, static_cast<int>(k), n, me));
    const BatchBuffers& x = fused.back();
    switch (s.kind) {
      case mc2::BatchKind::kAllReduce:
        entries.push_back(mc2::BatchEntry::AllReduce(x.in, x.out, s.count, s.dtype, s.op));
        break;
      case mc2::BatchKind::kAllGather:
        entries.push_back(mc2::BatchEntry::AllGather(x.in, x.out, s.count, s.dtype));
        break;
      case mc2::BatchKind::kReduceScatter:
        entries.push_back(mc2::BatchEntry::ReduceScatter(x.in, x.out, s.count, s.dtype, s.op));
        break;
      case mc2::BatchKind::kBroadcast:
        entries.push_back(mc2::BatchEntry::Broadcast(x.in, x.out, s.count, s.dtype, s.root));
        break;
    }
  }
  mc2::Batch(g, entries).Wait();
  for (size_t k = 0; k < specs.size(); ++k) {
    const BatchSpec& s = specs[k];
    BatchBuffers& x = separate[k];
    switch (s.kind) {
      case mc2::BatchKind::kAllReduce:
        mc2::AllReduce(g, x.in, x.out, s.count, s.dtype, s.op).Wait();
        break;
      case mc2::BatchKind::kAllGather:
        mc2::AllGather(g, x.in, x.out, s.count, s.dtype).Wait();
        break;
      case mc2::BatchKind::kReduceScatter:
        mc2::ReduceScatter(g, x.in, x.out, s.count, s.dtype, s.op).Wait();
        break;
      case mc2::BatchKind::kBroadcast:
        mc2::Broadcast(g, x.in, x.out, s.count, s.dtype, s.root).Wait();
        break;
    }
  }
  for (size_t k = 0; k < specs.size(); ++k) {
    const BatchSpec& s = specs[k];
    const BatchBuffers &f = fused[k], &x = separate[k];
    const std::string name = prefix + "batch_" + std::to_string(k) + "_" +
                             mc2::BatchKindName(s.kind) + "_" + std::to_string(s.count);
    out.Record(name, f.result, f.result_bytes);
    out.Check(name, std::memcmp(f.result, x.result, f.result_bytes) == 0,
              "the batch's output differs from the separate collective's");
    // Integer entries against the reference (wrapping sums, maxima, rank
    // blocks, the root's input).
    if (s.dtype != mc2::DType::kI32) continue;
    const int kase = static_cast<int>(k);
    std::vector<int32_t> want;
    auto input = [&](int rank, size_t i) { return IntInput(rank, 100 + kase, i); };
    switch (s.kind) {
      case mc2::BatchKind::kAllReduce:
      case mc2::BatchKind::kReduceScatter:
        for (size_t i = 0; i < s.count; ++i) {
          const size_t at = s.kind == mc2::BatchKind::kReduceScatter ? me * s.count + i : i;
          uint32_t sum = 0;
          int32_t max = input(0, at);
          for (int p = 0; p < n; ++p) {
            sum += static_cast<uint32_t>(input(p, at));
            max = std::max(max, input(p, at));
          }
          want.push_back(s.op == mc2::ReduceOp::kMax ? max : static_cast<int32_t>(sum));
        }
        break;
      case mc2::BatchKind::kAllGather:
        for (int p = 0; p < n; ++p)
          for (size_t i = 0; i < s.count; ++i) want.push_back(input(p, i));
        break;
      case mc2::BatchKind::kBroadcast:
        for (size_t i = 0; i < s.count; ++i) want.push_back(input(s.root, i));
        break;
    }
    out.Check(name + "_reference",
              want.size() * 4 == f.result_bytes &&
                  (want.empty() || std::memcmp(want.data(), f.result, f.result_bytes) == 0),
              "wrong integer result");
  }
  if (!big) return;
  // Many small all-reduces (the fused case the batch exists for).
  std::vector<std::vector<float>> small(200, std::vector<float>(257)), alone = small;
  entries.clear();
  for (size_t t = 0; t < small.size(); ++t) {
    for (size_t i = 0; i < small[t].size(); ++i) small[t][i] = FloatInput(me, 300 + static_cast<int>(t), i);
    alone[t] = small[t];
    entries.push_back(mc2::BatchEntry::AllReduce(small[t].data(), small[t].data(),
                                                 small[t].size(), mc2::DType::kF32,
                                                 mc2::ReduceOp::kSum));
  }
  mc2::Batch(g, entries).Wait();
  bool same = true;
  for (size_t t = 0; t < small.size(); ++t) {
    mc2::AllReduce(g, alone[t].data(), alone[t].data(), alone[t].size(), mc2::DType::kF32,
                   mc2::ReduceOp::kSum)
        .Wait();
    same = same && std::memcmp(alone[t].data(), small[t].data(), small[t].size() * 4) == 0;
    out.Record(prefix + "batch_small_" + std::to_string(t), small[t].data(), small[t].size() * 4);
  }
  out.Check(prefix + "batch_small", same, "200 fused all-reduces differ from the separate ones");
}

// Errors of a batch on every rank: entries that differ on one rank raise
// kMismatch on every rank, a bad root kInvalidArgument naming the entry;
// the group works after both.
int BatchBad() {
  mc2::Group world = mc2::Group::FromEnv();
  const int n = world.size(), me = world.rank();
  std::vector<float> a(100, 1.f), b(10, 2.f);
  auto report = [&](const mc2::Error& e) {
    std::printf("rank %d error: %s\n", me, e.what());
    std::fflush(stdout);
  };
  try {
    const size_t count = me == 1 ? 99 : 100;
    std::vector<mc2::BatchEntry> e = {
        mc2::BatchEntry::AllReduce(a.data(), a.data(), count, mc2::DType::kF32,
                                   mc2::ReduceOp::kSum),
        mc2::BatchEntry::Broadcast(b.data(), b.data(), b.size(), mc2::DType::kF32, 0)};
    mc2::Batch(world, e).Wait();
  } catch (const mc2::Error& e) {
    report(e);
  }
  try {
    std::vector<mc2::BatchEntry> e = {
        mc2::BatchEntry::AllReduce(a.data(), a.data(), a.size(), mc2::DType::kF32,
                                   mc2::ReduceOp::kSum),
        mc2::BatchEntry::Broadcast(b.data(), b.data(), b.size(), mc2::DType::kF32, n)};
    mc2::Batch(world, e).Wait();
  } catch (const mc2::Error& e) {
    report(e);
  }
  std::fill(a.begin(), a.end(), 1.f);
  std::vector<mc2::BatchEntry> e = {
      mc2::BatchEntry::AllReduce(a.data(), a.data(), a.size(), mc2::DType::kF32,
                                 mc2::ReduceOp::kSum),
      mc2::BatchEntry::Broadcast(b.data(), b.data(), b.size(), mc2::DType::kF32, 0)};
  mc2::Batch(world, e).Wait();
  const bool ok = std::all_of(a.begin(), a.end(), [&](float v) { return v == n; });
  std::printf("rank %d: batch_bad %s\n", me, ok ? "ok" : "wrong result");
  mc2::Barrier(world).Wait();
  return ok ? 0 : 1;
}

void PointToPoint(const mc2::Group& g, Out& out) {
  const int n = g.size(), r = g.rank();
  if (n < 2) return;
  // A ring, with a message larger than the net transport's piece.
  for (size_t count : {size_t{5}, (size_t{5} << 20) / 4 + 1}) {
    std::vector<int32_t> s(count), d(count, 0);
    for (size_t i = 0; i < count; ++i) s[i] = IntInput(r, 60, i);
    mc2::Work rw = g.Recv(d.data(), count * 4, (r + n - 1) % n, 7);
    mc2::Work sw = g.Send(s.data(), count * 4, (r + 1) % n, 7);
    sw.Wait();
    rw.Wait();
    bool ok = true;
    for (size_t i = 0; i < count; ++i) ok = ok && d[i] == IntInput((r + n - 1) % n, 60, i);
    out.Check("send_recv_" + std::to_string(count), ok, "wrong message");
  }
}

int Suite(const char* dir) {
  mc2::Group world = mc2::Group::FromEnv();
  Out out;
  out.file.open(std::string(dir) + "/rank" + std::to_string(world.rank()) + ".txt");
  AllReduceCases(world, out, "world_");
  OtherCases(world, out);
  PointToPoint(world, out);
  BatchCases(world, out, "world_", true);
  // Symmetric memory in a collective.
  {
    const size_t count = 4099;
    mc2::SymmetricBuffer buf = world.AllocSymmetric(count * 4);
    for (size_t i = 0; i < count; ++i) buf.as<float>()[i] = FloatInput(world.rank(), 70, i);
    mc2::AllReduce(world, buf.data(), buf.data(), count, mc2::DType::kF32, mc2::ReduceOp::kSum)
        .Wait();
    out.Record("symmetric_all_reduce", buf.data(), count * 4);
    mc2::Barrier(world).Wait();
  }
  // Subgroups: by parity (across hosts in the box) and by halves (one host
  // each with 2 ranks per host).
  for (int mode = 0; mode < 2; ++mode) {
    int color = mode == 0 ? world.rank() % 2 : world.rank() / 2;
    mc2::Group sub = world.Split(color, world.rank());
    std::string prefix = (mode == 0 ? "split_parity" : "split_halves") + std::to_string(color) +
                         "_";
    AllReduceCases(sub, out, prefix);
    PointToPoint(sub, out);
    if (mode == 0) BatchCases(sub, out, prefix, false);
    mc2::Barrier(sub).Wait();
  }
  // A batch on the world's ranks dealt round robin over the hosts (0, 2,
  // 1, 3 on 2 hosts x 2 ranks): a layout whose hosts hold no contiguous
  // block of ranks, where the span reductions run flat.
  {
    const int n = world.size(), r = world.rank();
    mc2::Group dealt = world.Split(0, (r % 2) * ((n + 1) / 2) + r / 2);
    BatchCases(dealt, out, "dealt_", false);
    mc2::Barrier(dealt).Wait();
  }
  // Nobody leaves while a peer still runs (a rank that exits is a dead
  // peer to the others).
  mc2::Barrier(world).Wait();
  out.file.close();
  std::printf("rank %d: %s\n", world.rank(), g_failures ? "FAILED" : "ok");
  return g_failures ? 1 : 0;
}

int Fault(int kill_rank) {
  mc2::Group world = mc2::Group::FromEnv();
  std::vector<float> v(1 << 16, 1.f);
  try {
    for (int it = 0; it < 1000000; ++it) {
      if (world.rank() == kill_rank && it == 20) {
        std::fflush(stdout);
        raise(SIGKILL);
      }
      mc2::AllReduce(world, v.data(), v.data(), v.size(), mc2::DType::kF32, mc2::ReduceOp::kMax)
          .Wait();
    }
  } catch (const mc2::Error& e) {
    std::printf("rank %d error: %s\n", world.rank(), e.what());
    std::fflush(stdout);
    std::exit(3);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "suite") {
    try {
      return Suite(argv[2]);
    } catch (const mc2::Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
  if (argc == 3 && std::string(argv[1]) == "fault") return Fault(std::atoi(argv[2]));
  if (argc == 2 && std::string(argv[1]) == "batch_bad") return BatchBad();
  std::fprintf(stderr, "usage: %s suite OUTDIR | fault KILLRANK | batch_bad\n", argv[0]);
  return 2;
}
