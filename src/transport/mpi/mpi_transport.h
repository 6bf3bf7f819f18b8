// The MPI transport: mc2's net transport (net_transport.h) over Open MPI,
// and mc2's only user of MPI.
//
// One thread (the transport's MPI thread) makes every MPI call after start-up.
// Other threads hand it requests through a lock-protected queue: Isend and
// Irecv of (communicator, peer, tag, buffer, bytes), and Call, which runs a
// function on the MPI thread (communicator creation, small all-gathers).
// The thread posts MPI_Isend / MPI_Irecv and drives them with MPI_Testsome;
// a message larger than one piece (MC2_MPI_PIECE_BYTES, default 1 MiB) is
// cut into pieces that are in flight together, so a large transfer keeps the
// link busy while MPI completes earlier pieces. Where mc2 initialises MPI,
// Open MPI's TCP eager limit is raised to hold a piece (unless the user
// set it): eager pieces need no rendezvous acknowledgement, which would
// otherwise queue behind the other direction's data and halve the rate of
// an exchange in both directions. Pieces of one message, and
// messages of one (communicator, peer, tag), match in posting order (MPI's
// non-overtaking rule), so receivers cut the same way.
//
// Threading levels. When mc2 initialises MPI (a program launched by mpirun
// that never called MPI_Init), it asks for MPI_THREAD_SERIALIZED: the MPI
// thread is not the thread that initialised MPI, so FUNNELED would not do,
// and only one thread ever calls MPI at a time. mc2 then calls MPI_Finalize
// at exit (FinalizeAtExit). When the program initialised MPI itself
// (mc2::FromMPI), its threads may call MPI while the transport's does, which
// needs MPI_THREAD_MULTIPLE; anything less is refused with kInvalidArgument
// naming the level granted.
//
// Communicators. mc2's traffic goes on duplicates of the world
// communicator (MPI_Comm_dup), never on the user's: one for data and one
// for control. Every duplicate has MPI_ERRORS_RETURN, and an MPI error on
// a request becomes kPeerDied naming the peer.
//
// Failures. The MPI thread always has a receive posted on the control
// communicator. Abort() sends the failure to every other rank (and records
// it here); a control message from a peer records the peer's failure. A
// recorded failure fails every pending request and every later one, and is
// reported to the owner through the `on_failure` callback (which aborts the
// node's shared-memory world so that its waits fail too). Every 50 ms the
// thread calls `probe` (the owner checks the node's health there; what it
// throws is recorded and sent), so a death on one host reaches every host
// without any operation in flight.
//
// Thread safety: every public method may be called from any thread.
#ifndef MC2_TRANSPORT_MPI_MPI_TRANSPORT_H_
#define MC2_TRANSPORT_MPI_MPI_TRANSPORT_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mc2/error.h"
#include "transport/net_transport.h"

namespace mc2::transport::mpi {

class MpiTransport final : public NetTransport {
 public:
  // Starts the transport on a communicator given as its Fortran handle, or
  // (comm_f < 0) on MPI_COMM_WORLD of a process launched by mpirun, where
  // MPI is initialised here if the program did not; then MPI_Finalize runs
  // at exit (FinalizeAtExit) and the SIGTERM grace is installed
  // (termination.h). Throws kMpi when MPI cannot be initialised,
  // kInvalidArgument when a program's MPI grants too low a thread level.
  static std::shared_ptr<MpiTransport> Start(int64_t comm_f);
  ~MpiTransport() override;  // stops the thread, frees the communicators

  const char* name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::shared_ptr<Completion> Isend(CommId comm, int peer, int tag, const void* data, size_t bytes,
                                    OnDone on_done, TimePoint deadline) override;
  std::shared_ptr<Completion> Irecv(CommId comm, int peer, int tag, void* data, size_t bytes,
                                    OnDone on_done, TimePoint deadline) override;
  std::shared_ptr<Completion> IrecvStanding(CommId comm, int peer, int tag, void* data,
                                            size_t bytes, OnDone on_done) override;
  void Cancel(const std::shared_ptr<Completion>& standing) override;

  std::optional<CommId> Split(CommId parent, int color, int key) override;
  void Free(CommId comm) override;
  std::vector<std::string> AllGatherStrings(CommId comm, const std::string& mine) override;

  void Abort(const Error& error) override;
  void CheckHealth() const override;
  bool failed() const override { return failed_.load(std::memory_order_acquire); }
  void SetCallbacks(std::function<void(const Error&)> on_failure,
                    std::function<void()> probe) override;

  struct Impl;  // MPI state, in mpi_transport.cc

 private:
  MpiTransport() = default;
  struct Request {
    enum Kind { kSend, kRecv, kCall, kCancel } kind = kSend;
    bool standing = false;  // kRecv: see IrecvStanding
    CommId comm = 0;
    int peer = 0, tag = 0;
    char* data = nullptr;
    size_t bytes = 0;
    TimePoint deadline = TimePoint::max();
    std::shared_ptr<Completion> done;
    std::function<void()> call;
  };
  // A send or receive request (the fields every message has).
  static Request Message(Request::Kind kind, CommId comm, int peer, int tag, const void* data,
                         size_t bytes, TimePoint deadline);
  std::shared_ptr<Completion> Post(Request r, OnDone on_done = {});
  void RunCall(std::function<void()> fn);
  void Record(const Error& error, bool send_to_peers);
  std::exception_ptr FailureError() const;
  // Where a process whose MPI this transport initialised stops it and
  // calls MPI_Finalize: at exit, unless a failure was recorded (a dead
  // peer would make MPI_Finalize wait for it: MPI_Abort then).
  static void FinalizeAtExit(std::shared_ptr<MpiTransport> transport);

  // The MPI thread's loop (mpi_loop.cc), one step per function.
  void Loop();
  bool PostRequests(std::deque<Request>& batch);  // true: something happened
  void PostMessage(Request& r);
  bool TestRequests();
  void ReceiveControl();
  void AnnounceFailure();
  void SetAnnounced();
  void DriveControlSends();
  void CheckDeadlinesAndProbe(TimePoint now);
  bool MayStop() const;
  void Idle(TimePoint now, TimePoint last_progress);
  void CancelSlot(size_t i);
  void DropFinishedSlots();
  void Shutdown();

  int rank_ = 0, size_ = 1;
  bool initialized_mpi_ = false;
  std::unique_ptr<Impl> impl_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request> queue_;  // guarded by mu_
  bool stop_ = false;          // guarded by mu_
  std::atomic<bool> failed_{false};
  std::atomic<bool> send_to_peers_{false};
  // The recorded failure was announced (its messages left or gave up).
  bool announced_ = false;                // guarded by fail_mu_
  std::condition_variable announced_cv_;  // the recorded failure is ours to announce
  mutable std::mutex fail_mu_;
  std::optional<Error> failure_;  // guarded by fail_mu_
  std::function<void(const Error&)> on_failure_;
  std::function<void()> probe_;
  std::thread thread_;
};

}  // namespace mc2::transport::mpi

#endif  // MC2_TRANSPORT_MPI_MPI_TRANSPORT_H_
