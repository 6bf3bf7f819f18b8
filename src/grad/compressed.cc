// CompressedAllReduce (mc2/grad.h): one BucketExchange over a caller's
// buffer, with the caller's residual copied into the exchange's own before
// the selection and back after it.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "grad/exchange.h"
#include "mc2/error.h"
#include "mc2/grad.h"

namespace mc2 {

namespace {

[[noreturn]] void Invalid(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "compressed all_reduce: " + what);
}

bool Sparse(Compression c) { return c == Compression::kThreshold || c == Compression::kTopK; }

}  // namespace

// Invariants: ex_ is null exactly when count_ is 0 (nothing to exchange);
// started_ from Start until Finish.
class CompressedAllReduce::Impl {
 public:
  Impl(const Group& g, float* data, size_t count, const CompressionOptions& c, bool average,
       std::span<float> residual, std::vector<size_t> segments)
      : residual_(residual) {
    if (!g.valid()) Invalid("the group is invalid");
    if (count > 0 && data == nullptr) Invalid("the data pointer is null");
    if (c.scheme == Compression::kThreshold && !(c.threshold >= 0 && std::isfinite(c.threshold))) {
      Invalid("the threshold must be finite and >= 0, got " + std::to_string(c.threshold));
    }
    if (c.scheme == Compression::kPowerSgd || c.scheme == Compression::kAuto) {
      Invalid(std::string("scheme ") + CompressionName(c.scheme) +
              " is for GradSync only (powersgd needs the parameters' shapes and keeps "
              "state across steps; auto measures whole steps)");
    }
    if (c.scheme == Compression::kTopK && !(c.topk_ratio > 0 && c.topk_ratio <= 1)) {
      Invalid("topk_ratio must be in (0, 1], got " + std::to_string(c.topk_ratio));
    }
    if (!residual.empty() && !Sparse(c.scheme)) {
      Invalid(std::string("error feedback (a residual) applies to threshold and topk, not to ") +
              CompressionName(c.scheme));
    }
    if (!residual.empty() && residual.size() != count) {
      Invalid("the residual holds " + std::to_string(residual.size()) +
              " elements; the data holds " + std::to_string(count));
    }
    if (segments.empty()) segments.push_back(0);
    if (segments[0] != 0) Invalid("the first segment must start at element 0");
    for (size_t i = 1; i < segments.size(); ++i) {
      if (segments[i] <= segments[i - 1] || segments[i] >= count) {
        Invalid("segment starts must be increasing and below the element count " +
                std::to_string(count) + " (segment " + std::to_string(i) + " starts at " +
                std::to_string(segments[i]) + ")");
      }
    }
    options_.compression = c;
    options_.compression.error_feedback = !residual.empty();
    options_.compression.warmup_steps = 0;
    options_.average = average;
    if (count == 0) return;
    ex_ = std::make_unique<grad::BucketExchange>(g, data, count, DType::kF32, std::move(segments),
                                                 options_);
  }

  ~Impl() {
    if (ex_ && started_) ex_->WaitQuietly();
  }

  void Start() {
    if (started_ || finished_) {
      throw Error(ErrorCode::kInvalidArgument, "compressed all_reduce: Start called twice");
    }
    started_ = true;
    if (!ex_) return;
    std::span<float> own = ex_->residual();
    if (!residual_.empty()) std::copy(residual_.begin(), residual_.end(), own.begin());
    ex_->Start(&stats_, /*compress=*/true);
    if (!residual_.empty()) std::copy(own.begin(), own.end(), residual_.begin());
    ex_->Advance();
  }

  Work pending() const { return ex_ ? ex_->pending() : Work(); }

  void Finish() {
    if (!started_) {
      throw Error(ErrorCode::kInvalidArgument, "compressed all_reduce: Finish before Start");
    }
    started_ = false;
    finished_ = true;
    if (ex_) ex_->Complete();
  }

  const GradSyncStats& stats() const { return stats_; }

 private:
  std::span<float> residual_;
  GradSyncOptions options_;  // the exchange keeps a reference: declared before it
  GradSyncStats stats_;
  std::unique_ptr<grad::BucketExchange> ex_;
  bool started_ = false, finished_ = false;
};

CompressedAllReduce::CompressedAllReduce(const Group& g, float* data, size_t count,
                                         const CompressionOptions& compression, bool average,
                                         std::span<float> residual, std::vector<size_t> segments)
    : impl_(std::make_unique<Impl>(g, data, count, compression, average, residual,
                                   std::move(segments))) {}

CompressedAllReduce::~CompressedAllReduce() = default;

void CompressedAllReduce::Start() { impl_->Start(); }
Work CompressedAllReduce::pending() const { return impl_->pending(); }
void CompressedAllReduce::Finish() { impl_->Finish(); }
const GradSyncStats& CompressedAllReduce::stats() const { return impl_->stats(); }

}  // namespace mc2
