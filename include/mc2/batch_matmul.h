// mc2/batch_matmul.h: the batched all-gather + matmul of sequence and
// context parallelism. Same conventions as the dense fused operators
// (mc2/fused_ops.h): a synchronous call, the agreement exchange, errors
// thrown on every rank, determinism, where things run.
#ifndef MC2_BATCH_MATMUL_H_
#define MC2_BATCH_MATMUL_H_

#include <cstddef>
#include <cstdint>

#include "mc2/fused_ops.h"
#include "mc2/group.h"
#include "mc2/tensor.h"

namespace mc2 {

// The layout of B in AllGatherBatchMatmul.
enum class BatchB : uint8_t {
  // B is [batch x k x n]: entry e of the batch multiplies by B[e] (e.g. the
  // per-head keys or values of attention).
  kPerBatch = 0,
  // B is one [k x n] matrix shared by every entry (e.g. a projection
  // weight): the batch is just more rows.
  kShared,
};

// C[e] [M x n] = gather_rows(A[e] of every rank) [M x k] * B[e] (or the
// shared B) for every batch entry e < batch. Rank r holds A [batch x m_r x
// k]: its rows (a sequence slice) of every entry; in C[e] and the gathered
// A, rank 0's rows come first, then rank 1's, ... (M = the sum of every
// rank's m; row counts may differ and be 0). C is [batch x M x n] f32,
// batch-major. `batch`, k and `b_layout` must agree across ranks (else
// kMismatch); n may differ (B is this rank's column block).
struct AllGatherBatchMatmulArgs {
  const void* a = nullptr;     // this rank's shard [batch x m x k] of dtype
  const void* b = nullptr;     // [batch x k x n] (kPerBatch) or [k x n] (kShared) of dtype
  float* c = nullptr;          // [batch x M x n]
  size_t m = 0, k = 0, n = 0;  // m: rows of this rank's shard per entry (may differ across ranks)
  DType dtype = DType::kF32;
  size_t batch = 0;
  BatchB b_layout = BatchB::kPerBatch;
  void* gathered_a = nullptr;  // optional [batch x M x k] of dtype, as AllGatherMatmul's
};

// Pipelines: serial = one AllGatherV, then one GEMM per entry (one GEMM in
// all for kShared); chunked = each shard, seen as batch*m rows, is cut into
// `splits` chunks gathered by separate AllGatherV calls (so the split runs
// along M when batch is 1 and along the batch when m is small), the own
// shard is multiplied first and chunk j of the others while chunks > j
// move; fused = point-to-point transfers all posted at once (each rank
// sends its shard to r+1, r+2, ... in that order): the own shard first,
// then the shards of ranks r-1, r-2, ..., each cut into `splits` chunks and
// multiplied chunk by chunk as they arrive; auto = the cost model's choice
// between serial and fused at the chunk count its T(s) favours (as for
// Pipeline::kAuto: fused only when predicted faster by a margin, from the
// busiest rank's GEMM rows and port bytes). Under link emulation serial and
// chunked gather with the ring algorithm (charged by the link).
FusedReport AllGatherBatchMatmul(const Group& g, const AllGatherBatchMatmulArgs& args,
                                 const FusedOptions& options = {});

}  // namespace mc2

#endif  // MC2_BATCH_MATMUL_H_
