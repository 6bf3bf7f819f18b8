// `mc2 demo fsdp` as a user runs it (tools/demo_fsdp.cc): a tiny run on 3
// ranks (shards padded) with --json, whose table and JSON show every
// configuration's step, overlap and memory, with losses bitwise identical
// across plain DP and every prefetch depth; the options named as typed
// when they are wrong, before any file is written.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/process_util.h"
#include "common/temp_dir.h"

namespace mc2 {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace ::mc2::testing;

class DemoFsdpTest : public TempDirTest {};

TEST_F(DemoFsdpTest, EveryConfigurationTrainsTheSameLossesAndReportsItsMemory) {
  const fs::path out = dir_ / "out", js = dir_ / "result.json";
  const Result r =
      RunMc2({"demo",    "fsdp",      "-n",    "3",        "--link",     "none",     "-i",
              "2",       "-w",        "1",     "--layers", "2",          "--hidden", "32",
              "--heads", "4",         "--ffn", "64",       "--vocab",    "17",       "--batch",
              "3",       "--seq-len", "8",     "--output", out.string(), "--json",   js.string()},
             {}, 120);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("step time (ms)"));
  EXPECT_THAT(r.out, HasSubstr("uncovered comm (%)"));
  EXPECT_THAT(r.out, HasSubstr("speedup vs prefetch 0"));
  EXPECT_THAT(r.out, HasSubstr("losses bitwise identical across the columns (every step, 3 of "
                               "them): yes"));
  std::ifstream f(js);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["mode"], "fsdp");
  EXPECT_EQ(j["losses_identical"], true);
  ASSERT_EQ(j["runs"].size(), 4u);
  // P of the model: embedding, 2 blocks, head; 16 bytes each unsharded.
  const double h = 32, ff = 64, V = 17;
  const double block = 2 * h + 4 * h * h + 3 * h * ff;
  const double P = V * h + 2 * block + h + h * V;
  for (const auto& run : j["runs"]) {
    const std::string c = run["config"];
    EXPECT_GT(run["step_ms"].get<double>(), 0) << c;
    EXPECT_EQ(run["unsharded_bytes"].get<double>(), 16 * P) << c;
    if (c == "plain-dp") {
      EXPECT_EQ(run["peak_bytes"].get<double>(), 16 * P);
    } else {
      // The sharded state is 1/3 of it (padded), and the peak never
      // exceeds the formula.
      EXPECT_GE(run["persistent_bytes"].get<double>() * 3, 16 * P) << c;
      EXPECT_LT(run["persistent_bytes"].get<double>() * 3, 16 * P + 16 * 3 * 4) << c;
      EXPECT_LE(run["peak_bytes"].get<double>(), run["formula_bytes"].get<double>()) << c;
      EXPECT_GT(run["peak_transient_bytes"].get<double>(), 0) << c;
    }
    const std::string name = c == "plain-dp" ? "dp" : c;
    EXPECT_TRUE(fs::exists(out / ("timeline-" + name + ".svg"))) << c;
    EXPECT_TRUE(fs::exists(out / ("trace-" + name + ".json"))) << c;
  }
  EXPECT_EQ(j["runs"][1]["config"], "prefetch-0");
  EXPECT_EQ(j["runs"][1]["speedup_vs_prefetch0"].get<double>(), 1.0);
}

TEST_F(DemoFsdpTest, TensorParallelShards) {
  // dp 2 x tp 2 on 4 ranks: every configuration trains bitwise the same
  // losses, and a rank's state is its TP rank's model (the blocks' matrices
  // split over tp) sharded over the 2 DP ranks.
  const fs::path out = dir_ / "out", js = dir_ / "result.json";
  const Result r = RunMc2(
      {"demo",     "fsdp", "-n",        "4", "--tp",       "2",          "--link",   "none",
       "-i",       "1",    "-w",        "0", "--prefetch", "0,1",        "--layers", "2",
       "--hidden", "32",   "--heads",   "4", "--ffn",      "64",         "--vocab",  "16",
       "--batch",  "4",    "--seq-len", "8", "--output",   out.string(), "--json",   js.string()},
      {}, 120);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("over 4 ranks (dp 2 x tp 2)"));
  EXPECT_THAT(r.out, HasSubstr("losses bitwise identical across the columns (every step, 1 of "
                               "them): yes"));
  std::ifstream f(js);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["tp"], 2);
  EXPECT_EQ(j["ranks"], 4);
  const double h = 32, ff = 64, V = 16;
  const double P = V * h + 2 * (2 * h + (4 * h * h + 3 * h * ff) / 2) + h + h * V;
  ASSERT_EQ(j["runs"].size(), 3u);
  for (const auto& run : j["runs"]) EXPECT_EQ(run["unsharded_bytes"].get<double>(), 16 * P);
  // --tp that does not divide the heads is refused before anything runs.
  const Result bad =
      RunMc2({"demo", "fsdp", "-n", "3", "--tp", "3", "--output", (dir_ / "bad").string()}, {}, 60);
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.err, HasSubstr("tp (3)"));
}

TEST_F(DemoFsdpTest, BadOptionsAreNamedBeforeAnythingRuns) {
  const fs::path out = dir_ / "never";
  Result r = RunMc2({"demo", "fsdp", "--prefetch", "0,3", "--output", out.string()}, {}, 60);
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--prefetch: '3' is not a depth (0, 1 or 2)"));
  r = RunMc2({"demo", "fsdp", "-n", "3", "--batch", "8", "--output", out.string()}, {}, 60);
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("-n 3 / --tp 1 = 3 must divide --batch 8"));
  r = RunMc2({"demo", "fsdp", "--hidden", "30", "--heads", "4", "--output", out.string()}, {}, 60);
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--heads 4 must divide --hidden 30"));
  r = RunMc2({"demo", "fsdp", "-n", "3", "--tp", "2", "--output", out.string()}, {}, 60);
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--tp 2 must divide -n 3"));
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace mc2
