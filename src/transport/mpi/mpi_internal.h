// What the MPI transport's files share (mpi_transport.cc, mpi_loop.cc):
// its MPI state and the helpers around MPI calls. Private to transport/mpi.
#ifndef MC2_TRANSPORT_MPI_MPI_INTERNAL_H_
#define MC2_TRANSPORT_MPI_MPI_INTERNAL_H_

// The C API only: the deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/mpi/mpi_transport.h"

namespace mc2::transport::mpi {

// Tag of the control messages on the control communicator.
constexpr int kCtlTag = 1;
// A failure as it travels between ranks.
struct CtlMsg {
  int32_t code;
  int32_t rank;
  char text[504];
};

// MPI's text for an error code.
std::string MpiErrorString(int rc);
// Throws kMpi naming `call` unless rc is MPI_SUCCESS.
void Check(int rc, const char* call);
// The bytes of one piece of a message (MC2_MPI_PIECE_BYTES, default 1 MiB).
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

struct MpiTransport::Impl {
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
  std::chrono::steady_clock::time_point announce_start{};
  // MPI_Testsome's outputs, kept to save allocations.
  std::vector<int> indices;
  std::vector<MPI_Status> statuses;
};

}  // namespace mc2::transport::mpi

#endif  // MC2_TRANSPORT_MPI_MPI_INTERNAL_H_
