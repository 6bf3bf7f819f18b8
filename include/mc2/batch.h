// mc2/batch.h: many collectives of different kinds, sizes, dtypes and
// reduction ops on one group, run as one exchange.
//
// Use:
//   std::vector<BatchEntry> b = {
//       BatchEntry::AllReduce(g1, g1, n1, DType::kF32, ReduceOp::kSum),
//       BatchEntry::AllGather(x, xs, n2, DType::kBF16),
//       BatchEntry::Broadcast(p, p, n3, DType::kI32, /*root=*/0)};
//   Batch(group, b).Wait();
//
// Each entry means what the collective of the same name in collectives.h
// means (counts in elements of its dtype; all_gather and reduce_scatter
// with one count per rank; in place as there). The batch runs them as one
// operation with one synchronisation when the packed contributions fit the
// group's scratch (2 x MC2_SCRATCH_BYTES; else one more per scratch half of
// data), where separate calls pay one or two each: every rank packs its
// contributions into its scratch, the ranks arrive once, and each rank
// computes every entry's result by reading its peers' packed data in place.
//
// Contracts:
// - Returns a Work (asynchronous, as every collective); every buffer must
//   stay valid until it completes. Entries complete together.
// - Every rank of the group must pass the same entries in the same order
//   (kind, count, dtype, op, root of each); a difference raises
//   mc2::Error(kMismatch) on every rank before data moves.
// - Invalid arguments throw mc2::Error(kInvalidArgument) from the call,
//   naming the entry: a bad dtype or op, a root out of range, a null buffer
//   that holds data, a byte count that overflows (as the single
//   collectives), an output that overlaps another entry's input or output
//   or its own input other than in place. Inputs may overlap each other
//   (one buffer sent in several entries). An empty batch is a no-op whose
//   Work is complete.
// - Deterministic mode (the default): each entry's result is bitwise the
//   one the separate collective gives (the canonical reduction order).
// - Any memory works: the batch always packs its inputs (one copy), so
//   symmetric buffers bring nothing here.
// - Groups that span hosts: one small all-gather, waited for in the call,
//   checks that every rank passed the same entries (kMismatch on every
//   rank otherwise; the group stays usable). Then the entries run as ONE
//   operation, fused into as few collectives across hosts as their kinds
//   allow: one all_reduce per (dtype, op) of the all_reduce entries, one
//   reduce_scatter per (dtype, op) of the reduce_scatter entries, and one
//   all_gatherv of bytes for every all_gather and broadcast entry together;
//   each with the algorithm (hierarchical or flat) that collective would
//   run at the packed size. Results are bitwise the separate collectives'
//   (deterministic mode). A fused step packs its inputs into a buffer of
//   its own (one copy in, one out; a step of a single entry uses the
//   entry's buffers); opts.timeout applies to each step;
//   opts.may_run_inline has no effect there.
// Thread safety: as the other collectives (one thread issues a group's
// calls).
#ifndef MC2_BATCH_H_
#define MC2_BATCH_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "mc2/collectives.h"
#include "mc2/group.h"
#include "mc2/tensor.h"
#include "mc2/work.h"

namespace mc2 {

enum class BatchKind : uint8_t { kAllReduce = 0, kAllGather, kReduceScatter, kBroadcast };
// "all_reduce", "all_gather", "reduce_scatter", "broadcast".
const char* BatchKindName(BatchKind k);

struct BatchEntry {
  BatchKind kind = BatchKind::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  // Elements: all_reduce and broadcast the whole buffer, all_gather and
  // reduce_scatter one rank's block (recv, resp. send, holds size x count).
  size_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;  // all_reduce, reduce_scatter
  int root = 0;                  // broadcast (send is read on root only)

  // recv = the reduction of every rank's send. In place: send == recv.
  static BatchEntry AllReduce(const void* send, void* recv, size_t count, DType dtype,
                              ReduceOp op) {
    return {BatchKind::kAllReduce, send, recv, count, dtype, op, 0};
  }
  // recv[r*count ..] = rank r's send. In place: send == recv + rank*count.
  static BatchEntry AllGather(const void* send, void* recv, size_t count, DType dtype) {
    return {BatchKind::kAllGather, send, recv, count, dtype, ReduceOp::kSum, 0};
  }
  // recv = block `rank` of the reduction of every rank's send (size*count).
  // In place: recv == send + rank*count.
  static BatchEntry ReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                                  ReduceOp op) {
    return {BatchKind::kReduceScatter, send, recv, count, dtype, op, 0};
  }
  // recv = root's send on every rank. In place on root: send == recv.
  static BatchEntry Broadcast(const void* send, void* recv, size_t count, DType dtype, int root) {
    return {BatchKind::kBroadcast, send, recv, count, dtype, ReduceOp::kSum, root};
  }
};

// Runs `entries` on `g` as one operation (see above). opts.algorithm must
// be kAuto or kDirect (the batch has one algorithm of its own);
// opts.may_run_inline and opts.timeout mean what they mean for the other
// collectives (inline: when the packed data is at most 4 MiB per rank).
Work Batch(const Group& g, std::span<const BatchEntry> entries, const CollectiveOptions& opts = {});

}  // namespace mc2

#endif  // MC2_BATCH_H_
