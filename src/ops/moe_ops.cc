// Mixture-of-experts operators (include/mc2/ops.h): MoeRoute, AllToAllMatmul
// (dispatch + expert GEMM) and MatmulAllToAll (expert GEMM + combine).
//
// Works as follows (P ranks, rank r, E/P local experts, s chunks).
//
// MoeRoute all-gathers every rank's per-expert slot counts, so every rank
// knows the whole P x E count matrix, hence how many rows go from any rank
// to any other and to which expert, before any token moves (DeepEP's
// "layout" / "notify" step). It also sorts the rank's routed slots by
// expert (a stable counting sort): the dispatch order.
//
// Three row orders appear below:
//   send order     the sender's routed slots sorted by expert: the rows for
//                  rank q form block q, within it sorted by local expert.
//   source-major   on an expert rank, block p holds the rows from rank p,
//                  in rank p's send order (what an all-to-all delivers).
//   expert-grouped the user-visible order: by local expert, then source
//                  rank, then the source's slot order.
// The sub-block (p, le) of rows from rank p for expert le is contiguous in
// both of the last two, so a GEMM can read it in one and write it in the
// other: the pipelines multiply sub-blocks (or parts of them) in place and
// never sort rows, except serial, which is the classic sequence (all-to-all,
// sort by expert, one GEMM per expert, and the reverse for the combine).
//
// Every pipeline moves rows over the engine's two-sided messages in its
// internal tag space (engine/channel.h: Channel::Send / Recv, never matched
// by a user's Recv), one message per (peer, chunk), so that they all pay
// for the same path, and so that link emulation, which charges
// point-to-point chunks but not the direct all-to-all collective
// (docs/link-emulation.md), times them alike.
//
// AllToAllMatmul (x [T x d] -> y [R x h] expert-grouped):
//   pack      x rows in send order into Xs (S rows: one copy of the routed
//             tokens, as every all-to-all dispatch makes).
//   serial    the all-to-all-v (every block posted, all waited for) into Xr
//             (source-major), sort Xr by expert, one GEMM per expert.
//   chunked   block (r -> q) cut into s chunks for every pair, every chunk
//             posted at once (messages to one peer move in posting order,
//             so chunk j of every block before chunk j+1); the own block is
//             multiplied first (it needs no transfer), then chunk j of every
//             other block as it arrives, while chunks > j move.
//   fused     every block cut into s chunks, every receive posted up
//             front; each rank sends its blocks one at a time, the busiest
//             receiver's (most expert rows) first, so each egress port
//             carries one block at a time (posting all sends at once would
//             interleave them and make every block arrive late) and the
//             rank whose GEMMs are longest gets its rows earliest. A rank
//             multiplies its own block first, then the chunks as they
//             arrive, the earliest due first. (A ring order, block r+i at
//             step i, makes the busiest rank wait for rows from ranks that
//             reach it late when experts are skewed.)
// MatmulAllToAll (hidden [R x h] expert-grouped -> out [T x d]):
//   serial    one GEMM per expert, sort to source-major, the all-to-all-v
//             back to send order (Yr), combine.
//   chunked   for j: chunk j of every block for another rank is multiplied,
//             then sent (it moves while chunk j+1 is multiplied); the own
//             block last, straight into Yr.
//   fused     every block cut into s chunks, every receive posted up
//             front; chunk j of the block for rank r+1, r+2, ... multiplied
//             and sent (it moves while the next is multiplied); the own
//             block last, straight into Yr.
//   combine   out[t] = sum over j of probs[t, j] * Yr[row of slot (t, j)],
//             j ascending, in f32.
// MoeMlp (x [T x d] -> out [T x d]: dispatch, per row GEMM 1, act, GEMM 2,
// combine; one call, so a row can start home while others arrive):
//   serial    the dispatch's serial sequence, act on every row, the
//             combine's serial sequence.
//   chunked   every dispatch chunk posted at once (as AllToAllMatmul's
//             chunked); chunk j of every block as it arrives: both GEMMs,
//             then sent straight back; the own rows in s + 1 parts, one
//             first, one after each round of chunks.
//   fused     AllToAllMatmul's fused dispatch (RunFusedDispatch); each
//             chunk's results sent back as soon as its GEMMs are done; the
//             own rows in s parts, one whenever no chunk has arrived, the
//             rest at the end: other ranks' rows go first, as their
//             results must travel and the own rows need no transfer
//             (own rows first, as the dispatch does, would hold every
//             return behind the own GEMMs).
//             The chunks of one block are done in order, as the owner
//             matches them in order.
//   In both, the combine's receives are all posted up front.
// Bytes per rank: the routed rows, once each way, d elements of dtype each
// way, in every pipeline. The expert GEMM accumulates in f32; for bf16
// operands its rows are rounded to bf16 to travel back (as DeepEP's combine
// sends bf16), which halves the combine's bytes: with f32 rows it carried
// two thirds of the traffic, and at 4 ranks its transfers outlasted the
// GEMMs they were to hide behind.
//
// Determinism: every pipeline computes each output row with the same GEMM
// shape (k, n, the same expert's weights); with one thread a oneDNN row
// does not depend on the other rows computed with it, and the combine sums
// in a fixed order, so all pipelines and split counts agree bit for bit.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/reduce.h"
#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/ops.h"
#include "ops/cost_model.h"
#include "ops/fused_common.h"
#include "ops/gemm.h"

namespace mc2 {

size_t MoeRouting::expert_rows(int local_expert) const {
  size_t rows = 0;
  const size_t E = static_cast<size_t>(num_experts);
  if (local_expert < 0 || local_expert >= experts_per_rank || counts.size() != ranks * E) return 0;
  for (int p = 0; p < ranks; ++p) {
    rows += counts[p * E + static_cast<size_t>(rank) * experts_per_rank + local_expert];
  }
  return rows;
}

size_t MoeRouting::num_received() const {
  size_t rows = 0;
  for (int le = 0; le < experts_per_rank; ++le) rows += expert_rows(le);
  return rows;
}

namespace {

using fused::ChunkLo;
using fused::OpSpan;
using fused::Pending;
using fused::Str;

constexpr const char* kRouteName = "moe_route";
constexpr const char* kDispatchName = "all_to_all_matmul";
constexpr const char* kCombineName = "matmul_all_to_all";
constexpr const char* kMlpName = "moe_mlp";
// Tags of the dispatch and combine messages (every pipeline), in the
// engine's internal tag space: never a user's message.
constexpr internal::InternalTag kDispatchTag = internal::InternalTag::kMoeDispatch;
constexpr internal::InternalTag kCombineTag = internal::InternalTag::kMoeCombine;

uint64_t Fnv1a(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 1099511628211ull;
  }
  return h;
}

// A hash of what every rank's routing must agree on.
uint64_t RoutingFingerprint(int ranks, int num_experts, int topk,
                            const std::vector<size_t>& counts) {
  uint64_t h = 14695981039346656037ull;
  h = Fnv1a(h, uint64_t(ranks));
  h = Fnv1a(h, uint64_t(num_experts));
  h = Fnv1a(h, uint64_t(topk));
  for (size_t c : counts) h = Fnv1a(h, c);
  return h;
}

struct RouteMsg {
  uint64_t num_experts;
  uint64_t topk;
  uint64_t num_tokens;
  uint64_t error;
};

}  // namespace

MoeRouting MoeRoute(const Group& g, const int32_t* expert_ids, size_t num_tokens, int topk,
                    int num_experts, std::chrono::nanoseconds timeout) {
  std::string err;
  const int P = g.valid() ? g.size() : 1;
  if (num_experts < 1 || num_experts % P != 0) {
    err = "num_experts (" + std::to_string(num_experts) +
          ") must be a positive multiple of the group size (" + std::to_string(P) + ")";
  } else if (topk < 1) {
    err = "topk must be >= 1, not " + std::to_string(topk);
  } else if (std::string e =
                 fused::SizeChecks({{"expert_ids (num_tokens x topk)",
                                     {num_tokens, static_cast<size_t>(topk), sizeof(int32_t)}}});
             !e.empty()) {
    err = e;
  } else if (expert_ids == nullptr && num_tokens > 0) {
    err = "expert_ids is null but num_tokens is " + Str(num_tokens);
  }
  const size_t slots = err.empty() ? num_tokens * static_cast<size_t>(topk) : 0;
  std::vector<uint64_t> mine(err.empty() ? num_experts : 0, 0);
  for (size_t s = 0; s < slots; ++s) {
    int32_t e = expert_ids[s];
    if (e < -1 || e >= num_experts) {
      err = "expert_ids[" + Str(s) + "] = " + std::to_string(e) + " is outside [-1, " +
            std::to_string(num_experts) + ")";
      break;
    }
    if (e >= 0) mine[e]++;
  }
  RouteMsg msg{uint64_t(std::max(num_experts, 0)), uint64_t(std::max(topk, 0)), num_tokens, 0};
  std::vector<RouteMsg> all =
      fused::ExchangeArgs(g, kRouteName, msg, err, &RouteMsg::error, timeout);
  fused::RequireSame(all, kRouteName, g.rank(), "num_experts",
                     [](const RouteMsg& m) { return m.num_experts; });
  fused::RequireSame(all, kRouteName, g.rank(), "topk", [](const RouteMsg& m) { return m.topk; });

  MoeRouting r;
  r.rank = g.rank();
  r.ranks = P;
  r.num_experts = num_experts;
  r.experts_per_rank = num_experts / P;
  r.topk = topk;
  r.num_tokens = num_tokens;
  if (P == 1) {
    r.counts.assign(mine.begin(), mine.end());  // one rank: its counts are the matrix
  } else {
    std::vector<uint64_t> matrix(size_t(P) * num_experts);
    CollectiveOptions co;
    co.timeout = timeout;
    AllGather(g, mine.data(), matrix.data(), mine.size(), DType::kI64, co).Wait();
    r.counts.assign(matrix.begin(), matrix.end());
  }
  // Stable counting sort of the routed slots by expert.
  std::vector<size_t> next(num_experts + 1, 0);
  for (int e = 0; e < num_experts; ++e) next[e + 1] = next[e] + mine[e];
  r.send_slots.resize(next[num_experts]);
  for (size_t s = 0; s < slots; ++s) {
    if (expert_ids[s] >= 0) r.send_slots[next[expert_ids[s]]++] = s;
  }
  r.fingerprint = RoutingFingerprint(P, num_experts, topk, r.counts);
  return r;
}

namespace {

// What every rank publishes at the start of a dispatch or combine.
struct MoeMsg {
  uint64_t op;  // 1 dispatch, 2 combine, 3 MLP
  uint64_t dtype;
  uint64_t d;
  uint64_t h;
  uint64_t h2;  // the MLP's second hidden width (0 for the others)
  uint64_t num_experts;
  uint64_t topk;
  uint64_t fingerprint;
  uint64_t pipeline_splits;
  uint64_t link_bw;  // emulated link bytes/s (0: none): auto depends on it
  uint64_t model_hash;  // the operator tuning in effect: auto depends on it
  uint64_t error;
};

// Checks a routing against the group and itself; "" if usable.
std::string CheckRouting(const Group& g, const MoeRouting& r) {
  if (!g.valid()) return {};
  if (r.ranks != g.size() || r.rank != g.rank()) {
    return "the routing was made for rank " + std::to_string(r.rank) + " of " +
           std::to_string(r.ranks) + ", not rank " + std::to_string(g.rank()) + " of " +
           std::to_string(g.size()) + " (use MoeRoute on this group)";
  }
  const size_t E = static_cast<size_t>(std::max(r.num_experts, 0));
  if (r.num_experts < 1 || r.topk < 1 || r.experts_per_rank * r.ranks != r.num_experts ||
      r.counts.size() != r.ranks * E) {
    return "the routing is malformed (use MoeRoute)";
  }
  size_t sent = 0;
  for (size_t e = 0; e < E; ++e) sent += r.counts[r.rank * E + e];
  if (sent != r.send_slots.size()) {
    return "the routing is malformed: send_slots has " + Str(r.send_slots.size()) +
           " entries, its counts say " + Str(sent);
  }
  const size_t slots = r.num_tokens * r.topk;
  for (size_t s : r.send_slots) {
    if (s >= slots) return "the routing is malformed: slot " + Str(s) + " >= T x topk";
  }
  return {};
}

uint64_t OpCode(const char* op) {
  return op == kDispatchName ? 1 : op == kCombineName ? 2 : 3;
}
const char* OpOfCode(uint64_t code) {
  return code == 1 ? kDispatchName : code == 2 ? kCombineName : kMlpName;
}

// One call's plan and the row layout of this rank (see the top comment).
struct MoePlan : fused::PlanBase {
  const char* op;
  int El = 0;  // local experts
  size_t E = 0;
  // Both directions move rows of dtype: the combine's expert products are
  // rounded to bf16 for bf16 operands (see the top of this file).
  // h: the hidden width (the MLP's first GEMM's); h2: the MLP's second.
  size_t d = 0, h = 0, h2 = 0;
  // Expert side: sub-block (p, le) has in_cnt[p El + le] rows, at row
  // in_src[p El + le] in source-major order and in_exp[p El + le] in
  // expert-grouped order; block p has in_blk[p] rows from row in_blk_off[p].
  std::vector<size_t> in_cnt, in_src, in_exp, in_blk, in_blk_off;
  size_t R = 0;
  // Token side: block q (for rank q) has out_blk[q] rows from out_blk_off[q]
  // in send order.
  std::vector<size_t> out_blk, out_blk_off;
  size_t S = 0;
  // Every rank's view: flow[a P + b] rows go from rank a to rank b's
  // experts; load[b] rows in all go to rank b's experts.
  std::vector<size_t> flow, load;
};

MoePlan MakeMoePlan(const Group& g, const char* op, const MoeRouting& r, DType dtype, size_t d,
                    size_t h, const std::string& local_error, const FusedOptions& o,
                    size_t h2 = 0) {
  MoeMsg mine{};
  mine.op = OpCode(op);
  mine.dtype = static_cast<uint64_t>(dtype);
  mine.d = d;
  mine.h = h;
  mine.h2 = h2;
  mine.num_experts = static_cast<uint64_t>(std::max(r.num_experts, 0));
  mine.topk = static_cast<uint64_t>(std::max(r.topk, 0));
  // Recomputed, not taken from the routing: a routing whose counts were
  // changed on one rank must fail everywhere, not leave messages of the
  // wrong size in flight.
  mine.fingerprint =
      local_error.empty() ? RoutingFingerprint(r.ranks, r.num_experts, r.topk, r.counts) : 0;
  mine.pipeline_splits = fused::PackPipelineSplits(o);
  if (g.valid()) {
    const ops::Environment env = fused::ModelEnvironment(g);
    mine.link_bw = static_cast<uint64_t>(env.link_bytes_per_second);
    mine.model_hash = fused::ModelHash(env);
  }
  const ops::CostParams& params = ops::LoadedCostParams();
  std::vector<MoeMsg> all =
      fused::ExchangeArgs(g, op, mine, local_error, &MoeMsg::error, o.timeout);
  MoePlan p;
  p.op = op;
  p.rank = g.rank();
  p.size = g.size();
  for (size_t q = 1; q < all.size(); ++q) {
    if (all[q].op != all[0].op) {
      fused::Fail(ErrorCode::kMismatch, op, p.rank,
                  "ranks called different operators: rank 0 " +
                      std::string(OpOfCode(all[0].op)) + ", rank " + std::to_string(q) + " " +
                      OpOfCode(all[q].op));
    }
  }
  auto same = [&](const char* what, auto get) { fused::RequireSame(all, op, p.rank, what, get); };
  same("dtype", [](const MoeMsg& m) { return m.dtype; });
  same("d (model dimension)", [](const MoeMsg& m) { return m.d; });
  same(op == kMlpName ? "h1 (w1's columns)" : "h (expert hidden dimension)",
       [](const MoeMsg& m) { return m.h; });
  same("h2 (w2's rows)", [](const MoeMsg& m) { return m.h2; });
  same("num_experts", [](const MoeMsg& m) { return m.num_experts; });
  same("topk", [](const MoeMsg& m) { return m.topk; });
  same("routing fingerprint (routings of different batches?)",
       [](const MoeMsg& m) { return m.fingerprint; });
  fused::RequireSameSettings(all, op, p.rank);

  const int P = p.size, me = p.rank;
  p.dtype = dtype;
  p.esize = DTypeSize(dtype);
  p.d = d;
  p.h = h;
  p.h2 = h2;
  p.E = static_cast<size_t>(r.num_experts);
  p.El = r.experts_per_rank;
  const size_t El = static_cast<size_t>(p.El);
  p.in_cnt.resize(P * El);
  p.in_src.resize(P * El);
  p.in_exp.resize(P * El);
  p.in_blk.assign(P, 0);
  p.in_blk_off.resize(P);
  p.out_blk.assign(P, 0);
  p.out_blk_off.resize(P);
  for (int q = 0; q < P; ++q) {
    p.in_blk_off[q] = p.R;
    for (size_t le = 0; le < El; ++le) {
      size_t c = r.counts[q * p.E + me * El + le];
      p.in_cnt[q * El + le] = c;
      p.in_src[q * El + le] = p.R;
      p.R += c;
      p.in_blk[q] += c;
    }
    p.out_blk_off[q] = p.S;
    for (size_t le = 0; le < El; ++le) p.out_blk[q] += r.counts[me * p.E + q * El + le];
    p.S += p.out_blk[q];
  }
  p.flow.assign(size_t(P) * P, 0);
  p.load.assign(P, 0);
  for (int a = 0; a < P; ++a) {
    for (int b = 0; b < P; ++b) {
      for (size_t le = 0; le < El; ++le) p.flow[a * P + b] += r.counts[a * p.E + b * El + le];
      p.load[b] += p.flow[a * P + b];
    }
  }
  size_t at = 0;
  for (size_t le = 0; le < El; ++le) {
    for (int q = 0; q < P; ++q) {
      p.in_exp[q * El + le] = at;
      at += p.in_cnt[q * El + le];
    }
  }
  p.pipeline = static_cast<Pipeline>(all[0].pipeline_splits >> 32);
  p.splits = static_cast<int>(all[0].pipeline_splits & 0xffffffff);
  if (p.pipeline == Pipeline::kAuto) {
    // From the count matrix, d, h and the link: the same on every rank. The
    // busiest rank's GEMM rows (load) and port bytes (the rows it sends to
    // others: flow out in the dispatch, flow in for the combine; both
    // directions move rows in dtype; the MLP both: its dispatch and its
    // combine share the port, and it runs two GEMMs per row).
    const bool dispatch = op == kDispatchName, mlp = op == kMlpName;
    double rows = 0, port = 0;
    for (int a = 0; a < P; ++a) {
      double out = 0;
      for (int b = 0; b < P; ++b) {
        if (b == a) continue;
        if (dispatch || mlp) out += p.flow[a * P + b];
        if (!dispatch || mlp) out += p.flow[b * P + a];
      }
      rows = std::max(rows, double(p.load[a]));
      port = std::max(port, out * d * p.esize);
    }
    // Fused rather than chunked: it sends one block per port at a time, so
    // the first blocks arrive early. Calls: a GEMM per local expert per
    // chunk.
    ops::SplitProblem sp;
    sp.dtype = dtype;
    sp.ranks = P;
    sp.rows = rows;
    // The MLP's two GEMMs (rows x d x h, rows x h2 x d) have the flops of
    // one rows x d x (h + h2), in twice the calls.
    sp.n = double(h + (mlp ? h2 : 0));
    sp.k = double(d);
    sp.fixed_calls = (mlp ? 2 : 1) * p.El;
    sp.calls_per_stage = (mlp ? 2 : 1) * p.El;
    sp.exposed_stages = mlp ? 2 : 1;
    sp.blocks = P - 1;
    sp.port_bytes = port;
    sp.link_bytes_per_second = double(all[0].link_bw);
    ops::Choice c = ops::ChooseSplitPipeline(params, sp);
    p.pipeline = c.pipeline;
    p.splits = c.splits;
  }
  fused::FinishPlan(g, o, p);
  return p;
}

// One direction of an all-to-all-v over the point-to-point channels: the
// rows of `rows[q]` starting at row `first[q]` of `base` go to (or come from)
// every other rank q. Chunk j of s posts rows [ChunkLo(rows, j, s),
// ChunkLo(rows, j + 1, s)) of each block, in ring order (to r+1, r+2, ...;
// from r-1, r-2, ...). Both ends compute the same sizes from the routing,
// so empty messages are skipped alike. Returns the posted works per rank.
std::vector<Work> PostBlocks(const Group& g, const MoePlan& p, bool send, internal::InternalTag tag,
                             char* base, const std::vector<size_t>& rows,
                             const std::vector<size_t>& first, size_t row_bytes, int j, int s,
                             Pending& pend) {
  std::vector<Work> works(p.size);
  for (int i = 1; i < p.size; ++i) {
    int q = fused::Mod(send ? p.rank + i : p.rank - i, p.size);
    size_t lo = ChunkLo(rows[q], j, s), hi = ChunkLo(rows[q], j + 1, s);
    if ((hi - lo) * row_bytes == 0) continue;
    char* at = base + (first[q] + lo) * row_bytes;
    works[q] = send ? internal::Channel::Of(g).Send(at, (hi - lo) * row_bytes, q, tag)
                    : internal::Channel::Of(g).Recv(at, (hi - lo) * row_bytes, q, tag);
    pend.Add(works[q]);
  }
  return works;
}

// rows x n (c_type: f32, or bf16 rounded from f32 sums) = A (rows x k,
// dtype) * W (k x n); zeros when k == 0.
void ExpertGemm(const MoePlan& p, const char* name, size_t rows, size_t n, size_t k, const char* a,
                const char* w, void* c, DType c_type = DType::kF32) {
  if (rows == 0 || n == 0) return;
  OpSpan span(name, trace::Category::kCompute, p.pipeline,
              static_cast<uint64_t>(GemmFlops(rows, n, k)));
  if (k == 0) {
    std::memset(c, 0, rows * n * DTypeSize(c_type));  // 0.0 in f32 and bf16
    return;
  }
  p.gemms.Gemm(rows, n, k, a, w, c_type, c);
}

// Calls fn(le, a, b, at) for each expert sub-block of block p that rows
// [lo, hi) of the block overlap: rows [a, b) of the block, `at` the first
// row of that sub-block's part in expert-grouped order.
template <typename Fn>
void ForSubBlocks(const MoePlan& p, int q, size_t lo, size_t hi, Fn&& fn) {
  const size_t El = static_cast<size_t>(p.El);
  for (size_t le = 0; le < El && lo < hi; ++le) {
    size_t s0 = p.in_src[q * El + le] - p.in_blk_off[q];
    size_t s1 = s0 + p.in_cnt[q * El + le];
    size_t a = std::max(lo, s0), b = std::min(hi, s1);
    if (a < b) fn(static_cast<int>(le), a, b, p.in_exp[q * El + le] + (a - s0));
  }
}

// Rows local expert `le` receives from every rank: rows [in_exp[le],
// in_exp[le] + ExpertRows) in expert-grouped order.
size_t ExpertRows(const MoePlan& p, int le) {
  size_t rows = 0;
  for (int q = 0; q < p.size; ++q) rows += p.in_cnt[q * p.El + le];
  return rows;
}

// Rows of d (dtype) between source-major order (`source_major`: the
// blocks as the all-to-all moves them) and expert-grouped order
// (`grouped`), one way or the other.
void SortRows(const MoePlan& p, const char* span_name, bool to_grouped, char* source_major,
              char* grouped) {
  const size_t rb = p.d * p.esize;
  if (rb == 0) return;
  OpSpan span(span_name, trace::Category::kHost, p.pipeline);
  for (int q = 0; q < p.size; ++q) {
    ForSubBlocks(p, q, 0, p.in_blk[q], [&](int, size_t a, size_t b, size_t at) {
      char* src = source_major + (p.in_blk_off[q] + a) * rb;
      char* grp = grouped + at * rb;
      if (to_grouped)
        std::memcpy(grp, src, (b - a) * rb);
      else
        std::memcpy(src, grp, (b - a) * rb);
    });
  }
}

// A serial pipeline's all-to-all-v, every block at once: block q of `send`
// (send_blk[q] rows from row send_off[q]) to rank q, block q of `recv`
// (recv_blk, recv_off) from rank q, the own block copied; then waits for
// all of it. The dispatch sends the token side's blocks and receives the
// expert side's; the combine the other way round.
void ExchangeAllBlocks(const Group& g, const MoePlan& p, internal::InternalTag tag,
                       const char* send, const std::vector<size_t>& send_blk,
                       const std::vector<size_t>& send_off, char* recv,
                       const std::vector<size_t>& recv_blk, const std::vector<size_t>& recv_off,
                       const char* wait_name, Pending& pend) {
  const size_t rb = p.d * p.esize;
  const int me = p.rank;
  PostBlocks(g, p, false, tag, recv, recv_blk, recv_off, rb, 0, 1, pend);
  PostBlocks(g, p, true, tag, const_cast<char*>(send), send_blk, send_off, rb, 0, 1, pend);
  if (recv_blk[me] * rb > 0)
    std::memcpy(recv + recv_off[me] * rb, send + send_off[me] * rb, recv_blk[me] * rb);
  OpSpan wait(wait_name, trace::Category::kWait, p.pipeline);
  pend.WaitAll();
}

// Every chunk of the dispatch posted at once: messages to one peer go in
// posting order, so chunk j of every block moves before chunk j+1. Returns
// the receives, [chunk][source rank].
std::vector<std::vector<Work>> PostChunkedDispatch(const Group& g, const MoePlan& p, const char* xs,
                                                   char* xr, Pending& pend) {
  const size_t rb = p.d * p.esize;
  std::vector<std::vector<Work>> recv(p.splits);
  for (int j = 0; j < p.splits; ++j) {
    recv[j] =
        PostBlocks(g, p, false, kDispatchTag, xr, p.in_blk, p.in_blk_off, rb, j, p.splits, pend);
    PostBlocks(g, p, true, kDispatchTag, const_cast<char*>(xs), p.out_blk, p.out_blk_off, rb, j,
               p.splits, pend);
  }
  return recv;
}

// Waits for one posted transfer, running the overlap work first if the
// transfer has not completed.
void WaitOne(const MoePlan& p, fused::OverlapWork* overlap, const char* wait_name, Work& w) {
  overlap->RunBefore(w);
  OpSpan wait(wait_name, trace::Category::kWait, p.pipeline);
  w.Wait();
}

// A pipeline's last wait: the overlap work runs before it unless every
// transfer already completed.
void WaitAllAfterOverlap(const MoePlan& p, fused::OverlapWork* overlap, const char* wait_name,
                         Pending& pend) {
  for (size_t i = 0; i < pend.size(); ++i) overlap->RunBefore(pend[i]);
  OpSpan wait(wait_name, trace::Category::kWait, p.pipeline);
  pend.WaitAll();
}

// ------------------------------------------------------------- dispatch
struct DispatchArgs {
  const char* w;
  float* y;
  char* dx;        // dispatched tokens (expert-grouped), or null
  const char* xs;  // tokens in send order
  char* xr;        // received tokens, source-major
  // The caller's overlap work: the chunked and fused pipelines run it at
  // their first wait for a transfer that has not arrived (serial: after the
  // call, by CompleteOp).
  fused::OverlapWork* overlap;
};

// Rows [lo, hi) of the block from rank q (at `block`): times their experts'
// weights into y, and copied to dispatched_x.
void DispatchRows(const MoePlan& p, const DispatchArgs& x, int q, const char* block, size_t lo,
                  size_t hi) {
  const size_t rb = p.d * p.esize;
  ForSubBlocks(p, q, lo, hi, [&](int le, size_t a, size_t b, size_t at) {
    const char* rows = block + a * rb;
    ExpertGemm(p, "all_to_all_matmul.expert_gemm", b - a, p.h, p.d, rows,
               x.w + le * p.d * p.h * p.esize, x.y + at * p.h);
    if (x.dx && (b - a) * rb > 0) std::memcpy(x.dx + at * rb, rows, (b - a) * rb);
  });
}

void DispatchSerial(const Group& g, const MoePlan& p, const DispatchArgs& x, Pending& pend) {
  const size_t rb = p.d * p.esize;
  ExchangeAllBlocks(g, p, kDispatchTag, x.xs, p.out_blk, p.out_blk_off, x.xr, p.in_blk,
                    p.in_blk_off, "all_to_all_matmul.wait", pend);
  SortRows(p, "all_to_all_matmul.sort", true, x.xr, x.dx);
  // One GEMM per expert over its contiguous rows.
  for (int le = 0; le < p.El; ++le) {
    const size_t first = p.in_exp[le];
    ExpertGemm(p, "all_to_all_matmul.expert_gemm", ExpertRows(p, le), p.h, p.d, x.dx + first * rb,
               x.w + le * p.d * p.h * p.esize, x.y + first * p.h);
  }
}

void DispatchChunked(const Group& g, const MoePlan& p, const DispatchArgs& x, Pending& pend) {
  const int P = p.size, me = p.rank, s = p.splits;
  const size_t rb = p.d * p.esize;
  std::vector<std::vector<Work>> recv = PostChunkedDispatch(g, p, x.xs, x.xr, pend);
  DispatchRows(p, x, me, x.xs + p.out_blk_off[me] * rb, 0, p.in_blk[me]);
  for (int j = 0; j < s; ++j) {
    for (int i = 1; i < P; ++i) {
      int q = fused::Mod(me - i, P);
      WaitOne(p, x.overlap, "all_to_all_matmul.wait", recv[j][q]);
      DispatchRows(p, x, q, x.xr + p.in_blk_off[q] * rb, ChunkLo(p.in_blk[q], j, s),
                   ChunkLo(p.in_blk[q], j + 1, s));
    }
  }
  pend.WaitAll();
}

// The ranks `from` sends its blocks to, busiest receiver first (most
// expert rows: its GEMMs are the longest, so its first rows are the most
// urgent), ties in step order (from+1, from+2, ...). Every rank computes
// every rank's order alike.
std::vector<int> DispatchSendOrder(const MoePlan& p, int from) {
  const int P = p.size;
  std::vector<int> order;
  for (int i = 1; i < P; ++i) order.push_back(fused::Mod(from + i, P));
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return p.load[a] > p.load[b]; });
  return order;
}

// The fused pipeline's dispatch (see the top), shared by AllToAllMatmul
// and MoeMlp: every receive posted up front, this rank's blocks sent one
// at a time in DispatchSendOrder; calls chunk(q, lo, hi) for rows [lo, hi)
// of the block from rank q as they arrive, the earliest due first, the
// chunks from one rank in order (the MLP sends each back when done, and
// its owner matches them in order), and own(lo, hi) for the own rows:
// with own_parts = 1 all of them first; else in own_parts chunks, one
// whenever no other rank's chunk is there, the rest at the end (the MLP:
// other ranks' rows first, as their results must travel home).
template <typename Own, typename Chunk>
void RunFusedDispatch(const Group& g, const MoePlan& p, const char* xs, char* xr,
                      const char* wait_name, fused::OverlapWork* overlap, Pending& pend, Own&& own,
                      Chunk&& chunk, int own_parts = 1) {
  const int P = p.size, me = p.rank, s = p.splits;
  const size_t rb = p.d * p.esize;
  // Every chunk's receive up front, listed in the order they are due:
  // chunk j of the block from rank q after the rows q sends before its end
  // (every port moves rows at the same rate).
  struct Due {
    size_t row;  // rows its sender sends before its end
    int step, q, j;
    Work work;
    bool done = false;
  };
  std::vector<Due> due;
  for (int i = 1; i < P; ++i) {
    const int q = fused::Mod(me - i, P);
    size_t before = 0;
    for (int dst : DispatchSendOrder(p, q)) {
      if (dst == me) break;
      before += p.flow[q * P + dst];
    }
    for (int j = 0; j < s; ++j) {
      size_t lo = ChunkLo(p.in_blk[q], j, s), hi = ChunkLo(p.in_blk[q], j + 1, s);
      if ((hi - lo) * rb == 0) continue;
      Work w = internal::Channel::Of(g).Recv(xr + (p.in_blk_off[q] + lo) * rb, (hi - lo) * rb, q,
                                             kDispatchTag);
      pend.Add(w);
      due.push_back({before + hi, i, q, j, std::move(w)});
    }
  }
  std::stable_sort(due.begin(), due.end(), [](const Due& a, const Due& b) {
    return std::tie(a.row, a.step) < std::tie(b.row, b.step);
  });
  // One block at a time on this rank's port, in DispatchSendOrder: the next
  // block is posted once the last one is all in the channel (the engine
  // sends in posting order, but a block larger than the channel would
  // otherwise let the next one in between its chunks).
  const std::vector<int> order = DispatchSendOrder(p, me);
  size_t next = 0;
  std::vector<Work> sending;
  auto post_ready = [&] {
    while (next < order.size() &&
           std::all_of(sending.begin(), sending.end(), [](const Work& w) { return w.Test(); })) {
      const int dst = order[next++];
      sending.clear();
      for (int j = 0; j < s; ++j) {
        size_t lo = ChunkLo(p.out_blk[dst], j, s), hi = ChunkLo(p.out_blk[dst], j + 1, s);
        if ((hi - lo) * rb == 0) continue;
        sending.push_back(internal::Channel::Of(g).Send(xs + (p.out_blk_off[dst] + lo) * rb,
                                                        (hi - lo) * rb, dst, kDispatchTag));
        pend.Add(sending.back());
      }
    }
  };
  // A chunk may go once the earlier chunks from its rank went (they come
  // before it in `due`).
  auto ready = [&](size_t c) {
    for (size_t e = 0; e < c; ++e)
      if (due[e].q == due[c].q && !due[e].done) return false;
    return true;
  };
  // The first ready chunk in due order that has arrived, or due.size().
  auto arrived = [&] {
    for (size_t c = 0; c < due.size(); ++c)
      if (!due[c].done && ready(c) && due[c].work.Test()) return c;
    return due.size();
  };
  int own_done = 0;
  auto own_next = [&] {
    const size_t rows = p.in_blk[me];
    own(ChunkLo(rows, own_done, own_parts), ChunkLo(rows, own_done + 1, own_parts));
    ++own_done;
  };
  post_ready();
  if (own_parts == 1) own_next();
  // Chunks are multiplied as they arrive, the earliest due first: a
  // sender that started late (descheduled, on a shared core) holds up only
  // its own chunks. Results do not depend on the order (see the top).
  for (size_t left = due.size(); left > 0; --left) {
    post_ready();
    size_t c = arrived();
    if (c == due.size() && own_done < own_parts) {
      own_next();
      ++left;  // no chunk taken
      continue;
    }
    if (c == due.size()) {
      size_t first = 0;
      while (due[first].done) ++first;
      overlap->RunBefore(due[first].work);
      OpSpan wait(wait_name, trace::Category::kWait, p.pipeline);
      // Wakes every millisecond to post the next block and to look for a
      // chunk that came in before the first due.
      while (!due[first].work.Wait(std::chrono::milliseconds(1))) {
        post_ready();
        if ((c = arrived()) != due.size()) break;
      }
      if (c == due.size()) c = first;
    }
    due[c].work.Wait();  // throws its error, if it failed
    due[c].done = true;
    const int q = due[c].q;
    chunk(q, ChunkLo(p.in_blk[q], due[c].j, s), ChunkLo(p.in_blk[q], due[c].j + 1, s));
  }
  while (own_done < own_parts) own_next();
  while (next < order.size()) {
    for (const Work& w : sending) w.Wait();
    post_ready();
  }
}

void DispatchFused(const Group& g, const MoePlan& p, const DispatchArgs& x, Pending& pend) {
  const size_t rb = p.d * p.esize;
  RunFusedDispatch(
      g, p, x.xs, x.xr, "all_to_all_matmul.wait", x.overlap, pend,
      [&](size_t lo, size_t hi) {
        DispatchRows(p, x, p.rank, x.xs + p.out_blk_off[p.rank] * rb, lo, hi);
      },
      [&](int q, size_t lo, size_t hi) {
        DispatchRows(p, x, q, x.xr + p.in_blk_off[q] * rb, lo, hi);
      });
  pend.WaitAll();
}

// -------------------------------------------------------------- combine
struct CombineArgs {
  const char* hidden;  // expert-grouped
  const char* w;
  char* ys;  // results for other ranks (rows of dtype), source-major
  char* yr;  // results back home, in send order
  // As DispatchArgs::overlap: chunked and fused run it once every chunk is
  // multiplied and sent, under the transfers, before waiting for them.
  fused::OverlapWork* overlap;
};

// Rows [lo, hi) of the block for rank q: their experts' products into
// `block` (the block's first row; rows in source-major order).
void CombineRows(const MoePlan& p, const CombineArgs& x, int q, char* block, size_t lo,
                 size_t hi) {
  ForSubBlocks(p, q, lo, hi, [&](int le, size_t a, size_t b, size_t at) {
    ExpertGemm(p, "matmul_all_to_all.expert_gemm", b - a, p.d, p.h, x.hidden + at * p.h * p.esize,
               x.w + le * p.h * p.d * p.esize, block + a * p.d * p.esize, p.dtype);
  });
}

void CombineSerial(const Group& g, const MoePlan& p, const CombineArgs& x, Pending& pend) {
  const size_t rb = p.d * p.esize;
  fused::Scratch<char> ye(p.R * rb);
  for (int le = 0; le < p.El; ++le) {
    const size_t first = p.in_exp[le];
    ExpertGemm(p, "matmul_all_to_all.expert_gemm", ExpertRows(p, le), p.d, p.h,
               x.hidden + first * p.h * p.esize, x.w + le * p.h * p.d * p.esize,
               ye.data() + first * rb, p.dtype);
  }
  SortRows(p, "matmul_all_to_all.sort", false, x.ys, ye.data());
  ExchangeAllBlocks(g, p, kCombineTag, x.ys, p.in_blk, p.in_blk_off, x.yr, p.out_blk, p.out_blk_off,
                    "matmul_all_to_all.wait", pend);
}

void CombineChunked(const Group& g, const MoePlan& p, const CombineArgs& x, Pending& pend) {
  const int P = p.size, me = p.rank, s = p.splits;
  const size_t rb = p.d * p.esize;
  for (int j = 0; j < s; ++j) {
    PostBlocks(g, p, false, kCombineTag, x.yr, p.out_blk, p.out_blk_off, rb, j, s, pend);
  }
  for (int j = 0; j < s; ++j) {
    for (int i = 1; i < P; ++i) {
      int q = fused::Mod(me + i, P);
      CombineRows(p, x, q, x.ys + p.in_blk_off[q] * rb, ChunkLo(p.in_blk[q], j, s),
                  ChunkLo(p.in_blk[q], j + 1, s));
    }
    PostBlocks(g, p, true, kCombineTag, x.ys, p.in_blk, p.in_blk_off, rb, j, s, pend);
  }
  CombineRows(p, x, me, x.yr + p.out_blk_off[me] * rb, 0, p.in_blk[me]);
  WaitAllAfterOverlap(p, x.overlap, "matmul_all_to_all.wait", pend);
}

void CombineFused(const Group& g, const MoePlan& p, const CombineArgs& x, Pending& pend) {
  const int P = p.size, me = p.rank, s = p.splits;
  const size_t rb = p.d * p.esize;
  for (int i = 1; i < P; ++i) {
    int src = fused::Mod(me - i, P);
    for (int j = 0; j < s; ++j) {
      size_t lo = ChunkLo(p.out_blk[src], j, s), hi = ChunkLo(p.out_blk[src], j + 1, s);
      if ((hi - lo) * rb == 0) continue;
      pend.Add(internal::Channel::Of(g).Recv(x.yr + (p.out_blk_off[src] + lo) * rb, (hi - lo) * rb,
                                             src, kCombineTag));
    }
  }
  for (int i = 1; i < P; ++i) {
    int dst = fused::Mod(me + i, P);
    char* block = x.ys + p.in_blk_off[dst] * rb;
    for (int j = 0; j < s; ++j) {
      size_t lo = ChunkLo(p.in_blk[dst], j, s), hi = ChunkLo(p.in_blk[dst], j + 1, s);
      if ((hi - lo) * rb == 0) continue;
      CombineRows(p, x, dst, block, lo, hi);
      pend.Add(internal::Channel::Of(g).Send(block + lo * rb, (hi - lo) * rb, dst, kCombineTag));
    }
  }
  CombineRows(p, x, me, x.yr + p.out_blk_off[me] * rb, 0, p.in_blk[me]);
  WaitAllAfterOverlap(p, x.overlap, "matmul_all_to_all.wait", pend);
}

// out[t] = sum over j ascending of probs[t, j] * Yr[row of slot (t, j)]
// (Yr rows of dtype, widened to f32).
void Combine(const MoePlan& p, const MoeRouting& r, const char* yr, const float* probs,
             float* out) {
  if (p.d == 0) return;
  OpSpan span(p.op == kMlpName ? "moe_mlp.combine" : "matmul_all_to_all.combine",
              trace::Category::kHost, p.pipeline);
  const size_t topk = static_cast<size_t>(r.topk);
  std::vector<int64_t> row_of(r.num_tokens * topk, -1);
  for (size_t pos = 0; pos < r.send_slots.size(); ++pos) row_of[r.send_slots[pos]] = pos;
  for (size_t t = 0; t < r.num_tokens; ++t) {
    float* o = out + t * p.d;
    std::fill(o, o + p.d, 0.0f);
    for (size_t j = 0; j < topk; ++j) {
      int64_t row = row_of[t * topk + j];
      if (row < 0) continue;
      const float wgt = probs ? probs[t * topk + j] : 1.0f;
      if (p.dtype == DType::kBF16) {
        const auto* y = reinterpret_cast<const uint16_t*>(yr) + row * p.d;
        for (size_t c = 0; c < p.d; ++c) o[c] += wgt * core::BF16ToF32(y[c]);
      } else {
        const auto* y = reinterpret_cast<const float*>(yr) + row * p.d;
        for (size_t c = 0; c < p.d; ++c) o[c] += wgt * y[c];
      }
    }
  }
}

// ------------------------------------------------------------------ MLP
struct MlpArgs {
  const char* w1;
  const char* w2;
  const MoeActivation* act;  // empty: identity
  const char* xs;            // tokens in send order
  char* xr;                  // received tokens, source-major
  char* dx;                  // received tokens, expert-grouped (saved), or null
  float* y1;                 // [R x h] f32, expert-grouped
  float* act_out;            // [R x h2] f32 scratch (bf16 only; f32 acts into hidden)
  char* hidden;              // [R x h2] of dtype, expert-grouped
  char* ys;                  // results for other ranks, source-major
  char* yr;                  // results back home, in send order
  fused::OverlapWork* overlap;
};

// hidden rows [at, at + rows) = act(y1 rows), rounded to dtype.
void Activate(const MoePlan& p, const MlpArgs& x, size_t at, size_t rows) {
  if (rows == 0 || p.h2 == 0) return;
  OpSpan span("moe_mlp.activation", trace::Category::kCompute, p.pipeline);
  const float* in = x.y1 + at * p.h;
  const bool f32 = p.dtype == DType::kF32;
  float* o = f32 ? reinterpret_cast<float*>(x.hidden) + at * p.h2 : x.act_out + at * p.h2;
  if (*x.act) {
    (*x.act)(in, rows, o);
  } else if (f32) {
    std::memcpy(o, in, rows * p.h2 * sizeof(float));
  } else {
    o = const_cast<float*>(in);  // identity: round y1 itself
  }
  if (!f32) {
    auto* b = reinterpret_cast<uint16_t*>(x.hidden) + at * p.h2;
    for (size_t i = 0; i < rows * p.h2; ++i) b[i] = core::F32ToBF16(o[i]);
  }
}

// Rows [lo, hi) of the block from rank q (tokens at `in`, rows of d): both
// GEMMs and the activation, the products into `out` (rows of d, dtype; the
// same rows of the block).
void MlpRows(const MoePlan& p, const MlpArgs& x, int q, const char* in, char* out, size_t lo,
             size_t hi) {
  const size_t rb = p.d * p.esize;
  ForSubBlocks(p, q, lo, hi, [&](int le, size_t a, size_t b, size_t at) {
    const size_t rows = b - a;
    ExpertGemm(p, "moe_mlp.gemm1", rows, p.h, p.d, in + a * rb, x.w1 + le * p.d * p.h * p.esize,
               x.y1 + at * p.h);
    if (x.dx && rows * rb > 0) std::memcpy(x.dx + at * rb, in + a * rb, rows * rb);
    Activate(p, x, at, rows);
    ExpertGemm(p, "moe_mlp.gemm2", rows, p.d, p.h2, x.hidden + at * p.h2 * p.esize,
               x.w2 + le * p.h2 * p.d * p.esize, out + a * rb, p.dtype);
  });
}

// Rows [lo, hi) of the block from rank q, computed and sent back.
void MlpChunk(const Group& g, const MoePlan& p, const MlpArgs& x, int q, size_t lo, size_t hi,
              Pending& pend) {
  const size_t rb = p.d * p.esize;
  char* out = x.ys + p.in_blk_off[q] * rb;
  MlpRows(p, x, q, x.xr + p.in_blk_off[q] * rb, out, lo, hi);
  if ((hi - lo) * rb > 0)
    pend.Add(internal::Channel::Of(g).Send(out + lo * rb, (hi - lo) * rb, q, kCombineTag));
}

// Rows [lo, hi) of the own block: from the packed tokens straight into Yr.
void MlpOwnRows(const MoePlan& p, const MlpArgs& x, size_t lo, size_t hi) {
  const size_t rb = p.d * p.esize;
  MlpRows(p, x, p.rank, x.xs + p.out_blk_off[p.rank] * rb, x.yr + p.out_blk_off[p.rank] * rb, lo,
          hi);
}

// The combine's receives, chunk j of every block from every rank for j <
// s, posted up front: each expert rank sends a block's chunks in order.
void PostCombineReceives(const Group& g, const MoePlan& p, const MlpArgs& x, Pending& pend) {
  for (int j = 0; j < p.splits; ++j) {
    PostBlocks(g, p, false, kCombineTag, x.yr, p.out_blk, p.out_blk_off, p.d * p.esize, j,
               p.splits, pend);
  }
}

// The classic sequence: all-to-all-v, sort by expert, the first GEMM per
// expert, the activation, the second GEMM per expert, sort back to
// source-major, all-to-all-v back.
void MlpSerial(const Group& g, const MoePlan& p, const MlpArgs& x, Pending& pend) {
  const size_t rb = p.d * p.esize;
  ExchangeAllBlocks(g, p, kDispatchTag, x.xs, p.out_blk, p.out_blk_off, x.xr, p.in_blk,
                    p.in_blk_off, "moe_mlp.wait", pend);
  SortRows(p, "moe_mlp.sort", true, x.xr, x.dx);
  for (int le = 0; le < p.El; ++le) {
    ExpertGemm(p, "moe_mlp.gemm1", ExpertRows(p, le), p.h, p.d, x.dx + p.in_exp[le] * rb,
               x.w1 + le * p.d * p.h * p.esize, x.y1 + p.in_exp[le] * p.h);
  }
  Activate(p, x, 0, p.R);
  fused::Scratch<char> ye(p.R * rb);  // the second GEMM's rows, expert-grouped
  for (int le = 0; le < p.El; ++le) {
    ExpertGemm(p, "moe_mlp.gemm2", ExpertRows(p, le), p.d, p.h2,
               x.hidden + p.in_exp[le] * p.h2 * p.esize, x.w2 + le * p.h2 * p.d * p.esize,
               ye.data() + p.in_exp[le] * rb, p.dtype);
  }
  SortRows(p, "moe_mlp.sort", false, x.ys, ye.data());
  // Serial never overlaps: the overlap work runs after the call (CompleteOp).
  ExchangeAllBlocks(g, p, kCombineTag, x.ys, p.in_blk, p.in_blk_off, x.yr, p.out_blk, p.out_blk_off,
                    "moe_mlp.wait", pend);
}

// Every chunk posted at once (as DispatchChunked); chunk j of every block,
// in ring order, computed and sent back as it arrives; the own rows in
// between (they need no transfer either way).
void MlpChunked(const Group& g, const MoePlan& p, const MlpArgs& x, Pending& pend) {
  const int P = p.size, me = p.rank, s = p.splits;
  PostCombineReceives(g, p, x, pend);
  std::vector<std::vector<Work>> recv = PostChunkedDispatch(g, p, x.xs, x.xr, pend);
  // The own rows in s + 1 parts: one before the first chunks arrive, one
  // after each round of chunks, the last under the last results' return.
  auto own = [&](int part) {
    MlpOwnRows(p, x, ChunkLo(p.in_blk[me], part, s + 1), ChunkLo(p.in_blk[me], part + 1, s + 1));
  };
  own(0);
  for (int j = 0; j < s; ++j) {
    for (int i = 1; i < P; ++i) {
      int q = fused::Mod(me - i, P);
      WaitOne(p, x.overlap, "moe_mlp.wait", recv[j][q]);
      MlpChunk(g, p, x, q, ChunkLo(p.in_blk[q], j, s), ChunkLo(p.in_blk[q], j + 1, s), pend);
    }
    own(j + 1);
  }
  WaitAllAfterOverlap(p, x.overlap, "moe_mlp.wait", pend);
}

// AllToAllMatmul's fused dispatch; each chunk sent back as soon as its
// GEMMs are done, so the combine moves under the remaining chunks' GEMMs.
void MlpFused(const Group& g, const MoePlan& p, const MlpArgs& x, Pending& pend) {
  PostCombineReceives(g, p, x, pend);
  // Results are sent as soon as they are done, queued behind any dispatch
  // block posted before them. (Holding them until this rank had posted all
  // its dispatch blocks, which feed other ranks' GEMMs, gains nothing.)
  RunFusedDispatch(
      g, p, x.xs, x.xr, "moe_mlp.wait", x.overlap, pend,
      [&](size_t lo, size_t hi) { MlpOwnRows(p, x, lo, hi); },
      [&](int q, size_t lo, size_t hi) { MlpChunk(g, p, x, q, lo, hi, pend); }, p.splits);
  WaitAllAfterOverlap(p, x.overlap, "moe_mlp.wait", pend);
}

// The sizes a MoE operator's arguments are checked with.
struct MoeSizes {
  size_t R, T, El, es;  // rows received, tokens, local experts, element size
};

// The routing check, then `checks(sizes)` (fused::ArgChecks of the
// operator's operands): "" if fine, else the reason.
template <typename Checks>
std::string CheckMoeArgs(const Group& g, const MoeRouting& r, DType dtype, Checks&& checks) {
  std::string err = CheckRouting(g, r);
  if (!err.empty()) return err;
  return checks(MoeSizes{r.num_received(), r.num_tokens, static_cast<size_t>(r.experts_per_rank),
                         DTypeSize(dtype)});
}

// One MoE operator call after its own checks: the agreement and plan, then
// `body(plan, overlap, pending)` under the common completion.
template <typename Body>
Work RunMoeOp(const Group& g, const char* op, const MoeRouting& routing, DType dtype, size_t d,
              size_t h, size_t h2, const std::string& err, const FusedOptions& options,
              FusedReport* report, Body&& body) {
  MoePlan p = MakeMoePlan(g, op, routing, dtype, d, h, err, options, h2);
  fused::OverlapWork overlap(options.overlap_work);
  const double flops = op == kDispatchName  ? GemmFlops(p.R, p.h, p.d)
                       : op == kCombineName ? GemmFlops(p.R, p.d, p.h)
                                            : GemmFlops(p.R, p.h, p.d) + GemmFlops(p.R, p.d, p.h2);
  return fused::CompleteOp(g, op, p.pipeline, p.splits, static_cast<uint64_t>(flops), report,
                           overlap, [&](Pending& pend) { body(p, overlap, pend); });
}

// The send buffer: x's rows in send order (one copy of the routed tokens).
void PackSendRows(const MoePlan& p, const MoeRouting& routing, const void* x, char* xs,
                  const char* span) {
  OpSpan pack(span, trace::Category::kHost, p.pipeline);
  const size_t rb = p.d * p.esize;
  const char* src = static_cast<const char*>(x);
  for (size_t pos = 0; pos < p.S && rb > 0; ++pos) {
    std::memcpy(xs + pos * rb, src + (routing.send_slots[pos] / routing.topk) * rb, rb);
  }
}

}  // namespace

Work AllToAllMatmul(const Group& g, const MoeRouting& routing, const void* x, size_t d,
                    const void* w, size_t h, DType dtype, float* y, void* dispatched_x,
                    const FusedOptions& options, FusedReport* report) {
  std::string err = CheckMoeArgs(g, routing, dtype, [&](const MoeSizes& z) {
    return fused::ArgChecks(
        dtype, options,
        {{"x (num_tokens x d)", {z.T, d, z.es}},
         {"w (experts_per_rank x d x h)", {z.El, d, h, z.es}},
         {"y (received rows x h)", {z.R, h, sizeof(float)}},
         {"the dispatched x (received rows x d)", {z.R, d, z.es}}},
        {x == nullptr && z.T > 0 && d > 0, w == nullptr && z.El > 0 && d > 0 && h > 0,
         y == nullptr && z.R > 0 && h > 0});
  });
  return RunMoeOp(
      g, kDispatchName, routing, dtype, d, h, 0, err, options, report,
      [&](const MoePlan& p, fused::OverlapWork& overlap, Pending& pend) {
        const size_t rb = p.d * p.esize;
        fused::Scratch<char> xs(p.S * rb), xr(p.R * rb), own_dx;
        PackSendRows(p, routing, x, xs.data(), "all_to_all_matmul.pack");
        DispatchArgs a{static_cast<const char*>(w),
                       y,
                       static_cast<char*>(dispatched_x),
                       xs.data(),
                       xr.data(),
                       &overlap};
        if (p.pipeline == Pipeline::kSerial) {
          // Serial sorts the received rows by expert, into dispatched_x if
          // asked for, else into a buffer of its own.
          if (a.dx == nullptr) {
            own_dx.Resize(p.R * rb);
            a.dx = own_dx.data();
          }
          DispatchSerial(g, p, a, pend);
        } else if (p.pipeline == Pipeline::kChunked) {
          DispatchChunked(g, p, a, pend);
        } else {
          DispatchFused(g, p, a, pend);
        }
      });
}

Work MatmulAllToAll(const Group& g, const MoeRouting& routing, const void* hidden, size_t h,
                    const void* w, size_t d, DType dtype, float* out, const float* probs,
                    const FusedOptions& options, FusedReport* report) {
  std::string err = CheckMoeArgs(g, routing, dtype, [&](const MoeSizes& z) {
    return fused::ArgChecks(
        dtype, options,
        {{"hidden (received rows x h)", {z.R, h, z.es}},
         {"w (experts_per_rank x h x d)", {z.El, h, d, z.es}},
         {"the expert outputs (received rows x d)", {z.R, d, sizeof(float)}},
         {"out (num_tokens x d)", {z.T, d, sizeof(float)}}},
        {hidden == nullptr && z.R > 0 && h > 0, w == nullptr && z.El > 0 && d > 0 && h > 0,
         out == nullptr && z.T > 0 && d > 0});
  });
  return RunMoeOp(
      g, kCombineName, routing, dtype, d, h, 0, err, options, report,
      [&](const MoePlan& p, fused::OverlapWork& overlap, Pending& pend) {
        fused::Scratch<char> ys(p.R * p.d * p.esize), yr(p.S * p.d * p.esize);
        CombineArgs a{static_cast<const char*>(hidden), static_cast<const char*>(w), ys.data(),
                      yr.data(), &overlap};
        if (p.pipeline == Pipeline::kSerial) {
          CombineSerial(g, p, a, pend);
        } else if (p.pipeline == Pipeline::kChunked) {
          CombineChunked(g, p, a, pend);
        } else {
          CombineFused(g, p, a, pend);
        }
        Combine(p, routing, yr.data(), probs, out);
      });
}

Work MoeMlp(const Group& g, const MoeRouting& routing, const void* x, size_t d, const void* w1,
            size_t h1, const MoeActivation& act, size_t h2, const void* w2, DType dtype,
            float* out, const float* probs, const MoeMlpSaved& saved, const FusedOptions& options,
            FusedReport* report) {
  std::string err = CheckMoeArgs(g, routing, dtype, [&](const MoeSizes& z) {
    return fused::ArgChecks(
        dtype, options,
        {{"x (num_tokens x d)", {z.T, d, z.es}},
         {"w1 (experts_per_rank x d x h1)", {z.El, d, h1, z.es}},
         {"w2 (experts_per_rank x h2 x d)", {z.El, h2, d, z.es}},
         {"the hidden rows (received rows x h1)", {z.R, h1, sizeof(float)}},
         {"the hidden rows (received rows x h2)", {z.R, h2, sizeof(float)}},
         {"the dispatched x (received rows x d)", {z.R, d, sizeof(float)}},
         {"out (num_tokens x d)", {z.T, d, sizeof(float)}}},
        {x == nullptr && z.T > 0 && d > 0, w1 == nullptr && z.El > 0 && d > 0 && h1 > 0,
         w2 == nullptr && z.El > 0 && h2 > 0 && d > 0, out == nullptr && z.T > 0 && d > 0});
  });
  if (err.empty() && !act && h1 != h2) {
    err = "act is null (the identity), so h2 (" + Str(h2) + ") must equal h1 (" + Str(h1) + ")";
  }
  return RunMoeOp(
      g, kMlpName, routing, dtype, d, h1, h2, err, options, report,
      [&](const MoePlan& p, fused::OverlapWork& overlap, Pending& pend) {
        const size_t rb = p.d * p.esize;
        fused::Scratch<char> xs(p.S * rb), xr(p.R * rb), ys(p.R * rb), yr(p.S * rb), own_dx,
            own_hidden;
        fused::Scratch<float> own_y1, act_out;
        PackSendRows(p, routing, x, xs.data(), "moe_mlp.pack");
        MlpArgs a{static_cast<const char*>(w1),
                  static_cast<const char*>(w2),
                  &act,
                  xs.data(),
                  xr.data(),
                  static_cast<char*>(saved.dispatched_x),
                  saved.y1,
                  nullptr,
                  static_cast<char*>(saved.hidden),
                  ys.data(),
                  yr.data(),
                  &overlap};
        if (a.y1 == nullptr) {
          own_y1.Resize(p.R * p.h);
          a.y1 = own_y1.data();
        }
        if (a.hidden == nullptr) {
          own_hidden.Resize(p.R * p.h2 * p.esize);
          a.hidden = own_hidden.data();
        }
        if (p.dtype != DType::kF32 && act) {
          act_out.Resize(p.R * p.h2);
          a.act_out = act_out.data();
        }
        if (p.pipeline == Pipeline::kSerial) {
          if (a.dx == nullptr) {  // serial sorts the received rows by expert
            own_dx.Resize(p.R * rb);
            a.dx = own_dx.data();
          }
          MlpSerial(g, p, a, pend);
        } else if (p.pipeline == Pipeline::kChunked) {
          MlpChunked(g, p, a, pend);
        } else {
          MlpFused(g, p, a, pend);
        }
        Combine(p, routing, yr.data(), probs, out);
      });
}

}  // namespace mc2
