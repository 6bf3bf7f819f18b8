// mc2/fused_ops.h: the dense fused compute+communication operators
// (AllGatherMatmul, MatmulReduceScatter, MatmulAllReduce), their pipelines
// and options, shared by the batched (mc2/batch_matmul.h) and MoE
// (mc2/moe.h) operators.
//
// Each operator multiplies local matrices and runs the collective that
// follows (or precedes) the product in a tensor-parallel layer. All matrices
// are row-major and tight; A and B are of `dtype` (kF32, or kBF16 with f32
// accumulation); C is always f32. Each takes its buffers and shapes in one
// argument struct, always in the same order (inputs, output, shapes, dtype,
// then the operator's own fields), meant for designated initializers:
//
//   AllGatherMatmul(g, {.a = x, .b = w, .c = y, .m = s, .k = h, .n = f});
//
// Synchronous calls. An operator returns when its whole result is in place;
// the overlap of GEMMs and communication happens inside the call, so an
// asynchronous form would add nothing but a handle that is always complete.
//
// Where things run. The call runs every GEMM on the calling thread and
// overlaps it with communication tasks it submits to the rank's progress
// thread (collectives, the fused pipeline's copies) and with the emulated
// link's delivery thread (the fused pipeline's transfers). It returns a
// FusedReport naming the pipeline that ran. Any failure throws mc2::Error:
// invalid arguments throw kInvalidArgument and shapes that disagree across
// ranks throw kMismatch, on EVERY rank: each call starts with a small
// all-gather of every rank's shapes and options, checked identically
// everywhere, so a bad argument on one rank fails all ranks instead of
// hanging them (a group of one rank runs no collective at all). Sizes whose
// byte counts overflow size_t or exceed PTRDIFF_MAX (the largest possible
// buffer) are invalid arguments; the error names the
// argument struct's fields (args.m, args.k, ...). A communication failure in
// the middle of a call (a peer died, a timeout) throws its code on every rank
// that meets it; the world is then aborted, so the others fail promptly too
// (docs/errors.md). Every rank of the group must call the same operator in
// the same order (like a collective). Calls on one group from one thread at
// a time. Buffers are the caller's; they are only used during the call.
//
// Determinism. In deterministic mode (Group::deterministic(), the default)
// f32 GEMMs run on GemmBackend::kOneDNN (a row-block invariant kernel:
// oneDNN's on AVX-512 hosts, mc2's tiled one elsewhere, mc2/gemm.h) and
// the reductions use the canonical ReduceTree order over ranks, so every
// pipeline and every split count give the serial result bit for bit (f32
// and bf16), with any number of GEMM threads per rank (gemm_threads: each
// thread computes its own row block, mc2/gemm.h). Outside deterministic
// mode f32 uses OpenBLAS and results may differ in the last bits between
// pipelines.
#ifndef MC2_FUSED_OPS_H_
#define MC2_FUSED_OPS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "mc2/group.h"
#include "mc2/tensor.h"

namespace mc2 {

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
  // rank within the timeout.
  kFused,
  // Chosen per call by the cost model: for serial, chunked and fused with
  // s = 1..16 it predicts
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
  // settings get kMismatch). The choice is reported in FusedReport and the
  // operator's trace span ("fused s=8").
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
  // GemmOptions::threads for every GEMM (0 = MC2_GEMM_THREADS, default 1):
  // the calling thread and gemm_threads - 1 helpers, which run only during
  // the GEMMs. With a rank per socket, the socket's cores less one (the
  // progress thread's core) is the usual choice (docs/topology.md).
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

// B is [k x n], or with trans_b its transpose stored [n x k] (the input
// gradient of a layer y = x W reads W [k x n] as B = W^T that way, with no
// transposed copy); the result is bitwise the one of B stored plain. trans_b
// is this rank's own layout (it may differ across ranks).
//
// C [M x n] = gather_rows(A of every rank) [M x k] * B [k x n], where rank r
// holds its shard A [m_r x k] and M = the sum of every rank's m (row counts
// may differ and be 0). k must agree across ranks; n may differ (B is this
// rank's column block; c may be null only when M x n = 0).
struct AllGatherMatmulArgs {
  const void* a = nullptr;     // this rank's shard [m x k] of dtype
  const void* b = nullptr;     // [k x n] of dtype ([n x k] with trans_b)
  float* c = nullptr;          // [M x n], M = the sum of every rank's m
  size_t m = 0, k = 0, n = 0;  // m: rows of this rank's shard (may differ across ranks)
  DType dtype = DType::kF32;
  void* gathered_a = nullptr;  // optional [M x k] of dtype: the gathered A (what backward reuses)
  bool trans_b = false;        // b holds B^T, [n x k]
};
FusedReport AllGatherMatmul(const Group& g, const AllGatherMatmulArgs& args,
                            const FusedOptions& options = {});

// C [m_local x n] = rows [sum of m_local of the ranks < r, + m_local) of
// the sum over ranks of A [m x k] * B [k x n]. m and n must agree across
// ranks, the ranks' m_local must add up to m; k may differ (each rank holds
// its slice of the reduction dimension).
struct MatmulReduceScatterArgs {
  const void* a = nullptr;     // [m x k] of dtype
  const void* b = nullptr;     // [k x n] of dtype ([n x k] with trans_b)
  float* c = nullptr;          // [m_local x n]: this rank's rows of the sum
  size_t m = 0, k = 0, n = 0;  // k: this rank's slice (may differ across ranks)
  DType dtype = DType::kF32;
  size_t m_local = 0;    // rows of c (may differ across ranks; they add up to m)
  bool trans_b = false;  // b holds B^T, [n x k]
};
FusedReport MatmulReduceScatter(const Group& g, const MatmulReduceScatterArgs& args,
                                const FusedOptions& options = {});

// C [m x n] = the sum over ranks of A [m x k] * B [k x n], on every rank. m
// and n must agree across ranks; k may differ.
struct MatmulAllReduceArgs {
  const void* a = nullptr;     // [m x k] of dtype
  const void* b = nullptr;     // [k x n] of dtype ([n x k] with trans_b)
  float* c = nullptr;          // [m x n]
  size_t m = 0, k = 0, n = 0;  // k: this rank's slice (may differ across ranks)
  DType dtype = DType::kF32;
  bool trans_b = false;        // b holds B^T, [n x k]
};
FusedReport MatmulAllReduce(const Group& g, const MatmulAllReduceArgs& args,
                            const FusedOptions& options = {});

}  // namespace mc2

#endif  // MC2_FUSED_OPS_H_
