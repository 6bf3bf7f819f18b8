// The shared state behind an mc2::Work.
//
// Invariants: state_ goes kPending -> kDone or kPending -> kFailed exactly
// once; error_ is written before that transition (release) and read only
// after it (acquire), so readers need no lock.
#ifndef MC2_ENGINE_WORK_STATE_H_
#define MC2_ENGINE_WORK_STATE_H_

#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>

namespace mc2::engine {
class ProgressEngine;
}

namespace mc2::internal {

class WorkState {
 public:
  enum State : int { kPending = 0, kDone = 1, kFailed = 2 };

  explicit WorkState(uint64_t seq = 0, const char* op = "") : seq_(seq), op_(op) {}

  // `name` must outlive the operation (a string literal or a static name).
  void SetAlgorithm(const char* name) { algorithm_.store(name, std::memory_order_release); }
  std::string algorithm() const {
    const char* a = algorithm_.load(std::memory_order_acquire);
    return a ? std::string(a) : std::string();
  }
  uint64_t seq() const { return seq_; }
  const char* op() const { return op_; }

  // The engine whose queue holds this operation; a waiter may run the queue
  // itself up to it (ProgressEngine::RunQueuedUntil). Set before queuing.
  void SetHelper(engine::ProgressEngine* engine) { helper_ = engine; }

  // Makes a finished state new again for operation `seq`, instead of
  // allocating one (GroupImpl::TryRunInline, on the latency path of every
  // small collective). Only for a state nobody else holds: the caller owns
  // the last reference, so no thread can be waiting on or reading it.
  void Reset(uint64_t seq, const char* op) {
    seq_ = seq;
    op_ = op;
    error_ = nullptr;
    algorithm_.store(nullptr, std::memory_order_relaxed);
    helper_ = nullptr;
    sleeping_.store(false, std::memory_order_relaxed);
    state_.store(kPending, std::memory_order_relaxed);
  }

  void Complete() { Finish(kDone, nullptr); }
  // Complete() for a state no other thread can reach yet (an operation run
  // inline, before its Work is returned): nobody can be asleep on it, so
  // the Dekker check on sleeping_ -- a locked store and a seq_cst load on
  // the latency path of every small collective -- is not needed.
  void CompleteUnshared() { state_.store(kDone, std::memory_order_release); }
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
  uint64_t seq_;
  const char* op_;
  std::atomic<const char*> algorithm_{nullptr};
  engine::ProgressEngine* helper_ = nullptr;
  // Completion takes mu_ only when a waiter sleeps (Dekker on seq_cst:
  // either the finisher sees sleeping_, or the waiter sees the state).
  std::atomic<bool> sleeping_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace mc2::internal

#endif  // MC2_ENGINE_WORK_STATE_H_
