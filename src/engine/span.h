// Worlds and groups that span hosts.
//
// A rank started by mpirun (or given a communicator through mc2::FromMPI)
// lives in two worlds: its node world, the ranks on its own host joined by
// shared memory (an ordinary World, with its transport, heap and progress
// engine), and the net world, every rank of the job reached over MPI. The
// net world is the MPI engine (transport/mpi/mpi_engine.h), the host
// layout (for every global rank its host and its index on that host) and a
// progress engine of its own that runs the operations of groups that span
// hosts, one at a time in submission order, as the node world's engine
// does for shared-memory groups. Its tasks call the node groups'
// collectives and wait for them, so they need an engine of their own.
//
// A group whose members all live on one host is an ordinary shared-memory
// GroupImpl of that host's node world: it runs at full speed, with no MPI
// involved. A group whose members span hosts is a GroupImpl shell (members,
// rank, size; no control area) carrying a SpanGroup: the MPI communicator
// of exactly its members (ranks in the group's order), the node subgroup
// (its members on this host, an ordinary shm group, ordered as in the
// group) and the member -> (host, local index) map. Every public entry
// point checks GroupImpl::span first and routes such groups to the span
// algorithms (collectives/span_*.cc) and to the functions below.
//
// Thread safety: the layout is fixed at start-up; the MPI engine and the
// progress engine are thread-safe; a SpanGroup is used by one operation at
// a time (its group's), like a GroupImpl.
#ifndef MC2_ENGINE_SPAN_H_
#define MC2_ENGINE_SPAN_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/progress_engine.h"
#include "mc2/group.h"
#include "mc2/work.h"
#include "transport/mpi/mpi_engine.h"

namespace mc2::internal {

class GroupImpl;
struct World;

struct NetWorld {
  std::shared_ptr<transport::mpi::MpiEngine> mpi;
  int rank = 0, size = 0;                    // in the job (MPI communicator)
  std::vector<std::string> host_names;       // per host, in order of first rank
  std::vector<int> host_of, local_of;        // per global rank
  std::vector<std::vector<int>> host_ranks;  // per host: its global ranks, ascending
  // "host NAME (its ranks 0..L-1 are global ranks ...)": added to errors,
  // whose node-level parts name node ranks.
  std::string where;
  // Runs the operations of span groups. Declared last: destroyed first.
  std::unique_ptr<engine::ProgressEngine> engine;
};

struct SpanGroup {
  std::shared_ptr<NetWorld> net;
  transport::mpi::CommId comm = 0;  // ranks = group ranks
  transport::mpi::CommId p2p = 0;   // the same ranks, for Send / Recv only
  // The same ranks, for the fused operators' channel only
  // (engine/span_channel.h: notifications and internal Send / Recv).
  transport::mpi::CommId chan = 0;
  std::vector<int> members;         // global ranks
  int rank = 0;
  // Hosts in order of their first member; per member its host and index
  // on that host (= its rank in that host's node subgroup).
  std::vector<int> host_of, local_of;
  std::vector<std::vector<int>> hosts;  // per host: its members (group ranks), ascending
  int my_host = 0;
  // Every host holds a contiguous block of members of one power-of-two
  // size, hosts in member order: the node pre-reduction is then a subtree
  // of the canonical reduction order (core/reduce.h).
  bool aligned = false;
  std::shared_ptr<GroupImpl> node;  // this host's members, as a shm group
  ~SpanGroup();
};

// Whether this process was started by mpirun / srun (and not by `mc2 run`).
bool LaunchedByMpi();
// The world of a rank started by mpirun (comm_f < 0) or of a user's
// communicator (comm_f: its Fortran handle). Collective over the job.
Group MakeNetWorldGroup(int64_t comm_f, const WorldOptions& options);

// Span group operations (span_group.cc). Split: collective over `g`.
Group SpanSplit(GroupImpl& g, int color, int key);
// `internal`: on the channel's communicator (engine/span_channel.h), where
// no user message travels, else on the group's point-to-point one.
Work SpanSendRecv(GroupImpl& g, bool send, char* data, size_t bytes, int peer, int tag,
                  bool internal = false);

// Runs `body` as an operation of span group `g` on the net world's engine
// (every error but kInvalidArgument aborts every rank of the job).
// `deadline` is now + the call's timeout when the body starts.
using SpanBody = std::function<void(SpanGroup& s, std::chrono::steady_clock::time_point deadline)>;
// `algorithm` (a static name, or null) is what the Work reports.
// `may_run_inline`: run `body` on the calling thread, before returning,
// when the engine has nothing queued or running (as CollectiveOptions'
// may_run_inline does on one host).
Work SpanSubmit(GroupImpl& g, const char* name, std::chrono::nanoseconds timeout, SpanBody body,
                const char* algorithm = nullptr, bool may_run_inline = false);

// Waits for an MPI request of span group `s`, checking the node's and the
// job's health, until `deadline`; `what` names the transfer in a timeout.
void SpanWait(SpanGroup& s, const transport::mpi::Completion& c,
              std::chrono::steady_clock::time_point deadline, const char* op);
// The failure every rank of the job reports: recorded in the MPI engine
// (sent to every host) and in the node world (its waits fail).
void SpanAbort(const std::shared_ptr<NetWorld>& net, World* node_world, const Error& error);

}  // namespace mc2::internal

#endif  // MC2_ENGINE_SPAN_H_
