// The Chrome Trace Event encoding: every event we write is checked against
// the format (required fields, their types, ph values), the reader accepts
// other producers' files (array form, unsorted, unknown events) and rejects
// malformed ones, and a write/read round trip keeps every field exactly.
#include "mc2/trace_file.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "mc2/error.h"
#include "trace_events_check.h"

namespace mc2::trace {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;
namespace fs = std::filesystem;

fs::path TempDir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / fmt::format("mc2_trace_{}_{}", name, ::getpid());
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

TraceData Sample() {
  TraceData t;
  t.ranks[0].world_size = 2;
  t.ranks[0].threads = {{11, "main"}, {12, "progress"}};
  t.ranks[1].world_size = 2;
  t.ranks[1].clock_offset_ns = -7;
  t.ranks[1].dropped = 3;
  t.ranks[1].threads = {{21, "main \"quoted\"\n"}};
  auto span = [&](int rank, int64_t tid, Category c, const char* name, int64_t lo, int64_t hi) {
    SpanRecord s;
    s.rank = rank;
    s.tid = tid;
    s.cat = c;
    s.name = name;
    s.start_ns = lo;
    s.end_ns = hi;
    t.spans.push_back(s);
    return &t.spans.back();
  };
  span(0, 11, Category::kCompute, "matmul", 1'000'001, 1'500'999)->flops = 123456789;
  SpanRecord* s = span(0, 12, Category::kComm, "all_reduce", 1'200'000, 1'300'007);
  s->algorithm = "ring";
  s->bytes = 1 << 20;
  s->step = 4;
  s = span(1, 21, Category::kComm, "odd \\ name \"x\"\t", -5'000, 12);
  s->pipeline = "tiles=4";
  span(1, 21, Category::kWait, "wait", 3, 3);
  span(1, 21, Category::kHost, "pack", 999'999'999'999'999, 1'000'000'000'000'123);
  t.marks.push_back({0, 11, 1'000'000, 4, false});
  t.marks.push_back({0, 11, 2'000'000, -1, true});
  return t;
}

TEST(TraceFile, WrittenEventsFollowTheTraceEventFormat) {
  Json doc = Json::parse(ToChromeJson(Sample()));
  EXPECT_THAT(CheckTraceEvents(doc), ::testing::IsEmpty());
  // Process and thread names, one per rank / thread.
  int processes = 0, threads = 0, complete = 0, instants = 0;
  for (const Json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") {
      ++processes;
      EXPECT_EQ(e["args"]["name"], fmt::format("rank {}", e["pid"].get<int>()));
    }
    if (e["ph"] == "M" && e["name"] == "thread_name") ++threads;
    if (e["ph"] == "X") ++complete;
    if (e["ph"] == "i") ++instants;
  }
  EXPECT_EQ(processes, 2);
  EXPECT_EQ(threads, 3);
  EXPECT_EQ(complete, 5);
  EXPECT_EQ(instants, 2);
  EXPECT_EQ(doc["displayTimeUnit"], "ns");
  EXPECT_EQ(doc["otherData"]["mc2"]["ranks"][1]["clock_offset_ns"], -7);
}

TEST(TraceFile, ArgsCarryAlgorithmBytesFlopsStep) {
  Json doc = Json::parse(ToChromeJson(Sample()));
  bool seen = false;
  for (const Json& e : doc["traceEvents"]) {
    if (e["ph"] != "X" || e["name"] != "all_reduce") continue;
    seen = true;
    EXPECT_EQ(e["cat"], "comm");
    EXPECT_EQ(e["args"]["algorithm"], "ring");
    EXPECT_EQ(e["args"]["bytes"], 1 << 20);
    EXPECT_EQ(e["args"]["step"], 4);
    EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 1200.0);
    EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 100.007);
  }
  EXPECT_TRUE(seen);
}

TEST(TraceFile, RoundTripKeepsEveryFieldToTheNanosecond) {
  fs::path dir = TempDir("roundtrip");
  TraceData t = Sample();
  WriteChromeTrace((dir / "x.json").string(), t);
  TraceData back = ReadChromeTrace((dir / "x.json").string());
  ASSERT_EQ(back.spans.size(), t.spans.size());
  // The writer sorts by (rank, start); sort the original the same way.
  std::stable_sort(t.spans.begin(), t.spans.end(), [](const auto& a, const auto& b) {
    return std::tie(a.rank, a.start_ns) < std::tie(b.rank, b.start_ns);
  });
  for (size_t i = 0; i < t.spans.size(); ++i) {
    const SpanRecord &a = t.spans[i], &b = back.spans[i];
    EXPECT_EQ(a.rank, b.rank);
    EXPECT_EQ(a.tid, b.tid);
    EXPECT_EQ(a.cat, b.cat);
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.algorithm, b.algorithm);
    EXPECT_EQ(a.pipeline, b.pipeline);
    EXPECT_EQ(a.bytes, b.bytes);
    EXPECT_EQ(a.flops, b.flops);
    EXPECT_EQ(a.start_ns, b.start_ns) << a.name;
    EXPECT_EQ(a.end_ns, b.end_ns) << a.name;
    EXPECT_EQ(a.step, b.step);
  }
  ASSERT_EQ(back.marks.size(), 2u);
  EXPECT_EQ(back.marks[0].step, 4);
  EXPECT_FALSE(back.marks[0].end);
  EXPECT_TRUE(back.marks[1].end);
  EXPECT_EQ(back.ranks[1].threads[21], "main \"quoted\"\n");
  EXPECT_EQ(back.ranks[1].clock_offset_ns, -7);
  EXPECT_EQ(back.ranks[1].dropped, 3u);
  EXPECT_EQ(back.ranks[0].world_size, 2);
  fs::remove_all(dir);
}

TEST(TraceFile, LoadDirectoryCombinesRanksAndAlignsClocks) {
  fs::path dir = TempDir("load");
  TraceData t = Sample();
  for (int rank : {0, 1}) {
    TraceData one;
    one.ranks[rank] = t.ranks[rank];
    for (const auto& s : t.spans)
      if (s.rank == rank) one.spans.push_back(s);
    for (const auto& m : t.marks)
      if (m.rank == rank) one.marks.push_back(m);
    WriteChromeTrace((dir / RankFileName(rank)).string(), one);
  }
  std::ofstream(dir / "notes.txt") << "not a trace";
  TraceData all = LoadTrace(dir.string());
  EXPECT_EQ(all.spans.size(), t.spans.size());
  EXPECT_EQ(all.ranks.size(), 2u);
  EXPECT_EQ(all.ranks[1].clock_offset_ns, 0);  // applied
  bool shifted = false;
  for (const auto& s : all.spans)
    if (s.rank == 1 && s.name == "wait") shifted = s.start_ns == 3 + 7;
  EXPECT_TRUE(shifted);
  TraceData raw = LoadTrace(dir.string(), /*align=*/false);
  EXPECT_EQ(raw.ranks[1].clock_offset_ns, -7);
  fs::remove_all(dir);
}

TEST(TraceFile, ReaderAcceptsArrayFormUnsortedAndForeignEvents) {
  fs::path dir = TempDir("foreign");
  std::ofstream(dir / "a.json") << R"([
    {"ph": "X", "name": "late", "cat": "compute", "pid": 0, "tid": 1, "ts": 50, "dur": 5},
    {"ph": "B", "name": "begin-end pairs are skipped", "pid": 0, "tid": 1, "ts": 1},
    {"ph": "C", "name": "counter", "pid": 0, "ts": 2, "args": {"v": 1}},
    {"ph": "X", "name": "early", "cat": "gpu_kernel", "pid": 3, "tid": 2, "ts": 1.5, "dur": 0.25},
    {"ph": "M", "name": "thread_name", "pid": 3, "tid": 2, "args": {"name": "worker"}}
  ])";
  TraceData t = ReadChromeTrace((dir / "a.json").string());
  ASSERT_EQ(t.spans.size(), 2u);
  EXPECT_EQ(t.spans[0].name, "late");
  EXPECT_EQ(t.spans[1].start_ns, 1500);
  EXPECT_EQ(t.spans[1].end_ns, 1750);
  EXPECT_EQ(t.spans[1].cat, Category::kHost);  // unknown categories are host work
  EXPECT_EQ(t.ranks[3].threads[2], "worker");
  fs::remove_all(dir);
}

TEST(TraceFile, ReaderRejectsMalformedFiles) {
  fs::path dir = TempDir("bad");
  auto error_of = [&](const std::string& text) -> std::string {
    std::ofstream(dir / "b.json") << text;
    try {
      ReadChromeTrace((dir / "b.json").string());
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return e.what();
    }
    return "";
  };
  EXPECT_THAT(error_of("{not json"), HasSubstr("not JSON"));
  EXPECT_THAT(error_of(R"({"events": []})"), HasSubstr("traceEvents"));
  EXPECT_THAT(error_of(R"([{"name": "x"}])"), HasSubstr("\"ph\""));
  EXPECT_THAT(error_of(R"([{"ph": "X", "name": "x", "pid": 0, "ts": 1}])"), HasSubstr("dur"));
  EXPECT_THAT(error_of(R"([{"ph": "X", "name": "x", "pid": 0, "ts": "1", "dur": 1}])"),
              HasSubstr("\"ts\" is not a number"));
  EXPECT_THAT(error_of(R"([{"ph": "X", "name": "x", "pid": "a", "ts": 1, "dur": 1}])"),
              HasSubstr("pid"));
  EXPECT_THAT(error_of(R"([{"ph": "X", "name": "x", "pid": 0, "ts": 1, "dur": -1}])"),
              HasSubstr("negative"));
  try {
    LoadTrace((dir / "missing").string());
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  fs::path empty = dir / "empty";
  fs::create_directories(empty);
  try {
    LoadTrace(empty.string());
    ADD_FAILURE() << "no error for a directory without traces";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank-<r>.trace.json"));
  }
  fs::remove_all(dir);
}

TEST(TraceFile, TheCheckerCatchesFormatViolations) {
  // The checker itself: each broken event must be reported.
  Json doc = {{"traceEvents",
               {{{"ph", "X"}, {"name", "a"}, {"pid", 0}, {"tid", 0}, {"ts", 1}},  // no dur
                {{"ph", "Q"}, {"name", "b"}, {"pid", 0}, {"tid", 0}, {"ts", 1}},  // bad ph
                {{"ph", "X"}, {"name", 3}, {"pid", 0}, {"tid", 0}, {"ts", 1}, {"dur", 1}},
                {{"ph", "i"}, {"name", "c"}, {"pid", 0}, {"tid", 0}, {"ts", 1}, {"s", "z"}},
                {{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}}}}};  // no args
  EXPECT_EQ(CheckTraceEvents(doc).size(), 5u);
}

}  // namespace
}  // namespace mc2::trace
