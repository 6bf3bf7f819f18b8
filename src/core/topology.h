// What this host is made of, as far as this process may use it: its name
// and the logical CPUs of the process's affinity mask, each with its core,
// socket (package) and NUMA node.
//
// Detection uses hwloc (DetectTopology). When hwloc cannot load a topology
// or finds no usable CPU (some containers hide /sys), a fallback builds one
// from the affinity mask and /sys/devices/system/cpu/*/topology where it is
// readable, else one core per CPU on one socket and one NUMA node; the
// result says which (`source`, `fallback_reason`).
//
// Thread safety: DetectTopology may be called from any thread; HostTopology
// detects once (the first caller pays) and returns the same object after.
#ifndef MC2_CORE_TOPOLOGY_H_
#define MC2_CORE_TOPOLOGY_H_

#include <string>
#include <vector>

namespace mc2::core {

// One logical CPU (processing unit) the process may run on. `core`,
// `socket` and `numa` are host-wide indices (hwloc's logical indices, or
// the kernel's ids in the fallback); `os_index` is the kernel's CPU number,
// the one sched_setaffinity takes.
struct Cpu {
  int os_index = 0;
  int core = 0;
  int socket = 0;
  int numa = 0;
  bool operator==(const Cpu&) const = default;
};

struct Topology {
  std::string host;  // gethostname()
  // The CPUs of the process's affinity mask when detected, sorted by
  // (socket, numa, core, os_index): CPUs of one core are adjacent, cores of
  // one NUMA node are adjacent, NUMA nodes of one socket are adjacent.
  std::vector<Cpu> cpus;
  // "hwloc" or "fallback".
  std::string source;
  // Why the fallback was used (empty with hwloc).
  std::string fallback_reason;

  // Distinct cores, sockets and NUMA nodes among `cpus`.
  int cores() const;
  int sockets() const;
  int numa_nodes() const;
  // The CPUs of each core, cores in `cpus` order.
  std::vector<std::vector<int>> CoreCpus() const;
  // The cores (as in CoreCpus, indices into it) of each socket or NUMA
  // node, in `cpus` order.
  std::vector<std::vector<int>> CoresBySocket() const;
  std::vector<std::vector<int>> CoresByNuma() const;
  // The Cpu with this os_index, or nullptr.
  const Cpu* Find(int os_index) const;
};

// Detects the topology now (hwloc, else the fallback). Never throws for a
// machine it cannot read: the fallback always yields at least one CPU.
Topology DetectTopology();

// The fallback alone, for tests and for when hwloc finds nothing:
// `allowed` the affinity mask's CPUs, `sysfs` the directory holding
// cpu<N>/topology (normally /sys/devices/system/cpu).
Topology FallbackTopology(const std::vector<int>& allowed, const std::string& sysfs,
                          const std::string& reason);

// DetectTopology, run once per process (at the first call).
const Topology& HostTopology();

// The CPUs the calling thread may run on (sched_getaffinity), ascending.
std::vector<int> ThreadCpus();

// "0-3,6,8-9" for {0,1,2,3,6,8,9}; "" for none. `cpus` need not be sorted.
std::string FormatCpuList(std::vector<int> cpus);

}  // namespace mc2::core

#endif  // MC2_CORE_TOPOLOGY_H_
