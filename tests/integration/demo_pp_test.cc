// `mc2 demo pp` as a user runs it (tools/demo_pp.cc): a tiny pipeline of
// two stages with every schedule and --json, whose table reports the bubble
// against its formula and the micro-batches in flight per schedule and
// stage, and whose schedules trained
// bitwise the same losses, also with context-parallel stages and with MoE
// stages over EP groups; invalid settings refused before any file is
// written.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/process_util.h"
#include "common/temp_dir.h"

namespace mc2 {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace ::mc2::testing;

class DemoPpTest : public TempDirTest {};

TEST_F(DemoPpTest, EveryScheduleTrainsTheSameLossesAndReportsItsBubble) {
  const fs::path out = dir_ / "out", js = dir_ / "result.json";
  const Result r = RunMc2({"demo",    "pp",       "--pp",       "2",      "--micro-batches",
                           "4",       "--link",   "none",       "-i",     "1",
                           "-w",      "1",        "--layers",   "4",      "--hidden",
                           "32",      "--heads",  "4",          "--ffn",  "64",
                           "--vocab", "16",       "--seq-len",  "8",      "--batch",
                           "8",       "--output", out.string(), "--json", js.string()},
                          {}, 120);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("bubble: formula (%)"));
  EXPECT_THAT(r.out, HasSubstr("stage 1: uncovered send/recv (%)"));
  EXPECT_THAT(r.out, HasSubstr("losses identical across schedules (bitwise): yes"));
  std::ifstream f(js);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["mode"], "pp");
  EXPECT_EQ(j["losses_identical"], true);
  ASSERT_EQ(j["runs"].size(), 3u);
  EXPECT_EQ(j["runs"][0]["schedule"], "1f1b");
  EXPECT_EQ(j["runs"][1]["schedule"], "eager-1f1b");
  EXPECT_EQ(j["runs"][2]["schedule"], "interleaved");
  // (p - 1) / (m + p - 1) (1F1B, eager 1F1B) and (p - 1) / (v m + p - 1)
  // with p 2, m 4, v 2.
  EXPECT_DOUBLE_EQ(j["runs"][0]["bubble_formula"].get<double>(), 1.0 / 5);
  EXPECT_DOUBLE_EQ(j["runs"][1]["bubble_formula"].get<double>(), 1.0 / 5);
  EXPECT_DOUBLE_EQ(j["runs"][2]["bubble_formula"].get<double>(), 1.0 / 9);
  // Micro-batches in flight on stages 0 and 1: min(p - r, m) for 1F1B,
  // min(2 (p - r) - 1, m) for eager 1F1B.
  EXPECT_EQ(j["runs"][0]["stage_peak_in_flight"], nlohmann::json::array({2, 1}));
  EXPECT_EQ(j["runs"][1]["stage_peak_in_flight"], nlohmann::json::array({3, 1}));
  EXPECT_THAT(r.out, HasSubstr("stage 0: micro-batches in flight (peak)"));
  for (const auto& run : j["runs"]) {
    const std::string s = run["schedule"];
    ASSERT_EQ(run["stage_bubble"].size(), 2u) << s;
    for (const auto& b : run["stage_bubble"]) {
      EXPECT_GE(b.get<double>(), 0.0) << s;
      EXPECT_LE(b.get<double>(), 1.0) << s;
    }
    EXPECT_GT(run["step_ms"].get<double>(), 0) << s;
    EXPECT_TRUE(fs::exists(out / ("timeline-" + s + ".svg"))) << s;
    EXPECT_TRUE(fs::exists(out / s / "rank-1.trace.json")) << s;
  }
}

TEST_F(DemoPpTest, StagesWithContextParallelism) {
  // pp 2 x cp 2 on 4 ranks: each stage's attention is ring attention over
  // its CP pair; both schedules still train bitwise the same losses.
  const fs::path out = dir_ / "out", js = dir_ / "result.json";
  const Result r = RunMc2(
      {"demo",     "pp",         "--pp",     "2",         "--cp",    "2",       "--micro-batches",
       "2",        "--link",     "none",     "-i",        "1",       "-w",      "0",
       "--layers", "4",          "--hidden", "32",        "--heads", "4",       "--ffn",
       "64",       "--vocab",    "16",       "--seq-len", "16",      "--batch", "4",
       "--output", out.string(), "--json",   js.string()},
      {}, 120);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("pp 2 x dp 1 x cp 2 x tp 1 (4 ranks)"));
  EXPECT_THAT(r.out, HasSubstr("losses identical across schedules (bitwise): yes"));
  std::ifstream f(js);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["cp"], 2);
  EXPECT_EQ(j["ranks"], 4);
  EXPECT_EQ(j["losses_identical"], true);
  EXPECT_TRUE(fs::exists(out / "1f1b" / "rank-3.trace.json"));
  // seq_len 10 cannot be cut into 2 * cp chunks: refused before the job.
  const Result bad = RunMc2({"demo", "pp", "--pp", "2", "--cp", "2", "--seq-len", "10", "--output",
                             (dir_ / "bad").string()});
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.err, HasSubstr("must be divisible by 2 * cp (4)"));
}

TEST_F(DemoPpTest, StagesWithMoeAndExpertParallelism) {
  // pp 2 x dp 2 on 4 ranks, every block MoE with its experts over each
  // stage's EP pair; both schedules still train bitwise the same losses.
  const fs::path out = dir_ / "out", js = dir_ / "result.json";
  const Result r = RunMc2({"demo",
                           "pp",
                           "--pp",
                           "2",
                           "--dp",
                           "2",
                           "--ep",
                           "2",
                           "--moe-experts",
                           "4",
                           "--micro-batches",
                           "2",
                           "--link",
                           "none",
                           "-i",
                           "1",
                           "-w",
                           "0",
                           "--layers",
                           "4",
                           "--hidden",
                           "32",
                           "--heads",
                           "4",
                           "--ffn",
                           "64",
                           "--vocab",
                           "16",
                           "--seq-len",
                           "8",
                           "--batch",
                           "8",
                           "--output",
                           out.string(),
                           "--json",
                           js.string()},
                          {}, 120);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("(4 ranks), 4 MoE experts top-2 over ep 2"));
  EXPECT_THAT(r.out, HasSubstr("losses identical across schedules (bitwise): yes"));
  std::ifstream f(js);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["ep"], 2);
  EXPECT_EQ(j["moe_experts"], 4);
  EXPECT_EQ(j["losses_identical"], true);
  // Invalid EP grids, refused before the job, naming the cause.
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--dp", "2", "--ep", "3", "--moe-experts", "6"}, "--ep 3 must divide --dp 2"},
      {{"--dp", "2", "--ep", "2"}, "--ep 2 needs --moe-experts > 0"},
      {{"--dp", "2", "--ep", "2", "--moe-experts", "3"}, "--ep 2 must divide --moe-experts 3"},
      {{"--dp", "2", "--cp", "2", "--ep", "2", "--moe-experts", "4"},
       "not combined with context parallelism"},
  };
  for (const auto& [args, message] : bad) {
    std::vector<std::string> argv = {"demo", "pp",       "--pp",
                                     "2",    "--output", (dir_ / "bad").string()};
    argv.insert(argv.end(), args.begin(), args.end());
    const Result b = RunMc2(argv);
    EXPECT_EQ(b.status, 2) << message;
    EXPECT_THAT(b.err, HasSubstr(message));
  }
  EXPECT_FALSE(fs::exists(dir_ / "bad"));
}

TEST_F(DemoPpTest, RefusesInvalidSettingsBeforeWritingAnything) {
  const fs::path out = dir_ / "out";
  Result r = RunMc2({"demo", "pp", "--pp", "2", "--layers", "3", "--output", out.string()});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("layers (3) must be divisible by pp * virtual_stages"));
  r = RunMc2({"demo", "pp", "--pp", "4", "--micro-batches", "6", "--schedules", "interleaved",
              "--output", out.string()});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("micro_batches (6) must be a multiple of pp (4)"));
  r = RunMc2({"demo", "pp", "--schedules", "gpipe", "--output", out.string()});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown schedule 'gpipe'"));
  r = RunMc2({"demo", "pp", "--link", "bw=fast", "--output", out.string()});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--link='bw=fast' is invalid"));
  // -n is the rank count, pp x dp x cp x tp: the DP size follows from it.
  r = RunMc2({"demo", "pp", "-n", "3", "--pp", "2", "--output", out.string()});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--pp 2 x --cp 1 x --tp 1 = 2 must divide -n 3"));
  r = RunMc2({"demo", "pp", "-n", "4", "--pp", "2", "--dp", "1", "--output", out.string()});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--pp 2 x --dp 1 x --cp 1 x --tp 1 must be -n 4"));
  r = RunMc2({"demo", "pp", "--pipelines", "fused,auto", "--output", out.string()});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("demo pp runs one pipeline"));
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace mc2
