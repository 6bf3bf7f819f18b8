// The MoE operators' shared pieces (moe_ops.cc: AllToAllMatmul and
// MatmulAllToAll; moe_mlp_ops.cc: MoeMlp; moe_common.cc, moe_route.cc):
// the agreed plan of a call and its row layout, the block exchanges over
// the engine's internal messages, the fused dispatch both operators use,
// the combine, and the entry path every operator takes. The layout and the
// pipelines are described at the top of moe_ops.cc.
//
// Thread safety: stateless functions; a MoePlan belongs to one call.
#ifndef MC2_OPS_MOE_COMMON_H_
#define MC2_OPS_MOE_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/channel.h"
#include "mc2/moe.h"
#include "ops/fused_common.h"

namespace mc2::moe {

using fused::ChunkLo;
using fused::OpSpan;
using fused::Pending;
using fused::Str;

// The operators' names (errors, trace spans, the agreement message). The
// code compares these pointers, so each is one inline array: one object
// with one address in every translation unit (a literal behind a pointer
// per unit need not be, and is not under ASan).
inline constexpr char kRouteName[] = "moe_route";
inline constexpr char kDispatchName[] = "all_to_all_matmul";
inline constexpr char kCombineName[] = "matmul_all_to_all";
inline constexpr char kMlpName[] = "moe_mlp";
// Tags of the dispatch and combine messages (every pipeline), in the
// engine's internal tag space: never a user's message.
constexpr internal::InternalTag kDispatchTag = internal::InternalTag::kMoeDispatch;
constexpr internal::InternalTag kCombineTag = internal::InternalTag::kMoeCombine;

// A hash of what every rank's routing must agree on.
uint64_t RoutingFingerprint(int ranks, int num_experts, int topk,
                            const std::vector<size_t>& counts);

// Checks a routing against the group and itself; "" if usable.
std::string CheckRouting(const Group& g, const MoeRouting& r);

// One call's plan and the row layout of this rank (see the top of
// moe_ops.cc).
struct MoePlan : fused::PlanBase {
  const char* op;
  int El = 0;  // local experts
  size_t E = 0;
  // Both directions move rows of dtype: the combine's expert products are
  // rounded to bf16 for bf16 operands (see the top of moe_ops.cc).
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
                    size_t h, const std::string& local_error, const FusedOptions& o, size_t h2 = 0);

// One direction of an all-to-all-v over the point-to-point channels: the
// rows of `rows[q]` starting at row `first[q]` of `base` go to (or come from)
// every other rank q. Chunk j of s posts rows [ChunkLo(rows, j, s),
// ChunkLo(rows, j + 1, s)) of each block, in ring order (to r+1, r+2, ...;
// from r-1, r-2, ...). Both ends compute the same sizes from the routing,
// so empty messages are skipped alike. Returns the posted works per rank.
std::vector<Work> PostBlocks(const Group& g, const MoePlan& p, bool send, internal::InternalTag tag,
                             char* base, const std::vector<size_t>& rows,
                             const std::vector<size_t>& first, size_t row_bytes, int j, int s,
                             Pending& pend);

// rows x n (c_type: f32, or bf16 rounded from f32 sums) = A (rows x k,
// dtype) * W (k x n); zeros when k == 0.
void ExpertGemm(const MoePlan& p, const char* name, size_t rows, size_t n, size_t k, const char* a,
                const char* w, void* c, DType c_type = DType::kF32);

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
size_t ExpertRows(const MoePlan& p, int le);

// Rows of d (dtype) between source-major order (`source_major`: the
// blocks as the all-to-all moves them) and expert-grouped order
// (`grouped`), one way or the other.
void SortRows(const MoePlan& p, const char* span_name, bool to_grouped, char* source_major,
              char* grouped);

// A serial pipeline's all-to-all-v, every block at once: block q of `send`
// (send_blk[q] rows from row send_off[q]) to rank q, block q of `recv`
// (recv_blk, recv_off) from rank q, the own block copied; then waits for
// all of it. The dispatch sends the token side's blocks and receives the
// expert side's; the combine the other way round.
void ExchangeAllBlocks(const Group& g, const MoePlan& p, internal::InternalTag tag,
                       const char* send, const std::vector<size_t>& send_blk,
                       const std::vector<size_t>& send_off, char* recv,
                       const std::vector<size_t>& recv_blk, const std::vector<size_t>& recv_off,
                       const char* wait_name, Pending& pend);

// Every chunk of the dispatch posted at once: messages to one peer go in
// posting order, so chunk j of every block moves before chunk j+1. Returns
// the receives, [chunk][source rank].
std::vector<std::vector<Work>> PostChunkedDispatch(const Group& g, const MoePlan& p, const char* xs,
                                                   char* xr, Pending& pend);

// Waits for one posted transfer, running the overlap work first if the
// transfer has not completed.
void WaitOne(const MoePlan& p, fused::OverlapWork* overlap, const char* wait_name, Work& w);

// A pipeline's last wait: the overlap work runs before it unless every
// transfer already completed.
void WaitAllAfterOverlap(const MoePlan& p, fused::OverlapWork* overlap, const char* wait_name,
                         Pending& pend);

// The ranks `from` sends its blocks to, busiest receiver first (most
// expert rows: its GEMMs are the longest, so its first rows are the most
// urgent), ties in step order (from+1, from+2, ...). Every rank computes
// every rank's order alike.
std::vector<int> DispatchSendOrder(const MoePlan& p, int from);

// The fused pipeline's dispatch (see the top), shared by AllToAllMatmul
// and MoeMlp: every receive posted up front, this rank's blocks sent one
// at a time in DispatchSendOrder; calls chunk(q, lo, hi) for rows [lo, hi)
// of the block from rank q as they arrive, the earliest due first, the
// chunks from one rank in order (the MLP sends each back when done, and
// its owner matches them in order), and own(lo, hi) for the own rows:
// with own_parts = 1 all of them first; else in own_parts chunks, one
// whenever no other rank's chunk is there, the rest at the end (the MLP:
// other ranks' rows first, as their results must travel home).
void RunFusedDispatch(const Group& g, const MoePlan& p, const char* xs, char* xr,
                      const char* wait_name, fused::OverlapWork* overlap, Pending& pend,
                      const std::function<void(size_t, size_t)>& own,
                      const std::function<void(int, size_t, size_t)>& chunk, int own_parts = 1);

// out[t] = sum over j ascending of probs[t, j] * Yr[row of slot (t, j)]
// (Yr rows of dtype, widened to f32).
void Combine(const MoePlan& p, const MoeRouting& r, const char* yr, const float* probs, float* out);
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
FusedReport RunMoeOp(const Group& g, const char* op, const MoeRouting& routing, DType dtype,
                     size_t d, size_t h, size_t h2, const std::string& err,
                     const FusedOptions& options, Body&& body) {
  MoePlan p = MakeMoePlan(g, op, routing, dtype, d, h, err, options, h2);
  fused::OverlapWork overlap(options.overlap_work);
  const double flops = op == kDispatchName  ? GemmFlops(p.R, p.h, p.d)
                       : op == kCombineName ? GemmFlops(p.R, p.d, p.h)
                                            : GemmFlops(p.R, p.h, p.d) + GemmFlops(p.R, p.d, p.h2);
  return fused::CompleteOp(g, op, p.pipeline, p.splits, fused::FlopCount(flops), overlap,
                           [&](Pending& pend) { body(p, overlap, pend); });
}

// The send buffer: x's rows in send order (one copy of the routed tokens).
void PackSendRows(const MoePlan& p, const MoeRouting& routing, const void* x, char* xs,
                  const char* span);

}  // namespace mc2::moe

#endif  // MC2_OPS_MOE_COMMON_H_
