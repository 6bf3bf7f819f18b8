// The choice between the hierarchical and the flat algorithm of groups that
// span hosts (collectives/selector.h SelectNetAlgorithm): the call's
// options, the tuning table's entries across hosts ("COLLECTIVE@L", host
// count), the V forms sharing their collective's entries; and the names.
// MC2_TUNING_FILE names a table written here before the selector reads it.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "collectives/selector.h"
#include "mc2/mc2.h"

namespace mc2 {
namespace {

using collectives::NetTableKind;
using collectives::SelectNetAlgorithm;
using internal::OpKind;

// all_gather on 2 hosts of 2 ranks: flat up to 1 KiB, hierarchical beyond;
// all_to_all on 2 hosts of 2 ranks: hierarchical; a one-host entry too.
const std::string kTablePath = [] {
  std::string path = ::testing::TempDir() + "/span_selector_table.json";
  std::ofstream(path) << R"({"all_gather@2": {"2": [[1024, "direct"], [1.8e19, "hierarchical"]]},
    "all_to_all@2": {"2": [[1.8e19, "hierarchical"]]},
    "all_reduce": {"2": [[1.8e19, "ring"]]}})";
  setenv("MC2_TUNING_FILE", path.c_str(), 1);
  unsetenv("MC2_ALGO");
  return path;
}();

TEST(NetSelector, Names) {
  EXPECT_EQ(ParseAlgorithm("hierarchical"), Algorithm::kHierarchical);
  EXPECT_EQ(ParseAlgorithm("flat"), Algorithm::kDirect);
  EXPECT_STREQ(AlgorithmName(Algorithm::kHierarchical), "hierarchical");
  auto env = collectives::ParseAlgoEnv("all_gather=hierarchical,all_to_all=flat");
  EXPECT_EQ(env.at("all_gather"), Algorithm::kHierarchical);
  EXPECT_EQ(env.at("all_to_allv"), Algorithm::kDirect);
  EXPECT_EQ(NetTableKind(OpKind::kAllGatherV, 2), "all_gather@2");
  EXPECT_EQ(NetTableKind(OpKind::kReduceScatterV, 4), "reduce_scatter@4");
  EXPECT_EQ(NetTableKind(OpKind::kAllToAllV, 1), "all_to_all@1");
}

TEST(NetSelector, OptionsThenTable) {
  // The call's choice wins over the table.
  EXPECT_EQ(SelectNetAlgorithm(OpKind::kAllGather, Algorithm::kHierarchical, 2, 2, 8, true),
            Algorithm::kHierarchical);
  EXPECT_EQ(SelectNetAlgorithm(OpKind::kAllToAll, Algorithm::kDirect, 2, 2, 8, true),
            Algorithm::kDirect);
  // The table, by size, for the plain and the V form.
  for (OpKind k : {OpKind::kAllGather, OpKind::kAllGatherV}) {
    EXPECT_EQ(SelectNetAlgorithm(k, Algorithm::kAuto, 2, 2, 512, true), Algorithm::kDirect);
    EXPECT_EQ(SelectNetAlgorithm(k, Algorithm::kAuto, 2, 2, 4096, true), Algorithm::kHierarchical);
    // Another one-host algorithm counts as auto.
    EXPECT_EQ(SelectNetAlgorithm(k, Algorithm::kRing, 2, 2, 4096, true), Algorithm::kHierarchical);
  }
  // The nearest host count at or below; none for another L or fewer hosts.
  EXPECT_EQ(SelectNetAlgorithm(OpKind::kAllToAll, Algorithm::kAuto, 5, 2, 64, true),
            Algorithm::kHierarchical);
  EXPECT_EQ(SelectNetAlgorithm(OpKind::kAllToAll, Algorithm::kAuto, 2, 4, 64, true),
            Algorithm::kAuto);
  EXPECT_EQ(SelectNetAlgorithm(OpKind::kAllGather, Algorithm::kAuto, 1, 2, 4096, true),
            Algorithm::kAuto);
  // Without the table (an all_to_allv), and where it names one-host ones.
  EXPECT_EQ(SelectNetAlgorithm(OpKind::kAllToAllV, Algorithm::kAuto, 2, 2, 64, false),
            Algorithm::kAuto);
  EXPECT_EQ(SelectNetAlgorithm(OpKind::kAllReduce, Algorithm::kAuto, 2, 2, 64, true),
            Algorithm::kAuto);
}

TEST(NetSelector, HierarchicalOnOneHostIsRefused) {
  Group::RunInProcess(2, [](Group& g) {
    std::vector<float> v(8, 1.f);
    try {
      AllReduce(g, v.data(), v.data(), v.size(), DType::kF32, ReduceOp::kSum,
                {.algorithm = Algorithm::kHierarchical})
          .Wait();
      ADD_FAILURE() << "hierarchical ran on one host";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("hierarchical"), std::string::npos) << e.what();
    }
    // The group still works.
    AllReduce(g, v.data(), v.data(), v.size(), DType::kF32, ReduceOp::kSum).Wait();
    EXPECT_EQ(v[0], 2.f);
  });
}

}  // namespace
}  // namespace mc2
