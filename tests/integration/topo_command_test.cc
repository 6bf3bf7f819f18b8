// `mc2 topo` (tools/topo_command.cc): the map of ranks and cores and the
// link measurement, on its own (-n) and inside a launch, in both output
// forms. The expected hosts, cores and CPUs come from the kernel (uname,
// sysfs, the affinity mask), not from mc2's topology code.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "common/process_util.h"

namespace mc2 {
namespace {

using ::testing::HasSubstr;
using namespace ::mc2::testing;

std::set<int> OwnCpus() {
  cpu_set_t own;
  sched_getaffinity(0, sizeof(own), &own);
  std::set<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &own)) out.insert(c);
  return out;
}

int SysfsCores(const std::set<int>& cpus) {
  std::set<std::pair<int, int>> cores;
  for (int c : cpus) {
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    int pkg = 0, core = c;
    std::ifstream(dir + "physical_package_id") >> pkg;
    std::ifstream(dir + "core_id") >> core;
    cores.insert({pkg, core});
  }
  return static_cast<int>(cores.size());
}

class TopoCommandTest : public LeakCheckedTest {};

TEST_F(TopoCommandTest, JsonMapsEveryRankAndMeasuresTheLink) {
  Result r = RunMc2({"topo", "-n", "2", "--json", "-", "-i", "20", "--bytes", "1M"}, {}, 30);
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  char host[HOST_NAME_MAX + 1] = {};
  gethostname(host, HOST_NAME_MAX);
  const std::set<int> own = OwnCpus();
  ASSERT_EQ(j["hosts"].size(), 1u);
  EXPECT_EQ(j["hosts"][0]["host"], host);
  EXPECT_EQ(j["hosts"][0]["cpus"], own.size());
  EXPECT_EQ(j["hosts"][0]["cores"], SysfsCores(own));
  ASSERT_EQ(j["ranks"].size(), 2u);
  std::set<int> seen;
  for (int rank = 0; rank < 2; ++rank) {
    const auto& rk = j["ranks"][rank];
    EXPECT_EQ(rk["rank"], rank);
    EXPECT_EQ(rk["local_rank"], rank);
    ASSERT_FALSE(rk["compute_cpus"].empty());
    ASSERT_FALSE(rk["progress_cpus"].empty());
    for (int c : rk["compute_cpus"]) EXPECT_TRUE(own.count(c)) << c;
    for (int c : rk["progress_cpus"]) EXPECT_TRUE(own.count(c)) << c;
    seen.insert(rk["compute_cpus"][0].get<int>());
  }
  if (own.size() == 2) {
    EXPECT_EQ(seen.size(), 2u);  // auto binds a core each here
  }
  EXPECT_EQ(j["link_bytes"], 1 << 20);
  ASSERT_EQ(j["links"].size(), 1u);  // one host, two ranks: one pair
  const auto& link = j["links"][0];
  EXPECT_EQ(link["ranks"], nlohmann::json({0, 1}));
  EXPECT_GT(link["latency_us"].get<double>(), 0.0);
  EXPECT_GT(link["bandwidth_GBps"].get<double>(), 0.0);
  const std::string level = link["level"];
  EXPECT_TRUE(level == "same-numa" || level == "cross-numa" || level == "cross-socket" ||
              level == "same-core")
      << level;
}

TEST_F(TopoCommandTest, InsideALaunchTheTableShowsRanksSharingACore) {
  const std::set<int> own = OwnCpus();
  const int cores = SysfsCores(own);
  if (cores > 8) GTEST_SKIP() << "a rank per core and one more would be " << cores + 1;
  const std::string n = std::to_string(cores + 1);
  Result r = RunMc2({"run", "-n", n, "--no-prefix", "--heap", "64M", "--bind", "core", kMc2,
                     "topo", "-i", "10", "--bytes", "64K"},
                    {}, 30);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("# " + n + " rank(s) on 1 host(s)"));
  EXPECT_THAT(r.out, HasSubstr("same-core"));  // rank `cores` shares rank 0's core
  EXPECT_THAT(r.out, HasSubstr("(hwloc)"));
}

TEST_F(TopoCommandTest, JsonToAFileKeepsTheTable) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("mc2-topo-" + std::to_string(getpid()) + ".json"))
          .string();
  Result r = RunMc2({"topo", "-n", "2", "--json", path, "-i", "10", "--bytes", "64K"}, {}, 30);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("# 2 rank(s) on 1 host(s)"));
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::filesystem::remove(path);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["ranks"].size(), 2u);
}

TEST_F(TopoCommandTest, BadOptionsAreUsageErrors) {
  Result r = RunMc2({"topo", "--bytes", "4"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--bytes"));
  r = RunMc2({"topo", "--json", "/nonexistent-mc2-dir/t.json"});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent-mc2-dir/t.json"));
}

}  // namespace
}  // namespace mc2
