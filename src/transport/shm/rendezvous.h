// A shared-memory world made by its own ranks, for launchers that know
// nothing of mc2 (mpirun, torchrun, a c10d store).
//
// `mc2 run` creates a job's segments before it starts the ranks and hands
// them down as inherited descriptors (job.h). When something else starts
// the ranks, the ranks of one host make the same world among themselves,
// given only a way to all-gather a short string (a key-value store, MPI):
//   1. every rank says which machine it is on (the kernel's boot id) and
//      how many ranks it expects; rank 0 also creates the job's segments
//      (CreateJobSegments: memory reserved up front, names unlinked at
//      once) and says its pid and the descriptor numbers, or why it could
//      not create them;
//   2. every other rank opens the same files through /proc/<pid>/fd/<n>
//      of rank 0 (same machine, same user), so no name ever exists in the
//      shared-memory directory and nothing is left behind whatever happens;
//   3. every rank maps them and starts as under `mc2 run` (MapJobTransport);
//      rank 0 keeps its descriptors until that start-up proves that every
//      rank has mapped everything.
// A failure at any step raises mc2::Error on every rank that can still
// learn of it: a rank 0 that cannot create the segments (kShmExhausted,
// kSystem) tells the others through the all-gather; ranks on different
// machines or with different world sizes get kInvalidArgument naming them.
// With no launcher watching, the ranks watch each other's processes (as
// under `mc2 run`), so a rank that dies later is kPeerDied everywhere.
#ifndef MC2_TRANSPORT_SHM_RENDEZVOUS_H_
#define MC2_TRANSPORT_SHM_RENDEZVOUS_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace mc2::shm {

// Given this rank's string, returns every rank's string in rank order. Must
// be collective over the `size` ranks of the world being made; strings are
// short (under 4 KiB) and contain no NUL.
using AllGatherStrings = std::function<std::vector<std::string>(const std::string& mine)>;

// Rank `rank` of `size`'s transport of a new world with `heap_bytes` per
// rank, its segments in directory `dir` (e.g. /dev/shm).
std::unique_ptr<transport::Transport> CreateRendezvousTransport(int rank, int size,
                                                                size_t heap_bytes,
                                                                const std::string& dir,
                                                                const AllGatherStrings& all_gather);

}  // namespace mc2::shm

#endif  // MC2_TRANSPORT_SHM_RENDEZVOUS_H_
