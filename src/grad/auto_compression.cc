#include "grad/auto_compression.h"

#include <fmt/format.h>

namespace mc2::grad {

AutoCompression::AutoCompression(Compression lossy, int warmup, int steps, double min_speedup)
    // Two candidates for the tuner's bookkeeping: 0 dense, 1 lossy (their
    // caps and thresholds are unused).
    : lossy_(lossy), min_speedup_(min_speedup), tuner_({{0, 0}, {1, 0}}, warmup, steps) {}

bool AutoCompression::lossy_now() const {
  if (decided_) return use_lossy_;
  return tuner_.current() == 1;
}

Autotuner::Next AutoCompression::OnStep(double seconds) {
  if (decided_) return Autotuner::Next::kContinue;
  return tuner_.OnStep(seconds);
}

Compression AutoCompression::Decide(double dense_seconds, double lossy_seconds) {
  dense_ = dense_seconds;
  lossy_seconds_ = lossy_seconds;
  tuner_.Decide({dense_seconds, lossy_seconds});
  use_lossy_ = dense_seconds > min_speedup_ * lossy_seconds;
  decided_ = true;
  return chosen();
}

std::string AutoCompression::Describe() const {
  return fmt::format(
      "GradSync auto compression: {} (median step time, slowest rank: none {:.3f} ms, {} {:.3f} "
      "ms; {} kept only when {:.2f}x faster)",
      use_lossy_ ? CompressionName(lossy_) : "none, compression does not pay", dense_ * 1e3,
      CompressionName(lossy_), lossy_seconds_ * 1e3, CompressionName(lossy_), min_speedup_);
}

}  // namespace mc2::grad
