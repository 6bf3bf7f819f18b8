// The MPI thread's loop (see mpi_transport.h): one pass takes the queued
// requests and posts them, tests the requests in flight, takes a failure
// sent by a peer, announces a failure recorded here, checks deadlines and
// probes the owner, then waits for the next thing to do.
#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>

#include "transport/mpi/mpi_internal.h"

namespace mc2::transport::mpi {

using Clock = std::chrono::steady_clock;

void MpiTransport::Loop() {
  BlockSigpipe no_sigpipe;  // the whole thread: it makes every MPI call
  Impl& m = *impl_;
  MPI_Irecv(&m.ctl_in, sizeof(CtlMsg), MPI_BYTE, MPI_ANY_SOURCE, kCtlTag, m.ctl, &m.ctl_req);
  auto last_probe = Clock::now();
  auto last_progress = Clock::now();
  for (;;) {
    std::deque<Request> batch;
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(mu_);
      stopping = stop_;
      batch.swap(queue_);
    }
    bool progress = PostRequests(batch);
    progress = TestRequests() || progress;
    ReceiveControl();
    if (failed() && !m.announced) AnnounceFailure();
    DriveControlSends();
    const auto now = Clock::now();
    if (now - last_probe > std::chrono::milliseconds(50)) {
      last_probe = now;
      CheckDeadlinesAndProbe(now);
    }
    if (stopping && MayStop()) break;
    if (progress) {
      last_progress = now;
      continue;
    }
    Idle(now, last_progress);
  }
  Shutdown();
}

bool MpiTransport::PostRequests(std::deque<Request>& batch) {
  Impl& m = *impl_;
  for (Request& r : batch) {
    if (r.kind == Request::kCall) {
      std::exception_ptr err;
      if (failed()) {
        err = FailureError();
      } else {
        try {
          r.call();
        } catch (...) {
          err = std::current_exception();
        }
      }
      r.done->Finish(err);
    } else if (r.kind == Request::kCancel) {
      for (size_t i = 0; i < m.reqs.size(); ++i)
        if (m.slots[i].done == r.done && m.slots[i].standing) CancelSlot(i);
      DropFinishedSlots();
    } else if (failed()) {
      r.done->Finish(FailureError());
    } else {
      PostMessage(r);
    }
  }
  return !batch.empty();
}

// Posts a send or receive, in pieces of PieceBytes(): one slot per piece.
void MpiTransport::PostMessage(Request& r) {
  Impl& m = *impl_;
  MPI_Comm comm = m.comms.at(r.comm);
  const size_t piece = PieceBytes();
  const size_t n = r.bytes == 0 ? 1 : (r.bytes + piece - 1) / piece;
  r.done->Expect(static_cast<int>(n));
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
      r.done->Finish(FailureError());
      return;
    }
    m.reqs.push_back(req);
    m.slots.push_back(
        {r.done, r.peer, r.kind == Request::kSend, r.standing, r.tag, r.bytes, r.deadline});
  }
}

bool MpiTransport::TestRequests() {
  Impl& m = *impl_;
  if (m.reqs.empty()) return false;
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
    m.slots[i].done->Finish(err != MPI_SUCCESS ? FailureError() : nullptr);
    m.slots[i].done.reset();
  }
  if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS && outcount == 0)
    Record(
        Error(ErrorCode::kMpi, fmt::format("MPI_Testsome failed: {}", MpiErrorString(rc)), rank_),
        true);
  if (outcount == 0) return false;
  DropFinishedSlots();
  return true;
}

// A failure sent by a peer.
void MpiTransport::ReceiveControl() {
  Impl& m = *impl_;
  if (m.ctl_req == MPI_REQUEST_NULL) return;
  int flag = 0;
  MPI_Status st;
  if (MPI_Test(&m.ctl_req, &flag, &st) != MPI_SUCCESS || !flag) return;
  m.ctl_in.text[sizeof(m.ctl_in.text) - 1] = 0;
  int code = m.ctl_in.code;
  if (code < static_cast<int>(ErrorCode::kInvalidArgument) ||
      code > static_cast<int>(ErrorCode::kInternal))
    code = static_cast<int>(ErrorCode::kAborted);
  Record(Error(static_cast<ErrorCode>(code), m.ctl_in.text, m.ctl_in.rank), false);
}

// Once, after a failure was recorded: sends it to every other rank (unless
// it came from one), fails everything pending and tells the owner.
void MpiTransport::AnnounceFailure() {
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
    m.slots[i].done->Finish(ep);
    m.slots[i].done.reset();
  }
  DropFinishedSlots();
  std::function<void(const Error&)> cb;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cb = on_failure_;
  }
  if (cb) cb(e);
  m.announce_start = Clock::now();
  if (m.ctl_out_reqs.empty()) SetAnnounced();
}

void MpiTransport::SetAnnounced() {
  std::lock_guard<std::mutex> lock(fail_mu_);
  announced_ = true;
  announced_cv_.notify_all();
}

// Drives the control sends out (best effort: a peer may be dead).
void MpiTransport::DriveControlSends() {
  Impl& m = *impl_;
  if (m.ctl_out_reqs.empty()) return;
  int all = 0;
  MPI_Testall(static_cast<int>(m.ctl_out_reqs.size()), m.ctl_out_reqs.data(), &all,
              MPI_STATUSES_IGNORE);
  // A dead peer may never take its message: give up after 1 s.
  if (all || Clock::now() - m.announce_start > std::chrono::seconds(1)) {
    m.ctl_out_reqs.clear();
    SetAnnounced();
  }
}

void MpiTransport::CheckDeadlinesAndProbe(TimePoint now) {
  // A message past its deadline: the peer stalled (a dead one fails the
  // request by itself), and the world cannot go on.
  for (const auto& slot : impl_->slots) {
    if (failed() || !slot.done || now < slot.deadline) continue;
    Record(
        Error(ErrorCode::kTimeout,
              fmt::format("MPI {} rank {} (tag {}, {} bytes) did not complete within "
                          "the timeout",
                          slot.send ? "send to" : "receive from", slot.peer, slot.tag, slot.bytes),
              rank_),
        true);
  }
  std::function<void()> probe;
  {
    std::lock_guard<std::mutex> lock(mu_);
    probe = probe_;
  }
  if (!probe || failed()) return;
  try {
    probe();
  } catch (const Error& e) {
    Record(e, true);
  }
}

// Standing receives do not keep the transport alive: it stops once every
// other request completed (or failed).
bool MpiTransport::MayStop() const {
  if (failed()) return true;
  for (const auto& slot : impl_->slots)
    if (!slot.standing) return false;
  return true;
}

// Requests in flight: poll, yielding, for a while after the last progress
// (a reply is often microseconds away), then in sleeps that grow with the
// time since (a sixteenth of it, 100 us to 1 ms): a long transfer is
// noticed at most about 6% late, and its polls (tens of microseconds each
// over TCP) stop taking the compute threads' cores tens of thousands of
// times a second. Only standing receives (a channel waiting for its next
// call): the same for 10 ms after the last progress (a call's next chunk),
// then every millisecond, so that an idle job costs no CPU to speak of.
// Idle: sleep until a request arrives, at most until the next probe.
void MpiTransport::Idle(TimePoint now, TimePoint last_progress) {
  const Impl& m = *impl_;
  bool standing_only = !m.reqs.empty();
  for (const auto& slot : m.slots) standing_only = standing_only && slot.standing;
  const bool busy = (!m.reqs.empty() && !standing_only) || !m.ctl_out_reqs.empty() ||
                    (standing_only && now - last_progress < std::chrono::milliseconds(10));
  std::unique_lock<std::mutex> lock(mu_);
  if (!queue_.empty() || stop_) return;
  if (busy) {
    if (now - last_progress < std::chrono::microseconds(200)) {
      lock.unlock();
      sched_yield();
    } else {
      const auto idle = std::chrono::duration_cast<std::chrono::microseconds>(now - last_progress);
      cv_.wait_for(lock, std::clamp(idle / 16, std::chrono::microseconds(100),
                                    std::chrono::microseconds(1000)));
    }
  } else if (standing_only) {
    cv_.wait_for(lock, std::chrono::milliseconds(1));
  } else {
    cv_.wait_for(lock, std::chrono::milliseconds(5));
  }
}

// Cancels the standing receive in slot i: it fails with kAborted unless it
// had matched already (then it completes normally).
void MpiTransport::CancelSlot(size_t i) {
  Impl& m = *impl_;
  MPI_Cancel(&m.reqs[i]);
  MPI_Status st;
  int cancelled = 1;
  if (!failed() && MPI_Wait(&m.reqs[i], &st) == MPI_SUCCESS) MPI_Test_cancelled(&st, &cancelled);
  m.slots[i].done->Finish(
      cancelled ? std::make_exception_ptr(Error(ErrorCode::kAborted, "receive cancelled"))
                : nullptr);
  m.slots[i].done.reset();
}

void MpiTransport::DropFinishedSlots() {
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

// Stop: standing receives are cancelled (their owners see kAborted), as is
// the receive of the control channel; the communicators are freed (not
// after a failure: freeing may wait for peers).
void MpiTransport::Shutdown() {
  Impl& m = *impl_;
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
}

}  // namespace mc2::transport::mpi
