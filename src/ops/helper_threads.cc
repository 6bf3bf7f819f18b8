// Helper threads per calling thread (helper_threads.h).
//
// Works as follows. Each calling thread owns a Team (thread_local): its
// helpers wait for the team's generation to change, run their block of the
// current call, and count themselves done; the caller runs block 0, then
// waits for the count. The team grows when a call has more blocks than it
// has helpers, and joins them when the calling thread exits.
#include "ops/helper_threads.h"

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace mc2::ops {
namespace {

class Team {
 public:
  ~Team() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  void Run(int blocks, const std::function<void(int)>& fn) {
    while (static_cast<int>(threads_.size()) < blocks - 1) {
      const int index = static_cast<int>(threads_.size()) + 1;
      // It starts from the generation before this call, so that it runs
      // its block of this call however late it first takes the lock.
      threads_.emplace_back([this, index, gen = generation_] { Loop(index, gen); });
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      blocks_ = blocks;
      pending_ = blocks - 1;
      error_ = nullptr;
      ++generation_;
    }
    start_.notify_all();
    RunOne(fn, 0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void RunOne(const std::function<void(int)>& fn, int index) {
    try {
      fn(index);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }

  void Loop(int index, uint64_t seen) {
    for (;;) {
      const std::function<void(int)>* fn = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (index >= blocks_) continue;  // this call needs fewer helpers
        fn = fn_;
      }
      RunOne(*fn, index);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable start_, done_;
  std::vector<std::thread> threads_;  // the owning thread's only
  // Written by the owning thread under mu_ (so it may read it without).
  const std::function<void(int)>* fn_ = nullptr;  // guarded by mu_
  int blocks_ = 0;                                // guarded by mu_
  int pending_ = 0;                               // guarded by mu_
  uint64_t generation_ = 0;                       // guarded by mu_
  bool stop_ = false;                             // guarded by mu_
  std::exception_ptr error_;                      // guarded by mu_
};

}  // namespace

void RunBlocks(int blocks, const std::function<void(int)>& fn) {
  if (blocks <= 1) return fn(0);
  thread_local Team team;
  team.Run(blocks, fn);
}

}  // namespace mc2::ops
