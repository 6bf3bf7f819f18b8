#include "engine/progress_engine.h"

#include <chrono>

#include "core/env.h"
#include "mc2/error.h"

namespace mc2::engine {

ProgressEngine::ProgressEngine(std::function<void(const std::exception_ptr&)> on_error)
    : on_error_(std::move(on_error)) {
  spin_ns_ = core::EnvInt("MC2_SPIN_US", 20, 0, 1000000) * 1000;
  thread_ = std::thread([this] { Loop(); });
}

ProgressEngine::~ProgressEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProgressEngine::Submit(std::shared_ptr<internal::WorkState> work, Task task) {
  outstanding_.fetch_add(1, std::memory_order_acq_rel);
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(work), std::move(task));
    wake = sleeping_;
  }
  if (wake) cv_.notify_one();
}

bool ProgressEngine::TryRunInline(const std::shared_ptr<internal::WorkState>& work,
                                  const Task& task) {
  if (outstanding_.load(std::memory_order_acquire) != 0) return false;
  Execute(work, task);
  return true;
}

void ProgressEngine::Execute(const std::shared_ptr<internal::WorkState>& work, const Task& task) {
  try {
    task();
    work->Complete();
  } catch (const Error& e) {
    auto ep = std::current_exception();
    if (e.code() != ErrorCode::kInvalidArgument && on_error_) on_error_(ep);
    work->Fail(ep);
  } catch (...) {
    auto ep = std::current_exception();
    if (on_error_) on_error_(ep);
    work->Fail(ep);
  }
}

void ProgressEngine::Loop() {
  using Clock = std::chrono::steady_clock;
  for (;;) {
    std::pair<std::shared_ptr<internal::WorkState>, Task> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (queue_.empty()) {
        // Spin (unlocked) for a while: a burst of operations usually follows.
        lock.unlock();
        auto end = Clock::now() + std::chrono::nanoseconds(spin_ns_);
        while (Clock::now() < end && outstanding_.load(std::memory_order_acquire) == 0)
          std::this_thread::yield();
        lock.lock();
        sleeping_ = true;
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        sleeping_ = false;
        if (queue_.empty()) return;  // stop_ and drained
      }
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    Execute(item.first, item.second);
    outstanding_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace mc2::engine
