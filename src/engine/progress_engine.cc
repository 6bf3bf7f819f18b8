#include "engine/progress_engine.h"

#include <pthread.h>

#include <chrono>

#include "core/env.h"
#include "core/placement.h"
#include "mc2/error.h"
#include "trace/recorder.h"

namespace mc2::engine {

ProgressEngine::ProgressEngine(std::function<void(const std::exception_ptr&)> on_error)
    : on_error_(std::move(on_error)) {
  spin_ns_ = core::EnvInt("MC2_SPIN_US", 20, 0, 1000000) * 1000;
  thread_ = std::thread([this] { Loop(); });
  // The OS name, so that tools (top -H, /proc/PID/task/*/comm, `mc2 topo`)
  // can find the thread; set here so that it is there before any caller
  // looks.
  pthread_setname_np(thread_.native_handle(), "mc2-progress");
}

ProgressEngine::~ProgressEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool ProgressEngine::BindThread(const std::vector<int>& cpus) {
  return core::BindThread(thread_.native_handle(), cpus);
}

void ProgressEngine::Submit(std::shared_ptr<internal::WorkState> work, Task task) {
  outstanding_.fetch_add(1, std::memory_order_acq_rel);
  work->SetHelper(this);
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({std::move(work), std::move(task), std::chrono::steady_clock::now()});
    wake = sleeping_;
  }
  if (wake) cv_.notify_one();
}

bool ProgressEngine::TakeHead(Queued* out) {
  if (running_ || queue_.empty()) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  running_ = true;
  return true;
}

void ProgressEngine::FinishTaken() {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
    wake = sleeping_;
  }
  outstanding_.fetch_sub(1, std::memory_order_acq_rel);
  if (wake) cv_.notify_all();
}

bool ProgressEngine::RunQueuedUntil(const internal::WorkState* target) {
  while (!target->done()) {
    Queued item;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!TakeHead(&item)) return target->done();
    }
    Execute(item.work, item.task);
    item = Queued{};  // release the task's captures before the next one
    FinishTaken();
  }
  return true;
}

void ProgressEngine::Fail(const std::shared_ptr<internal::WorkState>& work,
                          std::exception_ptr ep) {
  // Invalid arguments leave the world usable; anything else aborts it so
  // that every rank's pending operations fail promptly.
  bool abort = true;
  try {
    std::rethrow_exception(ep);
  } catch (const Error& e) {
    abort = e.code() != ErrorCode::kInvalidArgument;
  } catch (...) {
  }
  if (abort && on_error_) on_error_(ep);
  work->Fail(std::move(ep));
}

void ProgressEngine::Loop() {
  using Clock = std::chrono::steady_clock;
  trace::SetThreadName("progress");
  for (;;) {
    Queued item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (queue_.empty() && !stop_) {
        // Spin (unlocked) for a while: a burst of operations usually follows.
        lock.unlock();
        auto end = Clock::now() + std::chrono::nanoseconds(spin_ns_);
        while (Clock::now() < end && outstanding_.load(std::memory_order_acquire) == 0)
          std::this_thread::yield();
        lock.lock();
      }
      sleeping_ = true;
      cv_.wait(lock, [&] { return stop_ || (!queue_.empty() && !running_); });
      sleeping_ = false;
      if (queue_.empty()) {
        if (stop_ && !running_) return;  // stopped and drained
        continue;
      }
      // A caller about to wait for this task may run it itself (see the
      // class comment): leave it alone for kGrace.
      auto age = Clock::now() - queue_.front().queued_at;
      if (age < kGrace && !stop_) {
        lock.unlock();
        auto until = Clock::now() + (kGrace - age);
        while (Clock::now() < until) std::this_thread::yield();
        continue;
      }
      if (!TakeHead(&item)) continue;
    }
    Execute(item.work, item.task);
    item = Queued{};
    FinishTaken();
  }
}

}  // namespace mc2::engine
