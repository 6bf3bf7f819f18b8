// mc2/moe.h: mixture of experts (expert parallelism): the routing and the
// fused dispatch, expert GEMM and combine operators. Same conventions as
// the dense fused operators (mc2/fused_ops.h): synchronous calls, the
// agreement exchange, errors thrown on every rank, determinism.
//
// E experts are spread over the P ranks of a group, E / P per rank: expert e
// lives on rank e / (E / P) as its local expert e % (E / P). Each rank has T
// tokens [T x d] and routes each to `topk` experts (expert_ids [T x topk],
// row-major; id -1 drops that slot: it is neither sent nor combined). A
// *slot* is one (token t, choice j) pair, numbered t * topk + j. The three
// calls of one MoE layer:
//
//   MoeRouting r = MoeRoute(g, ids, T, topk, E);              // counts exchange
//   AllToAllMatmul(g, r, {.a = x, .b = w1, .c = y1, .k = d, .n = h});  // dispatch + x W1
//   ... y1 -> activation -> hidden (dtype) ...
//   MatmulAllToAll(g, r, {.a = hidden, .b = w2, .c = out, .k = h, .n = d});  // W2 + combine
//
// On the expert side, rows are in *expert-grouped order*: local expert 0's
// rows first, then expert 1's, ...; within an expert, the rows from rank 0
// (in its slot order), then from rank 1, ... expert_rows(le) gives the
// count of each expert, num_received() the total R.
#ifndef MC2_MOE_H_
#define MC2_MOE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "mc2/fused_ops.h"
#include "mc2/group.h"
#include "mc2/tensor.h"

namespace mc2 {

// Who sends what to whom, for one batch of tokens. Made by MoeRoute; reused
// by every dispatch and combine of that batch (forward and backward). Plain
// data: copyable, any thread may read it.
struct MoeRouting {
  int rank = 0;              // this rank in the group it was made for
  int ranks = 0;             // that group's size P
  int num_experts = 0;       // E
  int experts_per_rank = 0;  // E / P
  int topk = 1;
  size_t num_tokens = 0;  // T of this rank
  // counts[p * E + e]: slots of rank p routed to expert e (the whole P x E
  // matrix, identical on every rank).
  std::vector<size_t> counts;
  // This rank's routed slots in dispatch order: by expert (hence by
  // destination rank, then local expert), then by slot number.
  std::vector<size_t> send_slots;
  // A hash of (P, E, topk, counts), the same on every rank. The operators
  // recompute it from the fields and compare it across ranks, so routings
  // of different batches (or altered counts) fail with kMismatch.
  uint64_t fingerprint = 0;

  // Rows local expert `local_expert` receives (from all ranks).
  size_t expert_rows(int local_expert) const;
  // Rows this rank's experts receive in all: R.
  size_t num_received() const;
  // Slots this rank sends (routed slots, -1s excluded).
  size_t num_sent() const { return send_slots.size(); }
};

// Collective: builds the routing of this rank's T tokens (expert_ids
// [T x topk], ids in [-1, E)) by all-gathering the per-expert counts.
// num_experts must be a positive multiple of the group size; topk >= 1;
// num_experts and topk must agree across ranks (else kMismatch on every
// rank); a bad id or argument on any rank is kInvalidArgument on every
// rank. T may be 0 (expert_ids may then be null).
MoeRouting MoeRoute(const Group& g, const int32_t* expert_ids, size_t num_tokens, int topk,
                    int num_experts, std::chrono::nanoseconds timeout = {});

// Dispatch + expert GEMM: c receives, in expert-grouped order, each routed
// slot's token times its expert's weight (expert le's [k x n] at
// b + le k n). k and n must agree across ranks, and so must the routing (its
// fingerprint, recomputed): else kMismatch on every rank. The routing is a
// separate parameter: it is an object, not a shape.
struct AllToAllMatmulArgs {
  const void* a = nullptr;  // x [T x k] of dtype: this rank's tokens
  const void* b = nullptr;  // w [E/P x k x n] of dtype: this rank's experts' weights
  float* c = nullptr;       // y [R x n], expert-grouped
  size_t k = 0, n = 0;      // k: the token width d; n: the expert output width h
  DType dtype = DType::kF32;
  void* dispatched_a = nullptr;  // optional [R x k] of dtype: the received tokens, expert-grouped
                                 // (what the weight gradient needs)
};

// Pipelines (all move rows over the point-to-point channels, so link
// emulation charges each alike): serial = the all-to-all-v of every routed
// token, then one GEMM per expert (the classic dispatch, sort by expert,
// grouped GEMM); chunked = the rows each rank sends to each other rank are
// cut into `splits` chunks, the own rows are multiplied first and chunk j
// as it arrives while chunks > j move; fused = every rank sends its blocks
// (cut into `splits` chunks) one at a time, the rank with the most expert
// rows first, and multiplies the own rows first, then each chunk as it
// arrives while the others move; auto = the cost model's choice as for
// AllGatherBatchMatmul, from the busiest rank's rows and port bytes; the
// count matrix, link settings and operator tuning are the same everywhere
// (checked), so is the choice. FusedOptions::timeout does not apply to the
// point-to-point messages (they use the group's timeout).
FusedReport AllToAllMatmul(const Group& g, const MoeRouting& routing,
                           const AllToAllMatmulArgs& args, const FusedOptions& options = {});

// Expert GEMM + combine: a, in expert-grouped order (as AllToAllMatmul's c),
// is multiplied by this rank's experts' weights and each row is returned to
// the rank and slot it came from, in dtype (bf16 operands: the
// f32-accumulated row rounded to bf16, half the bytes of f32); c receives,
// per token t,
//   c[t] = sum over j = 0..topk-1 with expert_ids[t, j] != -1, in that
//          order, of probs[t * topk + j] * (row of slot (t, j))
// (probs null = 1). A token with every slot dropped gets zeros. Same
// agreement rules as AllToAllMatmul.
struct MatmulAllToAllArgs {
  const void* a = nullptr;  // hidden [R x k] of dtype, expert-grouped
  const void* b = nullptr;  // w [E/P x k x n] of dtype
  float* c = nullptr;       // out [T x n]
  size_t k = 0, n = 0;      // k: the hidden width h; n: the token width d
  DType dtype = DType::kF32;
  const float* probs = nullptr;  // optional [T x topk] weights (e.g. the router's gate values)
};

// Pipelines: serial = one GEMM per expert, then the all-to-all-v back,
// then the combine; chunked = the rows for each other rank are cut into
// `splits` chunks, each multiplied and then sent while the next is
// multiplied, the own rows last; fused = chunk j of the block for rank
// r+1, r+2, ... (blocks cut into `splits` chunks) multiplied and sent while
// the next is multiplied, the own block last; auto as AllToAllMatmul.
FusedReport MatmulAllToAll(const Group& g, const MoeRouting& routing,
                           const MatmulAllToAllArgs& args, const FusedOptions& options = {});

// A row-wise activation for MoeMlp: writes out [rows x h2] (f32) from in
// [rows x h1] (f32, the first GEMM's rows). Row i of out must depend on row
// i of in only, as the pipelines apply it to chunks of rows (SwiGLU:
// h1 = 2 h2, out = silu(gate) * up; GELU: h1 = h2). Runs on the calling
// thread; an exception from it fails the call (on this rank; the others
// then fail too, as when a rank dies mid-operator).
using MoeActivation = std::function<void(const float* in, size_t rows, float* out)>;

// What MoeMlp can keep for backward; each optional (null: not kept), each
// [R x ...] in expert-grouped order.
struct MoeMlpSaved {
  void* dispatched_x = nullptr;  // [R x d] of dtype: the received tokens
  float* y1 = nullptr;           // [R x h1] f32: tokens times w1 (act's input)
  void* hidden = nullptr;        // [R x h2] of dtype: act's output (w2's input)
};

// One MoE layer's expert MLP with its dispatch and combine, in one call:
// for each routed slot (t, j) of a token to expert e (the rank's local
// expert le),
//   y1     = a[t] w1[le]                     f32 (w1 [E/P x d x h1])
//   hidden = act(y1), rounded to dtype       (act null: identity, h2 = h1)
//   y2     = hidden w2[le], rounded to dtype (w2 [E/P x h2 x d])
// and c [T x d] f32 receives the probs-weighted sum of each token's y2 as
// MatmulAllToAll's does. The result is, bit for bit, that of
// AllToAllMatmul, act (then rounding to dtype), MatmulAllToAll. One call
// lets the pipelines overlap all three: a chunk of rows is sent back as
// soon as both its GEMMs are done, while later chunks still arrive, where
// two calls must finish the dispatch before the combine starts.
// Agreement rules as AllToAllMatmul's; h1 and h2 must agree too.
struct MoeMlpArgs {
  const void* a = nullptr;       // x [T x d] of dtype: this rank's tokens
  const void* w1 = nullptr;      // [E/P x d x h1] of dtype
  const void* w2 = nullptr;      // [E/P x h2 x d] of dtype
  float* c = nullptr;            // out [T x d]
  size_t d = 0, h1 = 0, h2 = 0;  // the token width and the widths before and after act
  DType dtype = DType::kF32;
  MoeActivation act = nullptr;   // null: the identity (then h2 must equal h1)
  const float* probs = nullptr;  // optional [T x topk] weights, as MatmulAllToAll's
  MoeMlpSaved saved = {};        // what to keep for backward
};

// Pipelines: serial = AllToAllMatmul's serial, act, MatmulAllToAll's
// serial; chunked = the rows for each rank are cut into `splits` chunks,
// every chunk posted at once, chunk j of every block multiplied (both
// GEMMs) and sent back as it arrives, the own rows in between; fused = the
// dispatch of AllToAllMatmul's fused pipeline (one block per port at a
// time, the busiest receiver's first), each chunk sent back as soon as its
// GEMMs are done, the own rows (cut into `splits` parts) whenever no chunk
// is there, and last; auto = the cost model's choice as for AllToAllMatmul,
// from the busiest rank's rows (both GEMMs) and port bytes (both
// directions).
FusedReport MoeMlp(const Group& g, const MoeRouting& routing, const MoeMlpArgs& args,
                   const FusedOptions& options = {});

}  // namespace mc2

#endif  // MC2_MOE_H_
