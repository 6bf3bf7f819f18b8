// The MPI engine (see mpi_engine.h): start-up, the MPI thread's loop,
// pieces, completions and the control channel that carries failures.
#include "transport/mpi/mpi_engine.h"

#include <fmt/format.h>
// The C API only: the deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/env.h"
#include "core/log.h"

namespace mc2::transport::mpi {

namespace {

using Clock = std::chrono::steady_clock;

// Tag of the control messages on the control communicator.
constexpr int kCtlTag = 1;
// A failure as it travels between ranks.
struct CtlMsg {
  int32_t code;
  int32_t rank;
  char text[504];
};

std::string MpiErrorString(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
  return std::string(buf, len);
}

void Check(int rc, const char* call) {
  if (rc != MPI_SUCCESS)
    throw Error(ErrorCode::kMpi, fmt::format("{} failed: {}", call, MpiErrorString(rc)));
}

const char* LevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown level";
}

size_t PieceBytes() {
  static const size_t bytes = std::max<size_t>(core::EnvBytes("MC2_MPI_PIECE_BYTES", 1u << 20), 1);
  return bytes;
}

// Open MPI's TCP transport sends a message above its eager limit (64 KiB by
// default) by rendezvous: the receiver acknowledges before the data flows.
// When both directions of a connection carry data at once, those
// acknowledgements queue behind the other direction's data, and the pair
// moves about one direction at a time. A piece sent eagerly needs no
// acknowledgement, so where mc2 initialises MPI it raises the eager limit
// to hold a piece, unless the user set it (the variable is read by
// MPI_Init; this runs before, before the engine's thread exists).
void RaiseTcpEagerLimit() {
  constexpr const char* kVar = "OMPI_MCA_btl_tcp_eager_limit";
  if (std::getenv(kVar) != nullptr) return;
  // The limit counts Open MPI's match header too.
  const std::string limit = std::to_string(PieceBytes() + 1024);
  setenv(kVar, limit.c_str(), /*overwrite=*/0);
}

// Open MPI's TCP transport writes to its sockets without MSG_NOSIGNAL, so
// a write to a peer that just died raises SIGPIPE, whose default action
// ends the process before mc2 can report the death. While this is in scope
// the calling thread blocks SIGPIPE (the write then fails with EPIPE, which
// MPI reports as an error); a SIGPIPE left pending on the thread is
// consumed before the caller's mask comes back. Threads started inside
// (MPI_Init's own) inherit the blocked mask.
class BlockSigpipe {
 public:
  BlockSigpipe() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    blocked_ = pthread_sigmask(SIG_BLOCK, &set, &old_) == 0 && !sigismember(&old_, SIGPIPE);
  }
  ~BlockSigpipe() {
    if (!blocked_) return;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    const timespec zero{};
    while (sigtimedwait(&set, nullptr, &zero) == SIGPIPE) {
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  BlockSigpipe(const BlockSigpipe&) = delete;
  BlockSigpipe& operator=(const BlockSigpipe&) = delete;

 private:
  sigset_t old_;
  bool blocked_ = false;
};

// Open MPI relays each of its help messages (a peer that hung up, a
// connect that failed) from the rank to mpirun and sleeps until mpirun has
// taken it. When a rank dies, that relay blocks the MPI thread for about a
// second, just when the failure report must travel to the other hosts;
// mc2 names the failure itself. So where mc2 initialises MPI, Open MPI's
// help messages are off (orte_execute_quiet), unless the user set it.
void QuietOpenMpiHelp() {
  setenv("OMPI_MCA_orte_execute_quiet", "1", /*overwrite=*/0);
}

}  // namespace

struct MpiEngine::Impl {
  std::vector<MPI_Comm> comms;  // [0]: the data duplicate; freed slots are MPI_COMM_NULL
  MPI_Comm ctl = MPI_COMM_NULL;
  // Requests in flight and what each belongs to (parallel vectors).
  std::vector<MPI_Request> reqs;
  struct Slot {
    std::shared_ptr<Completion> done;
    int peer;
    bool send;
    bool standing;  // IrecvStanding: cancelled at stop
    int tag;
    size_t bytes;  // the whole message's (a slot holds one piece)
    std::chrono::steady_clock::time_point deadline;
  };
  std::vector<Slot> slots;
  MPI_Request ctl_req = MPI_REQUEST_NULL;
  CtlMsg ctl_in{};
  std::vector<CtlMsg> ctl_out;
  std::vector<MPI_Request> ctl_out_reqs;
  bool announced = false;  // the failure was handled (sent, requests failed)
};

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
                  fmt::format("no {} {} rank {} completed within the timeout: {}",
                              send_ ? "send to" : "receive from", "world", peer_, what()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
}


std::shared_ptr<MpiEngine> MpiEngine::Start(int64_t comm_f) {
  std::shared_ptr<MpiEngine> e(new MpiEngine);
  e->impl_ = std::make_unique<Impl>();
  MPI_Comm base;
  int initialized = 0;
  Check(MPI_Initialized(&initialized), "MPI_Initialized");
  if (comm_f < 0 && !initialized) {
    int provided = MPI_THREAD_SINGLE;
    RaiseTcpEagerLimit();
    QuietOpenMpiHelp();
    BlockSigpipe no_sigpipe;
    Check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    e->initialized_mpi_ = true;
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      throw Error(ErrorCode::kMpi,
                  fmt::format("MPI granted {} where mc2's MPI thread needs MPI_THREAD_SERIALIZED",
                              LevelName(provided)));
    }
    base = MPI_COMM_WORLD;
  } else {
    int level = MPI_THREAD_SINGLE;
    Check(MPI_Query_thread(&level), "MPI_Query_thread");
    if (level < MPI_THREAD_MULTIPLE)
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("MPI was initialised with {}; mc2's MPI thread calls MPI while the "
                              "program's threads may too, which needs MPI_THREAD_MULTIPLE "
                              "(MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...))",
                              LevelName(level)));
    base = comm_f < 0 ? MPI_COMM_WORLD : MPI_Comm_f2c(static_cast<MPI_Fint>(comm_f));
  }
  MPI_Comm data, ctl;
  Check(MPI_Comm_dup(base, &data), "MPI_Comm_dup");
  Check(MPI_Comm_dup(base, &ctl), "MPI_Comm_dup");
  Check(MPI_Comm_set_errhandler(data, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  Check(MPI_Comm_set_errhandler(ctl, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  Check(MPI_Comm_rank(data, &e->rank_), "MPI_Comm_rank");
  Check(MPI_Comm_size(data, &e->size_), "MPI_Comm_size");
  e->impl_->comms.push_back(data);
  e->impl_->ctl = ctl;
  MpiEngine* raw = e.get();
  e->thread_ = std::thread([raw] { raw->Loop(); });
  pthread_setname_np(e->thread_.native_handle(), "mc2-mpi");
  return e;
}

MpiEngine::~MpiEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MpiEngine::SetCallbacks(std::function<void(const Error&)> on_failure,
                             std::function<void()> probe) {
  std::lock_guard<std::mutex> lock(mu_);
  on_failure_ = std::move(on_failure);
  probe_ = std::move(probe);
}

std::shared_ptr<Completion> MpiEngine::Post(Request r, OnDone on_done) {
  auto c = std::make_shared<Completion>();
  c->on_done_ = std::move(on_done);
  c->peer_ = r.peer;
  c->send_ = r.kind == Request::kSend;
  r.done = c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) throw Error(ErrorCode::kAborted, "the MPI engine has stopped (process exit)");
    queue_.push_back(std::move(r));
  }
  cv_.notify_all();
  return c;
}

MpiEngine::Request MpiEngine::Message(Request::Kind kind, CommId comm, int peer, int tag,
                                     const void* data, size_t bytes, TimePoint deadline) {
  Request r;
  r.kind = kind;
  r.comm = comm;
  r.peer = peer;
  r.tag = tag;
  r.data = static_cast<char*>(const_cast<void*>(data));
  r.bytes = bytes;
  r.deadline = deadline;
  return r;
}

std::shared_ptr<Completion> MpiEngine::Isend(CommId comm, int peer, int tag, const void* data,
                                             size_t bytes, OnDone on_done, TimePoint deadline) {
  return Post(Message(Request::kSend, comm, peer, tag, data, bytes, deadline),
              std::move(on_done));
}

std::shared_ptr<Completion> MpiEngine::Irecv(CommId comm, int peer, int tag, void* data,
                                             size_t bytes, OnDone on_done, TimePoint deadline) {
  return Post(Message(Request::kRecv, comm, peer, tag, data, bytes, deadline),
              std::move(on_done));
}

std::shared_ptr<Completion> MpiEngine::IrecvStanding(CommId comm, int peer, int tag, void* data,
                                                     size_t bytes, OnDone on_done) {
  Request r = Message(Request::kRecv, comm, peer, tag, data, bytes, TimePoint::max());
  r.standing = true;
  return Post(std::move(r), std::move(on_done));
}

void MpiEngine::Cancel(const std::shared_ptr<Completion>& standing) {
  Request r;
  r.kind = Request::kCancel;
  r.done = standing;
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return;  // the stop cancels every standing receive
  queue_.push_back(std::move(r));
  cv_.notify_all();
}

void MpiEngine::RunCall(std::function<void()> fn) {
  Request r;
  r.kind = Request::kCall;
  r.call = std::move(fn);
  auto c = Post(std::move(r));
  // Collective calls wait for every rank: no deadline of their own, but a
  // recorded failure ends the wait.
  c->Wait(Clock::time_point::max(), [this] { CheckHealth(); }, [] { return std::string(); });
}

std::optional<CommId> MpiEngine::Split(CommId parent, int color, int key) {
  std::optional<CommId> out;
  RunCall([&] {
    MPI_Comm nc;
    Check(MPI_Comm_split(impl_->comms.at(parent), color < 0 ? MPI_UNDEFINED : color, key, &nc),
          "MPI_Comm_split");
    if (nc == MPI_COMM_NULL) return;
    Check(MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    impl_->comms.push_back(nc);
    out = static_cast<CommId>(impl_->comms.size() - 1);
  });
  return out;
}

void MpiEngine::Free(CommId comm) {
  if (comm == kWorldComm) return;
  try {
    RunCall([&] {
      MPI_Comm& c = impl_->comms.at(comm);
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
      c = MPI_COMM_NULL;
    });
  } catch (const Error&) {
    // After a failure the communicator is not freed: the process is
    // going down, and MPI would wait for the dead peer.
  }
}

std::vector<std::string> MpiEngine::AllGatherStrings(CommId comm, const std::string& mine) {
  std::vector<std::string> out;
  RunCall([&] {
    MPI_Comm c = impl_->comms.at(comm);
    int n = 0;
    Check(MPI_Comm_size(c, &n), "MPI_Comm_size");
    int len = static_cast<int>(mine.size());
    std::vector<int> lens(n), displs(n);
    Check(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, c), "MPI_Allgather");
    int total = 0;
    for (int i = 0; i < n; ++i) {
      displs[i] = total;
      total += lens[i];
    }
    std::vector<char> all(std::max(total, 1));
    Check(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(),
                         MPI_CHAR, c),
          "MPI_Allgatherv");
    for (int i = 0; i < n; ++i) out.emplace_back(all.data() + displs[i], lens[i]);
  });
  return out;
}

void MpiEngine::Abort(const Error& error) {
  Record(error, /*send_to_peers=*/true);
  // Where mc2 owns MPI, the exit handler waits for the messages instead
  // (FinalizeAtExit): the caller raises the failure at once.
  if (initialized_mpi_ || std::this_thread::get_id() == thread_.get_id()) return;
  std::unique_lock<std::mutex> lock(fail_mu_);
  announced_cv_.wait_for(lock, std::chrono::seconds(1), [&] { return announced_; });
}

void MpiEngine::Record(const Error& error, bool send_to_peers) {
  {
    std::lock_guard<std::mutex> lock(fail_mu_);
    if (failure_) return;
    failure_ = error;
  }
  // Sending is the MPI thread's job; a failure received from a peer is not
  // sent on (every rank got it from its origin).
  send_to_peers_.store(send_to_peers, std::memory_order_relaxed);
  failed_.store(true, std::memory_order_release);
  cv_.notify_all();
}

void MpiEngine::CheckHealth() const {
  if (!failed()) return;
  std::lock_guard<std::mutex> lock(fail_mu_);
  throw *failure_;
}

void MpiEngine::Loop() {
  BlockSigpipe no_sigpipe;  // the whole thread: it makes every MPI call
  Impl& m = *impl_;
  auto post_ctl = [&] {
    MPI_Irecv(&m.ctl_in, sizeof(CtlMsg), MPI_BYTE, MPI_ANY_SOURCE, kCtlTag, m.ctl, &m.ctl_req);
  };
  post_ctl();
  auto fail_error = [&] {
    std::lock_guard<std::mutex> lock(fail_mu_);
    return std::make_exception_ptr(*failure_);
  };
  auto finish = [&](Completion& c, std::exception_ptr err) {
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
  };
  // Cancels the standing receive in slot i (MPI thread): it fails with
  // kAborted unless it had matched already (then it completes normally).
  auto cancel_slot = [&](size_t i) {
    MPI_Cancel(&m.reqs[i]);
    MPI_Status st;
    int cancelled = 1;
    if (!failed() && MPI_Wait(&m.reqs[i], &st) == MPI_SUCCESS) MPI_Test_cancelled(&st, &cancelled);
    finish(*m.slots[i].done,
           cancelled ? std::make_exception_ptr(Error(ErrorCode::kAborted, "receive cancelled"))
                     : nullptr);
    m.slots[i].done.reset();
  };
  auto compact = [&] {
    size_t w = 0;
    for (size_t i = 0; i < m.reqs.size(); ++i)
      if (m.slots[i].done) {
        m.reqs[w] = m.reqs[i];
        m.slots[w] = std::move(m.slots[i]);
        ++w;
      }
    m.reqs.resize(w);
    m.slots.resize(w);
  };
  auto set_announced = [&] {
    std::lock_guard<std::mutex> lock(fail_mu_);
    announced_ = true;
    announced_cv_.notify_all();
  };
  Clock::time_point announce_start{};
  auto last_probe = Clock::now();
  auto last_progress = Clock::now();
  std::vector<int> indices;
  std::vector<MPI_Status> statuses;
  for (;;) {
    std::deque<Request> batch;
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(mu_);
      stopping = stop_;
      batch.swap(queue_);
    }
    bool progress = !batch.empty();
    for (Request& r : batch) {
      if (r.kind == Request::kCall) {
        std::exception_ptr err;
        if (failed()) {
          err = fail_error();
        } else {
          try {
            r.call();
          } catch (...) {
            err = std::current_exception();
          }
        }
        finish(*r.done, err);
        continue;
      }
      if (r.kind == Request::kCancel) {
        for (size_t i = 0; i < m.reqs.size(); ++i)
          if (m.slots[i].done == r.done && m.slots[i].standing) cancel_slot(i);
        compact();
        continue;
      }
      if (failed()) {
        finish(*r.done, fail_error());
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
          finish(*r.done, fail_error());
          break;
        }
        m.reqs.push_back(req);
        m.slots.push_back(
            {r.done, r.peer, r.kind == Request::kSend, r.standing, r.tag, r.bytes, r.deadline});
      }
    }
    if (!m.reqs.empty()) {
      int count = static_cast<int>(m.reqs.size()), outcount = 0;
      indices.resize(count);
      statuses.resize(count);
      int rc = MPI_Testsome(count, m.reqs.data(), &outcount, indices.data(), statuses.data());
      if (outcount == MPI_UNDEFINED) outcount = 0;
      for (int k = 0; k < outcount; ++k) {
        int i = indices[k];
        int err = rc == MPI_ERR_IN_STATUS ? statuses[k].MPI_ERROR : MPI_SUCCESS;
        if (err != MPI_SUCCESS) {
          Record(Error(ErrorCode::kPeerDied,
                       fmt::format("MPI {} rank {} failed (the rank died or its host is "
                                   "unreachable): {}",
                                   m.slots[i].send ? "send to" : "receive from", m.slots[i].peer,
                                   MpiErrorString(err)),
                       rank_),
                 true);
        }
        finish(*m.slots[i].done, err != MPI_SUCCESS ? fail_error() : nullptr);
        m.slots[i].done.reset();
      }
      if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS && outcount == 0)
        Record(Error(ErrorCode::kMpi, fmt::format("MPI_Testsome failed: {}", MpiErrorString(rc)),
                     rank_),
               true);
      if (outcount > 0) {
        progress = true;
        compact();
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
    if (failed() && !m.announced) {
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
      // Everything pending fails now; receives are cancelled so that MPI
      // no longer writes into buffers their owners give up on. The
      // requests are then dropped, never tested nor cancelled again: after
      // a peer's death Open MPI's state for them is not to be trusted (a
      // second MPI_Cancel of such a receive crashed inside ob1), and the
      // process is going down.
      std::exception_ptr ep = std::make_exception_ptr(e);
      for (size_t i = 0; i < m.reqs.size(); ++i) {
        if (!m.slots[i].send) MPI_Cancel(&m.reqs[i]);
        finish(*m.slots[i].done, ep);
        m.slots[i].done.reset();
      }
      compact();
      std::function<void(const Error&)> cb;
      {
        std::lock_guard<std::mutex> lock(mu_);
        cb = on_failure_;
      }
      if (cb) cb(e);
      announce_start = Clock::now();
      if (m.ctl_out_reqs.empty()) set_announced();
    }
    // Drive the control sends out (best effort: a peer may be dead).
    if (!m.ctl_out_reqs.empty()) {
      int all = 0;
      MPI_Testall(static_cast<int>(m.ctl_out_reqs.size()), m.ctl_out_reqs.data(), &all,
                  MPI_STATUSES_IGNORE);
      // A dead peer may never take its message: give up after 1 s.
      if (all || Clock::now() - announce_start > std::chrono::seconds(1)) {
        m.ctl_out_reqs.clear();
        set_announced();
      }
    }
    auto now = Clock::now();
    if (now - last_probe > std::chrono::milliseconds(50)) {
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
    // Standing receives do not keep the engine alive: they are cancelled
    // once every other request completed.
    if (stopping) {
      bool only_standing = true;
      for (const auto& slot : m.slots) only_standing = only_standing && slot.standing;
      if (only_standing || failed()) break;
    }
    if (progress) {
      last_progress = now;
      continue;
    }
    // Requests in flight: poll, yielding, for a while after the last
    // progress (a reply is often microseconds away), then in sleeps that
    // grow with the time since (a sixteenth of it, 100 us to 1 ms): a
    // long transfer is noticed at most about 6% late, and its polls
    // (tens of microseconds each over TCP) stop taking the compute
    // threads' cores tens of thousands of times a second.
    // Only standing receives (a channel waiting for its next call): the
    // same for 10 ms after the last progress (a call's next chunk), then
    // every millisecond, so that an idle job costs no CPU to speak of.
    // Idle: sleep until a request arrives, at most until the next probe.
    bool standing_only = !m.reqs.empty();
    for (const auto& slot : m.slots) standing_only = standing_only && slot.standing;
    const bool busy = (!m.reqs.empty() && !standing_only) || !m.ctl_out_reqs.empty() ||
                      (standing_only && now - last_progress < std::chrono::milliseconds(10));
    std::unique_lock<std::mutex> lock(mu_);
    if (!queue_.empty() || stop_) continue;
    if (busy) {
      if (now - last_progress < std::chrono::microseconds(200)) {
        lock.unlock();
        sched_yield();
      } else {
        const auto idle =
            std::chrono::duration_cast<std::chrono::microseconds>(now - last_progress);
        cv_.wait_for(lock, std::clamp(idle / 16, std::chrono::microseconds(100),
                                      std::chrono::microseconds(1000)));
      }
    } else if (standing_only) {
      cv_.wait_for(lock, std::chrono::milliseconds(1));
    } else {
      cv_.wait_for(lock, std::chrono::milliseconds(5));
    }
  }
  // Stop: standing receives are cancelled (their owners see kAborted), as
  // is the receive of the control channel; the
  // communicators freed (not after a failure: freeing may wait for peers).
  if (!failed())  // after a failure every request was cancelled and failed
    for (size_t i = 0; i < m.reqs.size(); ++i)
      if (m.slots[i].done && m.slots[i].standing) cancel_slot(i);
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

namespace {
std::mutex g_final_mu;
std::shared_ptr<MpiEngine>* g_final = nullptr;
}  // namespace

void MpiEngine::FinalizeAtExit(std::shared_ptr<MpiEngine> engine) {
  std::lock_guard<std::mutex> lock(g_final_mu);
  if (g_final) return;
  g_final = new std::shared_ptr<MpiEngine>(std::move(engine));
  std::atexit([] {
    std::shared_ptr<MpiEngine> e;
    {
      std::lock_guard<std::mutex> lock(g_final_mu);
      e = std::move(*g_final);
    }
    bool failed = e->failed();
    // The failure goes to every other rank before MPI ends (at most 1 s:
    // a dead peer never takes its message).
    if (failed) {
      std::unique_lock<std::mutex> lock(e->fail_mu_);
      e->announced_cv_.wait_for(lock, std::chrono::seconds(1), [&] { return e->announced_; });
    }
    // Other references (a world the program never released) keep the
    // object, but its thread stops here: MPI ends now.
    {
      std::lock_guard<std::mutex> lock(e->mu_);
      e->stop_ = true;
    }
    e->cv_.notify_all();
    if (e->thread_.joinable()) e->thread_.join();
    BlockSigpipe no_sigpipe;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // After a failure MPI_Finalize would wait for the dead peer: the job
    // is aborted instead, so that mpirun ends it (and exits non-zero) even
    // when it was told to outlive a dead rank (--enable-recovery).
    if (failed) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
  });
}

}  // namespace mc2::transport::mpi
