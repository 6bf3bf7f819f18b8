// Tracing real processes: `MC2_TRACE=DIR mc2 run -n N trace_demo` writes one
// valid file per rank, and `mc2 trace merge`, `report` (text and --json -)
// and `plot` work on it. Also: a bad MC2_TRACE fails the job up front, and
// small all_reduces across processes record one span per call.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "common/process_util.h"
#include "trace_events_check.h"

namespace mc2::testing {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;
namespace fs = std::filesystem;

class TraceRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("mc2_trace_run_{}_{}",
                       ::testing::UnitTest::GetInstance()->current_test_info()->name(), ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

Json ReadJson(const fs::path& p) {
  std::ifstream in(p);
  return Json::parse(in);
}

TEST_F(TraceRunTest, TracesMergesReportsAndPlotsAThreeRankRun) {
  const fs::path traces = dir_ / "t";
  constexpr int kRanks = 3, kSteps = 3, kTiles = 3;
  Result run = RunMc2({"run", "-n", std::to_string(kRanks), TestProgram("trace_demo"),
                       std::to_string(kSteps), std::to_string(kTiles), "48", "524288"},
                      {{"MC2_TRACE", traces.string()}, {"MC2_HEAP_BYTES", "32M"}}, 120);
  ASSERT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_THAT(run.out, HasSubstr("ok"));

  // One file per rank, each in the Trace Event format, pid = rank.
  for (int r = 0; r < kRanks; ++r) {
    fs::path f = traces / fmt::format("rank-{}.trace.json", r);
    ASSERT_TRUE(fs::exists(f)) << f;
    Json doc = ReadJson(f);
    EXPECT_THAT(mc2::trace::CheckTraceEvents(doc), ::testing::IsEmpty());
    std::set<std::string> threads;
    std::map<std::string, int> names;
    for (const Json& e : doc["traceEvents"]) {
      EXPECT_EQ(e["pid"], r);
      if (e["ph"] == "M" && e["name"] == "thread_name") threads.insert(e["args"]["name"]);
      if (e["ph"] == "X") names[e["name"]] += 1;
    }
    EXPECT_TRUE(threads.count("main"));
    // Which thread ran each collective depends on timing (a waiting caller
    // runs its own queued task; slow builds such as ASan's do it for all),
    // so a "progress" track is not required, but no unknown one may appear.
    for (const std::string& t : threads)
      EXPECT_TRUE(t == "main" || t == "progress" || t == "p2p") << t;
    EXPECT_EQ(names["matmul"], kSteps * kTiles);
    EXPECT_EQ(names["all_reduce"], kSteps * kTiles);
    EXPECT_EQ(names["all_gather"], kSteps);
    EXPECT_EQ(doc["otherData"]["mc2"]["ranks"][0]["world_size"], kRanks);
    EXPECT_EQ(doc["otherData"]["mc2"]["ranks"][0]["clock_offset_ns"], 0);
  }

  // merge: one file, one process per rank, sorted metadata first.
  const fs::path merged = dir_ / "merged.json";
  Result m = RunMc2({"trace", "merge", traces.string(), "-o", merged.string()});
  ASSERT_EQ(m.status, 0) << m.out << m.err;
  Json doc = ReadJson(merged);
  EXPECT_THAT(mc2::trace::CheckTraceEvents(doc), ::testing::IsEmpty());
  std::set<int> pids;
  for (const Json& e : doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "process_name") pids.insert(e["pid"].get<int>());
  EXPECT_EQ(pids, (std::set<int>{0, 1, 2}));

  // report --json -, on the directory and on the merged file: same answer.
  Result rj = RunMc2({"trace", "report", traces.string(), "--json", "-"});
  ASSERT_EQ(rj.status, 0) << rj.err;
  Json rep = Json::parse(rj.out);
  EXPECT_TRUE(rep["steps_marked"]);
  ASSERT_EQ(rep["ranks"].size(), static_cast<size_t>(kRanks));
  EXPECT_EQ(rep["steps"].size(), static_cast<size_t>(kSteps));
  for (const Json& r : rep["ranks"]) {
    int64_t wall = r["wall_ns"], compute = r["compute_ns"], unc = r["uncovered_ns"],
            free = r["free_ns"], comm = r["comm_ns"], ov = r["overlapped_ns"];
    EXPECT_GT(wall, 0);
    EXPECT_GT(compute, 0);
    EXPECT_GT(comm, 0);
    EXPECT_EQ(compute + unc + free, wall);
    EXPECT_EQ(ov + unc, comm);
    EXPECT_EQ(r["steps"].size(), static_cast<size_t>(kSteps));
  }
  bool reduce_seen = false;
  for (const Json& op : rep["operators"]) {
    if (op["name"] != "all_reduce") continue;
    reduce_seen = true;
    EXPECT_EQ(op["calls"], kRanks * kSteps * kTiles);
    EXPECT_FALSE(op["algorithms"].empty());
    EXPECT_EQ(op["bytes"], uint64_t{524288} * kRanks * kSteps * kTiles);
  }
  EXPECT_TRUE(reduce_seen);
  EXPECT_FALSE(rep["top_uncovered"].empty());  // the serial all_gathers at least
  EXPECT_LE(rep["top_uncovered"].size(), 10u);
  Result rm = RunMc2({"trace", "report", merged.string(), "--json", "-"});
  ASSERT_EQ(rm.status, 0) << rm.err;
  EXPECT_EQ(Json::parse(rm.out)["overall"], rep["overall"]);

  // report as text.
  Result rt = RunMc2({"trace", "report", traces.string()});
  ASSERT_EQ(rt.status, 0) << rt.err;
  EXPECT_THAT(rt.out, HasSubstr("largest uncovered communication spans"));
  EXPECT_THAT(rt.out, HasSubstr("per step"));
  EXPECT_TRUE(std::regex_search(rt.out, std::regex("health .*(PASS|WARN|FAIL)"))) << rt.out;

  // plot.
  const fs::path svg = dir_ / "timeline.svg";
  Result p = RunMc2({"trace", "plot", traces.string(), "-o", svg.string(), "--step", "1"});
  ASSERT_EQ(p.status, 0) << p.err;
  std::ifstream in(svg);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("<svg"));
  EXPECT_THAT(text, HasSubstr("rank 2 communication"));
  EXPECT_THAT(text, HasSubstr("</svg>"));

  // report --json FILE: the JSON in the file, the text still on stdout;
  // with --json - the text went to stderr.
  EXPECT_THAT(rj.err, HasSubstr("per step"));
  const fs::path report_json = dir_ / "report.json";
  Result rf = RunMc2({"trace", "report", traces.string(), "--json", report_json.string()});
  ASSERT_EQ(rf.status, 0) << rf.err;
  EXPECT_THAT(rf.out, HasSubstr("per step"));
  std::ifstream jf(report_json);
  EXPECT_EQ(Json::parse(jf)["overall"], rep["overall"]);

  // plot without -o: timeline.svg in the trace directory, which a later
  // plot replaces; a file plot did not write there is left alone.
  const fs::path def = traces / "timeline.svg";
  Result d = RunMc2({"trace", "plot", traces.string()});
  ASSERT_EQ(d.status, 0) << d.err;
  EXPECT_THAT(d.out, HasSubstr(def.string()));
  ASSERT_TRUE(fs::exists(def));
  d = RunMc2({"trace", "plot", traces.string()});
  EXPECT_EQ(d.status, 0) << d.err;
  std::ofstream(def) << "mine\n";
  d = RunMc2({"trace", "plot", traces.string()});
  EXPECT_EQ(d.status, 2);
  EXPECT_THAT(d.err, HasSubstr("was not written by mc2 trace plot"));
  std::ifstream kept_in(def);
  std::string kept;
  std::getline(kept_in, kept);
  EXPECT_EQ(kept, "mine");
}

TEST_F(TraceRunTest, CommandErrorsAreReported) {
  Result r = RunMc2({"trace", "report", (dir_ / "nothing").string()});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("mc2 trace report"));
  r = RunMc2({"trace", "plot", dir_.string(), "-o", (dir_ / "x.svg").string()});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("rank-<r>.trace.json"));
  r = RunMc2({"trace", "plot", dir_.string(), "-o", "x.svg", "--from", "soon"});
  EXPECT_EQ(r.status, 2);
  r = RunMc2({"trace"});
  EXPECT_EQ(r.status, 2);
}

TEST_F(TraceRunTest, UnwritableTraceDirectoryFailsTheJobUpFront) {
  std::ofstream(dir_ / "file") << "x";
  Result r = RunMc2({"run", "-n", "2", TestProgram("trace_demo"), "1", "1", "16", "4096"},
                    {{"MC2_TRACE", (dir_ / "file" / "sub").string()}}, 60);
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.out + r.err, HasSubstr("MC2_TRACE"));
}

// Small all_reduces across processes: traced, every call of every rank is
// one span in its rank's file; untraced, no file is written; the results
// are right either way. (What tracing costs is measured by
// bench/trace_overhead.sh, not judged here: latency on a loaded machine is
// not a unit test's business.)
TEST_F(TraceRunTest, SmallAllReducesAcrossProcessesRecordOneSpanPerCall) {
  // allreduce_probe BYTES ITERS SYM: 5 warm-up calls, then 5 x ITERS.
  constexpr int kIters = 200, kCalls = 5 + 5 * kIters;
  for (bool traced : {false, true}) {
    const fs::path traces = dir_ / (traced ? "on" : "off");
    EnvOverrides env = {{"MC2_HEAP_BYTES", "64M"}};
    if (traced) env["MC2_TRACE"] = traces.string();
    Result r = RunMc2({"run", "-n", "2", TestProgram("allreduce_probe"), "8",
                       std::to_string(kIters), "1"},
                      env, 120);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("check=2\n")) << "1 + 1 on 2 ranks";
    if (!traced) {
      EXPECT_FALSE(fs::exists(traces)) << "untraced, a trace was written";
      continue;
    }
    for (int rank = 0; rank < 2; ++rank) {
      const fs::path f = traces / fmt::format("rank-{}.trace.json", rank);
      ASSERT_TRUE(fs::exists(f)) << f;
      const Json doc = ReadJson(f);
      int spans = 0;
      for (const Json& e : doc["traceEvents"])
        spans += e.value("ph", "") == "X" && e.value("name", "") == "all_reduce";
      EXPECT_EQ(spans, kCalls) << f;
    }
  }
}

}  // namespace
}  // namespace mc2::testing
