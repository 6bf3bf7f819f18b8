#include "grad/exchange.h"

#include <cstring>
#include <string>
#include <utility>

#include "core/reduce.h"
#include "mc2/error.h"
#include "mc2/trace.h"

namespace mc2::grad {

namespace {

bool Sparse(Compression c) { return c == Compression::kThreshold || c == Compression::kTopK; }

}  // namespace

BucketExchange::BucketExchange(const Group& g, void* data, size_t count, DType dtype,
                               std::vector<size_t> starts, const GradSyncOptions& options,
                               std::vector<MatrixShape> shapes)
    : g_(g), data_(data), count_(count), dtype_(dtype), starts_(std::move(starts)), opt_(options) {
  n_ranks_ = g.size();
  rank_ = g.rank();
  // In the background even when small: it is meant to run under the rest
  // of backward.
  coll_.may_run_inline = false;
  // Direct, rabenseifner, recursive doubling and tree follow the canonical
  // order whatever the group's setting; only the classic ring does not.
  if (opt_.deterministic && !g.deterministic()) coll_.algorithm = Algorithm::kRabenseifner;
  const Compression c = opt_.compression.scheme;
  if (c == Compression::kF16 || c == Compression::kBF16) {
    chunk_ = (count_ + static_cast<size_t>(n_ranks_) - 1) / static_cast<size_t>(n_ranks_);
    const size_t padded = chunk_ * static_cast<size_t>(n_ranks_);
    uint16_t* base;
    if (n_ranks_ > 1) {
      sym16_ = g.AllocSymmetric(3 * padded * sizeof(uint16_t));
      base = sym16_.as<uint16_t>();
    } else {
      own16_.assign(3 * padded, 0);
      base = own16_.data();
    }
    std::memset(base, 0, 3 * padded * sizeof(uint16_t));
    send16_ = base;
    recv16_ = base + padded;
    gather16_ = base + 2 * padded;
    wide_.assign(padded + chunk_, 0.0f);
  }
  if (Sparse(c)) {
    if (count_ > UINT32_MAX) {
      throw Error(ErrorCode::kInvalidArgument,
                  "GradSync: a bucket of " + std::to_string(count_) +
                      " elements is too large for sparse compression (indices are 32-bit)");
    }
    if (opt_.compression.error_feedback) residual_.assign(count_, 0.0f);
    counts_.assign(static_cast<size_t>(n_ranks_), 0);
  }
  if (c == Compression::kPowerSgd) InitLowRank(std::move(shapes));
}

void BucketExchange::Start(GradSyncStats* stats, bool compress) {
  scheme_ = compress ? opt_.compression.scheme : Compression::kNone;
  const Compression c = scheme_;
  const size_t esz = DTypeSize(dtype_);
  const size_t N = static_cast<size_t>(n_ranks_);
  if (N > 1) {
    ++stats->buckets;
    stats->dense_bytes += 2 * (N - 1) * count_ * esz / N;
  }
  started_ = true;
  stats_ = stats;
  if (c == Compression::kNone) {
    stats->sent_elements += count_;
    if (N == 1) return;  // the sum and the mean of one rank are the bucket
    stats->wire_bytes += 2 * (N - 1) * count_ * esz / N;
    work_ = AllReduce(g_, data_, data_, count_, dtype_,
                      opt_.average ? ReduceOp::kAvg : ReduceOp::kSum, coll_);
    return;
  }
  if (Sparse(c)) {
    StartSparse(stats);
  } else if (c == Compression::kPowerSgd) {
    StartLowRank(stats);
  } else {
    StartCast(stats);
  }
}

void BucketExchange::StartJoined(GradSyncStats* stats, const Work& work) {
  scheme_ = Compression::kNone;
  const size_t N = static_cast<size_t>(n_ranks_);
  const size_t b = 2 * (N - 1) * count_ * DTypeSize(dtype_) / N;
  ++stats->buckets;
  stats->dense_bytes += b;
  stats->wire_bytes += b;
  stats->sent_elements += count_;
  started_ = true;
  stats_ = stats;
  work_ = work;
}

void BucketExchange::StartCast(GradSyncStats* stats) {
  const DType half = scheme_ == Compression::kBF16 ? DType::kBF16 : DType::kF16;
  const size_t N = static_cast<size_t>(n_ranks_);
  {
    trace::Scope span("grad.compress", trace::Category::kCompute);
    ToHalf(half, static_cast<const float*>(data_), send16_, count_);
  }
  stats->sent_elements += count_;
  stats->wire_bytes += 2 * (N - 1) * chunk_ * sizeof(uint16_t);
  work_ = AllToAll(g_, send16_, recv16_, chunk_, half, coll_);
}

void BucketExchange::StartSparse(GradSyncStats* stats) {
  const size_t N = static_cast<size_t>(n_ranks_);
  const float* g = static_cast<const float*>(data_);
  {
    trace::Scope span("grad.compress", trace::Category::kCompute);
    if (scheme_ == Compression::kTopK) {
      mine_ = SelectTopK(g, residual_, count_, starts_, opt_.compression.topk_ratio);
    } else {
      mine_ = SelectThreshold(g, residual_, count_, opt_.compression.threshold);
    }
  }
  stats->sent_elements += mine_.size();
  if (scheme_ == Compression::kTopK) {
    // Every rank sends the same k (the same parameters, the same ratio):
    // one all-gather, no sizes to agree on.
    const size_t k = mine_.size();
    all_.resize(N * k);
    stats->wire_bytes += (N - 1) * k * sizeof(Pair);
    work_ = AllGather(g_, mine_.data(), all_.data(), k, DType::kI64, coll_);
    rcounts_.assign(N, k);
    return;
  }
  my_count_ = static_cast<int64_t>(mine_.size());
  stats->wire_bytes += (N - 1) * sizeof(int64_t);
  work_ = AllGather(g_, &my_count_, counts_.data(), 1, DType::kI64, coll_);
  rcounts_.clear();
}

void BucketExchange::Advance() {
  const Compression c = scheme_;
  if (c == Compression::kNone || c == Compression::kTopK) return;
  if (c == Compression::kPowerSgd) return AdvanceLowRank();
  work_.Wait();
  const size_t N = static_cast<size_t>(n_ranks_);
  if (c == Compression::kThreshold) {
    rcounts_.resize(N);
    displs_.resize(N);
    size_t total = 0;
    for (size_t r = 0; r < N; ++r) {
      if (counts_[r] < 0 || static_cast<uint64_t>(counts_[r]) > count_) {
        throw Error(ErrorCode::kInternal, "GradSync: rank " + std::to_string(r) + " sends " +
                                              std::to_string(counts_[r]) +
                                              " pairs for a bucket of " + std::to_string(count_));
      }
      rcounts_[r] = static_cast<size_t>(counts_[r]);
      displs_[r] = total;
      total += rcounts_[r];
    }
    all_.resize(total);
    stats_->wire_bytes += (total - rcounts_[static_cast<size_t>(rank_)]) * sizeof(Pair);
    work_ = AllGatherV(g_, mine_.data(), all_.data(), rcounts_, displs_, DType::kI64, coll_);
    return;
  }
  // 16-bit casts: rank r sums chunk r of every rank in f32.
  const DType half = c == Compression::kBF16 ? DType::kBF16 : DType::kF16;
  {
    trace::Scope span("grad.reduce", trace::Category::kCompute);
    FromHalf(half, recv16_, wide_.data(), N * chunk_);
    std::vector<const void*> srcs(N);
    for (size_t r = 0; r < N; ++r) srcs[r] = wide_.data() + r * chunk_;
    float* dst = wide_.data() + N * chunk_;
    core::ReduceTree(DType::kF32, opt_.average ? ReduceOp::kAvg : ReduceOp::kSum, dst, srcs.data(),
                     n_ranks_, chunk_, n_ranks_);
    ToHalf(half, dst, gather16_ + static_cast<size_t>(rank_) * chunk_, chunk_);
  }
  uint16_t* mine = gather16_ + static_cast<size_t>(rank_) * chunk_;
  work_ = AllGather(g_, mine, gather16_, chunk_, half, coll_);
}

void BucketExchange::Complete() {
  work_.Wait();
  work_ = Work();
  started_ = false;
  const Compression c = scheme_;
  if (c == Compression::kNone) return;
  trace::Scope span("grad.decompress", trace::Category::kCompute);
  if (c == Compression::kPowerSgd) return CompleteLowRank();
  float* out = static_cast<float*>(data_);
  if (c == Compression::kF16 || c == Compression::kBF16) {
    FromHalf(c == Compression::kBF16 ? DType::kBF16 : DType::kF16, gather16_, out, count_);
    return;
  }
  std::vector<std::span<const Pair>> lists;
  size_t off = 0;
  for (size_t r = 0; r < rcounts_.size(); ++r) {
    lists.emplace_back(all_.data() + off, rcounts_[r]);
    off += rcounts_[r];
  }
  MergeSparse(lists, out, count_, opt_.average);
}

void BucketExchange::WaitQuietly() {
  try {
    work_.Wait();
  } catch (...) {
  }
  work_ = Work();
  started_ = false;
}

}  // namespace mc2::grad
