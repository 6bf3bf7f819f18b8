// mc2/work.h: the handle of an asynchronous operation.
#ifndef MC2_WORK_H_
#define MC2_WORK_H_

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

namespace mc2 {

namespace internal {
class WorkState;
struct Access;
}  // namespace internal

// A Work is returned by every collective, point-to-point and fused operation.
// The operation runs on the rank's progress thread, or on the calling thread
// when that is cheaper: small calls made while nothing else is pending, and
// an operation still queued when Wait() is called (Wait runs it, and those
// queued before it, itself). The buffers it was given must stay valid and
// unmodified (inputs) or untouched (outputs) until the Work is complete.
//
// Copies share the same operation. A default-constructed Work is complete.
// Thread safety: Test/Wait may be called from any thread, concurrently.
class Work {
 public:
  Work() = default;

  // True once the operation finished, successfully or not. Never throws.
  bool Test() const;
  // Blocks until the operation finishes; throws its mc2::Error if it failed.
  // The operation's own timeout (MC2_TIMEOUT / options) bounds the wait.
  void Wait() const;
  // Like Wait, but returns false if still running after `timeout` (a queued
  // operation that this call runs itself may take longer).
  bool Wait(std::chrono::milliseconds timeout) const;
  // The failure, or null while running or after success.
  std::exception_ptr error() const;

  // The sequence number of the operation in its group (0 for no-ops).
  uint64_t seq() const;
  // The algorithm or pipeline that ran (e.g. "ring", "direct"); empty until
  // the operation has started.
  std::string algorithm() const;

 private:
  friend struct internal::Access;
  explicit Work(std::shared_ptr<internal::WorkState> state) : state_(std::move(state)) {}

  std::shared_ptr<internal::WorkState> state_;
};

}  // namespace mc2

#endif  // MC2_WORK_H_
