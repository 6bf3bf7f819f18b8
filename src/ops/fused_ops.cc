// The fused compute+communication operators of include/mc2/fused_ops.h:
// AllGatherMatmul, MatmulReduceScatter and MatmulAllReduce, each with the
// serial, chunked (CoC), fused (ring decomposition over one-sided
// symmetric-memory transfers) and auto (cost model) pipelines.
//
// Works as follows (n ranks, rank r, s chunks).
//
// Every call first all-gathers a ShapeMsg per rank (operator, dtype,
// shapes, pipeline, splits, a local-error flag, a hash of the cost model's
// inputs) and checks it identically on every rank, so any inconsistency
// raises the same error everywhere before data moves, and `auto` resolves to
// the same pipeline everywhere. Then, with the GEMMs on the calling thread:
//
// AllGatherMatmul (A_r [m_r x k], B [k x n] -> C [M x n]):
//   serial   AllGatherV(A) into Ag, then one GEMM.          comm then compute
//   chunked  s AllGatherV calls, chunk j = rows [m_r j/s, m_r (j+1)/s) of
//            every shard, all queued at once; wait chunk j, multiply its n
//            row blocks while chunks > j move.
//   fused    see "The fused pipeline" below: the own shard is multiplied
//            first; chunk j of shard r-1, r-2, ... as each lands.
// MatmulReduceScatter (A [M x k_r], B [k_r x n] -> C_r [m_r x n]):
//   serial   one GEMM into P [M x n], then ReduceScatterV.
//   chunked  chunk j = rows [m_d j/s, m_d (j+1)/s) of every destination
//            block d, multiplied into a packed buffer and reduce-scattered
//            (queued) while chunk j+1 is multiplied.
//   fused    chunk j of the partial for rank r+1, r+2, ... is multiplied
//            into the workspace and handed to its owner while the next is
//            multiplied; the own chunk j after them (with 2 ranks after
//            the partial of chunk j+1, so that the peer's partial has
//            landed when it is done); the owner reduces the n
//            partials of a chunk with core::ReduceTree in rank order (the
//            canonical order ReduceScatterV uses) as soon as all landed.
// MatmulAllReduce (A [M x k_r], B [k_r x n] -> C [M x n]):
//   serial   one GEMM, then AllReduce in place.
//   chunked  chunk j = rows [M j/s, M (j+1)/s): GEMM, then AllReduce queued.
//   fused    the fused reduce-scatter above over blocks [M b/n, M (b+1)/n);
//            each reduced chunk is handed to every peer at once (the
//            all-gather half), which copies it into its C. The last
//            chunk of a block is half as tall as the others (its
//            hand-offs end the call).
//
// The fused pipeline runs over the group's channel (engine/channel.h): a
// window of symmetric memory per rank and two phases of notification
// counters. A transfer is one-sided: the producer writes the chunk into its
// own window (the GEMM's output goes straight there; AllGatherMatmul's
// shard is copied there by the progress thread, Channel::Async, while the
// caller multiplies its own shard), then notifies the consumer with the
// chunk's offset and bytes. Under link emulation the notification arrives
// only at the modeled completion of the transfer on the producer's egress
// port, so the caller goes on multiplying while the "transfer" runs. The
// consumer waits for the count (a short spin, then a sleep, with the health
// checks that turn a dead or aborted peer into an error within the
// timeout) and reads the chunk in place through Channel::View (zero copy
// over shared memory: the GEMM or ReduceTree reads it directly).
//
// Reuse safety. A rank overwrites its window only in a later call, and
// every call starts with the agreement exchange, which no rank passes
// before every rank has entered the call, i.e. has returned from the
// previous one, having read everything it was handed. Within a call no
// region is written twice. Counters are cumulative (Channel::Consumed), so
// no reset is ever needed. A call that fails with a communication error
// aborts the world (the counters are then out of step and the world
// unusable, as after any failed collective).
//
// Cost of fused per rank: AllGatherMatmul hands out (n-1) m_r k bytes on
// its port (its shard to each peer) and copies m_r k; MatmulReduceScatter
// (M - m_r) n 4 bytes and no copy; MatmulAllReduce that plus (n-1) m_r n 4
// bytes, and copies (M - m_r) n 4 bytes into C. s chunks per block, so
// n s GEMM calls and n s signals per rank.
//
// GEMMs. Every pipeline multiplies by B packed once per call
// (ops::PackedGemmB): given plain B, oneDNN (and the tiled kernel) re-lay
// all of B out on every call, which made many small chunk GEMMs slower than
// one large one.
//
// Determinism: row blocks of a kOneDNN product (one thread; oneDNN's brgemm
// or the tiled kernel, ops/tiled_gemm.h) are bitwise the rows of the full
// product, and every reduction is ReduceTree over ranks
// (in the collectives or here), so all pipelines and split counts agree bit
// for bit with serial.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "core/reduce.h"
#include "engine/channel.h"
#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/ops.h"
#include "ops/cost_model.h"
#include "ops/fused_common.h"
#include "ops/gemm.h"
#include "trace/recorder.h"

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

// Trace labels "fused s=4" etc.: span strings must outlive the process's
// trace files, so they are made once.
const char* fused::PipelineLabel(Pipeline p, int splits) {
  static const auto labels = [] {
    std::vector<std::string> v;
    for (int i = 0; i < kNumPipelines; ++i)
      for (int s = 0; s <= 16; ++s)
        v.push_back(fmt::format("{} s={}", PipelineName(static_cast<Pipeline>(i)), s));
    return v;
  }();
  return labels[static_cast<int>(p) * 17 + std::clamp(splits, 0, 16)].c_str();
}

namespace {

using fused::ChunkLo;
using fused::LocalChecks;
using fused::PackPipelineSplits;
using fused::Pending;
using fused::Scratch;
using internal::GroupImpl;
using ops::FusedOpKind;

using FusedOp = FusedOpKind;

const char* FusedOpName(FusedOp op) { return ops::FusedOpKindName(op); }

using fused::Fail;
using fused::Str;

// What every rank publishes at the start of a call (fused::ExchangeArgs).
struct ShapeMsg {
  uint64_t op;
  uint64_t dtype;
  uint64_t m;        // AG: m_local; RS/AR: M
  uint64_t k;
  uint64_t n;
  uint64_t m_local;  // RS: the shard rows; others 0
  uint64_t pipeline_splits;  // pipeline << 32 | splits
  uint64_t error;            // 1 if this rank's arguments are invalid
  uint64_t c_null;           // AG: C is null with n > 0 (an error if M > 0)
  uint64_t model_hash;       // cost-model inputs (auto must decide alike)
  uint64_t want_gathered;    // AG: gathered_a requested (the model counts its copy)
};
static_assert(sizeof(ShapeMsg) == 88);

// The validated plan of one call, identical on every rank except `rank`.
struct Plan : fused::PlanBase {
  FusedOp op;
  const char* name = "";
  size_t k = 0, n = 0;
  size_t M = 0;
  std::vector<size_t> rows;  // per rank block rows
  std::vector<size_t> offs;  // per rank block first row
  // The caller's FusedOptions::overlap_work, run where a pipeline would
  // first block.
  fused::OverlapWork* overlap = nullptr;
};

// Validates locally, exchanges, validates globally. Throws on every rank.
Plan MakePlan(const Group& g, FusedOp op, const ShapeMsg& mine_in, const std::string& local_error,
              const FusedOptions& o, fused::OverlapWork& overlap) {
  const char* name = FusedOpName(op);
  ShapeMsg mine = mine_in;
  ops::Environment env;
  if (g.valid()) {
    env = fused::ModelEnvironment(g, o.timeout);
    mine.model_hash = fused::ModelHash(env);
  }
  std::vector<ShapeMsg> all =
      fused::ExchangeArgs(g, name, mine, local_error, &ShapeMsg::error, o.timeout);
  Plan p;
  p.op = op;
  p.name = name;
  p.rank = g.rank();
  p.size = g.size();
  p.overlap = &overlap;
  const ShapeMsg& z = all[0];
  for (int r = 1; r < p.size; ++r) {
    if (all[r].op != z.op) {
      Fail(ErrorCode::kMismatch, name, p.rank,
           std::string("ranks called different operators: rank 0 ") +
               FusedOpName(static_cast<FusedOp>(z.op)) + ", rank " + std::to_string(r) + " " +
               FusedOpName(static_cast<FusedOp>(all[r].op)));
    }
  }
  auto same = [&](const char* what, auto get) { fused::RequireSame(all, name, p.rank, what, get); };
  same("args.dtype", [](const ShapeMsg& m) { return m.dtype; });
  fused::RequireSameSettings(all, name, p.rank);
  if (op == FusedOp::kAllGatherMatmul) {
    same("args.k", [](const ShapeMsg& m) { return m.k; });
  } else {
    same("args.m (rows of A)", [](const ShapeMsg& m) { return m.m; });
    same("args.n (columns of B)", [](const ShapeMsg& m) { return m.n; });
  }
  p.dtype = static_cast<DType>(z.dtype);
  p.esize = DTypeSize(p.dtype);
  p.k = mine.k;
  p.n = mine.n;
  p.rows.resize(p.size);
  p.offs.resize(p.size);
  size_t total = 0, max_n = 0, max_k = 0;
  bool want_gathered = false;
  for (int r = 0; r < p.size; ++r) {
    size_t rows = 0;
    if (op == FusedOp::kAllGatherMatmul) rows = all[r].m;
    else if (op == FusedOp::kMatmulReduceScatter) rows = all[r].m_local;
    else rows = z.m * (r + 1) / p.size - z.m * r / p.size;
    if (total + rows < total) {
      Fail(ErrorCode::kInvalidArgument, name, p.rank,
           "the ranks' row counts add up to more than SIZE_MAX");
    }
    p.offs[r] = total;
    p.rows[r] = rows;
    total += rows;
    max_n = std::max<size_t>(max_n, all[r].n);
    max_k = std::max<size_t>(max_k, all[r].k);
    want_gathered = want_gathered || all[r].want_gathered;
  }
  if (op == FusedOp::kMatmulReduceScatter && total != z.m) {
    std::string list;
    for (int r = 0; r < p.size; ++r) {
      if (r > 0) list.push_back(',');
      list.append(Str(p.rows[r]));
    }
    Fail(ErrorCode::kMismatch, name, p.rank,
         "the ranks' args.m_local (" + list + ") add up to " + Str(total) +
             ", not args.m = " + Str(z.m));
  }
  p.M = op == FusedOp::kAllGatherMatmul ? total : z.m;
  if (op == FusedOp::kAllGatherMatmul) {
    // C [M x n] and the gathered A [M x k] are only known once M is.
    const std::string too_large =
        fused::SizeChecks({{"C (M x n)", {p.M, p.n, sizeof(float)}},
                           {"the gathered A (M x k)", {p.M, p.k, p.esize}}});
    if (!too_large.empty()) {
      Fail(ErrorCode::kInvalidArgument, name, p.rank,
           too_large + " (M = " + Str(p.M) + ", the sum of the ranks' args.m)");
    }
  }
  for (int r = 0; r < p.size; ++r) {
    if (all[r].c_null && p.M > 0) {
      Fail(ErrorCode::kInvalidArgument, name, p.rank,
           r == p.rank ? "args.c is null but M x n = " + Str(p.M * p.n)
                       : "rank " + std::to_string(r) + " passed a null args.c");
    }
  }
  p.pipeline = static_cast<Pipeline>(z.pipeline_splits >> 32);
  p.splits = static_cast<int>(z.pipeline_splits & 0xffffffff);
  if (p.pipeline == Pipeline::kAuto) {
    // Every input below is the same on every rank (the exchanged shapes,
    // and the model's parameters and environment, whose hash was checked),
    // so every rank makes the same choice.
    ops::Problem prob;
    prob.op = op;
    prob.ranks = p.size;
    prob.dtype = p.dtype;
    prob.M = p.M;
    prob.k = max_k;
    prob.n = max_n;
    prob.rows = p.rows;
    prob.gathered_a = want_gathered;
    ops::Choice c = ops::ChoosePipeline(ops::LoadedCostParams(), env, prob);
    p.pipeline = c.pipeline;
    p.splits = c.splits;
  }
  // (One rank runs the serial code whatever was asked: there is nothing to
  // overlap. The report still names the pipeline asked for.)
  fused::FinishPlan(g, o, p);
  return p;
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
  s.pipeline_splits = PackPipelineSplits(o);
  return s;
}

void RunGemm(const Plan& p, size_t m, size_t k, const char* a, const char* b, float* c) {
  if (m == 0 || p.n == 0) return;
  trace::ScopedSpan span(trace::Category::kCompute);
  if (span.on()) {
    span.span().name = "gemm";
    span.span().flops = static_cast<uint64_t>(GemmFlops(m, p.n, k));
  }
  p.gemms.Gemm(m, p.n, k, a, b, DType::kF32, c);
}

// The product of `rows` rows of A with B into dst; zeros when k == 0 (an
// empty sum), which the reductions after it still need as their input.
void GemmOrZero(const Plan& p, size_t rows, const char* a_rows, const char* b, float* dst) {
  if (p.k == 0) std::fill(dst, dst + rows * p.n, 0.0f);
  else RunGemm(p, rows, p.k, a_rows, b, dst);
}

// ---------------------------------------------------------------- channel
// One call of the fused pipeline over the group's channel
// (engine/channel.h): its window of `bytes` per rank, and the waits that
// run the caller's overlap work first and name the missing chunk.
class FusedCall {
 public:
  FusedCall(const Group& g, const Plan& p, size_t bytes)
      : p_(p), ch_(internal::Channel::Of(g)), bytes_(bytes) {
    ch_.Begin(bytes, {p.name, fused::PipelineLabel(p.pipeline, p.splits), p.timeout});
  }

  // This rank's window, and member r's (read only after waiting for it).
  char* Mine() const { return ch_.Window(); }
  const char* Of(int r) const { return ch_.View(r, 0, bytes_); }

  // Tells `dst` that one more chunk of `phase`, `bytes` at `offset` of our
  // window, is ready.
  void Signal(int phase, int dst, size_t offset, size_t bytes) const {
    ch_.Notify(dst, phase, offset, bytes);
  }
  // Whether chunk `j` (0-based, of this call) of `phase` from `src` landed.
  bool Landed(int phase, int src, uint64_t j) const { return ch_.Landed(src, phase, j + 1); }
  // Blocks until chunk j of `phase` from `src` landed, running the overlap
  // work first if it would block.
  void WaitLanded(int phase, int src, uint64_t j) const {
    if (Landed(phase, src, j)) return;
    p_.overlap->Run();
    ch_.Wait(src, phase, j + 1, [&] {
      return fmt::format("chunk {} of {} from rank {} ({} pipeline, phase {})", j + 1,
                         p_.splits, src, PipelineName(p_.pipeline), phase);
    });
  }
  void Consumed(int phase, uint64_t chunks) { ch_.Consumed(phase, chunks); }
  Work Async(std::function<void()> body) const { return ch_.Async(std::move(body)); }

 private:
  const Plan& p_;
  internal::Channel& ch_;
  size_t bytes_;
};

// ---------------------------------------------------------------- AG + GEMM
void FusedAllGatherMatmul(const Group& g, const Plan& p, const char* a_shard, const char* b,
                          float* c, char* ag, bool want_ag, Pending& pend) {
  const int n = p.size, me = p.rank, s = p.splits;
  const size_t row_bytes = p.k * p.esize;
  size_t most = 0;
  for (int r = 0; r < n; ++r) most = std::max(most, p.rows[r] * row_bytes);
  FusedCall call(g, p, most);
  // The progress thread copies our shard into the workspace chunk by chunk
  // and hands chunk j to r+1, r+2, ... in turn (so every port carries chunk
  // j to all peers before chunk j+1: consumers get every shard's first
  // chunks early), while this thread multiplies the own shard.
  const size_t my_rows = p.rows[me];
  // The task holds a copy of `call` (references to the plan, the group and
  // its workspace, which outlive it: a failing call drains it first).
  pend.Add(call.Async([call, a_shard, row_bytes, my_rows, s, n, me] {
    for (int j = 0; j < s; ++j) {
      size_t lo = ChunkLo(my_rows, j, s), hi = ChunkLo(my_rows, j + 1, s);
      const size_t bytes = (hi - lo) * row_bytes;
      if (bytes) std::memcpy(call.Mine() + lo * row_bytes, a_shard + lo * row_bytes, bytes);
      for (int i = 1; i < n; ++i) call.Signal(0, fused::Mod(me + i, n), lo * row_bytes, bytes);
    }
  }));
  RunGemm(p, my_rows, p.k, a_shard, b, c + p.offs[me] * p.n);
  if (want_ag && my_rows) std::memcpy(ag + p.offs[me] * row_bytes, a_shard, my_rows * row_bytes);
  // Chunk j of shard r-1, r-2, ...: the order in which they land.
  for (int j = 0; j < s; ++j) {
    for (int i = 1; i < n; ++i) {
      const int src = fused::Mod(me - i, n);
      size_t lo = ChunkLo(p.rows[src], j, s), hi = ChunkLo(p.rows[src], j + 1, s);
      call.WaitLanded(0, src, j);
      if (hi == lo) continue;
      const char* rows = call.Of(src) + lo * row_bytes;
      const size_t row = p.offs[src] + lo;
      if (want_ag) {
        trace::ScopedSpan span(trace::Category::kComm);
        if (span.on()) span.span().name = "fused_copy";
        std::memcpy(ag + row * row_bytes, rows, (hi - lo) * row_bytes);
        rows = ag + row * row_bytes;
      }
      RunGemm(p, hi - lo, p.k, rows, b, c + row * p.n);
    }
  }
  pend.WaitAll();
  call.Consumed(0, s);
}

void RunAllGatherMatmul(const Group& g, const Plan& p, const char* a_shard, const char* b,
                        float* c, char* ag, bool want_ag, Pending& pend) {
  const int n = p.size, me = p.rank;
  const size_t row_bytes = p.k * p.esize;
  if (n == 1) {  // the shard is the whole A: no communication
    if (want_ag && p.M * row_bytes > 0) std::memcpy(ag, a_shard, p.M * row_bytes);
    RunGemm(p, p.M, p.k, a_shard, b, c);
    return;
  }
  if (p.pipeline == Pipeline::kSerial) {
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
      p.overlap->RunBefore(pend[j]);
      pend[j].Wait();
      for (int r = 0; r < n; ++r) {
        size_t lo = ChunkLo(p.rows[r], j, s), hi = ChunkLo(p.rows[r], j + 1, s);
        size_t row = p.offs[r] + lo;
        RunGemm(p, hi - lo, p.k, ag + row * row_bytes, b, c + row * p.n);
      }
    }
    return;
  }
  FusedAllGatherMatmul(g, p, a_shard, b, c, ag, want_ag, pend);
}

// ---------------------------------------------------------------- GEMM + RS
// Fused reduce-scatter of the product over the blocks of p.rows/p.offs.
// The reduced block of this rank goes to `out` (rows[me] x n). With
// `all_gather` (MatmulAllReduce), `out` is C [M x n] and every reduced chunk
// is also handed to every peer, which copies it into its C.
//
// Window of rank r: the partials it makes for each other rank d, in rank
// order ((M - rows[r]) n floats), then (all_gather) its reduced block
// (rows[r] n floats).
void FusedMatmulReduceScatter(const Group& g, const Plan& p, const char* a, const char* b,
                              float* out, bool all_gather, Pending& pend) {
  const int n = p.size, me = p.rank, s = p.splits;
  const size_t row_bytes = p.k * p.esize;
  const size_t ncol = p.n;
  // Chunk j of a block starts at row chunk_lo(rows, j). For an all-reduce
  // the last chunk is half as tall as the others: the call ends with that
  // chunk's reduction and its hand-off to n - 1 peers, one after another
  // on the owner's port, which nothing overlaps: a shorter last chunk
  // shortens that exposed tail (a third-size one gained nothing more).
  const bool short_tail = all_gather;
  auto chunk_lo = [s, short_tail](size_t rows, int j) -> size_t {
    if (!short_tail) return ChunkLo(rows, j, s);
    return std::min(rows, rows * size_t(2 * j) / size_t(2 * s - 1));
  };
  // part_off(r, d): where rank r keeps its partial for d (in floats).
  auto part_off = [&](int r, int d) {
    size_t off = 0;
    for (int q = 0; q < d; ++q)
      if (q != r) off += p.rows[q] * ncol;
    return off;
  };
  auto reduced_off = [&](int r) { return (p.M - p.rows[r]) * ncol; };
  size_t most = 0;
  for (int r = 0; r < n; ++r)
    most = std::max(most, (all_gather ? p.M : p.M - p.rows[r]) * ncol * sizeof(float));
  FusedCall call(g, p, most);
  float* mine = reinterpret_cast<float*>(call.Mine());
  Scratch<float> own(p.rows[me] * ncol);
  float* my_out = all_gather ? out + p.offs[me] * ncol : out;

  // Progress that never blocks: reduce my chunks whose partials all landed
  // (in order), and (all_gather) copy peers' reduced chunks that landed.
  int reduced = 0;     // my chunks reduced so far
  int computed = 0;    // own-partial chunks computed so far
  std::vector<int> gathered(n, 0);  // chunks of each peer's block copied
  std::vector<const void*> srcs(n);
  auto reduce_chunk = [&](int j) {
    size_t lo = chunk_lo(p.rows[me], j), hi = chunk_lo(p.rows[me], j + 1);
    const size_t elems = (hi - lo) * ncol;
    if (elems > 0) {
      for (int r = 0; r < n; ++r) {
        srcs[r] = r == me ? static_cast<const void*>(own.data() + lo * ncol)
                          : reinterpret_cast<const float*>(call.Of(r)) + part_off(r, me) +
                                lo * ncol;
      }
      float* dst = all_gather ? mine + reduced_off(me) + lo * ncol : my_out + lo * ncol;
      core::ReduceTree(DType::kF32, ReduceOp::kSum, dst, srcs.data(), n, elems, n);
    }
    if (all_gather) {
      for (int i = 1; i < n; ++i) {
        call.Signal(1, fused::Mod(me + i, n), (reduced_off(me) + lo * ncol) * sizeof(float),
                    elems * sizeof(float));
      }
      if (elems) std::memcpy(my_out + lo * ncol, mine + reduced_off(me) + lo * ncol, elems * 4);
    }
  };
  auto copy_gathered = [&](int src, int j) {
    size_t lo = chunk_lo(p.rows[src], j), hi = chunk_lo(p.rows[src], j + 1);
    if (hi == lo) return;
    trace::ScopedSpan span(trace::Category::kComm);
    if (span.on()) span.span().name = "fused_copy";
    std::memcpy(out + (p.offs[src] + lo) * ncol,
                reinterpret_cast<const float*>(call.Of(src)) + reduced_off(src) + lo * ncol,
                (hi - lo) * ncol * sizeof(float));
  };
  auto progress = [&](bool block) {
    while (reduced < computed) {
      bool ready = true;
      for (int r = 0; r < n && ready; ++r) {
        if (r == me) continue;
        if (block) call.WaitLanded(0, r, reduced);
        else ready = call.Landed(0, r, reduced);
      }
      if (!ready) break;
      reduce_chunk(reduced++);
    }
    if (!all_gather) return;
    for (int i = 1; i < n; ++i) {
      const int src = fused::Mod(me - i, n);
      while (gathered[src] < s) {
        if (block) call.WaitLanded(1, src, gathered[src]);
        else if (!call.Landed(1, src, gathered[src])) break;
        copy_gathered(src, gathered[src]++);
      }
    }
  };

  auto own_gemm = [&](int j) {
    size_t lo = chunk_lo(p.rows[me], j), hi = chunk_lo(p.rows[me], j + 1);
    GemmOrZero(p, hi - lo, a + (p.offs[me] + lo) * row_bytes, b, own.data() + lo * ncol);
    computed = j + 1;
    progress(false);
  };
  // Chunk j of the partials for r+1, r+2, ..., each handed over as soon as
  // it is made, then my own chunk. With 2 ranks my own chunk j comes one
  // round late, after the partial of chunk j+1: when it is done the peer's
  // partial for it left a whole GEMM earlier and has landed, so it is
  // reduced (and handed out) at once, and the call ends with the last
  // chunk's reduction and hand-off only, not also the peer's last transfer.
  // With more ranks the delay piles the all-gather hand-offs (to n-1 peers
  // each) into the end of the call instead, so they go in order.
  const bool own_late = n == 2;
  for (int j = 0; j < s; ++j) {
    for (int i = 1; i < n; ++i) {
      const int d = fused::Mod(me + i, n);
      size_t lo = chunk_lo(p.rows[d], j), hi = chunk_lo(p.rows[d], j + 1);
      GemmOrZero(p, hi - lo, a + (p.offs[d] + lo) * row_bytes, b,
                 mine + part_off(me, d) + lo * ncol);
      call.Signal(0, d, (part_off(me, d) + lo * ncol) * sizeof(float),
                  (hi - lo) * ncol * sizeof(float));
      progress(false);
    }
    if (!own_late) own_gemm(j);
    else if (j > 0) own_gemm(j - 1);
  }
  if (own_late) own_gemm(s - 1);
  progress(true);
  pend.WaitAll();
  call.Consumed(0, s);
  if (all_gather) call.Consumed(1, s);
}

void RunMatmulReduceScatter(const Group& g, const Plan& p, const char* a, const char* b,
                            float* c, Pending& pend) {
  const int n = p.size, me = p.rank;
  const size_t row_bytes = p.k * p.esize;
  if (n == 1) {  // the own block is the whole product: no communication
    GemmOrZero(p, p.M, a, b, c);
    return;
  }
  if (p.pipeline == Pipeline::kSerial) {
    Scratch<float> full(p.M * p.n);
    GemmOrZero(p, p.M, a, b, full.data());
    std::vector<size_t> counts(n);
    for (int r = 0; r < n; ++r) counts[r] = p.rows[r] * p.n;
    pend.Add(ReduceScatterV(g, full.data(), c, counts, DType::kF32, ReduceOp::kSum, p.coll));
    pend[0].Wait();
    return;
  }
  if (p.pipeline == Pipeline::kChunked) {
    const int s = p.splits;
    Scratch<float> packed(p.M * p.n);
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
    p.overlap->Run();
    pend.WaitAll();
    return;
  }
  FusedMatmulReduceScatter(g, p, a, b, c, /*all_gather=*/false, pend);
}

// ---------------------------------------------------------------- GEMM + AR
void RunMatmulAllReduce(const Group& g, const Plan& p, const char* a, const char* b, float* c,
                        Pending& pend) {
  const int n = p.size;
  const size_t row_bytes = p.k * p.esize;
  if (p.pipeline == Pipeline::kSerial || n == 1) {
    GemmOrZero(p, p.M, a, b, c);
    if (p.M * p.n > 0 && n > 1) {
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
    p.overlap->Run();
    pend.WaitAll();
    return;
  }
  FusedMatmulReduceScatter(g, p, a, b, c, /*all_gather=*/true, pend);
}

// B as this rank stores it (args.trans_b: B^T, [n x k]): every GEMM of the
// call reads it so, packed straight from that layout (ops::PackedGemmB).
void SetTransB(Plan& p, bool trans_b) {
  if (!trans_b) return;
  p.gemm.trans_b = true;
  p.gemms = ops::PackedGemmBSet(p.dtype, p.gemm);
}

// Runs a dense operator's body under the common completion (fused_common.h).
template <typename Body>
FusedReport Complete(const Group& g, const Plan& p, Body&& body) {
  return fused::CompleteOp(g, p.name, p.pipeline, p.splits,
                           fused::FlopCount(GemmFlops(p.M, p.n, p.k)), *p.overlap,
                           std::forward<Body>(body));
}

// The checks every dense operator makes of its arguments: sizes of A
// (m x k), B (k x n) and the f32 product `c_label` (m x n) within bounds,
// A and B given where they hold elements, and C unless `c_missing` is
// false.
template <typename Args>
std::string DenseChecks(const Args& args, const FusedOptions& options, const char* c_label,
                        bool c_missing) {
  const size_t es = DTypeSize(args.dtype);
  return fused::ArgChecks(
      args.dtype, options,
      {{"A (args.m x args.k)", {args.m, args.k, es}},
       {"B (args.k x args.n)", {args.k, args.n, es}},
       {c_label, {args.m, args.n, sizeof(float)}}},
      {{args.a == nullptr && args.m > 0 && args.k > 0, "args.a"},
       {args.b == nullptr && args.k > 0 && args.n > 0, "args.b"},
       {c_missing, "args.c"}});
}

}  // namespace

FusedReport AllGatherMatmul(const Group& g, const AllGatherMatmulArgs& args,
                            const FusedOptions& options) {
  const FusedOp op = FusedOp::kAllGatherMatmul;
  std::string err = DenseChecks(args, options, "C (args.m x args.n)", false);
  ShapeMsg msg = Msg(op, args.dtype, args.m, args.k, args.n, 0, options);
  msg.want_gathered = args.gathered_a != nullptr;
  msg.c_null = args.c == nullptr && args.n > 0;
  fused::OverlapWork overlap(options.overlap_work);
  Plan p = MakePlan(g, op, msg, err, options, overlap);
  SetTransB(p, args.trans_b);
  return Complete(g, p, [&](Pending& pend) {
    Scratch<char> own;
    char* ag = static_cast<char*>(args.gathered_a);
    // Serial and chunked gather into Ag whatever the caller wants; fused
    // reads peers' shards in place and fills Ag only when asked.
    if (ag == nullptr && p.size > 1 && p.pipeline != Pipeline::kFused) {
      own.Resize(p.M * p.k * p.esize);
      ag = own.data();
    }
    RunAllGatherMatmul(g, p, static_cast<const char*>(args.a), static_cast<const char*>(args.b),
                       args.c, ag, args.gathered_a != nullptr, pend);
  });
}

FusedReport MatmulReduceScatter(const Group& g, const MatmulReduceScatterArgs& args,
                                const FusedOptions& options) {
  const FusedOp op = FusedOp::kMatmulReduceScatter;
  std::string err = DenseChecks(args, options, "the product (args.m x args.n)",
                                args.c == nullptr && args.m_local > 0 && args.n > 0);
  if (err.empty() && args.m_local > args.m)
    err = "args.m_local " + Str(args.m_local) + " exceeds args.m " + Str(args.m);
  fused::OverlapWork overlap(options.overlap_work);
  Plan p = MakePlan(g, op, Msg(op, args.dtype, args.m, args.k, args.n, args.m_local, options), err,
                    options, overlap);
  SetTransB(p, args.trans_b);
  return Complete(g, p, [&](Pending& pend) {
    RunMatmulReduceScatter(g, p, static_cast<const char*>(args.a),
                           static_cast<const char*>(args.b), args.c, pend);
  });
}

FusedReport MatmulAllReduce(const Group& g, const MatmulAllReduceArgs& args,
                            const FusedOptions& options) {
  const FusedOp op = FusedOp::kMatmulAllReduce;
  std::string err = DenseChecks(args, options, "C (args.m x args.n)",
                                args.c == nullptr && args.m > 0 && args.n > 0);
  fused::OverlapWork overlap(options.overlap_work);
  Plan p = MakePlan(g, op, Msg(op, args.dtype, args.m, args.k, args.n, 0, options), err, options,
                    overlap);
  SetTransB(p, args.trans_b);
  return Complete(g, p, [&](Pending& pend) {
    RunMatmulAllReduce(g, p, static_cast<const char*>(args.a), static_cast<const char*>(args.b),
                       args.c, pend);
  });
}

}  // namespace mc2
