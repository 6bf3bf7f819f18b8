// The progress engine: one thread per rank that executes communication.
//
// Tasks run one at a time in submission order, which is what keeps every
// rank's collectives in the same order. Small operations may instead run
// inline on the caller (TryRunInline) when nothing is queued or running, to
// save the thread hand-off (~microseconds) on latency-bound calls.
//
// Idle policy: the thread spins for MC2_SPIN_US (default 20 us) after its last
// task, then blocks on a condition variable, so an idle rank uses no CPU.
//
// Waiting callers help: a thread that waits for a task still queued runs the
// queue itself up to that task (RunQueuedUntil), so an operation issued and
// waited for at once costs no hand-off to the progress thread and back. The
// progress thread leaves a newly queued task alone for kGrace, enough for
// such a caller to arrive; a caller that computes instead gets its task run
// in the background after that.
//
// Thread safety: Submit/TryRunInline may be called from any thread.
#ifndef MC2_ENGINE_PROGRESS_ENGINE_H_
#define MC2_ENGINE_PROGRESS_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/work_state.h"

namespace mc2::engine {

class ProgressEngine {
 public:
  // `on_error` is called on the executing thread when a task throws an
  // mc2::Error other than kInvalidArgument (used to abort the world).
  explicit ProgressEngine(std::function<void(const std::exception_ptr&)> on_error);
  ~ProgressEngine();  // drains the queue, then joins the thread

  using Task = std::function<void()>;
  void Submit(std::shared_ptr<internal::WorkState> work, Task task);
  // Whether no task is queued or running (a hint: racy by nature, exact
  // when only the calling thread submits).
  bool Idle() const { return outstanding_.load(std::memory_order_acquire) == 0; }

  // Runs `task` on the calling thread if no task is queued or running;
  // returns false (and does nothing) otherwise. `work` must not be
  // reachable from another thread yet (it completes without the wake-up
  // check, WorkState::CompleteUnshared).
  template <typename F>
  bool TryRunInline(const std::shared_ptr<internal::WorkState>& work, F&& task) {
    if (outstanding_.load(std::memory_order_acquire) != 0) return false;
    try {
      task();
      work->CompleteUnshared();
    } catch (...) {
      Fail(work, std::current_exception());
    }
    return true;
  }

  // Runs queued tasks on the calling thread, in order, until `target` is
  // done or the queue holds nothing this thread can take (the progress
  // thread is running one). Returns whether `target` is done.
  bool RunQueuedUntil(const internal::WorkState* target);

  static constexpr std::chrono::microseconds kGrace{30};

  // The progress thread's id (tests of idleness read its CPU time).
  std::thread::id thread_id() const { return thread_.get_id(); }

  // Binds the progress thread to `cpus` (OS CPU numbers, core/placement.h);
  // false when the kernel refused, and the thread then keeps the CPUs it
  // inherited from the thread that made the engine. Any thread may call.
  bool BindThread(const std::vector<int>& cpus);

 private:
  void Loop();
  template <typename F>
  void Execute(const std::shared_ptr<internal::WorkState>& work, F&& task) {
    try {
      task();
      work->Complete();
    } catch (...) {
      Fail(work, std::current_exception());
    }
  }
  void Fail(const std::shared_ptr<internal::WorkState>& work, std::exception_ptr ep);

  std::function<void(const std::exception_ptr&)> on_error_;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Queued {
    std::shared_ptr<internal::WorkState> work;
    Task task;
    std::chrono::steady_clock::time_point queued_at;
  };
  // Takes the head task if no task is running (mu_ held); marks it running.
  bool TakeHead(Queued* out);
  void FinishTaken();
  std::deque<Queued> queue_;  // guarded by mu_
  bool running_ = false;      // guarded by mu_: a task is executing
  bool stop_ = false;                                                        // guarded by mu_
  bool sleeping_ = false;                                                    // guarded by mu_
  std::atomic<int64_t> outstanding_{0};  // queued + running tasks
  int64_t spin_ns_;
  std::thread thread_;
};

}  // namespace mc2::engine

#endif  // MC2_ENGINE_PROGRESS_ENGINE_H_
