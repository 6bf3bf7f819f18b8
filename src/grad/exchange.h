// One bucket's exchange in a GradSync step: the dense all-reduce in place,
// or a compressed scheme (mc2/grad.h), as Start -> Advance -> Complete.
//
// Start issues the first collective (asynchronous, on the progress thread);
// Advance issues the second one of the two-phase schemes (it needs the
// first's result: the 16-bit casts reduce the all-to-all's chunks, the
// threshold scheme sizes its all-gatherv from the all-gathered counts);
// Complete waits and decodes into the bucket. The caller calls each in
// bucket order on every rank, so every rank issues the same collectives in
// the same order.
#ifndef MC2_GRAD_EXCHANGE_H_
#define MC2_GRAD_EXCHANGE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "grad/codec.h"
#include "mc2/collectives.h"
#include "mc2/grad.h"
#include "mc2/group.h"
#include "mc2/work.h"

namespace mc2::grad {

// A parameter's shape as a matrix (kPowerSgd): rows x cols, 0 x 0 when it
// was registered as a vector; `key` (its id) seeds its Q.
struct MatrixShape {
  size_t rows = 0, cols = 0;
  uint64_t key = 0;
};

// Invariants: the buffers a Work reads or writes live until it completes
// (members, never resized while one is pending); Complete (or WaitQuietly)
// follows every Start before the next Start.
// Thread safety: the GradSync's thread only.
class BucketExchange {
 public:
  // `data`: the bucket, `count` elements of `dtype`, in g's symmetric heap.
  // Collective over g when the scheme needs buffers of its own (f16, bf16).
  // `starts`: the first element of each parameter in the bucket; `shapes`
  // (kPowerSgd; empty: none is a matrix): each parameter's shape.
  BucketExchange(const Group& g, void* data, size_t count, DType dtype, std::vector<size_t> starts,
                 const GradSyncOptions& options, std::vector<MatrixShape> shapes = {});

  // Issues the first collective; adds what the step moves to `stats`.
  // `compress` false: this step is exchanged uncompressed (warm-up).
  void Start(GradSyncStats* stats, bool compress);
  // Issues the second (two-phase schemes), after waiting for the first.
  void Advance();
  // Waits and leaves the reduced (decoded) gradient in the bucket.
  void Complete();
  // Waits for whatever is running, ignoring failures.
  void WaitQuietly();
  // As Start for an uncompressed step whose all-reduce the caller issued
  // (fused with other buckets' into one Batch): `work` completes it.
  void StartJoined(GradSyncStats* stats, const Work& work);
  // Whether this step's exchange of the bucket is a plain all-reduce of the
  // bucket in place (so several can be fused), given `compress`.
  bool Dense(bool compress) const {
    return !compress || opt_.compression.scheme == Compression::kNone;
  }
  size_t bytes() const { return count_ * DTypeSize(dtype_); }
  DType dtype() const { return dtype_; }
  const CollectiveOptions& collective_options() const { return coll_; }

  // The uncompressed all-reduce of a group that spans hosts: the flat
  // exchange instead of the hierarchical one (grad/levels.h chooses).
  void UseFlatAllReduce() { coll_.algorithm = Algorithm::kDirect; }

  std::span<float> residual() { return residual_; }
  // kPowerSgd: parameter `slot`'s Q (cols x r, its warm start), or an empty
  // span when the parameter is not compressed.
  std::span<float> low_rank_q(size_t slot);
  // The collective last issued (complete when none is running).
  const Work& pending() const { return work_; }
  void* data() const { return data_; }

 private:
  void StartCast(GradSyncStats* stats);
  void StartSparse(GradSyncStats* stats);
  // kPowerSgd (powersgd_exchange.cc).
  void InitLowRank(std::vector<MatrixShape> shapes);
  void StartLowRank(GradSyncStats* stats);
  void AdvanceLowRank();
  void CompleteLowRank();

  Group g_;
  void* data_;
  size_t count_;
  DType dtype_;
  std::vector<size_t> starts_;
  const GradSyncOptions& opt_;
  CollectiveOptions coll_;
  int n_ranks_, rank_;
  Work work_;
  GradSyncStats* stats_ = nullptr;  // of the step in progress
  bool started_ = false;
  Compression scheme_ = Compression::kNone;  // of the step in progress

  // 16-bit casts: chunk of c elements per rank.
  size_t chunk_ = 0;
  // In the symmetric heap (zero-copy exchanges) when the group has peers.
  SymmetricBuffer sym16_;
  std::vector<uint16_t> own16_;
  uint16_t *send16_ = nullptr, *recv16_ = nullptr, *gather16_ = nullptr;
  std::vector<float> wide_;
  // Sparse schemes.
  std::vector<float> residual_;
  std::vector<Pair> mine_, all_;
  int64_t my_count_ = 0;
  std::vector<int64_t> counts_;
  std::vector<size_t> rcounts_, displs_;
  // kPowerSgd: the compressed parameters, and the exchange buffer (in the
  // symmetric heap when the group has peers): [the uncompressed parameters'
  // elements | every P] all-reduced first, then [every Q].
  struct LowRank {
    size_t slot, offset, rows, cols, r;
    size_t p_off, q_off;  // in buf_lr_, q_off from the Q part's start
    uint64_t key;
    std::vector<float> q;  // the last step's Q (warm start)
  };
  std::vector<LowRank> lr_;
  std::vector<std::pair<size_t, size_t>> plain_;  // (offset, count) of the others
  size_t n_plain_ = 0, n_p_ = 0, n_q_ = 0;
  SymmetricBuffer sym_lr_;
  std::vector<float> own_lr_;
  float* buf_lr_ = nullptr;
  uint64_t lr_steps_ = 0;  // compressed steps started
};

}  // namespace mc2::grad

#endif  // MC2_GRAD_EXCHANGE_H_
