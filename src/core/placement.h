// Where a rank's threads run: the binding policy (MC2_BIND), the plan for
// one rank among the ranks of its host (PlanPlacement, a pure function of
// the topology), and applying it to the calling thread (PlaceThisProcess).
//
// A rank has a compute thread (the caller of the fused operators, with its
// GEMM helpers, MC2_GEMM_THREADS in all) and a progress thread. The plan
// gives each rank a domain of cores (its slice of the host's cores, or its
// socket or NUMA node), never outside the process's affinity mask; inside
// the domain the progress thread gets a core of its own when the domain has
// a core to spare beyond the GEMM threads of the ranks sharing it, and the
// compute thread (whose GEMM helpers inherit its mask) the rest. When the
// ranks' threads exceed the cores the plan says what it chose (`notes`).
//
// Thread safety: PlanPlacement is pure. PlaceThisProcess and
// CurrentPlacement may be called from any thread; the first placement of a
// process is the one recorded.
#ifndef MC2_CORE_PLACEMENT_H_
#define MC2_CORE_PLACEMENT_H_

#include <pthread.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/topology.h"

namespace mc2::core {

enum class BindPolicy {
  // kCore when the host's ranks have at least a core per thread to fill
  // (local ranks x (GEMM threads + 1) >= cores), else kNone.
  kAuto,
  kNone,    // nothing is bound
  kCore,    // each rank a contiguous slice of the cores, ranks spread evenly
  kSocket,  // each rank its socket (ranks spread evenly over the sockets)
  kNuma,    // each rank its NUMA node (ranks spread evenly over the nodes)
};
const char* BindPolicyName(BindPolicy p);
std::optional<BindPolicy> ParseBindPolicy(std::string_view name);
// MC2_BIND (auto, none, core, socket, numa); kAuto when unset. Throws
// mc2::Error(kInvalidArgument) naming the variable for any other value.
BindPolicy BindPolicyFromEnv();

// This process's rank among the ranks of its host.
struct LocalRank {
  int rank = 0;
  int size = 1;
  std::string source;  // the variables it came from
};
// From MC2_LOCAL_RANK/MC2_LOCAL_SIZE (mc2 run), else
// OMPI_COMM_WORLD_LOCAL_RANK/OMPI_COMM_WORLD_LOCAL_SIZE (mpirun), else
// SLURM_LOCALID/SLURM_NTASKS_PER_NODE (srun); nullopt when none is set.
// Throws kInvalidArgument naming the variable for a malformed value.
std::optional<LocalRank> LocalRankFromEnv();

struct PlacementRequest {
  int local_rank = 0;
  int local_size = 1;
  BindPolicy policy = BindPolicy::kAuto;
  int gemm_threads = 1;  // the compute thread and its GEMM helpers
};

struct Placement {
  BindPolicy policy = BindPolicy::kNone;  // as resolved (never kAuto)
  // OS CPU numbers; both empty when nothing is bound.
  std::vector<int> compute;
  std::vector<int> progress;
  bool own_progress_core = false;  // progress's CPUs are not compute's
  int ranks_sharing_domain = 1;    // ranks whose domain is this one
  // More GEMM threads (of the ranks sharing the domain) than its cores.
  bool gemm_oversubscribed = false;
  // What was chosen where the request could not be met as asked (threads
  // beyond the cores, ranks sharing cores); empty otherwise.
  std::string notes;
  bool bound() const { return !compute.empty(); }
  // One line: "core: compute 0-2, progress 3 (own core)" and the notes.
  std::string Describe() const;
};

// The plan for request.local_rank among request.local_size ranks of a host
// with topology `t` (t.cpus non-empty). Pure: every rank of a host computes
// its own and the plans fit together.
Placement PlanPlacement(const Topology& t, const PlacementRequest& request);

// Binds `thread` to `cpus` (pthread_setaffinity_np); false when the kernel
// refused (a placement is a hint: the thread then runs unbound).
bool BindThread(pthread_t thread, const std::vector<int>& cpus);

// Plans this process's placement from the host topology, MC2_BIND,
// MC2_GEMM_THREADS and the local rank (`local`, else LocalRankFromEnv;
// without one the policy resolves to kNone), binds the calling thread to its compute CPUs,
// records the plan (CurrentPlacement) and logs it (info level; a warning
// from local rank 0 when several GEMM threads per rank outnumber the
// cores). Later calls return the recorded plan and bind nothing.
const Placement& PlaceThisProcess(const std::optional<LocalRank>& local = std::nullopt);

// The placement PlaceThisProcess recorded, or nullptr before it ran (an
// in-process world binds nothing).
const Placement* CurrentPlacement();

}  // namespace mc2::core

#endif  // MC2_CORE_PLACEMENT_H_
