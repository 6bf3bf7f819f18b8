// Worlds and groups whose ranks live on several hosts ("net" groups).
//
// A rank started by mpirun (or given a communicator through mc2::FromMPI)
// lives in two worlds: its node world, the ranks on its own host joined by
// shared memory (an ordinary World, with its transport, heap and progress
// engine), and the net world, every rank of the job reached through a net
// transport (transport/net_transport.h). The net world is that transport,
// the host layout (for every global rank its host and its index on that
// host) and a progress engine of its own that runs the operations of net
// groups, one at a time in submission order, as the node world's engine
// does for shared-memory groups. Its tasks call the node groups'
// collectives and wait for them, so they need an engine of their own.
//
// A group whose members all live on one host is an ordinary shared-memory
// GroupImpl of that host's node world: it runs at full speed, with no net
// transport involved. A group whose members live on several hosts is a
// GroupImpl shell (members, rank, size; no control area) carrying a
// NetGroup: the communicator of exactly its members (ranks in the group's
// order), the node subgroup (its members on this host, an ordinary shm
// group, ordered as in the group) and the member -> (host, local index)
// map. Every public entry point checks GroupImpl::net_group first and
// routes such groups to the algorithms between hosts (collectives/net_*.cc)
// and to the functions below.
//
// Thread safety: the layout is fixed at start-up; the net transport and
// the progress engine are thread-safe; a NetGroup is used by one operation
// at a time (its group's), like a GroupImpl.
#ifndef MC2_ENGINE_NET_H_
#define MC2_ENGINE_NET_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/progress_engine.h"
#include "mc2/group.h"
#include "mc2/work.h"
#include "transport/net_transport.h"

namespace mc2::internal {

class GroupImpl;
struct World;

struct NetWorld {
  std::shared_ptr<transport::NetTransport> transport;
  int rank = 0, size = 0;                    // in the job (transport::kJobComm)
  std::vector<std::string> host_names;       // per host, in order of first rank
  std::vector<int> host_of, local_of;        // per global rank
  std::vector<std::vector<int>> host_ranks;  // per host: its global ranks, ascending
  // "host NAME (its ranks 0..L-1 are global ranks ...)": added to errors,
  // whose node-level parts name node ranks.
  std::string where;
  // Runs the operations of net groups. Declared last: destroyed first.
  std::unique_ptr<engine::ProgressEngine> engine;
};

struct NetGroup {
  std::shared_ptr<NetWorld> net;
  transport::CommId comm = 0;  // ranks = group ranks
  transport::CommId p2p = 0;   // the same ranks, for Send / Recv only
  // The same ranks, for the fused operators' channel only
  // (engine/net_channel.h: notifications and internal Send / Recv).
  transport::CommId chan = 0;
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
  ~NetGroup();
};

// The world of a rank started by mpirun (comm_f < 0) or of a user's
// communicator (comm_f: its Fortran handle). Collective over the job.
Group MakeNetWorldGroup(int64_t comm_f, const WorldOptions& options);

// Net group operations (net_group.cc). Split: collective over `g`.
Group NetSplit(GroupImpl& g, int color, int key);
// `internal`: on the channel's communicator (engine/net_channel.h), where
// no user message travels, else on the group's point-to-point one.
Work NetSendRecv(GroupImpl& g, bool send, char* data, size_t bytes, int peer, int tag,
                 bool internal = false);

// Runs `body` as an operation of net group `g` on the net world's engine
// (every error but kInvalidArgument aborts every rank of the job).
// `deadline` is now + the call's timeout when the body starts.
using NetBody = std::function<void(NetGroup& s, std::chrono::steady_clock::time_point deadline)>;
// `algorithm` (a static name, or null) is what the Work reports.
// `may_run_inline`: run `body` on the calling thread, before returning,
// when the engine has nothing queued or running (as CollectiveOptions'
// may_run_inline does on one host).
Work NetSubmit(GroupImpl& g, const char* name, std::chrono::nanoseconds timeout, NetBody body,
               const char* algorithm = nullptr, bool may_run_inline = false);

// Waits for a request of net group `s`, checking the node's and the
// job's health, until `deadline`; `what` names the transfer in a timeout.
void NetWait(NetGroup& s, const transport::Completion& c,
             std::chrono::steady_clock::time_point deadline, const char* op);
// The failure every rank of the job reports: recorded in the net transport
// (sent to every host) and in the node world (its waits fail).
void NetAbort(const std::shared_ptr<NetWorld>& net, World* node_world, const Error& error);

}  // namespace mc2::internal

#endif  // MC2_ENGINE_NET_H_
