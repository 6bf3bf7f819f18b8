// The validated form of a batch of collectives (include/mc2/batch.h) and
// the exchange that runs it (batch_exchange.cc).
//
// Every rank packs its contributions to all entries into one stream of
// bytes, each entry's part at a 64-byte aligned offset that depends only on
// the entries (so every rank computes the same layout), and reads its
// peers' streams in place.
#ifndef MC2_COLLECTIVES_BATCH_PLAN_H_
#define MC2_COLLECTIVES_BATCH_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/group_impl.h"
#include "mc2/batch.h"

namespace mc2::collectives {

// One entry, checked. `contrib` bytes are what each rank packs for it (a
// broadcast's root only; the others leave the space unused), at byte
// `offset` of the stream.
struct BatchItem {
  BatchKind kind = BatchKind::kAllReduce;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  size_t count = 0;
  size_t esize = 4;
  const char* send = nullptr;  // this rank's contribution (null when none)
  char* recv = nullptr;
  bool in_place = false;
  size_t contrib = 0;  // all_reduce, all_gather, broadcast: count x esize;
                       // reduce_scatter: size x count x esize
  size_t offset = 0;
};

struct BatchPlan {
  std::vector<BatchItem> items;
  size_t total = 0;   // stream bytes (a multiple of 64)
  uint64_t hash = 0;  // of every entry's kind, dtype, op, root and count
};

// Alignment of each entry's part of the stream: a cache line (so that
// entries do not share lines), which every element size divides (so that
// windows of the stream cut no element).
inline constexpr size_t kBatchAlign = 64;

// The body of a batch on shared memory, inside an operation (after
// AwaitReuse, before any arrival): packs, arrives with `fp`, computes every
// entry's result and ends the operation.
void RunBatchExchange(internal::OpContext& ctx, const BatchPlan& plan,
                      const internal::Fingerprint& fp);

// The batch on a group that spans hosts (net_batch.cc): checks that every
// rank passed the same entries, then runs them fused into as few span
// collectives as their kinds, dtypes and ops allow, as one operation.
Work NetBatch(const Group& g, BatchPlan&& plan, const CollectiveOptions& opts);

}  // namespace mc2::collectives

#endif  // MC2_COLLECTIVES_BATCH_PLAN_H_
