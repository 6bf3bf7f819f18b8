// A grace period after the launcher's SIGTERM, for ranks started by mpirun.
//
// When one rank of a job dies, Open MPI's mpirun sends SIGTERM to every
// other rank at once, and SIGKILL a second later (odls_base_sigkill_timeout).
// The failure itself reaches the other ranks over the MPI transport's control
// messages within tens of milliseconds, but a rank that SIGTERM kills at
// once never raises it: the user sees only mpirun's own message. With the
// grace, SIGTERM no longer kills at once: a watcher thread gives the
// failure kGraceWait to arrive (if none does, it records kAborted "terminated
// by the launcher (SIGTERM)" itself), so that the rank's pending and later
// mc2 calls raise the error that names the dead rank; then, kGraceExit
// after the signal, it restores SIGTERM's default action and raises it
// again, so a program that makes no mc2 call still ends as it would have.
// A rank that exits during the grace (having printed its error) waits for
// its end first: its exit calls MPI_Abort, on which mpirun kills every
// rank at once, also those still printing theirs.
//
// Installed only where the default action is in force (a program's own
// SIGTERM handler is left alone) and only by worlds whose MPI mc2
// initialised itself (a program that initialised MPI runs its own policy).
#ifndef MC2_TRANSPORT_MPI_TERMINATION_H_
#define MC2_TRANSPORT_MPI_TERMINATION_H_

#include <chrono>
#include <memory>

#include "transport/mpi/mpi_transport.h"

namespace mc2::transport::mpi {

inline constexpr std::chrono::milliseconds kGraceWait{300};
inline constexpr std::chrono::milliseconds kGraceExit{800};

// Once per process; later calls (or calls after the program installed its
// own handler) do nothing. The transport is held weakly.
void InstallTerminationGrace(const std::shared_ptr<MpiTransport>& tx);

}  // namespace mc2::transport::mpi

#endif  // MC2_TRANSPORT_MPI_TERMINATION_H_
