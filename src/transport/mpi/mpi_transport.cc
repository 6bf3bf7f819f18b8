// The MPI transport (see mpi_transport.h): start-up, requests,
// communicators, failures and the exit handler. The MPI thread's loop is in
// mpi_loop.cc.
#include "transport/mpi/mpi_transport.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/env.h"
#include "transport/mpi/mpi_internal.h"
#include "transport/mpi/termination.h"

namespace mc2::transport::mpi {

using Clock = std::chrono::steady_clock;

namespace {

const char* LevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown level";
}

// Open MPI's TCP transport sends a message above its eager limit (64 KiB by
// default) by rendezvous: the receiver acknowledges before the data flows.
// When both directions of a connection carry data at once, those
// acknowledgements queue behind the other direction's data, and the pair
// moves about one direction at a time. A piece sent eagerly needs no
// acknowledgement, so where mc2 initialises MPI it raises the eager limit
// to hold a piece, unless the user set it (the variable is read by
// MPI_Init; this runs before, before the transport's thread exists).
void RaiseTcpEagerLimit() {
  constexpr const char* kVar = "OMPI_MCA_btl_tcp_eager_limit";
  if (std::getenv(kVar) != nullptr) return;
  // The limit counts Open MPI's match header too.
  const std::string limit = std::to_string(PieceBytes() + 1024);
  setenv(kVar, limit.c_str(), /*overwrite=*/0);
}

// Open MPI relays each of its help messages (a peer that hung up, a
// connect that failed) from the rank to mpirun and sleeps until mpirun has
// taken it. When a rank dies, that relay blocks the MPI thread for about a
// second, just when the failure report must travel to the other hosts;
// mc2 names the failure itself. So where mc2 initialises MPI, Open MPI's
// help messages are off (orte_execute_quiet), unless the user set it.
void QuietOpenMpiHelp() { setenv("OMPI_MCA_orte_execute_quiet", "1", /*overwrite=*/0); }

}  // namespace

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

size_t PieceBytes() {
  static const size_t bytes = std::max<size_t>(core::EnvBytes("MC2_MPI_PIECE_BYTES", 1u << 20), 1);
  return bytes;
}

std::shared_ptr<MpiTransport> MpiTransport::Start(int64_t comm_f) {
  std::shared_ptr<MpiTransport> e(new MpiTransport);
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
  MpiTransport* raw = e.get();
  e->thread_ = std::thread([raw] { raw->Loop(); });
  pthread_setname_np(e->thread_.native_handle(), "mc2-mpi");
  if (e->initialized_mpi_) {
    // In this order: exit handlers run last-registered first, and the
    // grace's must wait before MPI ends.
    FinalizeAtExit(e);
    InstallTerminationGrace(e);
  }
  return e;
}

MpiTransport::~MpiTransport() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MpiTransport::SetCallbacks(std::function<void(const Error&)> on_failure,
                                std::function<void()> probe) {
  std::lock_guard<std::mutex> lock(mu_);
  on_failure_ = std::move(on_failure);
  probe_ = std::move(probe);
}

std::shared_ptr<Completion> MpiTransport::Post(Request r, OnDone on_done) {
  auto c = std::make_shared<Completion>(r.peer, r.kind == Request::kSend, std::move(on_done));
  r.done = c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) throw Error(ErrorCode::kAborted, "the MPI transport has stopped (process exit)");
    queue_.push_back(std::move(r));
  }
  cv_.notify_all();
  return c;
}

MpiTransport::Request MpiTransport::Message(Request::Kind kind, CommId comm, int peer, int tag,
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

std::shared_ptr<Completion> MpiTransport::Isend(CommId comm, int peer, int tag, const void* data,
                                                size_t bytes, OnDone on_done, TimePoint deadline) {
  return Post(Message(Request::kSend, comm, peer, tag, data, bytes, deadline), std::move(on_done));
}

std::shared_ptr<Completion> MpiTransport::Irecv(CommId comm, int peer, int tag, void* data,
                                                size_t bytes, OnDone on_done, TimePoint deadline) {
  return Post(Message(Request::kRecv, comm, peer, tag, data, bytes, deadline), std::move(on_done));
}

std::shared_ptr<Completion> MpiTransport::IrecvStanding(CommId comm, int peer, int tag, void* data,
                                                        size_t bytes, OnDone on_done) {
  if (bytes > kMaxStandingBytes)
    throw Error(ErrorCode::kInternal, fmt::format("a standing receive of {} bytes (at most {})",
                                                  bytes, kMaxStandingBytes));
  Request r = Message(Request::kRecv, comm, peer, tag, data, bytes, TimePoint::max());
  r.standing = true;
  return Post(std::move(r), std::move(on_done));
}

void MpiTransport::Cancel(const std::shared_ptr<Completion>& standing) {
  Request r;
  r.kind = Request::kCancel;
  r.done = standing;
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return;  // the stop cancels every standing receive
  queue_.push_back(std::move(r));
  cv_.notify_all();
}

void MpiTransport::RunCall(std::function<void()> fn) {
  Request r;
  r.kind = Request::kCall;
  r.call = std::move(fn);
  auto c = Post(std::move(r));
  // Collective calls wait for every rank: no deadline of their own, but a
  // recorded failure ends the wait.
  c->Wait(
      Clock::time_point::max(), [this] { CheckHealth(); }, [] { return std::string(); });
}

std::optional<CommId> MpiTransport::Split(CommId parent, int color, int key) {
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

void MpiTransport::Free(CommId comm) {
  if (comm == kJobComm) return;
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

std::vector<std::string> MpiTransport::AllGatherStrings(CommId comm, const std::string& mine) {
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

void MpiTransport::Abort(const Error& error) {
  Record(error, /*send_to_peers=*/true);
  // Where mc2 owns MPI, the exit handler waits for the messages instead
  // (FinalizeAtExit): the caller raises the failure at once.
  if (initialized_mpi_ || std::this_thread::get_id() == thread_.get_id()) return;
  std::unique_lock<std::mutex> lock(fail_mu_);
  announced_cv_.wait_for(lock, std::chrono::seconds(1), [&] { return announced_; });
}

void MpiTransport::Record(const Error& error, bool send_to_peers) {
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

std::exception_ptr MpiTransport::FailureError() const {
  std::lock_guard<std::mutex> lock(fail_mu_);
  return std::make_exception_ptr(*failure_);
}

void MpiTransport::CheckHealth() const {
  if (!failed()) return;
  std::lock_guard<std::mutex> lock(fail_mu_);
  throw *failure_;
}

namespace {
std::mutex g_final_mu;
std::shared_ptr<MpiTransport>* g_final = nullptr;
}  // namespace

void MpiTransport::FinalizeAtExit(std::shared_ptr<MpiTransport> transport) {
  std::lock_guard<std::mutex> lock(g_final_mu);
  if (g_final) return;
  g_final = new std::shared_ptr<MpiTransport>(std::move(transport));
  std::atexit([] {
    std::shared_ptr<MpiTransport> e;
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
