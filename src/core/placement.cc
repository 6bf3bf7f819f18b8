// Binding policies and the placement of one rank's threads.
//
// Works as follows. The cores of the process's affinity mask, in topology
// order (socket, NUMA node, core), are cut into domains:
//   core    local rank r of L gets cores [r C / L, (r + 1) C / L) of the C
//           cores, so ranks spread evenly and a rank's cores are adjacent
//           (with L <= C one rank per domain; with L > C rank r gets core
//           r mod C, shared by the ranks with the same remainder);
//   socket  the G sockets: with L >= G rank r gets socket r G / L (a socket
//   numa    shared by about L / G ranks); with L < G the sockets
//           [r G / L, (r + 1) G / L). NUMA nodes likewise.
// In a domain of n cores shared by k ranks with T GEMM threads each, the
// i-th of those ranks gets the domain's (n - 1 - i)-th core for its
// progress thread when n >= k (T + 1), and the remaining cores for its
// compute thread; otherwise both threads get the whole domain and the plan
// notes that the progress thread shares the GEMMs' cores.
#include "core/placement.h"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>

#include "core/env.h"
#include "core/log.h"
#include "mc2/error.h"

namespace mc2::core {
namespace {

struct Named {
  BindPolicy policy;
  const char* name;
};
constexpr Named kPolicies[] = {{BindPolicy::kAuto, "auto"},
                               {BindPolicy::kNone, "none"},
                               {BindPolicy::kCore, "core"},
                               {BindPolicy::kSocket, "socket"},
                               {BindPolicy::kNuma, "numa"}};

// An integer variable pair, both set, or nullopt when `rank_var` is unset.
std::optional<LocalRank> FromPair(const char* rank_var, const char* size_var) {
  auto rank = GetEnv(rank_var);
  auto size = GetEnv(size_var);
  if (!rank || !size) return std::nullopt;
  LocalRank lr;
  lr.size = static_cast<int>(ParseInt(*size, size_var, 1, 1 << 20));
  lr.rank = static_cast<int>(ParseInt(*rank, rank_var, 0, lr.size - 1));
  lr.source = fmt::format("{}/{}", rank_var, size_var);
  return lr;
}

std::vector<int> CpusOf(const std::vector<std::vector<int>>& core_cpus,
                        const std::vector<int>& cores) {
  std::vector<int> out;
  for (int c : cores) out.insert(out.end(), core_cpus[c].begin(), core_cpus[c].end());
  std::sort(out.begin(), out.end());
  return out;
}

std::mutex placement_mu;
Placement* recorded = nullptr;  // never freed: read until exit

}  // namespace

const char* BindPolicyName(BindPolicy p) {
  for (const Named& n : kPolicies)
    if (n.policy == p) return n.name;
  return "?";
}

std::optional<BindPolicy> ParseBindPolicy(std::string_view name) {
  for (const Named& n : kPolicies)
    if (name == n.name) return n.policy;
  return std::nullopt;
}

BindPolicy BindPolicyFromEnv() {
  auto v = GetEnv("MC2_BIND");
  if (!v) return BindPolicy::kAuto;
  auto p = ParseBindPolicy(TrimSpace(*v));
  if (!p)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("MC2_BIND='{}' is invalid: expected auto, none, core, socket or numa",
                            *v));
  return *p;
}

std::optional<LocalRank> LocalRankFromEnv() {
  if (auto lr = FromPair("MC2_LOCAL_RANK", "MC2_LOCAL_SIZE")) return lr;
  if (auto lr = FromPair("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")) return lr;
  return FromPair("SLURM_LOCALID", "SLURM_NTASKS_PER_NODE");
}

std::string Placement::Describe() const {
  std::string s;
  if (!bound()) {
    s = fmt::format("{}: unbound", BindPolicyName(policy));
  } else {
    s = fmt::format("{}: compute cpus {}, progress cpus {} ({})", BindPolicyName(policy),
                    FormatCpuList(compute), FormatCpuList(progress),
                    own_progress_core ? "a core of its own" : "shared with compute");
  }
  if (!notes.empty()) s += "; " + notes;
  return s;
}

Placement PlanPlacement(const Topology& t, const PlacementRequest& req) {
  const std::vector<std::vector<int>> core_cpus = t.CoreCpus();
  const long C = static_cast<long>(core_cpus.size());
  const long L = std::max(1, req.local_size);
  const long r = std::clamp<long>(req.local_rank, 0, L - 1);
  const long T = std::max(1, req.gemm_threads);
  Placement p;
  p.policy = req.policy;
  if (p.policy == BindPolicy::kAuto)
    p.policy = L * (T + 1) >= C ? BindPolicy::kCore : BindPolicy::kNone;
  if (p.policy == BindPolicy::kNone || C == 0) {
    p.policy = BindPolicy::kNone;
    return p;
  }

  std::vector<int> domain;  // core indices
  long sharing = 1, index = 0;
  if (p.policy == BindPolicy::kCore) {
    if (L <= C) {
      for (long c = r * C / L; c < (r + 1) * C / L; ++c) domain.push_back(static_cast<int>(c));
    } else {
      domain.push_back(static_cast<int>(r % C));
      sharing = L / C + (r % C < L % C ? 1 : 0);
      index = r / C;
      p.notes = fmt::format("{} ranks on {} cores: {} ranks share core {}", L, C, sharing,
                            FormatCpuList(core_cpus[r % C]));
    }
  } else {
    const auto groups = p.policy == BindPolicy::kSocket ? t.CoresBySocket() : t.CoresByNuma();
    const long G = static_cast<long>(groups.size());
    if (L >= G) {
      const long d = r * G / L;
      long first = L, count = 0;
      for (long q = 0; q < L; ++q)
        if (q * G / L == d) {
          first = std::min(first, q);
          ++count;
        }
      domain = groups[d];
      sharing = count;
      index = r - first;
    } else {
      for (long d = r * G / L; d < (r + 1) * G / L; ++d)
        domain.insert(domain.end(), groups[d].begin(), groups[d].end());
    }
  }
  p.ranks_sharing_domain = static_cast<int>(sharing);

  const long n = static_cast<long>(domain.size());
  if (n >= sharing * (T + 1)) {
    // The last `sharing` cores of the domain carry the progress threads.
    p.own_progress_core = true;
    p.progress = core_cpus[domain[n - 1 - index]];
    p.compute = CpusOf(core_cpus, std::vector<int>(domain.begin(), domain.end() - sharing));
  } else {
    p.compute = CpusOf(core_cpus, domain);
    p.progress = p.compute;
    p.gemm_oversubscribed = sharing * T > n;
    const std::string note = fmt::format(
        "{} rank(s) x ({} GEMM thread(s) + 1 progress thread) on {} core(s): the progress "
        "thread shares the compute cores{}",
        sharing, T, n, sharing * T > n ? " and the GEMM threads outnumber the cores" : "");
    p.notes = p.notes.empty() ? note : p.notes + "; " + note;
  }
  return p;
}

bool BindThread(pthread_t thread, const std::vector<int>& cpus) {
  if (cpus.empty()) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  return pthread_setaffinity_np(thread, sizeof(set), &set) == 0;
}

const Placement& PlaceThisProcess(const std::optional<LocalRank>& given) {
  std::lock_guard<std::mutex> lock(placement_mu);
  if (recorded) return *recorded;
  PlacementRequest req;
  req.policy = BindPolicyFromEnv();
  req.gemm_threads = static_cast<int>(EnvInt("MC2_GEMM_THREADS", 1, 1, 1024));
  const Topology& topo = HostTopology();
  const std::optional<LocalRank> local = given ? given : LocalRankFromEnv();
  if (local) {
    req.local_rank = local->rank;
    req.local_size = local->size;
    // mpirun and srun may have bound the rank already (mpirun binds to
    // cores at 2 ranks): auto keeps a binding narrower than the host.
    const bool external = local->source.rfind("MC2_", 0) != 0;
    if (req.policy == BindPolicy::kAuto && external &&
        static_cast<long>(topo.cpus.size()) < sysconf(_SC_NPROCESSORS_ONLN))
      req.policy = BindPolicy::kNone;
  } else if (req.policy == BindPolicy::kAuto) {
    req.policy = BindPolicy::kNone;  // nobody says how many ranks share the host
  }
  auto* p = new Placement(PlanPlacement(topo, req));
  if (p->bound() && !BindThread(pthread_self(), p->compute)) {
    p->notes += std::string(p->notes.empty() ? "" : "; ") + "the kernel refused the binding";
    p->compute.clear();
    p->progress.clear();
  }
  if (!topo.fallback_reason.empty())
    MC2_LOG(kInfo, "topology: hwloc unavailable ({}); using the affinity mask and sysfs",
            topo.fallback_reason);
  MC2_LOG(kInfo, "placement on {} (local rank {} of {}{}): {}", topo.host, req.local_rank,
          req.local_size, local ? " from " + local->source : "", p->Describe());
  // GEMM threads that cannot all run at once slow every GEMM: said once
  // per host, whatever the log level asks.
  if (p->gemm_oversubscribed && req.gemm_threads > 1 && req.local_rank == 0)
    MC2_LOG(kWarn, "MC2_GEMM_THREADS={} with {} rank(s) on this host's {} core(s) runs more "
                   "GEMM threads than cores: {}",
            req.gemm_threads, req.local_size, topo.cores(), p->Describe());
  recorded = p;
  return *p;
}

const Placement* CurrentPlacement() {
  std::lock_guard<std::mutex> lock(placement_mu);
  return recorded;
}

}  // namespace mc2::core
