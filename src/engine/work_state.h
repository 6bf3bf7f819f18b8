// The shared state behind an mc2::Work.
//
// Invariants: state_ goes kPending -> kDone or kPending -> kFailed exactly
// once; error_ and algorithm_ are written before that transition (release)
// and read only after it (acquire), so readers need no lock.
#ifndef MC2_ENGINE_WORK_STATE_H_
#define MC2_ENGINE_WORK_STATE_H_

#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>

namespace mc2::internal {

class WorkState {
 public:
  enum State : int { kPending = 0, kDone = 1, kFailed = 2 };

  explicit WorkState(uint64_t seq = 0, const char* op = "") : seq_(seq), op_(op) {}

  void SetAlgorithm(std::string name) {
    std::lock_guard<std::mutex> lock(mu_);
    algorithm_ = std::move(name);
  }
  std::string algorithm() const {
    std::lock_guard<std::mutex> lock(mu_);
    return algorithm_;
  }
  uint64_t seq() const { return seq_; }
  const char* op() const { return op_; }

  void Complete() { Finish(kDone, nullptr); }
  void Fail(std::exception_ptr e) { Finish(kFailed, std::move(e)); }

  bool done() const { return state_.load(std::memory_order_acquire) != kPending; }
  std::exception_ptr error() const {
    return state_.load(std::memory_order_acquire) == kFailed ? error_ : nullptr;
  }
  // Spins briefly (the common case for short operations), then blocks.
  // Returns false if `timeout_ns` (< 0: forever) passed first.
  bool WaitDone(int64_t timeout_ns);

 private:
  void Finish(State s, std::exception_ptr e);

  std::atomic<int> state_{kPending};
  std::exception_ptr error_;
  const uint64_t seq_;
  const char* op_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string algorithm_;
  bool sleeping_ = false;  // guarded by mu_
};

}  // namespace mc2::internal

#endif  // MC2_ENGINE_WORK_STATE_H_
