// GradSync's `auto` compression (Compression::kAuto): whether a lossy
// scheme (CompressionOptions::auto_scheme, bf16 by default) makes a
// training step faster than the exact dense all-reduce, decided from a few
// measured steps, so that compression is on only where it pays (a slow
// link) and off where it does not (shared memory, fast links, small
// models).
//
// Works as follows. Two candidates, dense (kNone) first, then the lossy
// scheme, each measured as the autotuner measures a bucket cap
// (autotune.h): warmup untimed steps, then `steps` timed ones, a step's time
// being that between the ends of two synchronised Finish calls (so the
// encoding on the caller's thread and the overlap with backward count). The
// ranks agree with one all-reduce (max) of the two medians; the lossy
// scheme is kept only when the agreed dense median exceeds min_speedup x the
// agreed lossy median (it must earn the accuracy it costs), otherwise
// compression is turned off. GradSync does the all-reduce and the layout
// change (grad_sync.cc); this class counts and decides.
//
// Invariants: dense is measured before lossy, each exactly once; after
// Decide() the choice never changes. Thread safety: none (GradSync's thread
// only).
#ifndef MC2_GRAD_AUTO_COMPRESSION_H_
#define MC2_GRAD_AUTO_COMPRESSION_H_

#include <string>

#include "grad/autotune.h"
#include "mc2/grad.h"

namespace mc2::grad {

class AutoCompression {
 public:
  // `lossy` is not kNone or kAuto; warmup >= 0, steps >= 1, min_speedup >= 1
  // (checked by GradSync).
  AutoCompression(Compression lossy, int warmup, int steps, double min_speedup);

  // Whether the current step exchanges with the lossy scheme: while
  // measuring, during the lossy candidate's steps; once decided, whether it
  // was chosen.
  bool lossy_now() const;
  // After a measured synchronised step of `seconds`: kContinue, kSwitch
  // (the lossy candidate starts with the next step) or kDecide (agree on
  // medians() with max over the ranks, then call Decide).
  Autotuner::Next OnStep(double seconds);
  // With the agreed {dense, lossy} medians: the scheme chosen.
  Compression Decide(double dense_seconds, double lossy_seconds);

  bool deciding() const { return !decided_; }
  Compression lossy() const { return lossy_; }
  // The scheme in use: kNone while measuring and when compression was
  // turned off, else the lossy scheme.
  Compression chosen() const { return decided_ && use_lossy_ ? lossy_ : Compression::kNone; }
  // This rank's medians of the dense and the lossy steps (seconds).
  const std::vector<double>& medians() const { return tuner_.medians(); }
  double dense_seconds() const { return dense_; }
  double lossy_seconds() const { return lossy_seconds_; }
  // The log line of the decision.
  std::string Describe() const;

 private:
  Compression lossy_;
  double min_speedup_;
  Autotuner tuner_;
  bool decided_ = false, use_lossy_ = false;
  double dense_ = 0, lossy_seconds_ = 0;  // agreed medians
};

}  // namespace mc2::grad

#endif  // MC2_GRAD_AUTO_COMPRESSION_H_
