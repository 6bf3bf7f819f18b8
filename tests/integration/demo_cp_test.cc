// `mc2 demo cp` as a user runs it (tools/demo_cp.cc): a tiny cp x tp run
// with --json whose table has both ring variants, bitwise equal results,
// traces and timelines; bad shapes named as typed, before any file is
// written.
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

class DemoCpTest : public TempDirTest {};

TEST_F(DemoCpTest, BothRingsGiveTheSameBitsAndATableWithTraces) {
  const fs::path out = dir_ / "out", js = dir_ / "result.json";
  const Result r =
      // -n 4 with --tp 2: a ring of cp = 2.
      RunMc2({"demo",    "cp", "-n",         "4",          "--tp",   "2",        "--seq-len", "32",
              "--heads", "4",  "--head-dim", "8",          "--link", "none",     "-i",        "2",
              "-w",      "1",  "--output",   out.string(), "--json", js.string()},
             {}, 120);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("step time (ms)"));
  EXPECT_THAT(r.out, HasSubstr("uncovered comm (%)"));
  EXPECT_THAT(r.out, HasSubstr("identical (bitwise) across variants: yes"));
  std::ifstream f(js);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["mode"], "cp");
  EXPECT_EQ(j["ranks"], 4);
  EXPECT_EQ(j["cp"], 2);
  EXPECT_EQ(j["identical"], true);
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["overlap"], false);  // the baseline first
  EXPECT_EQ(j["runs"][1]["overlap"], true);
  for (const char* m : {"no-overlap", "overlap"}) {
    EXPECT_TRUE(fs::exists(out / (std::string("timeline-") + m + ".svg"))) << m;
    EXPECT_TRUE(fs::exists(out / m / "rank-3.trace.json")) << m;
  }
  // The ring's transfers are in the trace as communication.
  std::ifstream t(out / "trace-overlap.json");
  const std::string trace((std::istreambuf_iterator<char>(t)), std::istreambuf_iterator<char>());
  EXPECT_THAT(trace, HasSubstr("ring_attention.recv_kv"));
  EXPECT_THAT(trace, HasSubstr("ring_attention.send_dkv"));
}

TEST_F(DemoCpTest, NamesBadShapesBeforeWritingAnything) {
  const fs::path out = dir_ / "out";
  const Result r = RunMc2(
      {"demo", "cp", "--cp", "2", "--seq-len", "6", "--link", "none", "--output", out.string()}, {},
      30);
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("--seq-len 6 must be divisible by 2 x --cp = 4"));
  const Result h = RunMc2(
      {"demo", "cp", "--tp", "3", "--heads", "8", "--link", "none", "--output", out.string()}, {},
      30);
  EXPECT_EQ(h.status, 2);
  EXPECT_THAT(h.err, HasSubstr("--tp 3 must divide --heads 8"));
  const Result n = RunMc2({"demo", "cp", "-n", "3", "--tp", "2", "--output", out.string()}, {}, 30);
  EXPECT_EQ(n.status, 2);
  EXPECT_THAT(n.err, HasSubstr("--tp 2 must divide -n 3"));
  const Result c = RunMc2({"demo", "cp", "-n", "4", "--cp", "2", "--output", out.string()}, {}, 30);
  EXPECT_EQ(c.status, 2);
  EXPECT_THAT(c.err, HasSubstr("--cp 2 x --tp 1 must be -n 4"));
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace mc2
