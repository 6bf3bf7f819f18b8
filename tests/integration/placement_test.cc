// Binding under `mc2 run` (--bind, MC2_BIND; core/placement.h): each rank
// binds its own compute and progress threads, read back from
// /proc/self/task by tests/programs/placement_probe.cc, i.e. as the kernel
// enforces them. Expected CPU sets come from the machine's own cores
// (sysfs), not from the planning code.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "common/process_util.h"

namespace mc2 {
namespace {

using ::testing::HasSubstr;
using namespace ::mc2::testing;

struct RankView {
  std::string compute, progress, plan;
};

// Rank r's line "[r] compute=X progress=Y plan=Z".
std::vector<RankView> Parse(const Result& r, int nranks) {
  std::vector<RankView> out(nranks);
  for (int rank = 0; rank < nranks; ++rank) {
    std::string prefix = "[";
    prefix += std::to_string(rank);
    prefix += "] compute=";
    auto lines = LinesWithPrefix(r.out, prefix);
    if (lines.size() != 1) {
      ADD_FAILURE() << "rank " << rank << " printed no placement:\n" << r.out << r.err;
      continue;
    }
    std::string line = lines[0].substr(prefix.size());
    const size_t p = line.find(" progress="), q = line.find(" plan=");
    out[rank] = {line.substr(0, p), line.substr(p + 10, q - p - 10), line.substr(q + 6)};
  }
  return out;
}

// The launcher's CPUs, one entry per core (sysfs core ids; a CPU list
// string per core, e.g. "0" or "0,4" for hyper-threads shown as "0,4").
std::vector<std::vector<int>> OwnCores() {
  cpu_set_t own;
  sched_getaffinity(0, sizeof(own), &own);
  std::vector<std::pair<std::pair<int, int>, int>> keyed;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &own)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    int pkg = 0, core = c;
    std::ifstream(dir + "physical_package_id") >> pkg;
    std::ifstream(dir + "core_id") >> core;
    keyed.push_back({{pkg, core}, c});
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<std::vector<int>> cores;
  for (size_t i = 0; i < keyed.size(); ++i) {
    if (i == 0 || keyed[i].first != keyed[i - 1].first) cores.emplace_back();
    cores.back().push_back(keyed[i].second);
  }
  return cores;
}

std::string List(std::vector<int> cpus) {  // "0-1,3" as /proc prints it
  std::sort(cpus.begin(), cpus.end());
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

class PlacementTest : public LeakCheckedTest {};

// A probe job: small scratch, so that the test heap holds the world group.
Result RunProbeJob(const std::vector<std::string>& args, EnvOverrides env = {}) {
  env.emplace("MC2_SCRATCH_BYTES", "64K");
  return RunMc2(args, env);
}

TEST_F(PlacementTest, CoreGivesEachRankItsCoreAndSaysWhenRanksShare) {
  const auto cores = OwnCores();
  const int C = static_cast<int>(cores.size());
  if (C > 16) GTEST_SKIP() << "a rank per core and one more would be " << C + 1;
  const std::string probe = TestProgram("placement_probe");
  // One more rank than cores: rank r on core r mod C, both threads there.
  const int n = C + 1;
  Result r = RunProbeJob({"run", "-n", std::to_string(n), "--bind", "core", probe});
  ASSERT_EQ(r.status, 0) << r.err;
  auto views = Parse(r, n);
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_EQ(views[rank].compute, List(cores[rank % C])) << rank;
    EXPECT_EQ(views[rank].progress, List(cores[rank % C])) << rank;
    EXPECT_THAT(views[rank].plan, HasSubstr(std::to_string(n) + " ranks on " +
                                            std::to_string(C) + " cores"));
  }
  // The same through MC2_BIND, and auto (the default) binds here too.
  r = RunProbeJob({"run", "-n", std::to_string(n), probe}, {{"MC2_BIND", "core"}});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(Parse(r, n)[C].compute, List(cores[0]));
  r = RunProbeJob({"run", "-n", std::to_string(n), probe});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(Parse(r, n)[1 % n].compute, List(cores[1 % C]));
}

TEST_F(PlacementTest, OneRankGetsTheProgressThreadACoreOfItsOwn) {
  const auto cores = OwnCores();
  const int C = static_cast<int>(cores.size());
  if (C < 2) GTEST_SKIP() << "needs two cores";
  Result r = RunProbeJob({"run", "-n", "1", "--bind", "core", TestProgram("placement_probe")});
  ASSERT_EQ(r.status, 0) << r.err;
  auto v = Parse(r, 1)[0];
  std::vector<int> rest;
  for (int c = 0; c + 1 < C; ++c) rest.insert(rest.end(), cores[c].begin(), cores[c].end());
  EXPECT_EQ(v.compute, List(rest));
  EXPECT_EQ(v.progress, List(cores[C - 1]));
  EXPECT_THAT(v.plan, HasSubstr("a core of its own"));
  // With GEMM threads for every core, the progress thread shares them.
  r = RunProbeJob({"run", "-n", "1", "--bind", "core", TestProgram("placement_probe")},
             {{"MC2_GEMM_THREADS", std::to_string(C)}});
  ASSERT_EQ(r.status, 0) << r.err;
  v = Parse(r, 1)[0];
  std::vector<int> all;
  for (const auto& c : cores) all.insert(all.end(), c.begin(), c.end());
  EXPECT_EQ(v.compute, List(all));
  EXPECT_EQ(v.progress, List(all));
  EXPECT_THAT(v.plan, HasSubstr("progress thread shares"));
}

TEST_F(PlacementTest, NoneLeavesRanksWhereTheLauncherRuns) {
  cpu_set_t own;
  sched_getaffinity(0, sizeof(own), &own);
  std::vector<int> mine;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &own)) mine.push_back(c);
  Result r = RunProbeJob({"run", "-n", "3", "--bind", "none", TestProgram("placement_probe")});
  ASSERT_EQ(r.status, 0) << r.err;
  for (const RankView& v : Parse(r, 3)) {
    EXPECT_EQ(v.compute, List(mine));
    EXPECT_EQ(v.progress, List(mine));
  }
}

TEST_F(PlacementTest, BadPoliciesAreUsageErrors) {
  Result r = RunProbeJob({"run", "-n", "1", "--bind", "sockets", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--bind"));
  r = RunProbeJob({"run", "-n", "1", "true"}, {{"MC2_BIND", "everywhere"}});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("MC2_BIND='everywhere'"));
}

}  // namespace
}  // namespace mc2
