// Topology detection (core/topology.h) and the placement plans
// (core/placement.h): detection against the kernel's affinity mask and
// sysfs, the fallback on a fake sysfs, and the plans of every policy on
// synthetic machines (two sockets, NUMA nodes, hyper-threads, more threads
// than cores), checked against the documented rules.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/placement.h"
#include "core/topology.h"
#include "mc2/error.h"

namespace mc2::core {
namespace {

using ::testing::HasSubstr;

// sockets x numa-per-socket x cores-per-numa x threads-per-core, OS
// numbering like Linux's on Intel: the first hyper-thread of every core
// first, then the second ones.
Topology Machine(int sockets, int numa_per_socket, int cores_per_numa, int ht) {
  Topology t;
  t.host = "test";
  t.source = "hwloc";
  const int cores = sockets * numa_per_socket * cores_per_numa;
  for (int h = 0; h < ht; ++h)
    for (int c = 0; c < cores; ++c) {
      Cpu cpu;
      cpu.os_index = h * cores + c;
      cpu.core = c;
      cpu.numa = c / cores_per_numa;
      cpu.socket = c / (cores_per_numa * numa_per_socket);
      t.cpus.push_back(cpu);
    }
  std::sort(t.cpus.begin(), t.cpus.end(), [](const Cpu& a, const Cpu& b) {
    return std::tie(a.socket, a.numa, a.core, a.os_index) <
           std::tie(b.socket, b.numa, b.core, b.os_index);
  });
  return t;
}

std::vector<int> Range(int lo, int hi) {  // [lo, hi)
  std::vector<int> v;
  for (int i = lo; i < hi; ++i) v.push_back(i);
  return v;
}

Placement Plan(const Topology& t, int rank, int size, BindPolicy p, int threads) {
  return PlanPlacement(t, {rank, size, p, threads});
}

TEST(Topology, DetectsTheProcessesCpusWithHwloc) {
  const Topology t = DetectTopology();
  ASSERT_FALSE(t.cpus.empty());
  EXPECT_EQ(t.source, "hwloc") << t.fallback_reason;
  std::vector<int> got;
  for (const Cpu& c : t.cpus) got.push_back(c.os_index);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, ThreadCpus());  // exactly the affinity mask
  EXPECT_FALSE(t.host.empty());
  // The kernel's own view: distinct (package, core id) pairs in sysfs.
  std::set<std::pair<int, int>> cores;
  std::set<int> packages;
  for (int os : got) {
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(os) + "/topology/";
    int pkg = -1, core = -1;
    std::ifstream(dir + "physical_package_id") >> pkg;
    std::ifstream(dir + "core_id") >> core;
    if (pkg < 0 || core < 0) GTEST_SKIP() << "sysfs topology is not readable here";
    cores.insert({pkg, core});
    packages.insert(pkg);
  }
  EXPECT_EQ(t.cores(), static_cast<int>(cores.size()));
  EXPECT_EQ(t.sockets(), static_cast<int>(packages.size()));
  EXPECT_GE(t.numa_nodes(), 1);
  EXPECT_EQ(&HostTopology(), &HostTopology());
}

TEST(Topology, FallbackReadsSysfsAndSaysWhy) {
  char tmpl[] = "/tmp/mc2-topology-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  // cpu0, cpu1: package 0 cores 0 and 1; cpu2, cpu3: package 1 cores 0 and 0
  // (hyper-threads); cpu2's and cpu3's node is 1.
  const int pkg[] = {0, 0, 1, 1}, core[] = {0, 1, 0, 0}, node[] = {0, 0, 1, 1};
  for (int i = 0; i < 4; ++i) {
    const std::string dir = root + "/cpu" + std::to_string(i);
    std::filesystem::create_directories(dir + "/topology");
    std::filesystem::create_directories(dir + "/node" + std::to_string(node[i]));
    std::ofstream(dir + "/topology/physical_package_id") << pkg[i] << "\n";
    std::ofstream(dir + "/topology/core_id") << core[i] << "\n";
    std::ofstream(dir + "/node" + std::to_string(node[i]) + "/cpumap") << "f\n";
  }
  const Topology t = FallbackTopology({3, 0, 1, 2}, root, "hwloc found nothing");
  std::filesystem::remove_all(root);
  EXPECT_EQ(t.source, "fallback");
  EXPECT_EQ(t.fallback_reason, "hwloc found nothing");
  EXPECT_EQ(t.cores(), 3);
  EXPECT_EQ(t.sockets(), 2);
  EXPECT_EQ(t.numa_nodes(), 2);
  EXPECT_EQ(t.CoreCpus(), (std::vector<std::vector<int>>{{0}, {1}, {2, 3}}));
  EXPECT_EQ(t.CoresBySocket(), (std::vector<std::vector<int>>{{0, 1}, {2}}));
  // Unreadable sysfs: one core per CPU, one socket, one node.
  const Topology bare = FallbackTopology({5, 7}, "/nonexistent", "x");
  EXPECT_EQ(bare.cores(), 2);
  EXPECT_EQ(bare.sockets(), 1);
  EXPECT_EQ(bare.numa_nodes(), 1);
}

TEST(Topology, FormatsCpuLists) {
  EXPECT_EQ(FormatCpuList({}), "");
  EXPECT_EQ(FormatCpuList({3}), "3");
  EXPECT_EQ(FormatCpuList({9, 0, 1, 2, 3, 6, 8, 3}), "0-3,6,8-9");
}

TEST(Placement, CoreSlicesGiveEachRankItsCoresAndTheProgressThreadTheLast) {
  const Topology t = Machine(2, 1, 4, 1);  // 2 sockets x 4 cores
  Placement p0 = Plan(t, 0, 2, BindPolicy::kCore, 3);
  Placement p1 = Plan(t, 1, 2, BindPolicy::kCore, 3);
  EXPECT_EQ(p0.compute, Range(0, 3));
  EXPECT_EQ(p0.progress, Range(3, 4));
  EXPECT_TRUE(p0.own_progress_core);
  EXPECT_EQ(p1.compute, Range(4, 7));
  EXPECT_EQ(p1.progress, Range(7, 8));
  EXPECT_TRUE(p0.notes.empty()) << p0.notes;
  // Three ranks of one thread: 8 cores cut 2, 3, 3.
  EXPECT_EQ(Plan(t, 0, 3, BindPolicy::kCore, 1).compute, Range(0, 1));
  EXPECT_EQ(Plan(t, 1, 3, BindPolicy::kCore, 1).compute, Range(2, 4));
  EXPECT_EQ(Plan(t, 1, 3, BindPolicy::kCore, 1).progress, Range(4, 5));
  EXPECT_EQ(Plan(t, 2, 3, BindPolicy::kCore, 1).compute, Range(5, 7));
}

TEST(Placement, HyperThreadsOfACoreStayTogether) {
  const Topology t = Machine(1, 1, 2, 2);  // cores {0,2} and {1,3}
  Placement p = Plan(t, 0, 1, BindPolicy::kCore, 1);
  EXPECT_EQ(p.compute, (std::vector<int>{0, 2}));
  EXPECT_EQ(p.progress, (std::vector<int>{1, 3}));
}

TEST(Placement, SocketAndNumaDomainsAreSharedByTheirRanks) {
  const Topology t = Machine(2, 2, 2, 1);  // 2 sockets x 2 NUMA x 2 cores
  // One rank per socket, GEMMs on all but the progress core.
  Placement s1 = Plan(t, 1, 2, BindPolicy::kSocket, 3);
  EXPECT_EQ(s1.compute, Range(4, 7));
  EXPECT_EQ(s1.progress, Range(7, 8));
  // Two ranks per socket: the last two cores carry their progress threads.
  Placement a = Plan(t, 0, 4, BindPolicy::kSocket, 1);
  Placement b = Plan(t, 1, 4, BindPolicy::kSocket, 1);
  EXPECT_EQ(a.ranks_sharing_domain, 2);
  EXPECT_EQ(a.compute, Range(0, 2));
  EXPECT_EQ(b.compute, Range(0, 2));
  EXPECT_EQ(a.progress, Range(3, 4));
  EXPECT_EQ(b.progress, Range(2, 3));
  // NUMA: four nodes of two cores, one rank each.
  Placement n2 = Plan(t, 2, 4, BindPolicy::kNuma, 1);
  EXPECT_EQ(n2.compute, Range(4, 5));
  EXPECT_EQ(n2.progress, Range(5, 6));
  // Fewer ranks than sockets: a rank spans its sockets.
  const Topology four = Machine(4, 1, 2, 1);
  EXPECT_EQ(Plan(four, 1, 2, BindPolicy::kSocket, 3).compute, Range(4, 7));
}

TEST(Placement, SaysWhatItChoseWhenThreadsOutnumberCores) {
  const Topology t = Machine(1, 1, 2, 1);  // this kind of machine: 2 cores
  // 1 rank x 2 GEMM threads: no core to spare, progress shares.
  Placement one = Plan(t, 0, 1, BindPolicy::kCore, 2);
  EXPECT_EQ(one.compute, Range(0, 2));
  EXPECT_EQ(one.progress, Range(0, 2));
  EXPECT_FALSE(one.own_progress_core);
  EXPECT_THAT(one.notes, HasSubstr("progress thread shares"));
  EXPECT_FALSE(one.gemm_oversubscribed);
  EXPECT_TRUE(Plan(t, 0, 1, BindPolicy::kCore, 3).gemm_oversubscribed);
  EXPECT_TRUE(Plan(t, 0, 2, BindPolicy::kCore, 2).gemm_oversubscribed);
  // 2 ranks x 1 thread: a core each, progress on it.
  Placement r1 = Plan(t, 1, 2, BindPolicy::kCore, 1);
  EXPECT_EQ(r1.compute, Range(1, 2));
  EXPECT_EQ(r1.progress, Range(1, 2));
  // 5 ranks on 2 cores: rank r on core r mod 2, and the plan says so.
  for (int r = 0; r < 5; ++r) {
    Placement p = Plan(t, r, 5, BindPolicy::kCore, 1);
    EXPECT_EQ(p.compute, (std::vector<int>{r % 2}));
    EXPECT_EQ(p.ranks_sharing_domain, r % 2 == 0 ? 3 : 2);
    EXPECT_THAT(p.notes, HasSubstr("5 ranks on 2 cores"));
  }
  EXPECT_THAT(one.Describe(), HasSubstr("core: compute cpus 0-1"));
}

TEST(Placement, AutoBindsWhenTheRanksThreadsFillTheCores) {
  const Topology t = Machine(2, 1, 4, 1);  // 8 cores
  EXPECT_EQ(Plan(t, 0, 2, BindPolicy::kAuto, 1).policy, BindPolicy::kNone);
  EXPECT_FALSE(Plan(t, 0, 2, BindPolicy::kAuto, 1).bound());
  EXPECT_EQ(Plan(t, 0, 2, BindPolicy::kAuto, 3).policy, BindPolicy::kCore);
  EXPECT_EQ(Plan(t, 0, 8, BindPolicy::kAuto, 1).policy, BindPolicy::kCore);
  EXPECT_FALSE(Plan(t, 0, 8, BindPolicy::kNone, 8).bound());
}

TEST(Placement, PlansOfAHostNeverOverlapAndStayInTheMask) {
  for (const Topology& t : {Machine(2, 2, 3, 2), Machine(1, 1, 5, 1)}) {
    std::set<int> mask;
    for (const Cpu& c : t.cpus) mask.insert(c.os_index);
    for (int size : {1, 2, 3, 4, 6}) {
      std::set<int> progress_seen;
      for (int r = 0; r < size; ++r) {
        Placement p = Plan(t, r, size, BindPolicy::kCore, 1);
        for (int c : p.compute) EXPECT_TRUE(mask.count(c));
        for (int c : p.progress) EXPECT_TRUE(mask.count(c));
        if (p.own_progress_core) {
          for (int c : p.progress) EXPECT_TRUE(progress_seen.insert(c).second) << c;
        }
      }
    }
  }
}

TEST(Placement, PolicyAndLocalRankComeFromTheEnvironment) {
  EXPECT_EQ(ParseBindPolicy("numa"), BindPolicy::kNuma);
  EXPECT_EQ(ParseBindPolicy("cores"), std::nullopt);
  unsetenv("MC2_BIND");
  EXPECT_EQ(BindPolicyFromEnv(), BindPolicy::kAuto);
  setenv("MC2_BIND", "socket", 1);
  EXPECT_EQ(BindPolicyFromEnv(), BindPolicy::kSocket);
  setenv("MC2_BIND", "sockets", 1);
  try {
    BindPolicyFromEnv();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("MC2_BIND='sockets'"));
  }
  unsetenv("MC2_BIND");

  for (const char* v : {"MC2_LOCAL_RANK", "MC2_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                        "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"})
    unsetenv(v);
  EXPECT_EQ(LocalRankFromEnv(), std::nullopt);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
  auto lr = LocalRankFromEnv();
  ASSERT_TRUE(lr);
  EXPECT_EQ(lr->rank, 1);
  EXPECT_EQ(lr->size, 4);
  setenv("MC2_LOCAL_RANK", "0", 1);  // mc2 run's own variables win
  setenv("MC2_LOCAL_SIZE", "2", 1);
  EXPECT_EQ(LocalRankFromEnv()->size, 2);
  setenv("MC2_LOCAL_RANK", "2", 1);  // not below the size
  EXPECT_THROW(LocalRankFromEnv(), Error);
  for (const char* v : {"MC2_LOCAL_RANK", "MC2_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                        "OMPI_COMM_WORLD_LOCAL_SIZE"})
    unsetenv(v);
}

}  // namespace
}  // namespace mc2::core
