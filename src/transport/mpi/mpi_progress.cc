// The MPI engine's progress (see mpi_engine.h): the progress pass, the
// waiters that drive it, and the MPI thread's loop.
#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>

#include "transport/mpi/mpi_internal.h"

namespace mc2::transport::mpi {

namespace {

// A poller (a waiter or the MPI thread) polls, yielding, for kPollSpin
// after the last progress (a reply is often microseconds away), then passes
// every kPollSleep, sleeping in between.
constexpr auto kPollSpin = std::chrono::microseconds(200);
constexpr auto kPollSleep = std::chrono::microseconds(100);
// Only standing receives (a channel between calls): polled as above for
// kStandingSpin after the last progress (a call's next chunk), then every
// kStandingSleep.
constexpr auto kStandingSpin = std::chrono::milliseconds(10);
constexpr auto kStandingSleep = std::chrono::milliseconds(1);
// The MPI thread's health probe and deadline checks; also its longest sleep.
constexpr auto kProbe = std::chrono::milliseconds(50);
// A waiter checks the owner's health (and its deadline) this often.
constexpr auto kHealthSlice = std::chrono::milliseconds(10);

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace

void Completion::Wait(Clock::time_point deadline, const std::function<void()>& health,
                      const std::function<std::string()>& what) const {
  while (!done()) {
    const auto slice_end = Clock::now() + kHealthSlice;
    if (engine_) {
      engine_->Drive(*this, slice_end);
    } else {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_until(lock, slice_end, [&] { return done(); });
    }
    if (done()) break;
    if (health) health();
    if (Clock::now() > deadline)
      throw Error(ErrorCode::kTimeout,
                  fmt::format("no {} {} rank {} completed within the timeout: {}",
                              send_ ? "send to" : "receive from", "world", peer_, what()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

void MpiEngine::Drive(const Completion& c, TimePoint until) {
  BlockSigpipe no_sigpipe;  // this thread may write to MPI's sockets
  drivers_.fetch_add(1, std::memory_order_acq_rel);
  // The poll budget counts from the last progress, or from now.
  const int64_t start = NowNs();
  while (!c.done()) {
    if (TryPass()) continue;
    // A failure is the MPI thread's to announce (it fails every request);
    // the caller's health check raises it meanwhile.
    if (Clock::now() >= until || failed()) break;
    const int64_t now = NowNs();
    const auto since = std::chrono::nanoseconds(
        now - std::max(start, last_progress_ns_.load(std::memory_order_relaxed)));
    if (since < kPollSpin) {
      sched_yield();
    } else {
      std::unique_lock<std::mutex> lock(c.mu_);
      c.cv_.wait_for(lock, kPollSleep, [&] { return c.done(); });
    }
  }
  if (drivers_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // The last driver leaves: the MPI thread takes over what is left.
  bool left = false;
  {
    std::unique_lock<std::mutex> mpi(mpi_mu_, std::try_to_lock);
    // Not taken: the MPI thread (awake) or another driver is in a pass.
    if (mpi.owns_lock() && !closed_) left = !impl_->reqs.empty();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    left = left || !queue_.empty();
  }
  if (left) cv_.notify_all();
}

bool MpiEngine::TryPass() {
  std::unique_lock<std::mutex> mpi(mpi_mu_, std::try_to_lock);
  if (!mpi.owns_lock() || closed_) return false;
  return Pass();
}

void MpiEngine::Finish(Completion& c, std::exception_ptr err) {
  bool now_done = false;
  {
    std::lock_guard<std::mutex> lock(c.mu_);
    if (err && !c.error_) c.error_ = err;
    int left = c.remaining_.load(std::memory_order_relaxed);
    if (left > 0) {
      c.remaining_.store(err ? 0 : left - 1, std::memory_order_release);
      now_done = err || left == 1;
    }
    c.cv_.notify_all();
  }
  if (now_done && c.on_done_) c.on_done_(c.error_);
}

// Cancels the standing receive in slot i: it fails with kAborted unless it
// had matched already (then it completes normally).
void MpiEngine::CancelSlot(size_t i) {
  Impl& m = *impl_;
  MPI_Cancel(&m.reqs[i]);
  MPI_Status st;
  int cancelled = 1;
  if (!failed() && MPI_Wait(&m.reqs[i], &st) == MPI_SUCCESS) MPI_Test_cancelled(&st, &cancelled);
  Finish(*m.slots[i].done,
         cancelled ? std::make_exception_ptr(Error(ErrorCode::kAborted, "receive cancelled"))
                   : nullptr);
  m.slots[i].done.reset();
}

void MpiEngine::Compact() {
  Impl& m = *impl_;
  size_t w = 0;
  for (size_t i = 0; i < m.reqs.size(); ++i)
    if (m.slots[i].done) {
      m.reqs[w] = m.reqs[i];
      m.slots[w] = std::move(m.slots[i]);
      ++w;
    }
  m.reqs.resize(w);
  m.slots.resize(w);
}

bool MpiEngine::Pass() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!queue_.empty()) m.batch.swap(queue_);
  }
  bool progress = !m.batch.empty();
  for (Request& r : m.batch) {
    if (r.kind == Request::kCall) {
      std::exception_ptr err;
      if (failed()) {
        err = FailError();
      } else {
        try {
          r.call();
        } catch (...) {
          err = std::current_exception();
        }
      }
      Finish(*r.done, err);
      continue;
    }
    if (r.kind == Request::kCancel) {
      for (size_t i = 0; i < m.reqs.size(); ++i)
        if (m.slots[i].done == r.done && m.slots[i].standing) CancelSlot(i);
      Compact();
      continue;
    }
    if (failed()) {
      Finish(*r.done, FailError());
      continue;
    }
    MPI_Comm comm = m.comms.at(r.comm);
    const size_t piece = PieceBytes();
    const size_t n = r.bytes == 0 ? 1 : (r.bytes + piece - 1) / piece;
    r.done->remaining_.store(static_cast<int>(n), std::memory_order_relaxed);
    for (size_t i = 0; i < n; ++i) {
      size_t off = i * piece;
      int len = static_cast<int>(std::min(piece, r.bytes - std::min(off, r.bytes)));
      MPI_Request req;
      int rc = r.kind == Request::kSend
                   ? MPI_Isend(r.data + off, len, MPI_BYTE, r.peer, r.tag, comm, &req)
                   : MPI_Irecv(r.data + off, len, MPI_BYTE, r.peer, r.tag, comm, &req);
      if (rc != MPI_SUCCESS) {
        Record(Error(ErrorCode::kPeerDied,
                     fmt::format("MPI {} rank {} failed: {}",
                                 r.kind == Request::kSend ? "send to" : "receive from", r.peer,
                                 MpiErrorString(rc)),
                     rank_),
               true);
        Finish(*r.done, FailError());
        break;
      }
      m.reqs.push_back(req);
      m.slots.push_back(
          {r.done, r.peer, r.kind == Request::kSend, r.standing, r.tag, r.bytes, r.deadline});
    }
  }
  m.batch.clear();
  if (!m.reqs.empty()) {
    int count = static_cast<int>(m.reqs.size()), outcount = 0;
    m.indices.resize(count);
    m.statuses.resize(count);
    int rc = MPI_Testsome(count, m.reqs.data(), &outcount, m.indices.data(), m.statuses.data());
    if (outcount == MPI_UNDEFINED) outcount = 0;
    for (int k = 0; k < outcount; ++k) {
      int i = m.indices[k];
      int err = rc == MPI_ERR_IN_STATUS ? m.statuses[k].MPI_ERROR : MPI_SUCCESS;
      if (err != MPI_SUCCESS) {
        Record(Error(ErrorCode::kPeerDied,
                     fmt::format("MPI {} rank {} failed (the rank died or its host is "
                                 "unreachable): {}",
                                 m.slots[i].send ? "send to" : "receive from", m.slots[i].peer,
                                 MpiErrorString(err)),
                     rank_),
               true);
      }
      Finish(*m.slots[i].done, err != MPI_SUCCESS ? FailError() : nullptr);
      m.slots[i].done.reset();
    }
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS && outcount == 0)
      Record(Error(ErrorCode::kMpi, fmt::format("MPI_Testsome failed: {}", MpiErrorString(rc)),
                   rank_),
             true);
    if (outcount > 0) {
      progress = true;
      Compact();
    }
  }
  // A failure sent by a peer.
  if (m.ctl_req != MPI_REQUEST_NULL) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Test(&m.ctl_req, &flag, &st) == MPI_SUCCESS && flag) {
      m.ctl_in.text[sizeof(m.ctl_in.text) - 1] = 0;
      int code = m.ctl_in.code;
      if (code < static_cast<int>(ErrorCode::kInvalidArgument) ||
          code > static_cast<int>(ErrorCode::kInternal))
        code = static_cast<int>(ErrorCode::kAborted);
      Record(Error(static_cast<ErrorCode>(code), m.ctl_in.text, m.ctl_in.rank), false);
    }
  }
  if (progress) last_progress_ns_.store(NowNs(), std::memory_order_relaxed);
  return progress;
}

void MpiEngine::Announce() {
  Impl& m = *impl_;
  m.announced = true;
  Error e = [&] {
    std::lock_guard<std::mutex> lock(fail_mu_);
    return *failure_;
  }();
  if (send_to_peers_.load(std::memory_order_relaxed)) {
    CtlMsg msg{};
    msg.code = static_cast<int32_t>(e.code());
    msg.rank = e.rank() >= 0 ? e.rank() : rank_;
    std::snprintf(msg.text, sizeof(msg.text), "%s", e.message().c_str());
    m.ctl_out.assign(size_, msg);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      MPI_Request req;
      if (MPI_Isend(&m.ctl_out[p], sizeof(CtlMsg), MPI_BYTE, p, kCtlTag, m.ctl, &req) ==
          MPI_SUCCESS)
        m.ctl_out_reqs.push_back(req);
    }
  }
  // Everything pending fails now; receives are cancelled so that MPI no
  // longer writes into buffers their owners give up on. The requests are
  // then dropped, never tested nor cancelled again: after a peer's death
  // Open MPI's state for them is not to be trusted (a second MPI_Cancel of
  // such a receive crashed inside ob1), and the process is going down.
  std::exception_ptr ep = std::make_exception_ptr(e);
  for (size_t i = 0; i < m.reqs.size(); ++i) {
    if (!m.slots[i].send) MPI_Cancel(&m.reqs[i]);
    Finish(*m.slots[i].done, ep);
    m.slots[i].done.reset();
  }
  Compact();
  std::function<void(const Error&)> cb;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cb = on_failure_;
  }
  if (cb) cb(e);
  m.announce_start = Clock::now();
}

void MpiEngine::Loop() {
  BlockSigpipe no_sigpipe;  // the whole thread: it calls MPI
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> mpi(mpi_mu_);
    MPI_Irecv(&m.ctl_in, sizeof(CtlMsg), MPI_BYTE, MPI_ANY_SOURCE, kCtlTag, m.ctl, &m.ctl_req);
  }
  auto set_announced = [&] {
    std::lock_guard<std::mutex> lock(fail_mu_);
    announced_ = true;
    announced_cv_.notify_all();
  };
  auto last_probe = Clock::now();
  for (;;) {
    bool progress, busy, standing_only, probe_due;
    {
      std::lock_guard<std::mutex> mpi(mpi_mu_);
      bool stopping;
      {
        std::lock_guard<std::mutex> lock(mu_);
        stopping = stop_;
      }
      progress = Pass();
      if (failed() && !m.announced) {
        Announce();
        if (m.ctl_out_reqs.empty()) set_announced();
      }
      // Drive the control sends out (best effort: a peer may be dead).
      if (!m.ctl_out_reqs.empty()) {
        int all = 0;
        MPI_Testall(static_cast<int>(m.ctl_out_reqs.size()), m.ctl_out_reqs.data(), &all,
                    MPI_STATUSES_IGNORE);
        // A dead peer may never take its message: give up after 1 s.
        if (all || Clock::now() - m.announce_start > std::chrono::seconds(1)) {
          m.ctl_out_reqs.clear();
          set_announced();
        }
      }
      const auto now = Clock::now();
      probe_due = now - last_probe > kProbe;
      if (probe_due) {
        last_probe = now;
        // A message past its deadline: the peer stalled (a dead one fails
        // the request by itself), and the world cannot go on.
        for (const auto& slot : m.slots) {
          if (failed() || !slot.done || now < slot.deadline) continue;
          Record(Error(ErrorCode::kTimeout,
                       fmt::format("MPI {} rank {} (tag {}, {} bytes) did not complete within "
                                   "the timeout",
                                   slot.send ? "send to" : "receive from", slot.peer, slot.tag,
                                   slot.bytes),
                       rank_),
                 true);
        }
      }
      standing_only = !m.reqs.empty();
      for (const auto& slot : m.slots) standing_only = standing_only && slot.standing;
      // Standing receives do not keep the engine alive: they are cancelled
      // once every other request completed.
      if (stopping && (standing_only || m.reqs.empty() || failed())) break;
      busy = (!m.reqs.empty() && !standing_only) || !m.ctl_out_reqs.empty();
    }
    if (probe_due) {
      std::function<void()> probe;
      {
        std::lock_guard<std::mutex> lock(mu_);
        probe = probe_;
      }
      if (probe && !failed()) {
        try {
          probe();
        } catch (const Error& e) {
          Record(e, true);
        }
      }
    }
    if (progress) continue;
    const auto since = std::chrono::nanoseconds(
        NowNs() - last_progress_ns_.load(std::memory_order_relaxed));
    std::unique_lock<std::mutex> lock(mu_);
    if (!queue_.empty() || stop_) continue;
    // A failure to announce wakes the thread (Record notifies).
    const bool announce = failed() && !m.announced;
    if (announce) continue;
    if (drivers_.load(std::memory_order_acquire) > 0 && m.ctl_out_reqs.empty()) {
      // A waiter drives progress: sleep until it leaves, a request to
      // post, a failure, or the next probe.
      cv_.wait_until(lock, last_probe + kProbe, [&] {
        return stop_ || !queue_.empty() || (failed() && !m.announced) ||
               drivers_.load(std::memory_order_acquire) == 0;
      });
    } else if (busy || (standing_only && since < kStandingSpin)) {
      if (since < kPollSpin) {
        lock.unlock();
        sched_yield();
      } else {
        cv_.wait_for(lock, kPollSleep);
      }
    } else if (standing_only) {
      cv_.wait_for(lock, kStandingSleep);
    } else {
      cv_.wait_until(lock, last_probe + kProbe);
    }
  }
  // Stop: standing receives are cancelled (their owners see kAborted), as
  // is the receive of the control channel; the communicators freed (not
  // after a failure: freeing may wait for peers). No MPI call follows.
  std::lock_guard<std::mutex> mpi(mpi_mu_);
  if (!failed())  // after a failure every request was cancelled and failed
    for (size_t i = 0; i < m.reqs.size(); ++i)
      if (m.slots[i].done && m.slots[i].standing) CancelSlot(i);
  if (m.ctl_req != MPI_REQUEST_NULL) {
    MPI_Cancel(&m.ctl_req);
    if (!failed()) MPI_Wait(&m.ctl_req, MPI_STATUS_IGNORE);
  }
  if (!failed()) {
    for (MPI_Comm& c : m.comms)
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
    MPI_Comm_free(&m.ctl);
  }
  closed_ = true;
}

}  // namespace mc2::transport::mpi
