// Mixture-of-experts operators (include/mc2/moe.h): MoeRoute, AllToAllMatmul
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
// shape (k, n, the same expert's weights); with one thread a kOneDNN row
// (oneDNN's brgemm or the tiled kernel, ops/tiled_gemm.h)
// does not depend on the other rows computed with it, and the combine sums
// in a fixed order, so all pipelines and split counts agree bit for bit.
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/reduce.h"
#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/ops.h"
#include "ops/cost_model.h"
#include "ops/fused_common.h"
#include "ops/gemm.h"
#include "ops/moe_common.h"

namespace mc2 {
namespace moe {
namespace {

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

}  // namespace
}  // namespace moe

using moe::CheckMoeArgs;
using moe::Combine;
using moe::CombineArgs;
using moe::CombineChunked;
using moe::CombineFused;
using moe::CombineSerial;
using moe::DispatchArgs;
using moe::DispatchChunked;
using moe::DispatchFused;
using moe::DispatchSerial;
using moe::kCombineName;
using moe::kDispatchName;
using moe::MoePlan;
using moe::MoeSizes;
using moe::PackSendRows;
using moe::Pending;
using moe::RunMoeOp;

FusedReport AllToAllMatmul(const Group& g, const MoeRouting& routing,
                           const AllToAllMatmulArgs& args, const FusedOptions& options) {
  // The tokens x (T x d), the experts' weights w and outputs y (R x h).
  const void *const x = args.a, *const w = args.b;
  float* const y = args.c;
  void* const dispatched_x = args.dispatched_a;
  const size_t d = args.k, h = args.n;
  const DType dtype = args.dtype;
  std::string err = CheckMoeArgs(g, routing, dtype, [&](const MoeSizes& z) {
    return fused::ArgChecks(dtype, options,
                            {{"x (num_tokens x args.k)", {z.T, d, z.es}},
                             {"w (experts_per_rank x args.k x args.n)", {z.El, d, h, z.es}},
                             {"y (received rows x args.n)", {z.R, h, sizeof(float)}},
                             {"the dispatched x (received rows x args.k)", {z.R, d, z.es}}},
                            {{x == nullptr && z.T > 0 && d > 0, "args.a"},
                             {w == nullptr && z.El > 0 && d > 0 && h > 0, "args.b"},
                             {y == nullptr && z.R > 0 && h > 0, "args.c"}});
  });
  return RunMoeOp(
      g, kDispatchName, routing, dtype, d, h, 0, err, options,
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

FusedReport MatmulAllToAll(const Group& g, const MoeRouting& routing,
                           const MatmulAllToAllArgs& args, const FusedOptions& options) {
  // The experts' hidden rows (R x h), their weights w, the combined out (T x d).
  const void *const hidden = args.a, *const w = args.b;
  float* const out = args.c;
  const float* const probs = args.probs;
  const size_t h = args.k, d = args.n;
  const DType dtype = args.dtype;
  std::string err = CheckMoeArgs(g, routing, dtype, [&](const MoeSizes& z) {
    return fused::ArgChecks(
        dtype, options,
        {{"hidden (received rows x args.k)", {z.R, h, z.es}},
         {"w (experts_per_rank x args.k x args.n)", {z.El, h, d, z.es}},
         {"the expert outputs (received rows x args.n)", {z.R, d, sizeof(float)}},
         {"out (num_tokens x args.n)", {z.T, d, sizeof(float)}}},
        {{hidden == nullptr && z.R > 0 && h > 0, "args.a"},
         {w == nullptr && z.El > 0 && d > 0 && h > 0, "args.b"},
         {out == nullptr && z.T > 0 && d > 0, "args.c"}});
  });
  return RunMoeOp(
      g, kCombineName, routing, dtype, d, h, 0, err, options,
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

}  // namespace mc2
