// What tracing does on the hot path, checked by what it records: a loop of
// small all_reduces gives one span per call on each rank with tracing on and
// none with it off, with the same results; a thread recording spans in a
// tight loop keeps every one. What tracing costs is a benchmark's business
// (`bench/trace_overhead.sh`, docs/tracing.md), not a unit test's: speed
// depends on the machine's load and on sanitizers.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "mc2/mc2.h"
#include "trace/recorder.h"

namespace mc2::trace {
namespace {

namespace fs = std::filesystem;

// Spans named `name` of category `kind` recorded since Enable.
size_t CountSpans(const char* name, Category kind) {
  size_t n = 0;
  for (const SpanWithThread& s : Snapshot())
    n += s.span.name != nullptr && std::strcmp(s.span.name, name) == 0 &&
         s.span.kind == static_cast<uint8_t>(kind);
  return n;
}

// Runs `iters` all_reduces of `count` floats on 2 in-process ranks; returns
// how many results were wrong (every element must be 1 + 1).
int RunAllReduces(size_t count, int iters) {
  std::atomic<int> wrong{0};
  Group::RunInProcess(2, [&](Group& g) {
    std::vector<float> x(count, 1.0f), y(count);
    for (int i = 0; i < iters; ++i) {
      std::fill(y.begin(), y.end(), 0.0f);
      AllReduce(g, x.data(), y.data(), count, DType::kF32, ReduceOp::kSum).Wait();
      for (float v : y) wrong += v != 2.0f;
    }
  });
  return wrong.load();
}

TEST(TraceOverhead, SmallAllReducesRecordOneSpanPerCallOnlyWhenTracingIsOn) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("mc2_overhead_{}", ::getpid());
  constexpr int kIters = 300;
  for (size_t count : {size_t{2}, size_t{4096}}) {
    Enable(dir.string());
    EXPECT_EQ(RunAllReduces(count, kIters), 0) << count << " floats, tracing on";
    EXPECT_EQ(CountSpans("all_reduce", Category::kComm), size_t{2} * kIters)
        << count << " floats: one span per call on each of the 2 ranks";
    Disable();
    // Off: the session keeps its spans and gains none.
    EXPECT_EQ(RunAllReduces(count, kIters), 0) << count << " floats, tracing off";
    EXPECT_EQ(CountSpans("all_reduce", Category::kComm), size_t{2} * kIters)
        << count << " floats: spans recorded while tracing was off";
  }
  fs::remove_all(dir);
}

// One thread recording spans back to back keeps every one of them (none
// dropped, none lost to a race with the per-thread buffer's growth).
TEST(TraceOverhead, ATightLoopOfSpansOnOneThreadRecordsEveryOne) {
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("mc2_overhead_span_{}", ::getpid());
  Enable(dir.string());
  constexpr long kSpans = 300'000;
  long on = 0;
  std::thread([&] {
    for (long i = 0; i < kSpans; ++i) {
      ScopedSpan s(Category::kComm);
      if (s.on()) {
        s.span().name = "overhead_probe";
        s.span().bytes = static_cast<uint64_t>(i);
        ++on;
      }
    }
  }).join();
  EXPECT_EQ(on, kSpans);
  EXPECT_EQ(CountSpans("overhead_probe", Category::kComm), static_cast<size_t>(kSpans));
  Disable();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mc2::trace
