// Internals of the MPI engine shared by its two files (mpi_engine.cc:
// start-up, requests, calls, failures; mpi_progress.cc: progress passes,
// waiters, the MPI thread's loop). Included by those files only.
#ifndef MC2_TRANSPORT_MPI_MPI_INTERNAL_H_
#define MC2_TRANSPORT_MPI_MPI_INTERNAL_H_

// The C API only: the deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "transport/mpi/mpi_engine.h"

namespace mc2::transport::mpi {

using Clock = std::chrono::steady_clock;

// Tag of the control messages on the control communicator.
constexpr int kCtlTag = 1;
// A failure as it travels between ranks.
struct CtlMsg {
  int32_t code;
  int32_t rank;
  char text[504];
};

std::string MpiErrorString(int rc);

// MC2_MPI_PIECE_BYTES: the largest message MPI carries at once.
size_t PieceBytes();

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

// The MPI state: only the thread in a pass (holding mpi_mu_) touches it.
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
  Clock::time_point announce_start{};
  // A pass's scratch, kept to spare allocations.
  std::deque<Request> batch;
  std::vector<int> indices;
  std::vector<MPI_Status> statuses;
};

}  // namespace mc2::transport::mpi

#endif  // MC2_TRANSPORT_MPI_MPI_INTERNAL_H_
