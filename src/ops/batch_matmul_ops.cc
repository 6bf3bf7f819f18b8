// AllGatherBatchMatmul (include/mc2/batch_matmul.h): the all-gather + matmul of
// AllGatherMatmul over a batch of independent products.
//
// Works as follows (P ranks, rank r, batch b, s chunks). Rank r's shard is
// [b x m_r x k]; seen as b m_r contiguous rows it is what the collectives
// move, into a rank-major buffer G (rank q's shard at row b M_q, M_q = sum
// of m of ranks < q). Row i of entry e of rank q's shard is row M_q + i of
// gathered entry e, so every GEMM reads G (or the own shard) in place and
// writes its rows of C[e]; only the gathered-A output is re-laid out to
// [b x M x k] (a copy of b M k elements, done only when asked for).
//
//   serial   AllGatherV of the shards into G, lay out G as [b x M x k],
//            then one GEMM of M rows per entry (one of b M rows when B is
//            shared). The baseline: communication, then compute.
//   chunked  chunk j = rows [b m_q j/s, b m_q (j+1)/s) of every shard, one
//            AllGatherV each, all queued at once; the own shard is
//            multiplied first, then chunk j of the other shards once it has
//            arrived, while chunks > j move. A chunk may cover parts of
//            several entries: it is multiplied entry by entry.
//   fused    over the point-to-point channels: every send and receive
//            posted up front, the shard cut into s chunks; rank r sends its
//            shard to r+1, r+2, ... in that order (the p2p engine moves
//            sends in posting order, so its port carries one shard at a
//            time and r-i's shard reaches r at step i), and multiplies its
//            own shard, then chunk j of the shard of rank r-i as soon as it
//            has arrived. No send waits for a receive: a ring whose step i+1
//            was posted when step i arrived paid a wake-up per step, which
//            under emulation on busy cores can take milliseconds. The
//            messages use the engine's internal tag space (engine/channel.h).
//            Under link emulation serial and chunked gather with the ring
//            algorithm, which charges the link (fused_common.h).
// Bytes per rank: (M - m_r) b k in, (P-1) m_r b k out, in every pipeline.
//
// Determinism: with one thread, row i of a kOneDNN product (oneDNN's brgemm
// or the tiled kernel, ops/tiled_gemm.h) does not depend on
// which other rows are computed with it, so every way of cutting the rows
// gives the serial result bit for bit.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/ops.h"
#include "ops/cost_model.h"
#include "ops/fused_common.h"
#include "ops/gemm.h"

namespace mc2 {
namespace {

using fused::ChunkLo;
using fused::OpSpan;
using fused::Pending;
using fused::Str;

constexpr const char* kOpName = "all_gather_batch_matmul";
// The fused ring's messages, in the engine's internal tag space (never a
// user's message, nor another operator's).
constexpr internal::InternalTag kBatchTag = internal::InternalTag::kBatchGather;

struct BatchMsg {
  uint64_t dtype;
  uint64_t batch;
  uint64_t m_local;
  uint64_t k;
  uint64_t n;
  uint64_t b_layout;
  uint64_t pipeline_splits;
  uint64_t c_null;   // C is null with n > 0: an error only if M > 0
  uint64_t link_bw;  // emulated link bytes/s (0: none): auto depends on it
  uint64_t model_hash;  // the operator tuning in effect: auto depends on it
  uint64_t error;
};

struct BatchPlan : fused::PlanBase {
  size_t batch = 0, k = 0, n = 0, M = 0;
  bool shared_b = false;
  std::vector<size_t> rows, offs;  // per rank m_q and M_q
};

BatchPlan MakeBatchPlan(const Group& g, const BatchMsg& mine, const std::string& local_error,
                        const FusedOptions& o) {
  std::vector<BatchMsg> all =
      fused::ExchangeArgs(g, kOpName, mine, local_error, &BatchMsg::error, o.timeout);
  BatchPlan p;
  p.rank = g.rank();
  p.size = g.size();
  auto same = [&](const char* what, auto get) {
    fused::RequireSame(all, kOpName, p.rank, what, get);
  };
  same("args.dtype", [](const BatchMsg& m) { return m.dtype; });
  same("args.batch", [](const BatchMsg& m) { return m.batch; });
  same("args.k", [](const BatchMsg& m) { return m.k; });
  same("args.b_layout (0 per batch, 1 shared)", [](const BatchMsg& m) { return m.b_layout; });
  fused::RequireSameSettings(all, kOpName, p.rank);
  p.dtype = static_cast<DType>(all[0].dtype);
  p.esize = DTypeSize(p.dtype);
  p.batch = all[0].batch;
  p.k = all[0].k;
  p.n = mine.n;
  p.shared_b = all[0].b_layout == static_cast<uint64_t>(BatchB::kShared);
  p.rows.resize(p.size);
  p.offs.resize(p.size);
  size_t max_n = 0;
  bool too_large = false;
  for (int q = 0; q < p.size; ++q) {
    p.offs[q] = p.M;
    p.rows[q] = all[q].m_local;
    too_large = too_large || __builtin_add_overflow(p.M, all[q].m_local, &p.M);
    max_n = std::max<size_t>(max_n, all[q].n);
  }
  // The gathered A and C are only known once M is (every rank fails alike).
  std::string size_err =
      too_large
          ? "M (the sum of the ranks' args.m) overflows size_t"
          : fused::SizeChecks({{"the gathered A (batch x M x k)", {p.batch, p.M, p.k, p.esize}},
                               {"C (batch x M x n)", {p.batch, p.M, max_n, sizeof(float)}}});
  if (!size_err.empty()) fused::Fail(ErrorCode::kInvalidArgument, kOpName, p.rank, size_err);
  // A null C is only known to be an error once M is known; every rank
  // sees every rank's flag, so all fail together.
  for (int q = 0; q < p.size && p.batch * p.M > 0; ++q) {
    if (all[q].c_null) {
      fused::Fail(ErrorCode::kInvalidArgument, kOpName, p.rank,
                  q == p.rank ? "args.c is null but batch x M x n = " + Str(p.batch * p.M * p.n)
                              : "rank " + std::to_string(q) + " passed a null args.c");
    }
  }
  p.pipeline = static_cast<Pipeline>(all[0].pipeline_splits >> 32);
  p.splits = static_cast<int>(all[0].pipeline_splits & 0xffffffff);
  if (p.pipeline == Pipeline::kAuto) {
    // The same inputs on every rank, so the same choice everywhere. A rank's
    // port carries its shard to each of the P - 1 others. Fused rather than
    // chunked: chunked gathers each chunk with a collective whose steps wait
    // on one another, and hides little.
    size_t max_rows = *std::max_element(p.rows.begin(), p.rows.end());
    ops::SplitProblem sp;
    sp.dtype = p.dtype;
    sp.ranks = p.size;
    sp.rows = double(p.batch * p.M);
    sp.n = double(max_n);
    sp.k = double(p.k);
    // A GEMM per entry of each shard (one per shard when B is shared), and
    // one more per chunk where a chunk boundary splits an entry.
    sp.fixed_calls = double(p.size) * (p.shared_b ? 1.0 : double(p.batch));
    sp.calls_per_stage = 1;
    // Whole entries per chunk, or whole chunks per entry: other counts cut
    // entries into two smaller GEMMs.
    sp.align = p.shared_b || p.batch > 16 ? 1 : static_cast<int>(std::max<size_t>(1, p.batch));
    sp.blocks = p.size - 1;
    sp.port_bytes = double(p.size - 1) * p.batch * max_rows * p.k * p.esize;
    sp.link_bytes_per_second = double(all[0].link_bw);
    ops::Choice c = ops::ChooseSplitPipeline(ops::LoadedCostParams(), sp);
    p.pipeline = c.pipeline;
    p.splits = c.splits;
  }
  fused::FinishPlan(g, o, p);
  return p;
}

// What one call works on.
struct BatchArgs {
  const char* a_shard;
  const char* b;
  float* c;
  char* ag;  // gathered A [batch x M x k], or null
  char* g;   // rank-major gather buffer: rank q's shard at row batch * offs[q]
};

// Rows [lo, hi) of rank q's shard (batch * rows[q] rows at `src`): their
// products into C, entry by entry, and their copy into the gathered A.
void MultiplyRows(const BatchPlan& p, const BatchArgs& x, int q, const char* src, size_t lo,
                  size_t hi) {
  const size_t m = p.rows[q];
  if (hi <= lo || m == 0) return;
  const size_t row_bytes = p.k * p.esize;
  for (size_t e = lo / m; e * m < hi; ++e) {
    size_t i0 = std::max(lo, e * m) - e * m, i1 = std::min(hi, (e + 1) * m) - e * m;
    size_t rows = i1 - i0;
    const char* a = src + (e * m + i0) * row_bytes;
    float* c = x.c + (e * p.M + p.offs[q] + i0) * p.n;
    if (p.n > 0) {
      OpSpan span("all_gather_batch_matmul.gemm", trace::Category::kCompute, p.pipeline,
                  static_cast<uint64_t>(GemmFlops(rows, p.n, p.k)));
      if (p.k == 0) {
        std::fill(c, c + rows * p.n, 0.0f);
      } else {
        const char* b = x.b + (p.shared_b ? 0 : e * p.k * p.n * p.esize);
        p.gemms.Gemm(rows, p.n, p.k, a, b, DType::kF32, c);
      }
    }
    // (When batch is 1 the gather buffer is the gathered A: nothing to copy.)
    char* ag_rows = x.ag ? x.ag + (e * p.M + p.offs[q] + i0) * row_bytes : nullptr;
    if (ag_rows && ag_rows != a && rows * row_bytes > 0) {
      std::memcpy(ag_rows, a, rows * row_bytes);
    }
  }
}

void RunSerial(const Group& g, const BatchPlan& p, const BatchArgs& x, Pending& pend) {
  const int P = p.size;
  const size_t row_bytes = p.k * p.esize;
  std::vector<size_t> counts(P), displs(P);
  for (int q = 0; q < P; ++q) {
    counts[q] = p.batch * p.rows[q] * row_bytes;
    displs[q] = p.batch * p.offs[q] * row_bytes;
  }
  pend.Add(AllGatherV(g, x.a_shard, x.g, counts, displs, DType::kU8, p.coll));
  {
    OpSpan wait("all_gather_batch_matmul.wait", trace::Category::kWait, p.pipeline);
    pend[0].Wait();
  }
  // Lay the gathered rows out as [batch x M x k] (in place when batch is 1:
  // then G is that layout already), then the baseline GEMMs.
  if (p.batch > 1) {
    OpSpan copy("all_gather_batch_matmul.layout", trace::Category::kHost, p.pipeline);
    for (int q = 0; q < P; ++q) {
      for (size_t e = 0; e < p.batch && p.rows[q] * row_bytes > 0; ++e) {
        std::memcpy(x.ag + (e * p.M + p.offs[q]) * row_bytes,
                    x.g + (p.batch * p.offs[q] + e * p.rows[q]) * row_bytes, p.rows[q] * row_bytes);
      }
    }
  }
  if (p.n == 0 || p.M == 0) return;
  const size_t entries = p.shared_b ? 1 : p.batch;
  const size_t rows = p.shared_b ? p.batch * p.M : p.M;
  for (size_t e = 0; e < entries; ++e) {
    OpSpan span("all_gather_batch_matmul.gemm", trace::Category::kCompute, p.pipeline,
                static_cast<uint64_t>(GemmFlops(rows, p.n, p.k)));
    float* c = x.c + e * p.M * p.n;
    if (p.k == 0) {
      std::fill(c, c + rows * p.n, 0.0f);
      continue;
    }
    p.gemms.Gemm(rows, p.n, p.k, x.ag + e * p.M * row_bytes, x.b + e * p.k * p.n * p.esize,
                 DType::kF32, c);
  }
}

void RunChunked(const Group& g, const BatchPlan& p, const BatchArgs& x, Pending& pend) {
  const int P = p.size, me = p.rank, s = p.splits;
  const size_t row_bytes = p.k * p.esize;
  std::vector<int> work_of(s, -1);  // index in pend of chunk j's gather
  for (int j = 0; j < s; ++j) {
    std::vector<size_t> counts(P), displs(P);
    bool empty = true;
    for (int q = 0; q < P; ++q) {
      size_t rows = p.batch * p.rows[q];
      size_t lo = ChunkLo(rows, j, s), hi = ChunkLo(rows, j + 1, s);
      counts[q] = (hi - lo) * row_bytes;
      displs[q] = (p.batch * p.offs[q] + lo) * row_bytes;
      if (hi > lo) empty = false;
    }
    // Every rank sees the same counts, so every rank skips the same chunks.
    if (empty) continue;
    work_of[j] = static_cast<int>(pend.size());
    size_t my_lo = ChunkLo(p.batch * p.rows[me], j, s);
    pend.Add(AllGatherV(g, x.a_shard + my_lo * row_bytes, x.g, counts, displs, DType::kU8, p.coll));
  }
  // With one batch entry the gather buffer is the gathered A, and the
  // gathers above write our own rows into it: copying them here as well
  // would race with them (same bytes, but concurrent writes).
  BatchArgs own = x;
  if (own.ag == x.g) own.ag = nullptr;
  MultiplyRows(p, own, me, x.a_shard, 0, p.batch * p.rows[me]);
  for (int j = 0; j < s; ++j) {
    if (work_of[j] < 0) continue;
    {
      OpSpan wait("all_gather_batch_matmul.wait", trace::Category::kWait, p.pipeline);
      pend[work_of[j]].Wait();
    }
    for (int q = 0; q < P; ++q) {
      if (q == me) continue;
      size_t rows = p.batch * p.rows[q];
      MultiplyRows(p, x, q, x.g + p.batch * p.offs[q] * row_bytes, ChunkLo(rows, j, s),
                   ChunkLo(rows, j + 1, s));
    }
  }
  pend.WaitAll();
}

void RunFused(const Group& g, const BatchPlan& p, const BatchArgs& x, Pending& pend) {
  const int P = p.size, me = p.rank, s = p.splits;
  const size_t row_bytes = p.k * p.esize;
  auto shard_of = [&](int q) { return x.g + p.batch * p.offs[q] * row_bytes; };
  const internal::Channel& ch = internal::Channel::Of(g);
  // recv[i][j]: chunk j of the shard of step i (rank r-i), as flat rows.
  std::vector<std::vector<Work>> recv(P, std::vector<Work>(s));
  for (int i = 1; i < P; ++i) {
    int src = fused::Mod(me - i, P);
    size_t rows = p.batch * p.rows[src];
    for (int j = 0; j < s; ++j) {
      size_t lo = ChunkLo(rows, j, s), hi = ChunkLo(rows, j + 1, s);
      if ((hi - lo) * row_bytes == 0) continue;
      recv[i][j] = ch.Recv(shard_of(src) + lo * row_bytes, (hi - lo) * row_bytes, src, kBatchTag);
      pend.Add(recv[i][j]);
    }
  }
  const size_t my_rows = p.batch * p.rows[me];
  auto post_send = [&](int i) {
    for (int j = 0; j < s; ++j) {
      size_t lo = ChunkLo(my_rows, j, s), hi = ChunkLo(my_rows, j + 1, s);
      if ((hi - lo) * row_bytes == 0) continue;
      pend.Add(ch.Send(x.a_shard + lo * row_bytes, (hi - lo) * row_bytes, fused::Mod(me + i, P),
                       kBatchTag));
    }
  };
  for (int i = 1; i < P; ++i) post_send(i);
  MultiplyRows(p, x, me, x.a_shard, 0, my_rows);
  for (int i = 1; i < P; ++i) {
    int src = fused::Mod(me - i, P);
    size_t rows = p.batch * p.rows[src];
    for (int j = 0; j < s; ++j) {
      {
        OpSpan wait("all_gather_batch_matmul.wait", trace::Category::kWait, p.pipeline);
        recv[i][j].Wait();
      }
      MultiplyRows(p, x, src, shard_of(src), ChunkLo(rows, j, s), ChunkLo(rows, j + 1, s));
    }
  }
  pend.WaitAll();
}

}  // namespace

FusedReport AllGatherBatchMatmul(const Group& g, const AllGatherBatchMatmulArgs& args,
                                 const FusedOptions& options) {
  // The fields under local names (references, not a structured binding:
  // clang 14 lets no lambda capture one).
  const auto& a_shard = args.a;
  const auto& b = args.b;
  const auto& c = args.c;
  const auto& m_local = args.m;
  const auto& k = args.k;
  const auto& n = args.n;
  const auto& dtype = args.dtype;
  const auto& batch = args.batch;
  const auto& b_layout = args.b_layout;
  const auto& gathered_a = args.gathered_a;
  const bool shared = b_layout == BatchB::kShared;
  const size_t es = DTypeSize(dtype);
  std::string err =
      fused::ArgChecks(dtype, options,
                       {{"A (args.batch x args.m x args.k)", {batch, m_local, k, es}},
                        {"B (args.batch x args.k x args.n)", {shared ? 1 : batch, k, n, es}},
                        {"C (args.batch x args.m x args.n)", {batch, m_local, n, sizeof(float)}}},
                       {{a_shard == nullptr && batch > 0 && m_local > 0 && k > 0, "args.a"},
                        {b == nullptr && (shared || batch > 0) && k > 0 && n > 0, "args.b"}});
  if (err.empty() && b_layout != BatchB::kPerBatch && !shared) {
    err = "args.b_layout must be BatchB::kPerBatch or BatchB::kShared";
  }
  BatchMsg mine{};
  mine.dtype = static_cast<uint64_t>(dtype);
  mine.batch = batch;
  mine.m_local = m_local;
  mine.k = k;
  mine.n = n;
  mine.b_layout = static_cast<uint64_t>(b_layout);
  mine.pipeline_splits = fused::PackPipelineSplits(options);
  mine.c_null = c == nullptr && n > 0;
  if (g.valid()) {
    const ops::Environment env = fused::ModelEnvironment(g, options.timeout);
    mine.link_bw = static_cast<uint64_t>(env.link_bytes_per_second);
    mine.model_hash = fused::ModelHash(env);
  }
  BatchPlan p = MakeBatchPlan(g, mine, err, options);
  fused::OverlapWork overlap(options.overlap_work);
  const auto flops = fused::FlopCount(GemmFlops(p.batch, p.M, 1) * p.n * p.k);
  return fused::CompleteOp(
      g, kOpName, p.pipeline, p.splits, flops, overlap, [&](Pending& pend) {
        const size_t total_bytes = p.batch * p.M * p.k * p.esize;
        fused::Scratch<char> own_ag, own_g;
        BatchArgs x{static_cast<const char*>(a_shard), static_cast<const char*>(b), c,
                    static_cast<char*>(gathered_a), nullptr};
        // Nothing to multiply or to gather on any rank (the plan is agreed):
        // done at once, however many empty entries the batch has.
        const bool no_rows = p.batch == 0 || p.M == 0;
        if (no_rows || (p.n == 0 && p.k == 0)) return;
        if (p.size == 1) {  // the shard is the whole A: no communication
          MultiplyRows(p, x, 0, x.a_shard, 0, p.batch * p.rows[0]);
          return;
        }
        // Serial always lays the gathered A out (its GEMMs read that layout);
        // when batch is 1, G already is that layout and is used for both.
        if (x.ag == nullptr && p.pipeline == Pipeline::kSerial) {
          own_ag.Resize(total_bytes);
          x.ag = own_ag.data();
        }
        if (p.batch == 1 && x.ag != nullptr) {
          x.g = x.ag;
        } else {
          own_g.Resize(total_bytes);
          x.g = own_g.data();
        }
        if (p.pipeline == Pipeline::kSerial) {
          RunSerial(g, p, x, pend);
        } else if (p.pipeline == Pipeline::kChunked) {
          RunChunked(g, p, x, pend);
        } else {
          RunFused(g, p, x, pend);
        }
      });
}

}  // namespace mc2
