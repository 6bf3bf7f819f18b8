// BucketExchange's kPowerSgd scheme (exchange.h): a bucket's matrices are
// sent as their rank-r factors, the other parameters exactly, in two
// all-reduces. Per matrix M (the gradient plus, with error feedback, the
// residual) and its Q (cols x r: the last step's, or the seeded start):
//   Start:    P = M Q; all-reduce [the other parameters | every P];
//   Advance:  orthogonalise the summed P (the same bits on every rank), this
//             rank's Q = M^T P, residual = M - P Q^T (what this rank did not
//             send); all-reduce [every Q];
//   Complete: M = P Q^T with the reduced Q (its mean or sum: the mean or sum
//             of the ranks' P Q_w^T), which is kept as the next step's Q.
// The error feedback is the paper's: each rank's residual is its own M minus
// its own contribution P Q_w^T, so over the ranks sum(M_w) = sum(P Q_w^T) +
// sum(residual_w), up to the rounding of the f32 products.
#include <algorithm>
#include <cstring>
#include <string>

#include "grad/exchange.h"
#include "grad/powersgd.h"
#include "mc2/error.h"
#include "mc2/trace.h"

namespace mc2::grad {

void BucketExchange::InitLowRank(std::vector<MatrixShape> shapes) {
  if (dtype_ != DType::kF32) {
    throw Error(ErrorCode::kInvalidArgument, "GradSync: powersgd compresses f32 gradients, not " +
                                                 std::string(DTypeName(dtype_)));
  }
  const CompressionOptions& c = opt_.compression;
  if (c.powersgd_rank < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "GradSync: powersgd_rank must be >= 1, got " + std::to_string(c.powersgd_rank));
  }
  const size_t want = static_cast<size_t>(c.powersgd_rank);
  for (size_t s = 0; s < starts_.size(); ++s) {
    const size_t end = s + 1 < starts_.size() ? starts_[s + 1] : count_;
    const size_t n = end - starts_[s];
    const MatrixShape m = s < shapes.size() ? shapes[s] : MatrixShape{};
    const size_t r = LowRankOf(m.rows, m.cols, want);
    if (m.rows * m.cols == n && LowRankPays(m.rows, m.cols, r)) {
      LowRank lr{s, starts_[s], m.rows, m.cols, r, n_p_, n_q_, m.key, std::vector<float>(m.cols * r)};
      InitQ(c.powersgd_seed, m.key, m.cols, r, lr.q.data());
      n_p_ += m.rows * r;
      n_q_ += m.cols * r;
      lr_.push_back(std::move(lr));
    } else if (n > 0) {
      plain_.emplace_back(starts_[s], n);
      n_plain_ += n;
    }
  }
  for (LowRank& lr : lr_) lr.p_off += n_plain_;
  const size_t total = n_plain_ + n_p_ + n_q_;
  if (n_ranks_ > 1) {
    sym_lr_ = g_.AllocSymmetric(std::max<size_t>(total, 1) * sizeof(float));
    buf_lr_ = sym_lr_.as<float>();
  } else {
    own_lr_.assign(std::max<size_t>(total, 1), 0.0f);
    buf_lr_ = own_lr_.data();
  }
  std::memset(buf_lr_, 0, std::max<size_t>(total, 1) * sizeof(float));
  if (c.error_feedback) residual_.assign(count_, 0.0f);
}

std::span<float> BucketExchange::low_rank_q(size_t slot) {
  for (LowRank& lr : lr_)
    if (lr.slot == slot) return lr.q;
  return {};
}

void BucketExchange::StartLowRank(GradSyncStats* stats) {
  float* m = static_cast<float*>(data_);
  {
    trace::Scope span("grad.compress", trace::Category::kCompute);
    size_t at = 0;
    for (auto [off, n] : plain_) {
      std::memcpy(buf_lr_ + at, m + off, n * sizeof(float));
      at += n;
    }
    for (LowRank& lr : lr_) {
      float* mm = m + lr.offset;
      if (!residual_.empty()) {
        const float* res = residual_.data() + lr.offset;
        for (size_t i = 0; i < lr.rows * lr.cols; ++i) mm[i] += res[i];
      }
      // Without warm start, a fresh Q each step: the seed, the tensor and
      // the step number choose it.
      if (!opt_.compression.powersgd_warm_start && lr_steps_ > 0)
        InitQ(opt_.compression.powersgd_seed + lr_steps_, lr.key, lr.cols, lr.r, lr.q.data());
      MulMQ(mm, lr.q.data(), buf_lr_ + lr.p_off, lr.rows, lr.cols, lr.r);
    }
  }
  ++lr_steps_;
  const size_t N = static_cast<size_t>(n_ranks_);
  stats->sent_elements += n_plain_ + n_p_ + n_q_;
  stats->wire_bytes += 2 * (N - 1) * (n_plain_ + n_p_ + n_q_) * sizeof(float) / N;
  const size_t n1 = n_plain_ + n_p_;
  if (n1 > 0)
    work_ = AllReduce(g_, buf_lr_, buf_lr_, n1, DType::kF32,
                      opt_.average ? ReduceOp::kAvg : ReduceOp::kSum, coll_);
}

void BucketExchange::AdvanceLowRank() {
  work_.Wait();
  if (lr_.empty()) return;
  const float* m = static_cast<const float*>(data_);
  float* qs = buf_lr_ + n_plain_ + n_p_;
  {
    trace::Scope span("grad.compress", trace::Category::kCompute);
    for (LowRank& lr : lr_) {
      float* p = buf_lr_ + lr.p_off;
      float* q = qs + lr.q_off;
      Orthogonalize(p, lr.rows, lr.r);
      MulMtP(m + lr.offset, p, q, lr.rows, lr.cols, lr.r);
      if (!residual_.empty()) {
        float* res = residual_.data() + lr.offset;
        std::memcpy(res, m + lr.offset, lr.rows * lr.cols * sizeof(float));
        MulPQt(p, q, res, lr.rows, lr.cols, lr.r, -1.0f, 1.0f);
      }
    }
  }
  work_ = AllReduce(g_, qs, qs, n_q_, DType::kF32, opt_.average ? ReduceOp::kAvg : ReduceOp::kSum,
                    coll_);
}

void BucketExchange::CompleteLowRank() {
  float* m = static_cast<float*>(data_);
  size_t at = 0;
  for (auto [off, n] : plain_) {
    std::memcpy(m + off, buf_lr_ + at, n * sizeof(float));
    at += n;
  }
  const float* qs = buf_lr_ + n_plain_ + n_p_;
  for (LowRank& lr : lr_) {
    const float* q = qs + lr.q_off;
    MulPQt(buf_lr_ + lr.p_off, q, m + lr.offset, lr.rows, lr.cols, lr.r, 1.0f, 0.0f);
    std::memcpy(lr.q.data(), q, lr.q.size() * sizeof(float));
  }
}

}  // namespace mc2::grad
