// The MPI engine: mc2's only user of MPI, for the traffic between hosts.
//
// One thread (the engine's MPI thread) makes every MPI call after start-up.
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
// (mc2::FromMPI), its threads may call MPI while the engine's does, which
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
// node's shared-memory world so that its waits fail too). While idle the
// thread calls `probe` every 50 ms (the owner checks the node's health
// there and calls Abort on a local death), so a death on one host reaches
// every host without any operation in flight.
//
// Thread safety: every public method may be called from any thread.
#ifndef MC2_TRANSPORT_MPI_MPI_ENGINE_H_
#define MC2_TRANSPORT_MPI_MPI_ENGINE_H_

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

namespace mc2::transport::mpi {

// A communicator of the engine (an index into its table); 0 is the data
// duplicate of the world communicator.
using CommId = int;
inline constexpr CommId kWorldComm = 0;

// The completion of one Isend or Irecv. Wait blocks until all its pieces
// completed, the engine recorded a failure, `health` throws, or the
// deadline passed (kTimeout naming `what`).
class Completion {
 public:
  bool done() const { return remaining_.load(std::memory_order_acquire) == 0; }
  // Throws the request's failure; returns once it is done.
  void Wait(std::chrono::steady_clock::time_point deadline, const std::function<void()>& health,
            const std::function<std::string()>& what) const;

 private:
  friend class MpiEngine;
  std::atomic<int> remaining_{1};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::exception_ptr error_;  // written under mu_ before remaining_ drops to 0
  // Called once, on the MPI thread, when the request completes or fails.
  std::function<void(std::exception_ptr)> on_done_;
  // Peer and direction, for errors.
  int peer_ = -1;
  bool send_ = false;
};

class MpiEngine {
 public:
  // Starts the engine on a communicator given as its Fortran handle
  // (MPI_Comm_c2f; <mpi.h> stays out of mc2's headers). comm_f < 0: MPI
  // must be initialised here (mpirun without MPI_Init), on MPI_COMM_WORLD.
  // Throws kMpi when MPI cannot be initialised, kInvalidArgument when a
  // user's MPI grants too low a thread level.
  static std::shared_ptr<MpiEngine> Start(int64_t comm_f);
  ~MpiEngine();  // stops the thread, frees the communicators

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Whether this engine initialised MPI (then MPI_Finalize runs at exit).
  bool initialized_mpi() const { return initialized_mpi_; }

  // `on_done`, if given, is called once on the MPI thread when the request
  // completes (null) or fails (the error); it must not block.
  //
  // `deadline`: a request still pending then records kTimeout (naming the
  // direction, peer, tag and size) as the failure of every rank, as a
  // point-to-point operation that times out on one host aborts its world
  // (checked every 50 ms). Requests whose owner waits with a deadline of
  // its own (Completion::Wait) leave it at max().
  using OnDone = std::function<void(std::exception_ptr)>;
  using TimePoint = std::chrono::steady_clock::time_point;
  std::shared_ptr<Completion> Isend(CommId comm, int peer, int tag, const void* data,
                                    size_t bytes, OnDone on_done = {},
                                    TimePoint deadline = TimePoint::max());
  std::shared_ptr<Completion> Irecv(CommId comm, int peer, int tag, void* data, size_t bytes,
                                    OnDone on_done = {}, TimePoint deadline = TimePoint::max());
  // A standing receive: one that may never match (a channel keeps one
  // posted per peer for the next notification). It does not keep the
  // engine from stopping: at stop, and on Cancel, it is cancelled and
  // fails with kAborted (its on_done then sees the error). At most one
  // piece (bytes <= MC2_MPI_PIECE_BYTES).
  std::shared_ptr<Completion> IrecvStanding(CommId comm, int peer, int tag, void* data,
                                            size_t bytes, OnDone on_done);
  // Cancels a standing receive unless it already completed (returns at
  // once; the cancellation happens on the MPI thread, after every request
  // posted before it).
  void Cancel(const std::shared_ptr<Completion>& standing);

  // Collective over `parent`'s ranks (each calls it, in the same order):
  // MPI_Comm_split. Returns the new communicator, or nullopt for color < 0.
  std::optional<CommId> Split(CommId parent, int color, int key);
  // Frees a communicator made by Split (local; pending requests on it
  // must be complete).
  void Free(CommId comm);
  // Collective over `comm`: every rank's string, in rank order.
  std::vector<std::string> AllGatherStrings(CommId comm, const std::string& mine);

  // Records `error` as the failure of every rank and sends it to every
  // other rank over the control communicator. First failure wins. When the
  // program initialised MPI, returns once the messages left (at most 1 s),
  // so that a process that exits right after still warns the other hosts;
  // when mc2 did, returns at once and the exit handler (FinalizeAtExit)
  // waits for them before MPI ends.
  void Abort(const Error& error);
  // Throws the recorded failure, if any.
  void CheckHealth() const;
  bool failed() const { return failed_.load(std::memory_order_acquire); }

  // Owner's callbacks (set once, before traffic): on_failure is called
  // once, on the MPI thread, when a failure is recorded; probe is called
  // on the MPI thread while idle, every 50 ms.
  void SetCallbacks(std::function<void(const Error&)> on_failure, std::function<void()> probe);

  // Where a process that initialised MPI itself stops the engine and
  // calls MPI_Finalize: at exit, once no world uses the engine, unless a
  // failure was recorded (a dead peer would make MPI_Finalize wait for it).
  // Called by the owner after Start when initialized_mpi().
  static void FinalizeAtExit(std::shared_ptr<MpiEngine> engine);

  struct Impl;  // MPI state, in mpi_engine.cc

 private:
  MpiEngine() = default;
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
  void Loop();
  void Record(const Error& error, bool send_to_peers);

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
  bool announced_ = false;  // guarded by fail_mu_
  std::condition_variable announced_cv_;  // the recorded failure is ours to announce
  mutable std::mutex fail_mu_;
  std::optional<Error> failure_;  // guarded by fail_mu_
  std::function<void(const Error&)> on_failure_;
  std::function<void()> probe_;
  std::thread thread_;
};

}  // namespace mc2::transport::mpi

#endif  // MC2_TRANSPORT_MPI_MPI_ENGINE_H_
