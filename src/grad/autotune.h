// GradSync's autotuner (GradSyncOptions::autotune): which bucket cap (and
// compression threshold) makes a training step fastest, chosen from a few
// measured steps, as Horovod's autotune does.
//
// Works as follows. The candidates are the cross product of the caps and
// thresholds to try. Each candidate runs for warmup_steps untimed steps
// (the layout was just rebuilt: new storage, cold caches) and then
// steps_per_candidate timed ones; a step's time is that between the ends of
// two consecutive synchronised Finish calls, so it covers backward and the
// overlap the buckets allow. Once every candidate has its median, the
// ranks agree with one all-reduce (max) of the medians -- a step is as fast
// as its slowest rank -- and every rank picks the same candidate: the
// lowest agreed median, the earlier candidate on a tie. The tuner itself
// only counts and decides; GradSync switches layouts and does the
// all-reduce (grad_sync.cc).
//
// Invariants: candidates are visited in order, each exactly once; after
// Decide() the choice never changes. Thread safety: none (GradSync's
// thread only).
#ifndef MC2_GRAD_AUTOTUNE_H_
#define MC2_GRAD_AUTOTUNE_H_

#include <cstddef>
#include <vector>

namespace mc2::grad {

// The median of `v` (the mean of the two middle values for an even count;
// v must not be empty).
double Median(std::vector<double> v);

struct TuneCandidate {
  size_t bucket_cap_bytes = 0;
  float threshold = 0;
};

class Autotuner {
 public:
  // `candidates` non-empty; warmup >= 0, steps >= 1 (checked by GradSync).
  Autotuner(std::vector<TuneCandidate> candidates, int warmup, int steps);

  // What the caller must do after a synchronised step that took `seconds`
  // (negative: not measured, e.g. the first step).
  enum class Next {
    kContinue,  // keep the current candidate
    kSwitch,    // install candidate current() from the next step on
    kDecide,    // every candidate is measured: agree on medians() (max
                // over the ranks), then call Decide
  };
  Next OnStep(double seconds);
  // With the medians agreed across ranks: picks the fastest and returns it.
  size_t Decide(const std::vector<double>& agreed_medians);

  bool tuning() const { return !decided_; }
  size_t current() const { return current_; }
  const std::vector<TuneCandidate>& candidates() const { return candidates_; }
  // This rank's median step time of each candidate (seconds).
  const std::vector<double>& medians() const { return medians_; }
  const std::vector<double>& agreed() const { return agreed_; }

 private:
  std::vector<TuneCandidate> candidates_;
  int warmup_, steps_;
  size_t current_ = 0;
  int seen_ = 0;  // steps of the current candidate so far
  std::vector<double> times_;
  std::vector<double> medians_, agreed_;
  bool decided_ = false;
};

}  // namespace mc2::grad

#endif  // MC2_GRAD_AUTOTUNE_H_
