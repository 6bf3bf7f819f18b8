// python/src/async_work.cc: AsyncWork, the completion threads and the
// callback threads (see async_work.h).
#include "async_work.h"

#include <fmt/format.h>
#include <pybind11/pybind11.h>

#include <set>

namespace mc2py {

AsyncWork::AsyncWork(int rank, c10d::OpType type, std::string op, std::vector<at::Tensor> result)
    : c10d::Work(rank, type),
      op_(std::move(op)),
      result_(std::move(result)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors())) {}

AsyncWork::~AsyncWork() = default;

void AsyncWork::Watch(const at::Tensor& t, std::string what) {
  watched_.push_back({t, t.unsafeGetTensorImpl()->version_counter().current_version(),
                      std::move(what)});
}

bool AsyncWork::AllDone() const {
  for (const mc2::Work& w : works_)
    if (!w.Test()) return false;
  return true;
}

void AsyncWork::Start(const c10::intrusive_ptr<AsyncWork>& w, Completer& completer) {
  if (w->AllDone()) {
    w->Complete(/*issuing=*/true);
  } else {
    completer.Push(w);
  }
}

void AsyncWork::Complete(bool issuing) {
  std::exception_ptr failure;
  try {
    for (const mc2::Work& w : works_) w.Wait();
    for (const Watched& x : watched_) {
      uint32_t now = x.t.unsafeGetTensorImpl()->version_counter().current_version();
      if (now != x.version) {
        throw mc2::Error(mc2::ErrorCode::kInvalidArgument,
                         fmt::format("{} was modified in place while the call ran (its version "
                                     "went from {} to {}): a tensor handed to an asynchronous "
                                     "call must not change before wait()",
                                     x.what, x.version, now),
                         -1, op_);
      }
    }
    for (auto& fn : on_success_) fn();
  } catch (...) {
    failure = std::current_exception();
  }
  // Drop what the operations used before anyone is woken.
  works_.clear();
  keep_.clear();
  watched_.clear();
  on_success_.clear();
  finish(failure);
  c10::intrusive_ptr<c10::ivalue::Future> fut = future_;
  std::vector<at::Tensor> value = result_;
  auto mark = [fut, value = std::move(value), failure]() mutable {
    if (failure) {
      fut->setError(failure);
    } else {
      fut->markCompleted(c10::IValue(std::move(value)));
    }
  };
  if (issuing) {
    mark();
  } else {
    RunOnCallbackThread(std::move(mark));
  }
}

bool AsyncWork::isCompleted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool AsyncWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr AsyncWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

bool AsyncWork::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == kNoTimeout) {
    cv_.wait(lock, [&] { return completed_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
    throw mc2::Error(mc2::ErrorCode::kTimeout,
                     fmt::format("wait() gave up after {} ms; the call is still running",
                                 timeout.count()),
                     -1, op_);
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

namespace {

// Every live completer (StopAllAtExit).
std::mutex g_completers_mu;
std::set<Completer*>& Completers() {
  static auto* all = new std::set<Completer*>;
  return *all;
}

}  // namespace

Completer::Completer() {
  std::lock_guard<std::mutex> lock(g_completers_mu);
  Completers().insert(this);
}

Completer::~Completer() {
  {
    std::lock_guard<std::mutex> lock(g_completers_mu);
    Completers().erase(this);
  }
  Stop();
}

void Completer::Stop() {
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    t = std::move(thread_);
  }
  cv_.notify_all();
  if (t.joinable()) t.join();
}

// Waits (call without the GIL) until no callback is queued or running, at
// most `limit`: a callback still running when the interpreter finalizes may
// ask for the GIL (a future's Python callback, or dropping a Python object)
// and would be ended on the spot, which aborts the process.
void DrainCallbacks(std::chrono::milliseconds limit);

void Completer::StopAllAtExit() {
  pybind11::gil_scoped_release no_gil;
  {
    std::lock_guard<std::mutex> lock(g_completers_mu);
    for (Completer* c : Completers()) c->Stop();
  }
  // The completed works' futures run their callbacks on the callback
  // threads: let those finish while the interpreter still runs.
  DrainCallbacks(std::chrono::seconds(10));
}

void Completer::Push(c10::intrusive_ptr<AsyncWork> w) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(w));
    if (!thread_.joinable()) {
      thread_ = std::thread([this] { Loop(); });
    } else if (stop_) {
      // After Stop a thread ends once the queue is empty, and may have
      // decided so before this work came: a new one takes over once it
      // has ended.
      std::thread old = std::move(thread_);
      thread_ = std::thread([this, old = std::move(old)]() mutable {
        old.join();
        Loop();
      });
    }
  }
  cv_.notify_one();
}

void Completer::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, nothing pending
    c10::intrusive_ptr<AsyncWork> w = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    w->Complete(/*issuing=*/false);
    w.reset();
    lock.lock();
  }
}

namespace {

// The callback threads. Invariant: idle_ counts the threads blocked waiting
// for a task; a task pushed while idle_ == 0 starts a new thread. Threads
// live as long as the process (they are detached and hold the pool by a
// shared pointer, so a thread still running at exit touches nothing freed).
struct CallbackPool {
  std::mutex mu;
  std::condition_variable cv;
  std::condition_variable quiet;  // tasks empty and none running (DrainCallbacks)
  std::deque<std::function<void()>> tasks;
  int idle = 0;
  int running = 0;
};

std::shared_ptr<CallbackPool> Pool() {
  static auto* pool = new std::shared_ptr<CallbackPool>(std::make_shared<CallbackPool>());
  return *pool;
}

void CallbackThread(std::shared_ptr<CallbackPool> pool) {
  std::unique_lock<std::mutex> lock(pool->mu);
  for (;;) {
    ++pool->idle;
    pool->cv.wait(lock, [&] { return !pool->tasks.empty(); });
    --pool->idle;
    std::function<void()> fn = std::move(pool->tasks.front());
    pool->tasks.pop_front();
    ++pool->running;
    lock.unlock();
    fn();  // marking a future: never throws (callbacks' errors go to their futures)
    fn = nullptr;
    lock.lock();
    if (--pool->running == 0 && pool->tasks.empty()) pool->quiet.notify_all();
  }
}

}  // namespace

void DrainCallbacks(std::chrono::milliseconds limit) {
  std::shared_ptr<CallbackPool> p = Pool();
  std::unique_lock<std::mutex> lock(p->mu);
  p->quiet.wait_for(lock, limit, [&] { return p->tasks.empty() && p->running == 0; });
}

void RunOnCallbackThread(std::function<void()> fn) {
  std::shared_ptr<CallbackPool> p = Pool();
  std::lock_guard<std::mutex> lock(p->mu);
  p->tasks.push_back(std::move(fn));
  if (p->idle < static_cast<int>(p->tasks.size())) {
    std::thread(CallbackThread, p).detach();
  } else {
    p->cv.notify_one();
  }
}

}  // namespace mc2py
