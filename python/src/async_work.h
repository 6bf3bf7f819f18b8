// python/src/async_work.h: the handle of an asynchronous call from Python or
// torch.distributed (a c10d::Work), and the threads that complete it.
//
// How a call completes. The call issues one or more mc2 operations (each an
// mc2::Work running on the rank's progress thread, or already complete when
// it ran inline) and returns an AsyncWork at once. The AsyncWork completes
// when all of them are done, its tensors are checked (see below) and its
// finishing step ran (copying results into non-contiguous or listed output
// tensors): on the calling thread if everything was already done at return,
// else on the group's completion thread, which waits for its works in order.
// Then wait() returns, and the future (getFuture()) is marked completed --
// never on mc2's progress thread and never on the completion thread, but on
// a callback thread: a callback may itself issue a call and wait for its
// future (PowerSGD's hook does), which needs the completion thread free.
//
// Tensors must not change while a call runs. The version counters of the
// tensors a call reads or writes are recorded when it is issued and compared
// when its operations are done: an in-place change made in between (the
// only kind torch counts) fails the call with kInvalidArgument naming it.
//
// Thread safety: every member function may be called from any thread.
#ifndef MC2_PYTHON_ASYNC_WORK_H_
#define MC2_PYTHON_ASYNC_WORK_H_

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

namespace mc2py {

class Completer;

class AsyncWork : public c10d::Work {
 public:
  // `result`: the tensors the future's value lists (torch's convention: the
  // output tensors of the call).
  AsyncWork(int rank, c10d::OpType type, std::string op, std::vector<at::Tensor> result);
  ~AsyncWork() override;

  // Set-up, before Start (single thread).
  void Add(mc2::Work w) { works_.push_back(std::move(w)); }
  // Keeps `t` alive until completion and watches its version counter;
  // `what` names it in the error ("all_reduce: tensor").
  void Watch(const at::Tensor& t, std::string what);
  // Keeps `t` alive until completion (a temporary the operations use).
  void Keep(at::Tensor t) { keep_.push_back(std::move(t)); }
  // Runs after the operations succeeded, before completion (in the order
  // added), e.g. copying a result into a non-contiguous output.
  void OnSuccess(std::function<void()> fn) { on_success_.push_back(std::move(fn)); }
  // Whether an operation was issued already.
  bool Issued() const { return !works_.empty(); }
  // Completes at once if every operation is already done, else hands the
  // work to `completer`.
  static void Start(const c10::intrusive_ptr<AsyncWork>& w, Completer& completer);

  // c10d::Work.
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override { return result_; }
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  const std::string& op() const { return op_; }
  bool AllDone() const;
  // Waits for the operations, checks and finishes; then completes the work
  // and marks the future: on this thread when `issuing` (the call is being
  // issued, so nothing can have been chained to its future yet), else on a
  // callback thread. Never throws.
  void Complete(bool issuing);

 private:
  std::string op_;
  std::vector<mc2::Work> works_;
  std::vector<at::Tensor> keep_;
  struct Watched {
    at::Tensor t;
    uint32_t version;
    std::string what;
  };
  std::vector<Watched> watched_;
  std::vector<std::function<void()>> on_success_;
  std::vector<at::Tensor> result_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// One thread per group that waits for the group's pending works in issue
// order (a group's operations complete in that order) and completes them.
//
// A work's last reference may be dropped on the completer's thread, which
// then frees its tensors, and a tensor that owns a Python object takes the
// GIL to free it. Once the interpreter finalizes, a thread that asks for
// the GIL is ended on the spot (and a C++ thread so ended aborts the
// process), so every completer is stopped (its pending works completed,
// its thread joined) at interpreter exit, before finalization:
// StopAllAtExit, from the module's atexit hook, which then waits until no
// callback thread runs (WaitForCallbackThreads). A work issued after that
// (by a later atexit hook or a finalizer) completes on the issuing thread,
// in the call.
class Completer {
 public:
  Completer();
  ~Completer();  // Stop()
  void Push(c10::intrusive_ptr<AsyncWork> w);
  // Waits for the pending works, then joins the thread. Call without the
  // GIL (the thread may need it).
  void Stop();
  // Stop() on every completer of the process, then WaitForCallbackThreads
  // (atexit; releases the GIL). From then on Exiting() is true.
  static void StopAllAtExit();
  static bool Exiting();

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<AsyncWork>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// Runs `fn` on a callback thread of the process: a pool that starts a new
// thread whenever none is idle, so a callback that blocks (waiting for
// another call's future) never keeps a later future from completing.
void RunOnCallbackThread(std::function<void()> fn);
// Blocks until no callback thread runs a task or holds what one used (call
// without the GIL: the callbacks may need it).
void WaitForCallbackThreads();

}  // namespace mc2py

#endif  // MC2_PYTHON_ASYNC_WORK_H_
