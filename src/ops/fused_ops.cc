// The fused compute+communication operators of include/mc2/ops.h:
// AllGatherMatmul, MatmulReduceScatter and MatmulAllReduce, each with the
// serial, chunked (CoC) and fused (ring decomposition) pipelines.
//
// Works as follows (n ranks, rank r, s chunks).
//
// Every call first all-gathers a 64-byte ShapeMsg per rank (operator, dtype,
// shapes, pipeline, splits, a local-error flag) and checks it identically on
// every rank, so any inconsistency raises the same error everywhere before
// data moves. Then, with the GEMMs on the calling thread:
//
// AllGatherMatmul (A_r [m_r x k], B [k x n] -> C [M x n]):
//   serial   AllGatherV(A) into Ag, then one GEMM.          comm then compute
//   chunked  s AllGatherV calls, chunk j = rows [m_r j/s, m_r (j+1)/s) of
//            every shard, all queued at once; wait chunk j, multiply its n
//            row blocks while chunks > j move.
//   fused    own shard first (no wait), then at step i = 1..n-1 the shard of
//            rank r-i, received over the point-to-point channel while the
//            previous shard is multiplied; rank r sends its shard to r+i at
//            step i, so every egress port carries one shard at a time.
//            Bytes per rank: (M - m_r) k in, (n-1) m_r k out.
// MatmulReduceScatter (A [M x k_r], B [k_r x n] -> C_r [m_r x n]):
//   serial   one GEMM into P [M x n], then ReduceScatterV.
//   chunked  chunk j = rows [m_d j/s, m_d (j+1)/s) of every destination
//            block d, multiplied into a packed buffer and reduce-scattered
//            (queued) while chunk j+1 is multiplied.
//   fused    at step i = 1..n-1 the partial for rank d = r+i is multiplied
//            and sent to d while the next one is multiplied; the own partial
//            last; the owner reduces the n partials with core::ReduceTree in
//            rank order (the canonical order ReduceScatterV uses).
// MatmulAllReduce (A [M x k_r], B [k_r x n] -> C [M x n]):
//   serial   one GEMM, then AllReduce in place.
//   chunked  chunk j = rows [M j/s, M (j+1)/s): GEMM, then AllReduce queued.
//   fused    the fused reduce-scatter above over blocks [M b/n, M (b+1)/n),
//            reduced into C, then AllGatherV in place.
//
// Determinism: row blocks of a oneDNN product (one thread) are bitwise the
// rows of the full product, and every reduction is ReduceTree over ranks
// (in the collectives or here), so all pipelines and split counts agree bit
// for bit with serial.
#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "core/reduce.h"
#include "engine/work_state.h"
#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/ops.h"

namespace mc2 {

const char* PipelineName(Pipeline p) {
  switch (p) {
    case Pipeline::kSerial: return "serial";
    case Pipeline::kChunked: return "chunked";
    case Pipeline::kFused: return "fused";
    case Pipeline::kAuto: return "auto";
  }
  return "?";
}

std::optional<Pipeline> ParsePipeline(std::string_view name) {
  for (int i = 0; i < kNumPipelines; ++i) {
    if (name == PipelineName(static_cast<Pipeline>(i))) return static_cast<Pipeline>(i);
  }
  return std::nullopt;
}

namespace {

enum class FusedOp : uint64_t { kAllGatherMatmul = 1, kMatmulReduceScatter, kMatmulAllReduce };

const char* FusedOpName(FusedOp op) {
  switch (op) {
    case FusedOp::kAllGatherMatmul: return "all_gather_matmul";
    case FusedOp::kMatmulReduceScatter: return "matmul_reduce_scatter";
    case FusedOp::kMatmulAllReduce: return "matmul_all_reduce";
  }
  return "?";
}

// Point-to-point tag of the fused ring steps (messages between two ranks are
// matched in order, so one tag serves every call).
constexpr int kFusedTag = 0x4d433246;  // "MC2F"

// What every rank publishes at the start of a call.
struct ShapeMsg {
  uint64_t op;
  uint64_t dtype;
  uint64_t m;        // AG: m_local; RS/AR: M
  uint64_t k;
  uint64_t n;
  uint64_t m_local;  // RS: the shard rows; others 0
  uint64_t pipeline_splits;  // pipeline << 32 | splits
  uint64_t local_error;      // 1 if this rank's arguments are invalid
};
static_assert(sizeof(ShapeMsg) == 64);

[[noreturn]] void Fail(ErrorCode code, FusedOp op, int rank, const std::string& msg) {
  throw Error(code, msg, rank, FusedOpName(op));
}

std::string Str(uint64_t v) { return std::to_string(v); }

// The validated plan of one call, identical on every rank except `rank`.
struct Plan {
  FusedOp op;
  int rank = 0;
  int size = 1;
  DType dtype = DType::kF32;
  size_t esize = 4;
  Pipeline pipeline = Pipeline::kSerial;
  int splits = 1;
  size_t k = 0, n = 0;
  size_t M = 0;
  std::vector<size_t> rows;  // per rank block rows
  std::vector<size_t> offs;  // per rank block first row
  GemmOptions gemm;
  CollectiveOptions coll;
};

// Validates locally, exchanges, validates globally. Throws on every rank.
// `c_null`: AllGatherMatmul's C is null with n > 0, an error only if M > 0
// (known after the exchange).
Plan MakePlan(const Group& g, FusedOp op, const ShapeMsg& mine_in, std::string local_error,
              const FusedOptions& o, bool c_null = false) {
  if (!g.valid()) throw Error(ErrorCode::kInvalidArgument, "invalid group", -1, FusedOpName(op));
  Plan p;
  p.op = op;
  p.rank = g.rank();
  p.size = g.size();
  ShapeMsg mine = mine_in;
  mine.local_error = (local_error.empty() ? 0 : 1) | (c_null ? 2 : 0);
  std::vector<ShapeMsg> all(p.size);
  CollectiveOptions co;
  co.timeout = o.timeout;
  AllGather(g, &mine, all.data(), sizeof(ShapeMsg), DType::kU8, co).Wait();
  if (!local_error.empty()) Fail(ErrorCode::kInvalidArgument, op, p.rank, local_error);
  for (int r = 0; r < p.size; ++r) {
    if (all[r].local_error & 1) {
      Fail(ErrorCode::kInvalidArgument, op, p.rank,
           "rank " + std::to_string(r) + " passed invalid arguments (see its error)");
    }
  }
  const ShapeMsg& z = all[0];
  auto mismatch = [&](int r, const char* what, uint64_t v0, uint64_t vr) {
    Fail(ErrorCode::kMismatch, op, p.rank,
         std::string(what) + " differs across ranks: rank 0 has " + Str(v0) + ", rank " +
             std::to_string(r) + " has " + Str(vr));
  };
  for (int r = 1; r < p.size; ++r) {
    const ShapeMsg& x = all[r];
    if (x.op != z.op) {
      Fail(ErrorCode::kMismatch, op, p.rank,
           std::string("ranks called different operators: rank 0 ") +
               FusedOpName(static_cast<FusedOp>(z.op)) + ", rank " + std::to_string(r) + " " +
               FusedOpName(static_cast<FusedOp>(x.op)));
    }
    if (x.dtype != z.dtype) mismatch(r, "dtype", z.dtype, x.dtype);
    if (x.pipeline_splits >> 32 != z.pipeline_splits >> 32) {
      mismatch(r, "pipeline", z.pipeline_splits >> 32, x.pipeline_splits >> 32);
    }
    if ((x.pipeline_splits & 0xffffffff) != (z.pipeline_splits & 0xffffffff)) {
      mismatch(r, "splits", z.pipeline_splits & 0xffffffff, x.pipeline_splits & 0xffffffff);
    }
    if (op == FusedOp::kAllGatherMatmul) {
      if (x.k != z.k) mismatch(r, "k", z.k, x.k);
    } else {
      if (x.m != z.m) mismatch(r, "M (rows of A)", z.m, x.m);
      if (x.n != z.n) mismatch(r, "n (columns of B)", z.n, x.n);
    }
  }
  p.dtype = static_cast<DType>(z.dtype);
  p.esize = DTypeSize(p.dtype);
  p.k = mine.k;
  p.n = mine.n;
  p.rows.resize(p.size);
  p.offs.resize(p.size);
  size_t total = 0, max_n = 0, max_k = 0;
  for (int r = 0; r < p.size; ++r) {
    size_t rows = 0;
    if (op == FusedOp::kAllGatherMatmul) rows = all[r].m;
    else if (op == FusedOp::kMatmulReduceScatter) rows = all[r].m_local;
    else rows = z.m * (r + 1) / p.size - z.m * r / p.size;
    p.offs[r] = total;
    p.rows[r] = rows;
    total += rows;
    max_n = std::max<size_t>(max_n, all[r].n);
    max_k = std::max<size_t>(max_k, all[r].k);
  }
  if (op == FusedOp::kMatmulReduceScatter && total != z.m) {
    std::string list;
    for (int r = 0; r < p.size; ++r) {
      if (r > 0) list.push_back(',');
      list.append(Str(p.rows[r]));
    }
    Fail(ErrorCode::kMismatch, op, p.rank,
         "the ranks' m_local (" + list + ") add up to " + Str(total) + ", not M = " + Str(z.m));
  }
  p.M = op == FusedOp::kAllGatherMatmul ? total : z.m;
  for (int r = 0; r < p.size; ++r) {
    if ((all[r].local_error & 2) && p.M > 0) {
      Fail(ErrorCode::kInvalidArgument, op, p.rank,
           r == p.rank ? "C is null but M x n = " + Str(p.M * p.n)
                       : "rank " + std::to_string(r) + " passed a null C");
    }
  }
  p.pipeline = static_cast<Pipeline>(z.pipeline_splits >> 32);
  p.splits = static_cast<int>(z.pipeline_splits & 0xffffffff);
  if (p.pipeline == Pipeline::kAuto) {
    // Same inputs on every rank, so the same choice everywhere.
    double flops = GemmFlops(op == FusedOp::kAllGatherMatmul ? p.M : p.M, max_n, max_k);
    // Chunked with 4 chunks measured best of the three on this host (2
    // ranks, 2048x1024x1024 MatmulAllReduce); a measured cost model is
    // still to come (issue 3).
    bool small = p.size == 1 || flops < double(1 << 25);
    p.pipeline = small ? Pipeline::kSerial : Pipeline::kChunked;
    p.splits = small ? 1 : 4;
  }
  if (p.pipeline != Pipeline::kChunked) p.splits = 1;
  p.gemm.threads = o.gemm_threads;
  if (g.deterministic() && p.dtype == DType::kF32) p.gemm.backend = GemmBackend::kOneDNN;
  p.coll = co;
  // The pipelines' collectives must run beside the GEMMs, however small.
  p.coll.may_run_inline = false;
  return p;
}

std::string LocalChecks(DType dtype, const FusedOptions& o, std::initializer_list<bool> nulls) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return std::string("dtype must be f32 or bf16, not ") + DTypeName(dtype);
  }
  if (o.splits < 1 || o.splits > 16) {
    return "splits must be in 1..16, not " + std::to_string(o.splits);
  }
  if (static_cast<unsigned>(o.pipeline) >= kNumPipelines) {
    return "invalid pipeline";
  }
  if (o.gemm_threads < 0) return "gemm_threads must be >= 0";
  for (bool bad : nulls) {
    if (bad) return "a null pointer was passed for a non-empty matrix";
  }
  return {};
}

ShapeMsg Msg(FusedOp op, DType dtype, size_t m, size_t k, size_t n, size_t m_local,
             const FusedOptions& o) {
  ShapeMsg s{};
  s.op = static_cast<uint64_t>(op);
  s.dtype = static_cast<uint64_t>(dtype);
  s.m = m;
  s.k = k;
  s.n = n;
  s.m_local = m_local;
  s.pipeline_splits = (uint64_t(static_cast<uint8_t>(o.pipeline)) << 32) |
                      uint32_t(std::clamp(o.splits, 0, 1 << 20));
  return s;
}

// Chunk j of s of a block of `rows` rows: [lo, hi).
size_t ChunkLo(size_t rows, int j, int s) { return rows * j / s; }

// Outstanding works of a call: on failure every one is waited for (errors
// ignored) before the buffers they use go away.
class Pending {
 public:
  void Add(Work w) { works_.push_back(std::move(w)); }
  Work& operator[](size_t i) { return works_[i]; }
  void WaitAll() {
    for (auto& w : works_) w.Wait();
  }
  void Drain() noexcept {
    for (auto& w : works_) {
      try {
        w.Wait();
      } catch (...) {
      }
    }
  }

 private:
  std::vector<Work> works_;
};

void RunGemm(const Plan& p, size_t m, size_t k, const char* a, const char* b, float* c) {
  if (m == 0 || p.n == 0) return;
  Gemm(m, p.n, k, p.dtype, a, b, DType::kF32, c, p.gemm);
}

// The product of `rows` rows of A with B into dst; zeros when k == 0 (an
// empty sum), which the reductions after it still need as their input.
void GemmOrZero(const Plan& p, size_t rows, const char* a_rows, const char* b, float* dst) {
  if (p.k == 0) std::fill(dst, dst + rows * p.n, 0.0f);
  else RunGemm(p, rows, p.k, a_rows, b, dst);
}

// ---------------------------------------------------------------- AG + GEMM
void RunAllGatherMatmul(const Group& g, const Plan& p, const char* a_shard, const char* b,
                        float* c, char* ag, Pending& pend) {
  const int n = p.size, me = p.rank;
  const size_t row_bytes = p.k * p.esize;
  if (p.pipeline == Pipeline::kSerial || n == 1) {
    std::vector<size_t> counts(n), displs(n);
    for (int r = 0; r < n; ++r) {
      counts[r] = p.rows[r] * row_bytes;
      displs[r] = p.offs[r] * row_bytes;
    }
    pend.Add(AllGatherV(g, a_shard, ag, counts, displs, DType::kU8, p.coll));
    pend[0].Wait();
    RunGemm(p, p.M, p.k, ag, b, c);
    return;
  }
  if (p.pipeline == Pipeline::kChunked) {
    const int s = p.splits;
    std::vector<bool> empty(s, true);
    for (int j = 0; j < s; ++j) {
      std::vector<size_t> counts(n), displs(n);
      for (int r = 0; r < n; ++r) {
        size_t lo = ChunkLo(p.rows[r], j, s), hi = ChunkLo(p.rows[r], j + 1, s);
        counts[r] = (hi - lo) * row_bytes;
        displs[r] = (p.offs[r] + lo) * row_bytes;
        if (hi > lo) empty[j] = false;
      }
      // Every rank skips the same (all-empty) chunks.
      if (empty[j]) {
        pend.Add(Work());
        continue;
      }
      pend.Add(AllGatherV(g, a_shard + ChunkLo(p.rows[me], j, s) * row_bytes, ag, counts, displs,
                          DType::kU8, p.coll));
    }
    for (int j = 0; j < s; ++j) {
      pend[j].Wait();
      for (int r = 0; r < n; ++r) {
        size_t lo = ChunkLo(p.rows[r], j, s), hi = ChunkLo(p.rows[r], j + 1, s);
        size_t row = p.offs[r] + lo;
        RunGemm(p, hi - lo, p.k, ag + row * row_bytes, b, c + row * p.n);
      }
    }
    return;
  }
  // Fused: receives are posted at once (each from a different peer); the
  // send of step i is posted once the shard of step i-1 arrived.
  std::vector<Work> recv(n);
  for (int i = 1; i < n; ++i) {
    int src = collectives::Mod(me - i, n);
    if (p.rows[src] == 0) continue;
    recv[i] = g.Recv(ag + p.offs[src] * row_bytes, p.rows[src] * row_bytes, src, kFusedTag);
    pend.Add(recv[i]);
  }
  auto post_send = [&](int i) {
    if (i >= n || p.rows[me] == 0) return;
    pend.Add(g.Send(a_shard, p.rows[me] * row_bytes, collectives::Mod(me + i, n), kFusedTag));
  };
  post_send(1);
  RunGemm(p, p.rows[me], p.k, a_shard, b, c + p.offs[me] * p.n);
  if (p.rows[me]) std::memcpy(ag + p.offs[me] * row_bytes, a_shard, p.rows[me] * row_bytes);
  for (int i = 1; i < n; ++i) {
    int src = collectives::Mod(me - i, n);
    recv[i].Wait();
    post_send(i + 1);
    RunGemm(p, p.rows[src], p.k, ag + p.offs[src] * row_bytes, b, c + p.offs[src] * p.n);
  }
  pend.WaitAll();
}

// ---------------------------------------------------------------- GEMM + RS
// Fused reduce-scatter of the product over the blocks of p.rows/p.offs:
// the reduced block of this rank goes to `out` (rows[me] x n).
void FusedMatmulReduceScatter(const Group& g, const Plan& p, const char* a, const char* b,
                              float* out, Pending& pend) {
  const int n = p.size, me = p.rank;
  const size_t row_bytes = p.k * p.esize;
  const size_t my_elems = p.rows[me] * p.n;
  // partial[r]: rank r's partial of my block (mine computed here).
  std::vector<std::vector<float>> partial(n);
  std::vector<Work> recv(n);
  if (my_elems > 0) {
    for (int i = 1; i < n; ++i) {
      int src = collectives::Mod(me - i, n);
      partial[src].resize(my_elems);
      recv[src] = g.Recv(partial[src].data(), my_elems * sizeof(float), src, kFusedTag);
      pend.Add(recv[src]);
    }
  }
  // Partials for other ranks, each sent while the next is multiplied.
  std::vector<std::vector<float>> outgoing(n);
  for (int i = 1; i < n; ++i) {
    int d = collectives::Mod(me + i, n);
    size_t elems = p.rows[d] * p.n;
    if (elems == 0) continue;
    outgoing[d].resize(elems);
    if (p.k == 0) {
      std::fill(outgoing[d].begin(), outgoing[d].end(), 0.0f);
    } else {
      RunGemm(p, p.rows[d], p.k, a + p.offs[d] * row_bytes, b, outgoing[d].data());
    }
    pend.Add(g.Send(outgoing[d].data(), elems * sizeof(float), d, kFusedTag));
  }
  if (my_elems > 0) {
    partial[me].resize(my_elems);
    if (p.k == 0) {
      std::fill(partial[me].begin(), partial[me].end(), 0.0f);
    } else {
      RunGemm(p, p.rows[me], p.k, a + p.offs[me] * row_bytes, b, partial[me].data());
    }
    std::vector<const void*> srcs(n);
    for (int r = 0; r < n; ++r) {
      if (r != me) recv[r].Wait();
      srcs[r] = partial[r].data();
    }
    core::ReduceTree(DType::kF32, ReduceOp::kSum, out, srcs.data(), n, my_elems, n);
  }
  pend.WaitAll();
}

void RunMatmulReduceScatter(const Group& g, const Plan& p, const char* a, const char* b,
                            float* c, Pending& pend) {
  const int n = p.size, me = p.rank;
  const size_t row_bytes = p.k * p.esize;
  if (p.pipeline == Pipeline::kSerial || n == 1) {
    std::vector<float> full(p.M * p.n);
    GemmOrZero(p, p.M, a, b, full.data());
    std::vector<size_t> counts(n);
    for (int r = 0; r < n; ++r) counts[r] = p.rows[r] * p.n;
    pend.Add(ReduceScatterV(g, full.data(), c, counts, DType::kF32, ReduceOp::kSum, p.coll));
    pend[0].Wait();
    return;
  }
  if (p.pipeline == Pipeline::kChunked) {
    const int s = p.splits;
    std::vector<float> packed(p.M * p.n);
    size_t base = 0;
    for (int j = 0; j < s; ++j) {
      std::vector<size_t> counts(n);
      size_t at = base;
      for (int r = 0; r < n; ++r) {
        size_t lo = ChunkLo(p.rows[r], j, s), hi = ChunkLo(p.rows[r], j + 1, s);
        GemmOrZero(p, hi - lo, a + (p.offs[r] + lo) * row_bytes, b, packed.data() + at);
        counts[r] = (hi - lo) * p.n;
        at += counts[r];
      }
      if (at > base) {
        pend.Add(ReduceScatterV(g, packed.data() + base, c + ChunkLo(p.rows[me], j, s) * p.n,
                                counts, DType::kF32, ReduceOp::kSum, p.coll));
      }
      base = at;
    }
    pend.WaitAll();
    return;
  }
  FusedMatmulReduceScatter(g, p, a, b, c, pend);
}

// ---------------------------------------------------------------- GEMM + AR
void RunMatmulAllReduce(const Group& g, const Plan& p, const char* a, const char* b, float* c,
                        Pending& pend) {
  const int n = p.size, me = p.rank;
  const size_t row_bytes = p.k * p.esize;
  if (p.pipeline == Pipeline::kSerial || n == 1) {
    GemmOrZero(p, p.M, a, b, c);
    if (p.M * p.n > 0) {
      pend.Add(AllReduce(g, c, c, p.M * p.n, DType::kF32, ReduceOp::kSum, p.coll));
      pend.WaitAll();
    }
    return;
  }
  if (p.pipeline == Pipeline::kChunked) {
    const int s = p.splits;
    for (int j = 0; j < s; ++j) {
      size_t lo = ChunkLo(p.M, j, s), hi = ChunkLo(p.M, j + 1, s);
      if (hi == lo || p.n == 0) continue;
      GemmOrZero(p, hi - lo, a + lo * row_bytes, b, c + lo * p.n);
      pend.Add(AllReduce(g, c + lo * p.n, c + lo * p.n, (hi - lo) * p.n, DType::kF32,
                         ReduceOp::kSum, p.coll));
    }
    pend.WaitAll();
    return;
  }
  FusedMatmulReduceScatter(g, p, a, b, c + p.offs[me] * p.n, pend);
  if (p.M * p.n > 0) {
    std::vector<size_t> counts(n), displs(n);
    for (int r = 0; r < n; ++r) {
      counts[r] = p.rows[r] * p.n;
      displs[r] = p.offs[r] * p.n;
    }
    Work w = AllGatherV(g, c + displs[me], c, counts, displs, DType::kF32, p.coll);
    pend.Add(w);
    w.Wait();
  }
}

// Runs `body` and returns a completed Work carrying the pipeline name, or
// the failure (after every outstanding communication has finished).
template <typename Body>
Work Complete(const Plan& p, FusedReport* report, Body&& body) {
  if (report) {
    report->pipeline = p.pipeline;
    report->splits = p.splits;
  }
  auto state = std::make_shared<internal::WorkState>(0, FusedOpName(p.op));
  state->SetAlgorithm(PipelineName(p.pipeline));
  Pending pend;
  try {
    body(pend);
    state->Complete();
  } catch (...) {
    pend.Drain();
    state->Fail(std::current_exception());
  }
  return Work(state);
}

}  // namespace

Work AllGatherMatmul(const Group& g, const void* a_shard, size_t m_local, size_t k,
                     const void* b, size_t n, DType dtype, float* c, void* gathered_a,
                     const FusedOptions& options, FusedReport* report) {
  const FusedOp op = FusedOp::kAllGatherMatmul;
  std::string err = LocalChecks(dtype, options,
                                {a_shard == nullptr && m_local * k > 0,
                                 b == nullptr && k * n > 0});
  Plan p = MakePlan(g, op, Msg(op, dtype, m_local, k, n, 0, options), err, options,
                    c == nullptr && n > 0);
  return Complete(p, report, [&](Pending& pend) {
    std::vector<char> own;
    char* ag = static_cast<char*>(gathered_a);
    if (ag == nullptr) {
      own.resize(p.M * p.k * p.esize);
      ag = own.data();
    }
    RunAllGatherMatmul(g, p, static_cast<const char*>(a_shard), static_cast<const char*>(b), c,
                       ag, pend);
  });
}

Work MatmulReduceScatter(const Group& g, const void* a, size_t m, size_t k, const void* b,
                         size_t n, DType dtype, float* c_shard, size_t m_local,
                         const FusedOptions& options, FusedReport* report) {
  const FusedOp op = FusedOp::kMatmulReduceScatter;
  std::string err = LocalChecks(dtype, options,
                                {a == nullptr && m * k > 0, b == nullptr && k * n > 0,
                                 c_shard == nullptr && m_local * n > 0});
  if (err.empty() && m_local > m) err = "m_local " + Str(m_local) + " exceeds M " + Str(m);
  Plan p = MakePlan(g, op, Msg(op, dtype, m, k, n, m_local, options), err, options);
  return Complete(p, report, [&](Pending& pend) {
    RunMatmulReduceScatter(g, p, static_cast<const char*>(a), static_cast<const char*>(b),
                           c_shard, pend);
  });
}

Work MatmulAllReduce(const Group& g, const void* a, size_t m, size_t k, const void* b, size_t n,
                     DType dtype, float* c, const FusedOptions& options, FusedReport* report) {
  const FusedOp op = FusedOp::kMatmulAllReduce;
  std::string err = LocalChecks(dtype, options,
                                {a == nullptr && m * k > 0, b == nullptr && k * n > 0,
                                 c == nullptr && m * n > 0});
  Plan p = MakePlan(g, op, Msg(op, dtype, m, k, n, 0, options), err, options);
  return Complete(p, report, [&](Pending& pend) {
    RunMatmulAllReduce(g, p, static_cast<const char*>(a), static_cast<const char*>(b), c, pend);
  });
}

}  // namespace mc2
