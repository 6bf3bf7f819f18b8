// mc2/ops.h: compute building blocks of the fused compute+communication
// operators: the GEMM wrapper and 16-bit float conversions.
//
// GEMM. Row-major, C = alpha * op(A) * op(B) + beta * C (+ bias), where
// op(X) is X or its transpose, op(A) is m x k, op(B) is k x n and C is m x n.
// f32 runs on OpenBLAS (cblas_sgemm); bf16 inputs run on oneDNN's matmul,
// accumulating in f32 and writing f32 or bf16. Both are thin wrappers: the
// numbers are the libraries' own.
#ifndef MC2_OPS_H_
#define MC2_OPS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "mc2/group.h"
#include "mc2/tensor.h"
#include "mc2/work.h"

namespace mc2 {

// Which library runs a GEMM. kAuto: OpenBLAS for f32, oneDNN for bf16.
// kOneDNN also runs f32 (oneDNN's own f32 matmul; on this machine's
// AVX-512 cores 1.9x OpenBLAS's rate: 183 against 96 GF/s at 1024^3 in
// build/bench/gemm_bench) and is the one to use when results must not
// depend on how the rows are cut: with one thread, a oneDNN product's row i
// is bitwise the same whatever m and whichever rows are computed with it,
// while OpenBLAS picks different kernels (and summation orders) by size.
// kOpenBLAS with bf16 is invalid.
enum class GemmBackend : uint8_t { kAuto = 0, kOpenBLAS, kOneDNN };

struct GemmOptions {
  // op(A) = A^T: A is stored k x m (row-major). Likewise trans_b: B is n x k.
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  // With beta == 0, C is not read (it may hold NaNs or garbage).
  float beta = 0.0f;
  // Optional f32 vector of n elements added to every row of C, after the
  // alpha/beta combination: C = alpha * op(A) op(B) + beta * C + bias.
  const float* bias = nullptr;
  // Row strides in elements of the stored matrices; 0 means tight (the
  // stored row length: k or m for A, n or k for B, n for C). A non-zero
  // stride must be at least the stored row length.
  size_t lda = 0;
  size_t ldb = 0;
  size_t ldc = 0;
  // Threads this call may use: 0 = MC2_GEMM_THREADS, default 1 (one core
  // per rank; the rank's other threads are for communication).
  int threads = 0;
  GemmBackend backend = GemmBackend::kAuto;
};

// C = alpha * op(A) * op(B) + beta * C (+ bias), synchronously on the calling
// thread (and `threads` - 1 helpers).
//
// Types: `ab` is the type of A and B, `c_type` that of C. Supported:
//   ab = kF32,  c_type = kF32    OpenBLAS cblas_sgemm (oneDNN with kOneDNN)
//   ab = kBF16, c_type = kF32    oneDNN matmul, f32 accumulation
//   ab = kBF16, c_type = kBF16   same, the result rounded to bf16 (nearest
//                                even); beta reads the bf16 C
// Anything else, a null pointer with a non-empty operand, or a stride below
// the row length throws mc2::Error(kInvalidArgument); a library failure
// throws mc2::Error(kInternal) naming it. m, n or k may be 0 (k == 0 gives
// C = beta * C + bias).
//
// The buffers are the caller's and only read (A, B, bias) or written (C)
// during the call; C must not overlap A, B or bias.
//
// Performance: oneDNN primitives are created once per (shape, transposes,
// strides, types, alpha, beta, bias, threads) and cached for the life of the
// process (a thread-safe cache; the first call of a shape pays for the
// primitive's creation, about a millisecond). On oneDNN, a transposed A and
// strided (non-tight) operands are first copied to dense buffers (m k, k n
// or m n elements, small next to the 2 m n k flops), which keeps every call
// on its fast kernels; those buffers stay allocated per calling thread.
// OpenBLAS calls go straight to the library. Measured on this host (one
// thread, bench/gemm_bench): ~102 GF/s f32, ~206 GF/s bf16.
//
// Reproducibility: the same call gives the same bits every time. Across
// shapes see GemmBackend: with kOneDNN and one thread, computing rows
// [r0, r1) alone gives exactly those rows of the full product (what chunked
// pipelines need); column blocks are not invariant (oneDNN blocks K by N).
//
// Threading: any thread may call Gemm, concurrently with other calls (ranks
// that are threads of one process included). `threads` sets OpenMP's thread
// count of the calling thread for oneDNN, and OpenBLAS's thread count, which
// is process-wide: concurrent f32 calls should use the same value. With more
// than one thread, both libraries' helper threads may spin for a while after
// a call, taking CPU from communication; the default of 1 has no helpers.
void Gemm(size_t m, size_t n, size_t k, DType ab, const void* a, const void* b, DType c_type,
          void* c, const GemmOptions& options = {});

inline void Gemm(size_t m, size_t n, size_t k, const float* a, const float* b, float* c,
                 const GemmOptions& options = {}) {
  Gemm(m, n, k, DType::kF32, a, b, DType::kF32, c, options);
}
inline void Gemm(size_t m, size_t n, size_t k, const bf16* a, const bf16* b, float* c,
                 const GemmOptions& options = {}) {
  Gemm(m, n, k, DType::kBF16, a, b, DType::kF32, c, options);
}
inline void Gemm(size_t m, size_t n, size_t k, const bf16* a, const bf16* b, bf16* c,
                 const GemmOptions& options = {}) {
  Gemm(m, n, k, DType::kBF16, a, b, DType::kBF16, c, options);
}

// The FLOP count of one Gemm call, 2 m n k, for reporting GF/s.
inline double GemmFlops(size_t m, size_t n, size_t k) {
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
}

// Element-wise conversions between f32 and bf16 (round to nearest even; NaN
// stays NaN, quiet). src and dst must not overlap. Any thread may call.
void ConvertF32ToBF16(const float* src, bf16* dst, size_t count);
void ConvertBF16ToF32(const bf16* src, float* dst, size_t count);

// ---------------------------------------------------------------------------
// Fused compute+communication operators (issue 3).
//
// Each operator multiplies local matrices and runs the collective that
// follows (or precedes) the product in a tensor-parallel layer. All matrices
// are row-major and tight; A and B are of `dtype` (kF32, or kBF16 with f32
// accumulation); C is always f32.
//
// Where things run. The operator call runs every GEMM on the calling thread
// and overlaps it with communication tasks it submits to the rank's progress
// thread (collectives, the fused pipeline's copies) and with the emulated
// link's delivery thread (the fused pipeline's transfers). It
// returns once the whole result is in place: the returned Work is already
// complete (Work::algorithm() names the pipeline that ran). A communication
// failure is reported by that Work (Wait() rethrows it); the ...Sync
// convenience calls Wait() for you. Invalid arguments throw
// mc2::Error(kInvalidArgument) and shapes that disagree across ranks throw
// mc2::Error(kMismatch) from the call, on EVERY rank: each call starts with a
// small all-gather of every rank's shapes and options, checked identically
// everywhere, so a bad argument on one rank fails all ranks instead of
// hanging them (a group of one rank runs no collective at all). Sizes whose
// byte counts overflow size_t are invalid arguments, named in the error. Every rank of the group
// must call the same operator in the same order (like a collective). Calls on one group from one
// thread at a time. Buffers are the caller's; they are only used during the call.
//
// Determinism. In deterministic mode (Group::deterministic(), the default)
// f32 GEMMs run on oneDNN (GemmBackend::kOneDNN, row-block invariant) and
// the reductions use the canonical ReduceTree order over ranks, so every
// pipeline and every split count give the serial result bit for bit (f32
// and bf16). This needs one GEMM thread per rank (gemm_threads 0 with
// MC2_GEMM_THREADS unset, or 1). Outside deterministic mode f32 uses
// OpenBLAS and results may differ in the last bits between pipelines.

// How an operator overlaps its GEMMs with the communication.
enum class Pipeline : uint8_t {
  // GEMM, then the collective (or the collective, then the GEMM). Under
  // link emulation (MC2_LINK) serial and chunked run their collectives with
  // the ring algorithm, which charges the link with the bytes it sends
  // (the direct algorithms declare none, docs/link-emulation.md).
  kSerial = 0,
  // CoC: M is cut into `splits` chunks (every rank's row block is cut the
  // same way); the collective of chunk i runs on the progress thread while
  // chunk i+1 is multiplied.
  kChunked,
  // Ring decomposition over one-sided symmetric-memory transfers: every
  // block is cut into `splits` chunks; a rank multiplies the chunk it
  // already holds while the next ones move (AllGatherMatmul: its own shard
  // first, then chunk j of shard r-1, r-2, ... as each lands;
  // MatmulReduceScatter: chunk j of the partial for rank r+1, r+2, ...,
  // each handed to its owner as soon as it is made, which reduces the n
  // partials of a chunk with ReduceTree in rank order once they landed;
  // MatmulAllReduce: the same, and each reduced chunk is handed to every
  // peer at once). The data lives in a per-group workspace in the symmetric
  // heap (allocated on first use, grown as needed, freed with the group;
  // for M x n products about M n 4 bytes per rank: a workspace that does
  // not fit the heap fails with kShmExhausted on every rank); a transfer is
  // a signal that, under link emulation, arrives at the modeled completion
  // time on the sender's egress port, and the consumer reads the chunk in
  // place. Waiting sleeps (no CPU burnt); a dead or stuck peer fails every
  // rank within the timeout. See src/ops/fused_ops.cc.
  kFused,
  // Chosen per call by a cost model (src/ops/cost_model.h): for serial,
  // chunked and fused with s = 1..16 it predicts
  //   T(s) ~ max(Tc, Tm) + min(Tc, Tm) / stages + steps * alpha
  // with the GEMM's efficiency loss on small chunks, the collectives' cost
  // on shared memory (of which only a measured fraction hides behind
  // GEMMs: the cores that copy are the cores that multiply) and the
  // emulated link's (which hides fully), and takes the fastest; it keeps
  // serial unless that is predicted >= 3% faster (serial for one rank).
  // Parameters: the tuning file `mc2 bench ops --tune` writes
  // (MC2_OPS_TUNING_FILE, else ~/.cache/mc2/ops_tuning.json), else built-in
  // defaults. The inputs are the globally agreed shapes and settings, so
  // every rank chooses alike (ranks with different tuning files or link
  // settings get kMismatch). The choice is reported in FusedReport,
  // Work::algorithm() and the operator's trace span ("fused s=8").
  kAuto,
};
inline constexpr int kNumPipelines = 4;
// "serial", "chunked", "fused", "auto".
const char* PipelineName(Pipeline p);
std::optional<Pipeline> ParsePipeline(std::string_view name);

struct FusedOptions {
  Pipeline pipeline = Pipeline::kAuto;
  // Chunks of the chunked pipeline, and chunks per block of the fused one,
  // 1..16 (must agree across ranks; serial and auto check the range but
  // ignore the value).
  int splits = 4;
  // Timeout of the collectives involved; 0 = the group's (MC2_TIMEOUT).
  std::chrono::nanoseconds timeout{0};
  // GemmOptions::threads for every GEMM (0 = MC2_GEMM_THREADS, default 1).
  int gemm_threads = 0;
  // Independent work to hide behind this call's communication, e.g. a
  // weight-gradient GEMM that does not depend on the call (Megatron overlaps
  // the input-gradient reduce-scatter with it). Run once on the calling
  // thread: AllGatherMatmul, MatmulReduceScatter and MatmulAllReduce run it
  // at the first moment their chunked or fused pipeline would otherwise
  // block on a transfer; the serial pipeline (which never overlaps), the
  // other operators, and calls that never block run it just before
  // returning. It must not use this call's buffers or communicate on this
  // group; an exception from it fails the call (and aborts the world, as
  // any failure in the middle of an operator does). Local to this rank: not
  // part of the agreement across ranks.
  std::function<void()> overlap_work;
};

// What an operator call ran (kAuto resolved), for reports and benchmarks.
struct FusedReport {
  Pipeline pipeline = Pipeline::kSerial;
  int splits = 1;
};

// C [M x n] = gather_rows(A_shard of every rank) [M x k] * B [k x n], where
// rank r holds A_shard [m_local_r x k] and M = sum of m_local_r (row counts
// may differ and be 0). k must agree across ranks; n may differ (B is this
// rank's column block; C may be null only when M x n = 0). `gathered_a` (optional, M x k of dtype) receives the
// gathered A (what backward reuses); null if not wanted.
Work AllGatherMatmul(const Group& g, const void* a_shard, size_t m_local, size_t k,
                     const void* b, size_t n, DType dtype, float* c, void* gathered_a = nullptr,
                     const FusedOptions& options = {}, FusedReport* report = nullptr);

// C_shard [m_local x n] = rows [sum(m_local of ranks < r), +m_local) of
// sum over ranks of A [M x k_local] * B [k_local x n]. M and n must agree
// across ranks, the m_local must add up to M; k_local may differ.
Work MatmulReduceScatter(const Group& g, const void* a, size_t m, size_t k, const void* b,
                         size_t n, DType dtype, float* c_shard, size_t m_local,
                         const FusedOptions& options = {}, FusedReport* report = nullptr);

// C [M x n] = sum over ranks of A [M x k_local] * B [k_local x n], on every
// rank. M and n must agree across ranks; k_local may differ.
Work MatmulAllReduce(const Group& g, const void* a, size_t m, size_t k, const void* b,
                     size_t n, DType dtype, float* c, const FusedOptions& options = {},
                     FusedReport* report = nullptr);

// Synchronous conveniences: the call, then Wait().
inline void AllGatherMatmulSync(const Group& g, const void* a_shard, size_t m_local, size_t k,
                                const void* b, size_t n, DType dtype, float* c,
                                void* gathered_a = nullptr, const FusedOptions& options = {},
                                FusedReport* report = nullptr) {
  AllGatherMatmul(g, a_shard, m_local, k, b, n, dtype, c, gathered_a, options, report).Wait();
}
inline void MatmulReduceScatterSync(const Group& g, const void* a, size_t m, size_t k,
                                    const void* b, size_t n, DType dtype, float* c_shard,
                                    size_t m_local, const FusedOptions& options = {},
                                    FusedReport* report = nullptr) {
  MatmulReduceScatter(g, a, m, k, b, n, dtype, c_shard, m_local, options, report).Wait();
}
inline void MatmulAllReduceSync(const Group& g, const void* a, size_t m, size_t k, const void* b,
                                size_t n, DType dtype, float* c, const FusedOptions& options = {},
                                FusedReport* report = nullptr) {
  MatmulAllReduce(g, a, m, k, b, n, dtype, c, options, report).Wait();
}

// ---------------------------------------------------------------------------
// Batched all-gather + matmul (sequence / context parallelism), issue 3 §2.
// Same conventions as the operators above (agreement exchange, errors on
// every rank, determinism, where things run).

// The layout of B in AllGatherBatchMatmul.
enum class BatchB : uint8_t {
  // B is [batch x k x n]: entry e of the batch multiplies by B[e] (e.g. the
  // per-head keys or values of attention).
  kPerBatch = 0,
  // B is one [k x n] matrix shared by every entry (e.g. a projection
  // weight): the batch is just more rows.
  kShared,
};

// C[e] [M x n] = gather_rows(A_shard[e] of every rank) [M x k] * B[e] (or
// the shared B) for every batch entry e < batch. Rank r holds A_shard
// [batch x m_local_r x k]: its rows (a sequence slice) of every entry; in
// C[e] and the gathered A, rank 0's rows come first, then rank 1's, ...
// (M = sum of m_local_r; row counts may differ and be 0). C is
// [batch x M x n] f32, batch-major. `batch`, k and `b_layout` must agree
// across ranks (else kMismatch); n may differ (B is this rank's column
// block). `gathered_a` (optional, [batch x M x k] of dtype) receives the
// gathered A, as AllGatherMatmul's.
//
// Pipelines: serial = one AllGatherV, then one GEMM per entry (one GEMM in
// all for kShared); chunked = each shard, seen as batch*m_local rows, is
// cut into `splits` chunks gathered by separate AllGatherV calls (so the
// split runs along M when batch is 1 and along the batch when m_local is
// small), the own shard is multiplied first and chunk j of the others while
// chunks > j move; fused = point-to-point transfers all posted at once (each
// rank sends its shard to r+1, r+2, ... in that order): the own shard
// first, then the shards of ranks r-1, r-2, ..., each cut into `splits`
// chunks and multiplied chunk by chunk as they arrive; auto = the cost
// model's choice between serial and fused at the chunk count its T(s)
// favours (as for Pipeline::kAuto: fused only when predicted faster by a
// margin, from the busiest rank's GEMM rows and port bytes). Under link
// emulation serial and chunked gather with the ring algorithm (charged by
// the link).
Work AllGatherBatchMatmul(const Group& g, const void* a_shard, size_t batch, size_t m_local,
                          size_t k, const void* b, BatchB b_layout, size_t n, DType dtype,
                          float* c, void* gathered_a = nullptr, const FusedOptions& options = {},
                          FusedReport* report = nullptr);

inline void AllGatherBatchMatmulSync(const Group& g, const void* a_shard, size_t batch,
                                     size_t m_local, size_t k, const void* b, BatchB b_layout,
                                     size_t n, DType dtype, float* c, void* gathered_a = nullptr,
                                     const FusedOptions& options = {},
                                     FusedReport* report = nullptr) {
  AllGatherBatchMatmul(g, a_shard, batch, m_local, k, b, b_layout, n, dtype, c, gathered_a,
                       options, report)
      .Wait();
}

// ---------------------------------------------------------------------------
// Mixture of experts (expert parallelism), issue 3 §2.
//
// E experts are spread over the P ranks of a group, E / P per rank: expert e
// lives on rank e / (E / P) as its local expert e % (E / P). Each rank has T
// tokens [T x d] and routes each to `topk` experts (expert_ids [T x topk],
// row-major; id -1 drops that slot: it is neither sent nor combined). A
// *slot* is one (token t, choice j) pair, numbered t * topk + j. The three
// calls of one MoE layer:
//
//   MoeRouting r = MoeRoute(g, ids, T, topk, E);          // counts exchange
//   AllToAllMatmul(g, r, x, d, w1, h, dtype, y1);         // dispatch + x W1
//   ... y1 -> activation -> hidden (dtype) ...
//   MatmulAllToAll(g, r, hidden, h, w2, d, dtype, out, probs);  // W2 + combine
//
// On the expert side, rows are in *expert-grouped order*: local expert 0's
// rows first, then expert 1's, ...; within an expert, the rows from rank 0
// (in its slot order), then from rank 1, ... expert_rows(le) gives the
// count of each expert, num_received() the total R.

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

// Dispatch + expert GEMM. x [T x d] (dtype) are this rank's tokens, w
// [E/P x d x h] (dtype) its experts' weights (expert le's [d x h] at
// w + le d h). y [R x h] f32 receives, in expert-grouped order, each routed
// slot's token times its expert's weight; `dispatched_x` (optional,
// [R x d] of dtype) the received tokens in the same order (what the weight
// gradient needs). d and h must agree across ranks, and so must the
// routing (its fingerprint, recomputed): else kMismatch on every rank.
//
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
// count matrix, link settings and operator
// tuning are the same everywhere (checked), so is the choice.
// FusedOptions::timeout does not apply
// to the point-to-point messages (they use the group's timeout).
Work AllToAllMatmul(const Group& g, const MoeRouting& routing, const void* x, size_t d,
                    const void* w, size_t h, DType dtype, float* y, void* dispatched_x = nullptr,
                    const FusedOptions& options = {}, FusedReport* report = nullptr);

// Expert GEMM + combine. hidden [R x h] (dtype), in expert-grouped order (as
// AllToAllMatmul's y), is multiplied by this rank's experts' w
// [E/P x h x d] (dtype) and each row is returned to the rank and slot it
// came from, in dtype (bf16 operands: the f32-accumulated row rounded to
// bf16, half the bytes of f32); out [T x d] f32 receives, per token t,
//   out[t] = sum over j = 0..topk-1 with expert_ids[t, j] != -1, in that
//            order, of probs[t * topk + j] * (row of slot (t, j))
// (probs: f32 [T x topk], e.g. the router's gate values; null = 1). A token
// with every slot dropped gets zeros. Same agreement rules as
// AllToAllMatmul.
//
// Pipelines: serial = one GEMM per expert, then the all-to-all-v back,
// then the combine; chunked = the rows for each other rank are cut into
// `splits` chunks, each multiplied and then sent while the next is
// multiplied, the own rows last; fused = chunk j of the block for rank
// r+1, r+2, ... (blocks cut into `splits` chunks) multiplied and sent while
// the next is multiplied, the own block last; auto as AllToAllMatmul.
Work MatmulAllToAll(const Group& g, const MoeRouting& routing, const void* hidden, size_t h,
                    const void* w, size_t d, DType dtype, float* out,
                    const float* probs = nullptr, const FusedOptions& options = {},
                    FusedReport* report = nullptr);

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
//   y1     = x[t] w1[le]                     f32 (w1 [E/P x d x h1])
//   hidden = act(y1), rounded to dtype       (act null: identity, h2 = h1)
//   y2     = hidden w2[le], rounded to dtype (w2 [E/P x h2 x d])
// and out [T x d] f32 receives the probs-weighted sum of each token's y2 as
// MatmulAllToAll's does. The result is, bit for bit, that of
// AllToAllMatmul, act (then rounding to dtype), MatmulAllToAll. One call
// lets the pipelines overlap all three: a chunk of rows is sent back as
// soon as both its GEMMs are done, while later chunks still arrive, where
// two calls must finish the dispatch before the combine starts (with
// skewed experts at 4 ranks, the busiest rank's dispatch GEMMs and its
// combine sends then cannot overlap; docs/benchmarks.md).
//
// Pipelines: serial = AllToAllMatmul's serial, act, MatmulAllToAll's
// serial; chunked = the rows for each rank are cut into `splits` chunks,
// every chunk posted at once, chunk j of every block multiplied (both
// GEMMs) and sent back as it arrives, the own rows in between; fused = the
// dispatch of AllToAllMatmul's fused pipeline (one block per port at a
// time, the busiest receiver's first), each chunk sent back as soon as
// its GEMMs are done, the own rows (cut into `splits` parts) whenever no
// chunk is there, and last; auto = the cost model's choice as for
// AllToAllMatmul, from the busiest rank's rows (both GEMMs) and port bytes
// (both directions). Agreement
// rules as AllToAllMatmul's; h1 and h2 must agree too.
Work MoeMlp(const Group& g, const MoeRouting& routing, const void* x, size_t d, const void* w1,
            size_t h1, const MoeActivation& act, size_t h2, const void* w2, DType dtype,
            float* out, const float* probs = nullptr, const MoeMlpSaved& saved = {},
            const FusedOptions& options = {}, FusedReport* report = nullptr);

inline void MoeMlpSync(const Group& g, const MoeRouting& routing, const void* x, size_t d,
                       const void* w1, size_t h1, const MoeActivation& act, size_t h2,
                       const void* w2, DType dtype, float* out, const float* probs = nullptr,
                       const MoeMlpSaved& saved = {}, const FusedOptions& options = {},
                       FusedReport* report = nullptr) {
  MoeMlp(g, routing, x, d, w1, h1, act, h2, w2, dtype, out, probs, saved, options, report).Wait();
}

inline void AllToAllMatmulSync(const Group& g, const MoeRouting& routing, const void* x,
                               size_t d, const void* w, size_t h, DType dtype, float* y,
                               void* dispatched_x = nullptr, const FusedOptions& options = {},
                               FusedReport* report = nullptr) {
  AllToAllMatmul(g, routing, x, d, w, h, dtype, y, dispatched_x, options, report).Wait();
}
inline void MatmulAllToAllSync(const Group& g, const MoeRouting& routing, const void* hidden,
                               size_t h, const void* w, size_t d, DType dtype, float* out,
                               const float* probs = nullptr, const FusedOptions& options = {},
                               FusedReport* report = nullptr) {
  MatmulAllToAll(g, routing, hidden, h, w, d, dtype, out, probs, options, report).Wait();
}

}  // namespace mc2

#endif  // MC2_OPS_H_
