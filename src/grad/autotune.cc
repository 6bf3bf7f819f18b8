#include "grad/autotune.h"

#include <algorithm>
#include <utility>

namespace mc2::grad {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

Autotuner::Autotuner(std::vector<TuneCandidate> candidates, int warmup, int steps)
    : candidates_(std::move(candidates)), warmup_(warmup), steps_(steps) {}

Autotuner::Next Autotuner::OnStep(double seconds) {
  if (decided_) return Next::kContinue;
  ++seen_;
  // A step that was not measured does not count as a timed one.
  if (seen_ > warmup_ && seconds >= 0) times_.push_back(seconds);
  if (seen_ <= warmup_ || static_cast<int>(times_.size()) < steps_) {
    if (seen_ > warmup_ && seconds < 0) --seen_;
    return Next::kContinue;
  }
  medians_.push_back(Median(times_));
  times_.clear();
  seen_ = 0;
  if (current_ + 1 < candidates_.size()) {
    ++current_;
    return Next::kSwitch;
  }
  return Next::kDecide;
}

size_t Autotuner::Decide(const std::vector<double>& agreed_medians) {
  agreed_ = agreed_medians;
  size_t best = 0;
  for (size_t i = 1; i < agreed_.size(); ++i)
    if (agreed_[i] < agreed_[best]) best = i;
  current_ = best;
  decided_ = true;
  return best;
}

}  // namespace mc2::grad
