#include <chrono>
#include <thread>

#include "engine/progress_engine.h"
#include "engine/work_state.h"
#include "mc2/work.h"

namespace mc2 {
namespace internal {

void WorkState::Finish(State s, std::exception_ptr e) {
  error_ = std::move(e);
  state_.store(s, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst)) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
}

bool WorkState::WaitDone(int64_t timeout_ns) {
  using Clock = std::chrono::steady_clock;
  if (done()) return true;
  // Run our own operation (and those queued before it) rather than wait
  // for the progress thread to get to it.
  if (helper_ && helper_->RunQueuedUntil(this)) return true;
  // Spin, yielding, for up to kSpin before sleeping: a sleeping waiter
  // costs a wake-up (tens of microseconds in a VM) when the operation
  // completes, which dominates mid-sized operations. Yielding keeps the
  // spin from starving the progress threads when ranks share cores.
  constexpr auto kSpin = std::chrono::microseconds(50);
  auto start = Clock::now();
  for (int i = 0;; ++i) {
    if (done()) return true;
    if ((i & 15) == 15) {
      if (Clock::now() - start > kSpin) break;
      std::this_thread::yield();
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  sleeping_.store(true, std::memory_order_seq_cst);
  if (timeout_ns < 0) {
    cv_.wait(lock, [&] { return done(); });
    return true;
  }
  return cv_.wait_until(lock, start + std::chrono::nanoseconds(timeout_ns), [&] { return done(); });
}

}  // namespace internal

bool Work::Test() const { return !state_ || state_->done(); }

void Work::Wait() const {
  if (!state_) return;
  state_->WaitDone(-1);
  if (auto e = state_->error()) std::rethrow_exception(e);
}

bool Work::Wait(std::chrono::milliseconds timeout) const {
  if (!state_) return true;
  if (!state_->WaitDone(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count()))
    return false;
  if (auto e = state_->error()) std::rethrow_exception(e);
  return true;
}

std::exception_ptr Work::error() const { return state_ ? state_->error() : nullptr; }
uint64_t Work::seq() const { return state_ ? state_->seq() : 0; }
std::string Work::algorithm() const { return state_ ? state_->algorithm() : std::string(); }

}  // namespace mc2
