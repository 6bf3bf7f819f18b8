// `mc2 bench ops` (tools/bench_ops*.cc) on small shapes: every pipeline's
// result equals serial (#wrong 0), the documented columns, header lines and
// JSON fields exist, the floor is max(compute-only, comm-only) and no
// overlap exceeds 100%, --link SPEC and --link auto label their figures,
// usage errors exit 2 naming the option, an unwritable --json or --output
// fails before the run. And the fused pipeline on real processes: a rank
// killed in the middle of a fused MatmulAllReduce makes every other rank
// fail well within the timeout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>

#include "common/process_util.h"

namespace mc2::testing {
namespace {

using ::testing::HasSubstr;

// Data rows: lines that do not start with '#', split on blanks.
std::vector<std::vector<std::string>> DataRows(const std::string& out) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& line : Lines(out)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::vector<std::string> f;
    for (std::string w; in >> w;) f.push_back(w);
    if (!f.empty()) rows.push_back(f);
  }
  return rows;
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "-" + std::to_string(getpid()) + ".json"))
      .string();
}

// The overlap column as printed: "93%", "-94%", "noise" or "-".
std::optional<double> PrintedOverlap(const std::string& text) {
  if (text == "noise" || text == "-") return std::nullopt;
  EXPECT_EQ(text.back(), '%') << text;
  return std::stod(text.substr(0, text.size() - 1)) / 100;
}

class BenchOpsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BenchOpsTest, EveryPipelineMatchesSerialAndColumnsExist) {
  const std::string json_path = TempPath("bench-ops-" + GetParam());
  // 3 ranks, shapes not divisible by the ranks or the splits.
  Result r = RunMc2(
      {"bench", "ops", "-n",       "3", "--operator", GetParam(), "-m", "67", "-k",     "45",
       "-N",    "29",  "--splits", "3", "-i",         "2",        "-w", "1",  "--json", json_path},
      {{"MC2_HEAP_BYTES", "64M"}}, 120);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("# mc2 bench ops " + GetParam() + ": 3 ranks, dtype f32"));
  EXPECT_THAT(r.out, HasSubstr("# no link emulation"));
  EXPECT_THAT(r.out, HasSubstr("# compute-only "));
  EXPECT_THAT(r.out, HasSubstr("comm-only "));
  for (const char* col : {"pipeline", "splits", "time_ms", "floor_ms", "vs_floor", "overlap",
                          "model_ms", "speedup", "#wrong"})
    EXPECT_THAT(r.out, HasSubstr(col)) << col;
  EXPECT_THAT(r.out, HasSubstr("# Out of bounds values : 0 OK"));
  auto rows = DataRows(r.out);
  // serial, chunked s=3, fused s=3, auto.
  ASSERT_EQ(rows.size(), 4u) << r.out;
  std::vector<std::string> names;
  for (const auto& row : rows) {
    ASSERT_GE(row.size(), 11u) << r.out;
    names.push_back(row[0]);
    EXPECT_EQ(row[9], "0") << "#wrong of " << row[0];
  }
  EXPECT_EQ(names, (std::vector<std::string>{"serial", "chunked", "fused", "auto"}));
  EXPECT_EQ(rows[1][1], "3");
  EXPECT_EQ(rows[2][1], "3");
  EXPECT_EQ(rows[2][2], "9") << "fused stages = ranks x splits";
  std::ifstream in(json_path);
  ASSERT_TRUE(in) << json_path;
  nlohmann::json j = nlohmann::json::parse(in);
  std::filesystem::remove(json_path);
  EXPECT_EQ(j["op"], GetParam());
  EXPECT_EQ(j["ranks"], 3);
  EXPECT_EQ(j["link"], "none");
  const double tc = j["compute_ms"].get<double>(), tm = j["comm_ms"].get<double>();
  EXPECT_GT(tc, 0);
  EXPECT_GT(tm, 0);
  // The floor is max(compute-only, comm-only) of the same run, exactly.
  EXPECT_EQ(j["floor_ms"].get<double>(), std::max(tc, tm));
  ASSERT_EQ(j["rows"].size(), 4u);
  for (size_t i = 0; i < j["rows"].size(); ++i) {
    const auto& row = j["rows"][i];
    for (const char* key : {"pipeline", "splits", "time_ms", "floor_ms", "vs_floor", "below_floor",
                            "overlap", "model_ms", "speedup", "wrong", "ran"})
      EXPECT_TRUE(row.contains(key)) << key;
    EXPECT_EQ(row["wrong"], 0);
    const double t = row["time_ms"].get<double>();
    EXPECT_GT(t, 0);
    EXPECT_EQ(row["floor_ms"].get<double>(), std::max(tc, tm));
    EXPECT_NEAR(row["vs_floor"].get<double>(), t / std::max(tc, tm), 1e-9);
    // The overlap is (Tc + Tm - t) / min(Tc, Tm), never above 100%; a time
    // below the floor has none (null) and says so.
    EXPECT_EQ(row["below_floor"].get<bool>(), t < std::max(tc, tm)) << row.dump();
    if (row["overlap"].is_null()) {
      EXPECT_TRUE(row["below_floor"].get<bool>()) << row.dump();
    } else {
      const double o = row["overlap"].get<double>();
      EXPECT_LE(o, 1.0) << row.dump();
      EXPECT_NEAR(o, (tc + tm - t) / std::min(tc, tm), 1e-9) << row.dump();
    }
    // The printed row: the same floor (to the printed digits), the
    // overlap at most 100% or the noise marker.
    EXPECT_NEAR(std::stod(rows[i][4]), std::max(tc, tm), 0.006) << r.out;
    std::optional<double> printed = PrintedOverlap(rows[i][6]);
    if (printed)
      EXPECT_LE(*printed, 1.0) << r.out;
    else
      EXPECT_EQ(rows[i][6], "noise") << r.out;
    EXPECT_EQ(rows[i][6] == "noise", row["below_floor"].get<bool>()) << r.out;
  }
  // The model (max + min / stages; serial: the sum) is a separate column.
  EXPECT_NEAR(j["rows"][0]["model_ms"].get<double>(), tc + tm, 1e-9);
  EXPECT_NEAR(j["rows"][2]["model_ms"].get<double>(), std::max(tc, tm) + std::min(tc, tm) / 9,
              1e-9);
  // --confirm defaults to --iters: the best fixed row (auto excluded) and
  // auto are re-timed next to compute-only, comm-only and serial.
  EXPECT_THAT(r.out, HasSubstr("# confirmed (2 fresh round-robin iterations"));
  ASSERT_TRUE(j.contains("confirm")) << j.dump(2);
  const auto& c = j["confirm"];
  EXPECT_EQ(c["iters"], 2);
  const nlohmann::json* best = nullptr;
  for (const auto& row : j["rows"])
    if (row["pipeline"] != "auto" &&
        (!best || row["time_ms"].get<double>() < (*best)["time_ms"].get<double>()))
      best = &row;
  ASSERT_NE(best, nullptr);
  EXPECT_EQ(c["best_pipeline"], (*best)["pipeline"]);
  EXPECT_EQ(c["best_splits"], (*best)["splits"]);
  EXPECT_EQ(c["auto_ran"], j["rows"].back()["ran"]);
  for (const char* key :
       {"compute_ms", "comm_ms", "floor_ms", "serial_ms", "best_ms", "auto_ms", "best_model_ms"})
    EXPECT_GT(c[key].get<double>(), 0) << key;
  EXPECT_EQ(c["floor_ms"].get<double>(),
            std::max(c["compute_ms"].get<double>(), c["comm_ms"].get<double>()));
  if (c["best_overlap"].is_null())
    EXPECT_TRUE(c["best_below_floor"].get<bool>());
  else
    EXPECT_LE(c["best_overlap"].get<double>(), 1.0);
  // auto's ratios as medians of the confirmation iterations' ratios.
  for (const char* key : {"auto_over_best_paired", "auto_over_serial_paired"})
    EXPECT_GT(c[key].get<double>(), 0) << key;
  EXPECT_THAT(r.out, HasSubstr("(median of the iterations' ratios:"));
  // The best's paired ratios, recomputed from the iterations' times.
  const auto& it = c["iterations_ms"];
  for (const char* key : {"compute", "comm", "serial", "best", "auto"})
    ASSERT_EQ(it[key].size(), 2u) << key;
  std::vector<double> serial_over_best, best_over_floor;
  for (size_t i = 0; i < 2; ++i) {
    const double b = it["best"][i].get<double>();
    serial_over_best.push_back(it["serial"][i].get<double>() / b);
    best_over_floor.push_back(
        b / std::max(it["compute"][i].get<double>(), it["comm"][i].get<double>()));
  }
  // The median of two is their mean.
  EXPECT_NEAR(c["serial_over_best_paired"].get<double>(),
              (serial_over_best[0] + serial_over_best[1]) / 2, 1e-9);
  EXPECT_NEAR(c["best_over_floor_paired"].get<double>(),
              (best_over_floor[0] + best_over_floor[1]) / 2, 1e-9);
}

INSTANTIATE_TEST_SUITE_P(Ops, BenchOpsTest,
                         ::testing::Values("all_gather_matmul", "matmul_reduce_scatter",
                                           "matmul_all_reduce", "all_gather_batch_matmul", "moe",
                                           "moe_mlp"));

// One rank: no comm-only, so the floor is compute-only and nothing can be
// hidden (overlap "-", null in JSON), unless a time beats the floor.
TEST(BenchOpsOneRank, FloorIsComputeOnlyAndNothingIsHidden) {
  const std::string json_path = TempPath("bench-ops-one-rank");
  Result r = RunMc2(
      {"bench", "ops", "-n",       "1", "--operator", "moe", "-m", "40", "-k",     "24",
       "-N",    "16",  "--splits", "2", "-i",         "2",   "-w", "0",  "--json", json_path},
      {{"MC2_HEAP_BYTES", "64M"}}, 60);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  std::ifstream in(json_path);
  ASSERT_TRUE(in) << json_path;
  nlohmann::json j = nlohmann::json::parse(in);
  std::filesystem::remove(json_path);
  EXPECT_EQ(j["comm_ms"].get<double>(), 0.0);
  EXPECT_EQ(j["floor_ms"].get<double>(), j["compute_ms"].get<double>());
  auto rows = DataRows(r.out);
  ASSERT_EQ(rows.size(), j["rows"].size()) << r.out;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = j["rows"][i];
    EXPECT_TRUE(row["overlap"].is_null()) << row.dump();
    EXPECT_EQ(rows[i][6], row["below_floor"].get<bool>() ? "noise" : "-") << r.out;
  }
}

TEST(BenchOpsLink, EmulatedLinkIsLabelledAndResultsStayExact) {
  Result r = RunMc2({"bench",       "ops",
                     "-n",          "2",
                     "--operator",  "matmul_all_reduce",
                     "-m",          "64",
                     "-k",          "32",
                     "-N",          "48",
                     "-d",          "bf16",
                     "--pipelines", "fused",
                     "--splits",    "sweep",
                     "--link",      "bw=2GB/s,lat=10us",
                     "--iters",     "1",
                     "--warmup",    "0"},
                    {{"MC2_HEAP_BYTES", "64M"}}, 120);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("# emulated link: bw=2 GB/s, lat=10 us"));
  auto rows = DataRows(r.out);
  ASSERT_EQ(rows.size(), 9u) << r.out;  // serial + 8 split counts
  for (const auto& row : rows) EXPECT_EQ(row[9], "0") << r.out;
}

TEST(BenchOpsLink, LinkAutoCalibratesAgainstCompute) {
  // Compute (~2 x 512 x 1024 x 2048 flops) well above the raw all-gather
  // of 2 MiB, also under sanitizers and parallel tests, so a balancing
  // link exists.
  Result r = RunMc2(
      {"bench",   "ops",  "-n",       "2",    "--operator",  "all_gather_matmul", "-m",     "512",
       "-k",      "1024", "-N",       "2048", "--pipelines", "chunked",           "--link", "auto",
       "--iters", "2",    "--warmup", "1"},
      {{"MC2_HEAP_BYTES", "64M"}}, 180);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("--link auto: comm-only calibrated to compute-only"));
  EXPECT_THAT(r.out, HasSubstr("# emulated link: bw="));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m,
                                std::regex("compute-only ([0-9.]+) ms, comm-only ([0-9.]+) ms")))
      << r.out;
  // Calibrated, not equal: the two are measured (noisy host), but a link
  // that makes comm 10x compute or 1/10 of it would be a broken calibration.
  const double tc = std::stod(m[1]), tm = std::stod(m[2]);
  EXPECT_GT(tm, tc / 10) << r.out;
  EXPECT_LT(tm, tc * 10) << r.out;
  // No printed overlap above 100%, whatever the link.
  for (const auto& row : DataRows(r.out)) {
    ASSERT_GE(row.size(), 11u) << r.out;
    std::optional<double> o = PrintedOverlap(row[6]);
    if (o) {
      EXPECT_LE(*o, 1.0) << r.out;
    }
  }
}

TEST(BenchOpsUsage, BadArgumentsExitTwoNamingTheOption) {
  const std::vector<std::string> base = {"bench", "ops",        "-n",
                                         "2",     "--operator", "matmul_all_reduce"};
  struct Case {
    std::vector<std::string> extra;
    std::string says;
  };
  const Case cases[] = {
      {{"--operator", "bogus"}, "--operator: bogus not in"},
      {{"--splits", "17"}, "--splits"},
      {{"--splits", "2,x"}, "--splits"},
      {{"--pipelines", "ring"}, "--pipelines: 'ring' is not a pipeline"},
      {{"--link", "bw=fast"}, "--link"},
      {{"-d", "f64"}, "--dtype: f64 not in"},
      {{"--confirm", "-2"}, "--confirm"},
      {{"-n", "0"}, "--nranks"},
      {{"-i", "0"}, "--iters"},
      {{"-w", "-1"}, "--warmup"},
      {{"-m", "0"}, "-m: '0' is invalid"},
      // Element counts, not bytes: no size suffixes.
      {{"-k", "2K"}, "-k: '2K' is invalid"},
      // --op is the reduction elsewhere; the operator is --operator.
      {{"--op", "matmul_all_reduce"}, "choose the fused operator with --operator"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = base;
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    Result r = RunMc2(args, {}, 30);
    EXPECT_EQ(r.status, 2) << c.extra[0] << "\n" << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.says)) << r.err;
    EXPECT_EQ(r.out.find("# mc2 bench ops"), std::string::npos) << r.out;
  }
  Result r = RunMc2({"bench", "ops", "-n", "2"}, {}, 30);
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.err, HasSubstr("mc2 bench ops: missing --operator"));
}

// --json and --output that cannot be written fail before the run, with the
// OS's reason; a writable --json that exists is not touched by the check.
TEST(BenchOpsUsage, UnwritableOutputFailsBeforeTheRun) {
  const std::string dir = std::filesystem::temp_directory_path().string();
  for (std::vector<std::string> args :
       {std::vector<std::string>{"bench", "ops", "-n", "2", "--operator", "matmul_all_reduce",
                                 "--json", "/nonexistent-mc2-dir/x.json"},
        {"bench", "ops", "-n", "2", "--tune", "--output", "/nonexistent-mc2-dir/x.json"}}) {
    Result r = RunMc2(args, {}, 30);
    EXPECT_EQ(r.status, 2) << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr("mc2 bench ops: " + args[args.size() - 2] +
                                 " /nonexistent-mc2-dir/x.json: cannot create it: No such file "
                                 "or directory"));
    EXPECT_EQ(r.out.find("# mc2 bench ops"), std::string::npos) << r.out;
  }
  Result d =
      RunMc2({"bench", "ops", "-n", "2", "--operator", "matmul_all_reduce", "--json", dir}, {}, 30);
  EXPECT_EQ(d.status, 2);
  EXPECT_THAT(d.err, HasSubstr("Is a directory"));
  EXPECT_FALSE(std::filesystem::exists("/nonexistent-mc2-dir"));
  // A run that fails after the check (--link auto needs two ranks) leaves
  // an existing file as it was and creates none.
  const std::string kept = TempPath("bench-ops-kept"), fresh = TempPath("bench-ops-fresh");
  std::ofstream(kept) << "keep\n";
  for (const std::string& path : {kept, fresh}) {
    Result f = RunMc2({"bench", "ops", "-n", "1", "--operator", "matmul_all_reduce", "--link",
                       "auto", "--json", path},
                      {}, 30);
    EXPECT_EQ(f.status, 2) << f.out << f.err;
    EXPECT_THAT(f.err, HasSubstr("--link auto needs at least 2 ranks"));
  }
  std::ifstream in(kept);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "keep");
  EXPECT_FALSE(std::filesystem::exists(fresh));
  std::filesystem::remove(kept);
}

TEST(FusedOnProcesses, RankKilledMidFusedCallFailsEveryoneBeforeTheTimeout) {
  const auto shm_before = ShmEntries();
  Result r = RunMc2({"run", "-n", "3", TestProgram("fused_fault_probe"), "kill"},
                    {{"MC2_HEAP_BYTES", "64M"}, {"MC2_TIMEOUT", "20s"}}, 60);
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.status, 0);
  std::map<int, std::string> lines;
  std::regex line("\\[(\\d+)\\] rank (\\d+): (.*)");
  for (auto& l : Lines(r.out)) {
    std::smatch m;
    if (std::regex_match(l, m, line)) lines[std::stoi(m[2])] = m[3];
  }
  for (int rank : {0, 2}) {
    ASSERT_TRUE(lines.count(rank)) << r.out << r.err;
    EXPECT_THAT(lines[rank], HasSubstr("failed after")) << lines[rank];
    // Killed at 300 ms; the timeout is 20 s: the failure must come from the
    // health checks (peer_died, or aborted by the survivor that saw the death
    // first), not from the timeout, whose expiry would be the error's code.
    std::smatch m;
    ASSERT_TRUE(std::regex_search(lines[rank], m, std::regex("after \\d+ ms: ([a-z_]+):")))
        << lines[rank];
    EXPECT_TRUE(m[1] == "peer_died" || m[1] == "aborted") << lines[rank];
  }
  EXPECT_EQ(lines.count(1), 0u) << "rank 1 was killed: " << lines[1];
  auto left = TaggedProcesses();
  EXPECT_TRUE(left.empty());
  for (pid_t p : left) kill(p, SIGKILL);
  for (const auto& name : ShmEntries()) EXPECT_TRUE(shm_before.count(name)) << name;
}

TEST(FusedOnProcesses, FusedCallsSucceedWithoutFaults) {
  Result r = RunMc2({"run", "-n", "3", TestProgram("fused_fault_probe")},
                    {{"MC2_HEAP_BYTES", "64M"}}, 60);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_THAT(r.out, HasSubstr("rank " + std::to_string(rank) + ": finished"));
}

}  // namespace
}  // namespace mc2::testing
