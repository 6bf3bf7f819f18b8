// The completion of a net transport's request (net_transport.h).
#include "transport/net_transport.h"

#include <fmt/format.h>
#include <sched.h>

namespace mc2::transport {

using Clock = std::chrono::steady_clock;

void Completion::Finish(std::exception_ptr error) {
  bool now_done = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error && !error_) error_ = error;
    int left = remaining_.load(std::memory_order_relaxed);
    if (left > 0) {
      remaining_.store(error ? 0 : left - 1, std::memory_order_release);
      now_done = error || left == 1;
    }
    cv_.notify_all();
  }
  if (now_done && on_done_) on_done_(error_);
}

void Completion::Wait(Clock::time_point deadline, const std::function<void()>& health,
                      const std::function<std::string()>& what) const {
  // Short messages complete within microseconds: poll first.
  auto spin_until = Clock::now() + std::chrono::microseconds(50);
  while (!done() && Clock::now() < spin_until) sched_yield();
  while (!done()) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(10), [&] { return done(); });
    }
    if (done()) break;
    if (health) health();
    if (Clock::now() > deadline)
      throw Error(ErrorCode::kTimeout,
                  fmt::format("no {} rank {} completed within the timeout: {}",
                              send_ ? "send to" : "receive from", peer_, what ? what() : ""));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

}  // namespace mc2::transport
