// The span recorder on in-process worlds: collectives record comm spans
// with their algorithm and bytes on the right rank, user scopes and step
// marks land on the calling thread's rank, files are written when a world
// ends, nothing is recorded when tracing is off, Enable restarts the
// session, buffers overflow into a dropped count, and MC2_TRACE is checked.
#include "trace/recorder.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/env.h"
#include "mc2/mc2.h"
#include "mc2/trace_file.h"
#include "trace_events_check.h"

namespace mc2::trace {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

class RecorderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("mc2_rec_{}_{}",
                       ::testing::UnitTest::GetInstance()->current_test_info()->name(), ::getpid());
    fs::remove_all(dir_);
  }
  void TearDown() override {
    Disable();
    fs::remove_all(dir_);
  }
  fs::path dir_;
};

std::vector<SpanWithThread> Of(const std::vector<SpanWithThread>& all, const std::string& name) {
  std::vector<SpanWithThread> out;
  for (const auto& s : all)
    if (s.span.name && name == s.span.name) out.push_back(s);
  return out;
}

TEST_F(RecorderTest, CollectivesAndScopesAreRecordedPerRank) {
  Enable(dir_.string());
  ASSERT_TRUE(Enabled());
  constexpr int kRanks = 3;
  Group::RunInProcess(kRanks, [](Group& g) {
    std::vector<float> x(100000, 1.0f), y(100000);
    for (int step = 0; step < 2; ++step) {
      MarkStep(step);
      {
        Scope s("matmul", Category::kCompute, 1000);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      AllReduce(g, x.data(), y.data(), x.size(), DType::kF32, ReduceOp::kSum).Wait();
      Scope w(std::string("host_") + "work", Category::kHost);
    }
    EndStep();
    Barrier(g).Wait();
  });
  auto all = Snapshot();
  auto reduces = Of(all, "all_reduce");
  ASSERT_EQ(reduces.size(), 2u * kRanks);
  std::set<int> ranks;
  for (const auto& s : reduces) {
    ranks.insert(s.span.rank);
    EXPECT_EQ(s.span.kind, static_cast<uint8_t>(Category::kComm));
    EXPECT_EQ(s.span.bytes, 400000u);
    ASSERT_NE(s.span.algorithm, nullptr);
    EXPECT_STRNE(s.span.algorithm, "");
    EXPECT_GE(s.span.end_ns, s.span.start_ns);
    EXPECT_GE(s.span.step, 0);
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(kRanks));
  auto matmuls = Of(all, "matmul");
  ASSERT_EQ(matmuls.size(), 2u * kRanks);
  for (const auto& s : matmuls) {
    EXPECT_GE(s.span.end_ns - s.span.start_ns, 1'000'000);
    EXPECT_EQ(s.span.flops, 1000u);
  }
  EXPECT_EQ(Of(all, "host_work").size(), 2u * kRanks);
  EXPECT_EQ(Of(all, "barrier").size(), static_cast<size_t>(kRanks));
  EXPECT_EQ(Of(all, "step").size(), 2u * kRanks);
  EXPECT_EQ(Of(all, "step end").size(), static_cast<size_t>(kRanks));

  // Each world flushed its rank's file when it ended; the files follow the
  // Trace Event format and name the threads.
  for (int r = 0; r < kRanks; ++r) {
    fs::path f = dir_ / RankFileName(r);
    ASSERT_TRUE(fs::exists(f)) << f;
    std::ifstream in(f);
    nlohmann::json doc = nlohmann::json::parse(in);
    EXPECT_THAT(CheckTraceEvents(doc), ::testing::IsEmpty());
    std::set<std::string> threads;
    int comm = 0;
    for (const auto& e : doc["traceEvents"]) {
      EXPECT_EQ(e["pid"], r);
      if (e["ph"] == "M" && e["name"] == "thread_name") threads.insert(e["args"]["name"]);
      if (e["ph"] == "X" && e["cat"] == "comm") ++comm;
    }
    EXPECT_TRUE(threads.count("main")) << r;
    EXPECT_EQ(comm, 3);  // 2 all_reduce + 1 barrier
    TraceData t = ReadChromeTrace(f.string());
    EXPECT_EQ(t.ranks[r].world_size, kRanks);
    EXPECT_EQ(t.marks.size(), 3u);
  }
}

// A collective the caller does not wait for at once runs on the progress
// thread while the caller computes (one waited for at once may be run by the
// waiting caller itself).
TEST_F(RecorderTest, BackgroundCollectivesRunOnTheProgressThread) {
  Enable(dir_.string());
  Group::RunInProcess(2, [](Group& g) {
    // 8 MiB: above the size that runs inline on an idle engine (4 MiB).
    std::vector<float> x(1 << 21, 1.0f), y(1 << 21);
    Work w = AllReduce(g, x.data(), y.data(), x.size(), DType::kF32, ReduceOp::kSum);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // "compute"
    w.Wait();
  });
  TraceData t = ReadChromeTrace((dir_ / RankFileName(0)).string());
  ASSERT_EQ(t.spans.size(), 1u);
  EXPECT_EQ(t.ranks[0].threads[t.spans[0].tid], "progress");
}

TEST_F(RecorderTest, NothingIsRecordedWhenOff) {
  Enable(dir_.string());
  Disable();
  ASSERT_FALSE(Enabled());
  size_t before = Snapshot().size();
  Group::RunInProcess(2, [](Group& g) {
    int x = 1, y = 0;
    for (int i = 0; i < 10; ++i) AllReduce(g, &x, &y, 1, DType::kI32, ReduceOp::kSum).Wait();
    Scope s("matmul");
    MarkStep(1);
  });
  EXPECT_EQ(Snapshot().size(), before);
}

TEST_F(RecorderTest, EnableStartsANewSessionAndFlushIsIdempotent) {
  Enable(dir_.string());
  { Scope s("first"); }
  Flush();
  Enable(dir_.string());
  { Scope s("second"); }
  auto all = Snapshot();
  EXPECT_TRUE(Of(all, "first").empty());
  EXPECT_EQ(Of(all, "second").size(), 1u);
  Flush();
  Flush();
  TraceData t = LoadTrace(dir_.string());
  ASSERT_EQ(t.spans.size(), 1u);
  EXPECT_EQ(t.spans[0].name, "second");
}

// Flushing while other threads record: the flusher reads each buffer's
// published prefix, lock-free for the writers (run under TSan too).
TEST_F(RecorderTest, FlushWhileOtherThreadsRecord) {
  Enable(dir_.string());
  constexpr int kThreads = 3, kSpans = 30000;
  std::atomic<int> done{0};
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t)
    writers.emplace_back([&, t] {
      SetThreadRank(7);
      for (int i = 0; i < kSpans; ++i) {
        ScopedSpan s(Category::kComm);
        if (s.on()) s.span().name = "all_reduce";
        if (i == kSpans / 2 && t == 0) SetThreadName("renamed");
      }
      done.fetch_add(1);
    });
  size_t seen = 0;
  while (done.load() < kThreads) {
    FlushRank(7);
    size_t n = Snapshot(7).size();
    EXPECT_GE(n, seen);  // the published prefix only grows
    seen = n;
  }
  for (auto& w : writers) w.join();
  FlushRank(7);
  TraceData t = ReadChromeTrace((dir_ / RankFileName(7)).string());
  EXPECT_EQ(t.spans.size(), static_cast<size_t>(kThreads * kSpans));
  for (const auto& s : t.spans) EXPECT_LE(s.start_ns, s.end_ns);
}

TEST_F(RecorderTest, FullBuffersCountDroppedSpans) {
  Enable(dir_.string());
  // A fresh thread, so that its buffer starts empty.
  std::thread([] {
    SetThreadRank(5);
    SetThreadName("filler");
    for (size_t i = 0; i < kMaxSpansPerThread + 7; ++i) Scope s("tiny", Category::kHost);
  }).join();
  // (Not flushed: a million spans make a file of ~150 MB.)
  EXPECT_EQ(Snapshot(5).size(), kMaxSpansPerThread);
  EXPECT_EQ(DroppedSpans(5), 7u);
}

TEST_F(RecorderTest, EnableRejectsUnwritableDirectories) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "file") << "x";
  try {
    Enable((dir_ / "file" / "sub").string());
    ADD_FAILURE() << "Enable accepted a path under a file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("writable"));
  }
  EXPECT_FALSE(Enabled());
}

TEST_F(RecorderTest, ValidateEnvironmentChecksMC2_TRACE) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "file") << "x";
  ::setenv("MC2_TRACE", (dir_ / "file").c_str(), 1);
  try {
    core::ValidateEnvironment();
    ADD_FAILURE() << "MC2_TRACE naming a file was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("MC2_TRACE"));
  }
  // A directory that does not exist yet is created.
  ::setenv("MC2_TRACE", (dir_ / "a" / "b").c_str(), 1);
  EXPECT_NO_THROW(core::ValidateEnvironment());
  EXPECT_TRUE(fs::is_directory(dir_ / "a" / "b"));
  ::unsetenv("MC2_TRACE");
}

// A span when tracing is off is never on and records nothing, neither a
// library span nor a user scope. (What it costs is measured by
// bench/trace_overhead.sh: speed is not a unit test's business.)
TEST_F(RecorderTest, DisabledSpansRecordNothing) {
  Disable();
  const size_t before = Snapshot().size();
  constexpr int kIters = 1'000'000;
  int on = 0;
  for (int i = 0; i < kIters; ++i) {
    ScopedSpan s(Category::kComm);
    if (s.on()) {
      s.span().bytes = i;
      ++on;
    }
    Scope u("x");
  }
  EXPECT_EQ(on, 0);
  EXPECT_EQ(Snapshot().size(), before);
}

}  // namespace
}  // namespace mc2::trace
