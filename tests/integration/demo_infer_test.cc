// `mc2 demo infer` as a user runs it (tools/demo_infer.cc): a tiny run
// per pipeline with --json, whose table says what ran in each phase and
// that every pipeline generated the same tokens; a model trained first
// continues its task; the options named as
// typed when they are wrong, before any file is written.
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

class DemoInferTest : public TempDirTest {};

TEST_F(DemoInferTest, EveryPipelineGeneratesTheSameTokensAndEachPhaseSaysWhatRan) {
  const fs::path out = dir_ / "out", js = dir_ / "result.json";
  const Result r =
      RunMc2({"demo",         "infer",    "-n",       "2", "--link",       "none",
              "-i",           "2",        "-w",       "1", "--layers",     "1",
              "--hidden",     "32",       "--heads",  "4", "--ffn",        "64",
              "--vocab",      "16",       "--batch",  "2", "--prompt-len", "6",
              "--new-tokens", "5",        "--splits", "2", "--output",     out.string(),
              "--json",       js.string()},
             {}, 120);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("time to first token (ms)"));
  EXPECT_THAT(r.out, HasSubstr("per-token latency p99 (ms)"));
  EXPECT_THAT(r.out, HasSubstr("generated tokens identical across pipelines (and their logits, "
                               "bitwise): yes"));
  std::ifstream f(js);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["mode"], "infer");
  EXPECT_EQ(j["tokens_identical"], true);
  ASSERT_EQ(j["runs"].size(), 4u);
  for (const auto& run : j["runs"]) {
    const std::string p = run["pipeline"];
    EXPECT_GT(run["ttft_ms"].get<double>(), 0) << p;
    EXPECT_LE(run["token_p50_ms"].get<double>(), run["token_p99_ms"].get<double>()) << p;
    // Prefill with sequence parallelism: qkv, o, gate_up, down; decode: o
    // and down, per step (4 of them).
    if (p == "serial") {
      EXPECT_EQ(run["prefill_ran"], "serial (4 calls)");
      EXPECT_EQ(run["decode_ran"], "serial (8 calls)");
    }
    if (p == "fused") {
      EXPECT_EQ(run["decode_ran"], "fused s=2 (8 calls)");
    }
    EXPECT_TRUE(fs::exists(out / ("timeline-" + p + ".svg"))) << p;
    EXPECT_TRUE(fs::exists(out / p / "rank-1.trace.json")) << p;
  }
}

TEST_F(DemoInferTest, ATrainedModelContinuesItsTask) {
  // Trained on modular addition first, the model's greedy tokens continue
  // held-out prompts as the task does (the table says how many).
  const fs::path out = dir_ / "out", js = dir_ / "result.json";
  const Result r =
      RunMc2({"demo",          "infer",  "-n",           "2",          "--link",       "none",
              "--pipelines",   "serial", "-i",           "1",          "--hidden",     "64",
              "--heads",       "4",      "--ffn",        "128",        "--vocab",      "32",
              "--batch",       "8",      "--prompt-len", "8",          "--new-tokens", "16",
              "--train-steps", "200",    "--output",     out.string(), "--json",       js.string()},
             {}, 120);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("continue the task (modadd) correctly"));
  std::ifstream f(js);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["train_steps"], 200);
  EXPECT_GE(j["task_accuracy"].get<double>(), 0.9) << r.out;
}

TEST_F(DemoInferTest, NamesTheOptionsAsTypedBeforeWritingAnything) {
  const fs::path out = dir_ / "out";
  Result r = RunMc2(
      {"demo", "infer", "-n", "2", "--heads", "3", "--hidden", "12", "--output", out.string()});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--tp 2 must divide --heads 3"));
  r = RunMc2({"demo", "infer", "-n", "4", "--tp", "2", "--batch", "3", "--output", out.string()});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("-n 4 / --tp 2 = 2 must divide --batch 3"));
  r = RunMc2({"demo", "infer", "--new-tokens", "0", "--output", out.string()});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--new-tokens"));
  r = RunMc2({"demo", "infer", "--link", "bw=fast", "--output", out.string()});
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--link='bw=fast' is invalid"));
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace mc2
