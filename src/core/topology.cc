// Host topology: hwloc, else a fallback from the affinity mask and sysfs.
//
// Works as follows. hwloc loads the whole machine; every PU (logical CPU)
// in the process's affinity mask becomes a Cpu with the logical index of
// its core and package ancestors and of the first NUMA node of its
// nodeset (hwloc 2 hangs NUMA nodes beside the CPU tree, as memory
// children). The affinity mask, not hwloc's own "allowed" set, decides what
// is kept: a rank started inside a cpuset (taskset, mpirun --bind-to,
// Slurm) must never be placed outside it.
#include "core/topology.h"

#include <hwloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

namespace mc2::core {
namespace {

void SortCpus(std::vector<Cpu>& cpus) {
  std::sort(cpus.begin(), cpus.end(), [](const Cpu& a, const Cpu& b) {
    return std::tie(a.socket, a.numa, a.core, a.os_index) <
           std::tie(b.socket, b.numa, b.core, b.os_index);
  });
}

std::string HostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

// The cores of each group (socket or NUMA node), keyed by `key`, in `cpus`
// order.
template <typename Key>
std::vector<std::vector<int>> GroupCores(const Topology& t, Key key) {
  std::vector<std::vector<int>> groups;
  std::vector<int> keys;
  int core_index = -1;
  int last_core = INT_MIN;
  for (const Cpu& c : t.cpus) {
    if (c.core == last_core) continue;
    last_core = c.core;
    ++core_index;
    const int k = key(c);
    if (keys.empty() || keys.back() != k) {
      keys.push_back(k);
      groups.emplace_back();
    }
    groups.back().push_back(core_index);
  }
  return groups;
}

int Distinct(const std::vector<Cpu>& cpus, int Cpu::*field) {
  std::set<int> s;
  for (const Cpu& c : cpus) s.insert(c.*field);
  return static_cast<int>(s.size());
}

// Reads one integer from a sysfs file; false when unreadable.
bool ReadInt(const std::string& path, int* out) {
  std::ifstream in(path);
  return static_cast<bool>(in >> *out);
}

// The hwloc detection; false (with `reason`) when it yields nothing usable.
bool DetectWithHwloc(const std::vector<int>& allowed, Topology* t, std::string* reason) {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) {
    *reason = "hwloc_topology_init failed";
    return false;
  }
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    *reason = "hwloc_topology_load failed";
    return false;
  }
  const std::set<int> mask(allowed.begin(), allowed.end());
  const int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t pu = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PU, static_cast<unsigned>(i));
    if (pu == nullptr || !mask.count(static_cast<int>(pu->os_index))) continue;
    Cpu c;
    c.os_index = static_cast<int>(pu->os_index);
    hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_CORE, pu);
    // A PU without a core object (some virtual machines): its own core.
    c.core = core ? static_cast<int>(core->logical_index)
                  : 1000000 + static_cast<int>(pu->logical_index);
    hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, pu);
    c.socket = pkg ? static_cast<int>(pkg->logical_index) : 0;
    c.numa = 0;
    if (pu->nodeset != nullptr) {
      const int node_os = hwloc_bitmap_first(pu->nodeset);
      if (node_os >= 0) {
        hwloc_obj_t node =
            hwloc_get_numanode_obj_by_os_index(topo, static_cast<unsigned>(node_os));
        c.numa = node ? static_cast<int>(node->logical_index) : node_os;
      }
    }
    t->cpus.push_back(c);
  }
  hwloc_topology_destroy(topo);
  if (t->cpus.empty()) {
    *reason = "hwloc found none of the process's CPUs";
    return false;
  }
  SortCpus(t->cpus);
  t->source = "hwloc";
  return true;
}

}  // namespace

int Topology::cores() const { return Distinct(cpus, &Cpu::core); }
int Topology::sockets() const { return Distinct(cpus, &Cpu::socket); }
int Topology::numa_nodes() const { return Distinct(cpus, &Cpu::numa); }

std::vector<std::vector<int>> Topology::CoreCpus() const {
  std::vector<std::vector<int>> out;
  int last = INT_MIN;
  for (const Cpu& c : cpus) {
    if (out.empty() || c.core != last) out.emplace_back();
    last = c.core;
    out.back().push_back(c.os_index);
  }
  return out;
}

std::vector<std::vector<int>> Topology::CoresBySocket() const {
  return GroupCores(*this, [](const Cpu& c) { return c.socket; });
}

std::vector<std::vector<int>> Topology::CoresByNuma() const {
  // A NUMA node spanning two sockets (rare) is split by socket, so that a
  // group never interleaves with another in `cpus` order.
  return GroupCores(*this, [](const Cpu& c) { return c.socket * 65536 + c.numa; });
}

const Cpu* Topology::Find(int os_index) const {
  for (const Cpu& c : cpus)
    if (c.os_index == os_index) return &c;
  return nullptr;
}

std::vector<int> ThreadCpus() {
  std::vector<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) out.push_back(cpu);
  return out;
}

std::string FormatCpuList(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

Topology FallbackTopology(const std::vector<int>& allowed, const std::string& sysfs,
                          const std::string& reason) {
  Topology t;
  t.host = HostName();
  t.source = "fallback";
  t.fallback_reason = reason;
  std::vector<int> cpus = allowed;
  if (cpus.empty()) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long i = 0; i < std::max(1L, n); ++i) cpus.push_back(static_cast<int>(i));
  }
  // Core ids repeat across packages: number cores by (package, core id).
  std::map<std::pair<int, int>, int> core_ids;
  for (int os : cpus) {
    const std::string dir = sysfs + "/cpu" + std::to_string(os) + "/topology/";
    Cpu c;
    c.os_index = os;
    int pkg = 0, core = os;
    if (!ReadInt(dir + "physical_package_id", &pkg) || pkg < 0) pkg = 0;
    if (!ReadInt(dir + "core_id", &core)) core = os;
    c.socket = pkg;
    auto [it, fresh] = core_ids.emplace(std::make_pair(pkg, core), 0);
    if (fresh) it->second = static_cast<int>(core_ids.size()) - 1;
    c.core = it->second;
    c.numa = 0;
    // NUMA node: the node<N> entry in the CPU's sysfs directory.
    for (int node = 0; node < 64; ++node) {
      std::ifstream probe(sysfs + "/cpu" + std::to_string(os) + "/node" + std::to_string(node) +
                          "/cpumap");
      if (probe.good()) {
        c.numa = node;
        break;
      }
    }
    t.cpus.push_back(c);
  }
  SortCpus(t.cpus);
  return t;
}

Topology DetectTopology() {
  std::vector<int> allowed = ThreadCpus();
  Topology t;
  std::string reason;
  if (allowed.empty()) {
    reason = "sched_getaffinity failed";
  } else if (DetectWithHwloc(allowed, &t, &reason)) {
    t.host = HostName();
    return t;
  }
  return FallbackTopology(allowed, "/sys/devices/system/cpu", reason);
}

const Topology& HostTopology() {
  static const Topology topology = DetectTopology();
  return topology;
}

}  // namespace mc2::core
