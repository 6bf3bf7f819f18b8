// mc2/mpi.h: a world over a communicator of a program that uses MPI itself.
//
// The one mc2 header that includes <mpi.h>: include it only where MPI is
// part of the build (link MPI as well as mc2). A program launched by
// mpirun or srun that does not use MPI itself needs none of this:
// mc2::Group::FromEnv() initialises MPI and builds the world on its own.
#ifndef MC2_MPI_H_
#define MC2_MPI_H_

#include <mpi.h>

#include <cstdint>

#include "mc2/group.h"

namespace mc2 {

namespace internal {
// FromMPI without <mpi.h> types: the communicator as MPI_Comm_c2f gives it.
Group FromMPIHandle(int64_t comm_f, const WorldOptions& options);
}  // namespace internal

// Collective over `comm`: the world of its ranks, in its rank order. Ranks
// on one host (by hostname; MC2_HOSTNAME overrides it) share memory; between
// hosts mc2 sends over MPI on a duplicate of `comm`, never on `comm` itself.
// mc2's MPI thread calls MPI while the program's threads may, so MPI must
// have been initialised with MPI_THREAD_MULTIPLE: any other level throws
// mc2::Error(kInvalidArgument) naming the level. The program keeps calling
// MPI_Finalize itself, after its last mc2 group is destroyed. Errors as for
// Group::FromEnv.
inline Group FromMPI(MPI_Comm comm, const WorldOptions& options = {}) {
  return internal::FromMPIHandle(static_cast<int64_t>(MPI_Comm_c2f(comm)), options);
}

}  // namespace mc2

#endif  // MC2_MPI_H_
