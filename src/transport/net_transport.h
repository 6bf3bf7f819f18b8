// The net transport: how the ranks of a job on several hosts exchange
// messages.
//
// Inside a host, ranks share memory (transport.h: heaps, flags, loads and
// stores). Between hosts they cannot, so the engine asks a net transport
// for what it needs there, and nothing else:
//   - point-to-point messages with tags (Isend / Irecv) on communicators,
//     matched per (communicator, peer, tag) in posting order, completing
//     asynchronously (Completion), with an optional deadline;
//   - standing receives (a receive that may never match, cancelled at
//     stop), on which the engine builds the one-sided channel of the fused
//     operators (engine/net_channel.h);
//   - communicators: Split, and a small all-gather of strings (start-up
//     and group creation);
//   - liveness: a failure recorded on one rank (Abort) reaches every rank
//     of the job; a dead peer fails the requests that need it (kPeerDied);
//     the owner is told (on_failure) and may probe its own host while the
//     transport is idle (probe);
//   - progress: the transport moves its messages on its own thread, so the
//     caller computes while they travel.
// Implementations live in a folder each (mpi/: Open MPI, under mpirun or
// on a user's communicator) and are named only by the factory (factory.cc,
// StartNetTransport). The engine and the collectives see this interface.
//
// Thread safety: every method of NetTransport may be called from any
// thread. A Completion may be waited for by any thread.
#ifndef MC2_TRANSPORT_NET_TRANSPORT_H_
#define MC2_TRANSPORT_NET_TRANSPORT_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "mc2/error.h"

namespace mc2::transport {

// A communicator of a net transport: an ordered set of the job's ranks
// with a message space of its own. kJobComm holds every rank of the job,
// in job order; Split makes the others.
using CommId = int;
inline constexpr CommId kJobComm = 0;

// The completion of one send or receive. Wait blocks until it completed,
// failed, `health` throws, or the deadline passed (kTimeout naming `what`).
class Completion {
 public:
  using OnDone = std::function<void(std::exception_ptr)>;
  // `peer` and `send` name the message in errors; `on_done` (may be empty)
  // is called once, on the transport's thread, when the request completes
  // (null) or fails (the error), right after done() turned true (a waiter
  // may return before it ran); it must not block.
  Completion(int peer, bool send, OnDone on_done)
      : on_done_(std::move(on_done)), peer_(peer), send_(send) {}

  bool done() const { return remaining_.load(std::memory_order_acquire) == 0; }
  // Throws the request's failure; returns once it is done.
  void Wait(std::chrono::steady_clock::time_point deadline, const std::function<void()>& health,
            const std::function<std::string()>& what) const;

  // For implementations. Expect: the request completes after `parts`
  // calls of Finish(null) (a message sent in pieces); call before the
  // first Finish. Finish: one part completed (null), or the request failed
  // (the first error is kept and the request is done at once).
  void Expect(int parts) { remaining_.store(parts, std::memory_order_relaxed); }
  void Finish(std::exception_ptr error);

 private:
  std::atomic<int> remaining_{1};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::exception_ptr error_;  // written under mu_ before remaining_ drops to 0
  OnDone on_done_;
  int peer_ = -1;
  bool send_ = false;
};

class NetTransport {
 public:
  using OnDone = Completion::OnDone;
  using TimePoint = std::chrono::steady_clock::time_point;
  // The deadline of a request whose owner waits with one of its own.
  static constexpr TimePoint kNoDeadline = TimePoint::max();

  virtual ~NetTransport() = default;

  // "mpi", for logs and errors.
  virtual const char* name() const = 0;
  // This rank and the number of ranks in the job (kJobComm).
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Posts a send of `bytes` at `data` (which must stay valid until the
  // completion) to `peer` of `comm` with `tag` >= 0, or a receive into
  // `data` of exactly `bytes` from `peer` with `tag`. `on_done` as for
  // Completion. `deadline`: a request still pending then records kTimeout
  // (naming the direction, peer, tag and size) as the failure of every
  // rank, as a point-to-point operation that times out on one host aborts
  // its world. Requests whose owner waits with a deadline of its own
  // (Completion::Wait) pass kNoDeadline. After a recorded failure
  // every request fails with it.
  virtual std::shared_ptr<Completion> Isend(CommId comm, int peer, int tag, const void* data,
                                            size_t bytes, OnDone on_done, TimePoint deadline) = 0;
  virtual std::shared_ptr<Completion> Irecv(CommId comm, int peer, int tag, void* data,
                                            size_t bytes, OnDone on_done, TimePoint deadline) = 0;
  // A standing receive: one that may never match (a channel keeps one
  // posted per peer for its next notification). It does not keep the
  // transport from stopping: at stop, and on Cancel, it is cancelled and
  // fails with kAborted (its on_done then sees the error). At most
  // kMaxStandingBytes.
  static constexpr size_t kMaxStandingBytes = 4096;
  virtual std::shared_ptr<Completion> IrecvStanding(CommId comm, int peer, int tag, void* data,
                                                    size_t bytes, OnDone on_done) = 0;
  // Cancels a standing receive unless it already completed. Returns at
  // once; the cancellation happens after every request posted before it.
  virtual void Cancel(const std::shared_ptr<Completion>& standing) = 0;

  // Collective over `parent`'s ranks (each calls it, in the same order):
  // the ranks of one `color` >= 0 form a new communicator, ordered by
  // `key` then by rank in `parent`. Returns it, or nullopt for color < 0.
  // A recorded failure ends the wait (it is thrown).
  virtual std::optional<CommId> Split(CommId parent, int color, int key) = 0;
  // Frees a communicator made by Split (local; its requests must be
  // complete). After a failure it does nothing.
  virtual void Free(CommId comm) = 0;
  // Collective over `comm`: every rank's string, in rank order.
  virtual std::vector<std::string> AllGatherStrings(CommId comm, const std::string& mine) = 0;

  // Records `error` as the failure of every rank and sends it to every
  // other rank. The first failure wins. Returns once the messages left (or
  // a bounded time passed), or at once where an exit handler of the
  // transport waits for them, so that a process that exits right after
  // still warns the other hosts.
  virtual void Abort(const Error& error) = 0;
  // Throws the recorded failure, if any.
  virtual void CheckHealth() const = 0;
  virtual bool failed() const = 0;

  // The owner's callbacks (set once, before traffic): `on_failure` is
  // called once, on the transport's thread, when a failure is recorded
  // (here or received); `probe` is called on that thread every 50 ms while
  // no failure is recorded: what it throws (an mc2::Error) is recorded
  // and sent as this rank's failure.
  virtual void SetCallbacks(std::function<void(const Error&)> on_failure,
                            std::function<void()> probe) = 0;
};

// Which net transport the factory starts, and on what.
struct NetTransportOptions {
  // MPI: the communicator's Fortran handle (MPI_Comm_c2f; <mpi.h> stays
  // out of mc2's headers), or < 0 for a process launched by mpirun, where
  // the transport initialises MPI itself if the program did not.
  int64_t mpi_comm_f = -1;
};

// Whether this process was started by mpirun / srun (and not by `mc2 run`).
bool LaunchedByMpi();

// The one place that names concrete net transports (factory.cc). Throws
// kMpi when MPI cannot be initialised, kInvalidArgument when a program's
// MPI grants too low a thread level.
std::shared_ptr<NetTransport> StartNetTransport(const NetTransportOptions& options);

}  // namespace mc2::transport

#endif  // MC2_TRANSPORT_NET_TRANSPORT_H_
