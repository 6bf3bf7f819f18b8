// The overlap analysis on synthetic span sets whose answers are known:
// interval arithmetic, nested spans, spans of several threads overlapping,
// gaps, spans cut by step boundaries, several ranks, thresholds, empty
// traces, and the report's text and JSON forms.
#include "trace_tools/analysis.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace mc2::trace {
namespace {

using ::testing::HasSubstr;

constexpr Category kC = Category::kCompute;
constexpr Category kM = Category::kComm;

// A small builder of synthetic traces (times in ns).
struct Builder {
  TraceData t;
  Builder& Span(int rank, int64_t tid, Category cat, int64_t lo, int64_t hi,
                const std::string& name = "", const std::string& algo = "", uint64_t bytes = 0) {
    SpanRecord s;
    s.rank = rank;
    s.tid = tid;
    s.cat = cat;
    s.name = name.empty() ? (cat == kC ? "matmul" : cat == kM ? "all_reduce" : "other") : name;
    s.algorithm = algo;
    s.bytes = bytes;
    s.start_ns = lo;
    s.end_ns = hi;
    t.ranks[rank];
    t.spans.push_back(s);
    return *this;
  }
  Builder& Step(int rank, int64_t at, int64_t step) {
    t.marks.push_back({rank, 1, at, step, false});
    t.ranks[rank];
    return *this;
  }
  Builder& End(int rank, int64_t at) {
    t.marks.push_back({rank, 1, at, -1, true});
    return *this;
  }
};

void ExpectBreakdown(const Breakdown& b, int64_t wall, int64_t compute, int64_t comm,
                     int64_t overlapped, int64_t uncovered, int64_t free) {
  EXPECT_EQ(b.wall_ns, wall);
  EXPECT_EQ(b.compute_ns, compute);
  EXPECT_EQ(b.comm_ns, comm);
  EXPECT_EQ(b.overlapped_ns, overlapped);
  EXPECT_EQ(b.uncovered_ns, uncovered);
  EXPECT_EQ(b.free_ns, free);
  // The identity every breakdown satisfies.
  EXPECT_EQ(b.compute_ns + b.uncovered_ns + b.free_ns, b.wall_ns);
}

TEST(Intervals, UnionMergesNestedOverlappingAndTouching) {
  Intervals u = Union({{50, 60}, {0, 10}, {5, 8}, {10, 20}, {30, 40}, {35, 45}, {70, 70}});
  EXPECT_EQ(u, (Intervals{{0, 20}, {30, 45}, {50, 60}}));
  EXPECT_EQ(Length(u), 20 + 15 + 10);
  EXPECT_TRUE(Union({}).empty());
  EXPECT_TRUE(Union({{5, 5}, {9, 3}}).empty());  // empty and inverted pieces vanish
}

TEST(Intervals, IntersectSubtractClip) {
  Intervals a{{0, 10}, {20, 30}, {40, 50}};
  Intervals b{{5, 25}, {45, 60}};
  EXPECT_EQ(Intersect(a, b), (Intervals{{5, 10}, {20, 25}, {45, 50}}));
  EXPECT_EQ(Subtract(a, b), (Intervals{{0, 5}, {25, 30}, {40, 45}}));
  EXPECT_EQ(Subtract(b, a), (Intervals{{10, 20}, {50, 60}}));
  EXPECT_EQ(Subtract(a, {}), a);
  EXPECT_TRUE(Subtract(a, {{-100, 100}}).empty());
  EXPECT_EQ(Subtract({{0, 100}}, {{10, 20}, {30, 40}}), (Intervals{{0, 10}, {20, 30}, {40, 100}}));
  EXPECT_EQ(Clip(a, 8, 42), (Intervals{{8, 10}, {20, 30}, {40, 42}}));
  EXPECT_TRUE(Clip(a, 42, 8).empty());
  EXPECT_EQ(Length(Intersect(a, b)) + Length(Subtract(a, b)), Length(a));
}

TEST(Analyze, EmptyTrace) {
  Report r = Analyze(TraceData{});
  EXPECT_TRUE(r.ranks.empty());
  EXPECT_EQ(r.overall.wall_ns, 0);
  EXPECT_EQ(r.overall.UncoveredVerdict(), Verdict::kNone);
  EXPECT_EQ(r.overall.FreeVerdict(), Verdict::kNone);
  EXPECT_THAT(FormatReport(r, "x"), HasSubstr("no spans recorded"));
  EXPECT_EQ(ReportToJson(r)["ranks"].size(), 0u);
}

TEST(Analyze, PartialOverlapOnOneThreadEach) {
  // compute [0,100) on main, comm [50,150) on the progress thread.
  Builder b;
  b.Span(0, 1, kC, 0, 100).Span(0, 2, kM, 50, 150);
  Report r = Analyze(b.t);
  ASSERT_EQ(r.ranks.size(), 1u);
  ExpectBreakdown(r.ranks[0].total, 150, 100, 100, 50, 50, 0);
  EXPECT_NEAR(r.overall.Pct(r.overall.uncovered_ns), 100.0 / 3, 1e-9);
  EXPECT_EQ(r.overall.UncoveredVerdict(), Verdict::kFail);
  EXPECT_EQ(r.overall.FreeVerdict(), Verdict::kPass);
}

TEST(Analyze, NestedSpansCountOnce) {
  // An outer "layer" compute span with nested matmuls on the same thread,
  // and nested comm spans (a fused op's comm containing a collective).
  Builder b;
  b.Span(0, 1, kC, 0, 100, "layer").Span(0, 1, kC, 10, 20).Span(0, 1, kC, 30, 90);
  b.Span(0, 2, kM, 80, 130, "fused_comm").Span(0, 2, kM, 85, 95);
  Report r = Analyze(b.t);
  ExpectBreakdown(r.ranks[0].total, 130, 100, 50, 20, 30, 0);
}

TEST(Analyze, OverlappingSpansAcrossThreads) {
  // Compute on two threads, [0,60) and [40,100): the union is [0,100).
  // Comm on two threads, [20,120) and [110,125).
  Builder b;
  b.Span(0, 1, kC, 0, 60).Span(0, 3, kC, 40, 100);
  b.Span(0, 2, kM, 20, 120).Span(0, 4, kM, 110, 125);
  Report r = Analyze(b.t);
  ExpectBreakdown(r.ranks[0].total, 125, 100, 105, 80, 25, 0);
  auto iv = ComputeRankIntervals(b.t);
  EXPECT_EQ(iv[0].compute, (Intervals{{0, 100}}));
  EXPECT_EQ(iv[0].comm, (Intervals{{20, 125}}));
  EXPECT_EQ(iv[0].uncovered, (Intervals{{100, 125}}));
}

TEST(Analyze, GapsAreFreeTimeAndWaitHostCountAsFree) {
  // compute [0,10), comm [30,40), a wait span [10,30) and a host span in
  // the gap: free = 20 of 40 ns.
  Builder b;
  b.Span(0, 1, kC, 0, 10).Span(0, 2, kM, 30, 40);
  b.Span(0, 1, Category::kWait, 10, 30, "wait").Span(0, 1, Category::kHost, 12, 14, "pack");
  Report r = Analyze(b.t);
  ExpectBreakdown(r.ranks[0].total, 40, 10, 10, 0, 10, 20);
  EXPECT_DOUBLE_EQ(r.overall.Pct(r.overall.free_ns), 50.0);
  EXPECT_EQ(r.overall.FreeVerdict(), Verdict::kFail);
  EXPECT_EQ(r.overall.UncoveredVerdict(), Verdict::kFail);
}

TEST(Analyze, StepsCutSpansAtTheirBoundaries) {
  // Warm-up before step 0 (excluded), step 0 = [100,200), step 1 =
  // [200,300) closed by an end marker, and a tail after it (excluded).
  // A compute span crosses the step boundary, and so does a comm span.
  Builder b;
  b.Span(0, 1, kM, 0, 80, "warmup_allreduce");
  b.Step(0, 100, 0).Step(0, 200, 1).End(0, 300);
  b.Span(0, 1, kC, 120, 250);  // 80 in step 0, 50 in step 1
  b.Span(0, 2, kM, 180, 280);  // 20 in step 0 (hidden), 80 in step 1 (50 hidden)
  b.Span(0, 2, kM, 290, 400);  // 10 in step 1 (uncovered), rest after the end
  Report r = Analyze(b.t);
  ASSERT_TRUE(r.steps_marked);
  ASSERT_EQ(r.ranks[0].steps.size(), 2u);
  EXPECT_EQ(r.ranks[0].steps[0].step, 0);
  ExpectBreakdown(r.ranks[0].steps[0].b, 100, 80, 20, 20, 0, 20);
  EXPECT_EQ(r.ranks[0].steps[1].step, 1);
  ExpectBreakdown(r.ranks[0].steps[1].b, 100, 50, 90, 50, 40, 10);
  // The rank's total is the sum of its steps: the warm-up and tail are out.
  ExpectBreakdown(r.ranks[0].total, 200, 130, 110, 70, 40, 30);
  // Only the parts inside the steps count for the operators and spans.
  bool saw_warmup = false;
  for (const auto& op : r.operators) saw_warmup |= op.name == "warmup_allreduce";
  EXPECT_FALSE(saw_warmup);
  ASSERT_EQ(r.top_uncovered.size(), 2u);
  EXPECT_EQ(r.top_uncovered[0].uncovered_ns, 30);  // the [180,280) span, in step 0 by start
  EXPECT_EQ(r.top_uncovered[0].step, 0);
  EXPECT_EQ(r.top_uncovered[1].uncovered_ns, 10);
  EXPECT_EQ(r.top_uncovered[1].step, 1);
}

TEST(Analyze, LastStepEndsWithTheRanksLastSpan) {
  Builder b;
  b.Step(0, 0, 7).Span(0, 1, kC, 0, 50).Span(0, 2, kM, 40, 90);
  Report r = Analyze(b.t);
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].step, 7);
  ExpectBreakdown(r.steps[0].b, 90, 50, 50, 10, 40, 0);
}

TEST(Analyze, SeveralRanksAndOverallMean) {
  Builder b;
  b.Span(0, 1, kC, 0, 100).Span(0, 2, kM, 0, 100);    // fully hidden
  b.Span(1, 1, kC, 0, 100).Span(1, 2, kM, 100, 200);  // fully uncovered
  b.Step(0, 0, 0).Step(1, 0, 0).End(0, 100).End(1, 200);
  Report r = Analyze(b.t);
  ASSERT_EQ(r.ranks.size(), 2u);
  ExpectBreakdown(r.ranks[0].total, 100, 100, 100, 100, 0, 0);
  ExpectBreakdown(r.ranks[1].total, 200, 100, 100, 0, 100, 0);
  ExpectBreakdown(r.overall, 150, 100, 100, 50, 50, 0);
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].ranks, 2);
  EXPECT_EQ(r.steps[0].start_ns, 0);
  EXPECT_EQ(r.steps[0].end_ns, 200);
  EXPECT_EQ(r.ranks[0].total.UncoveredVerdict(), Verdict::kPass);
  EXPECT_EQ(r.ranks[1].total.UncoveredVerdict(), Verdict::kFail);
}

TEST(Analyze, HealthThresholds) {
  auto verdicts = [](int64_t uncovered, int64_t free) {
    Breakdown b;
    b.wall_ns = 1000;
    b.uncovered_ns = uncovered;
    b.free_ns = free;
    return std::make_pair(b.UncoveredVerdict(), b.FreeVerdict());
  };
  EXPECT_EQ(verdicts(100, 29).first, Verdict::kPass);  // 10% exactly
  EXPECT_EQ(verdicts(101, 29).first, Verdict::kWarn);
  EXPECT_EQ(verdicts(200, 29).first, Verdict::kWarn);  // 20% exactly
  EXPECT_EQ(verdicts(201, 29).first, Verdict::kFail);
  EXPECT_EQ(verdicts(0, 29).second, Verdict::kPass);  // 2.9%
  EXPECT_EQ(verdicts(0, 30).second, Verdict::kFail);  // 3% is not < 3%
}

TEST(Analyze, TopUncoveredAndOperators) {
  Builder b;
  // 12 comm spans with uncovered time 1..12 ns, alternating algorithms, and
  // one fully hidden one.
  for (int i = 1; i <= 12; ++i)
    b.Span(0, 2, kM, i * 100, i * 100 + i, "all_reduce", i % 2 ? "ring" : "direct", 64);
  b.Span(0, 1, kC, 5000, 6000).Span(0, 2, kM, 5100, 5200, "all_gather", "direct", 32);
  Report r = Analyze(b.t);
  ASSERT_EQ(r.top_uncovered.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(r.top_uncovered[i].uncovered_ns, 12 - int(i));
  EXPECT_EQ(r.top_uncovered[0].algorithm, "direct");
  EXPECT_EQ(r.top_uncovered[0].start_ns, 1200 - r.origin_ns);
  const OperatorSummary* ar = nullptr;
  const OperatorSummary* ag = nullptr;
  for (const auto& op : r.operators) {
    if (op.name == "all_reduce") ar = &op;
    if (op.name == "all_gather") ag = &op;
  }
  ASSERT_TRUE(ar && ag);
  EXPECT_EQ(ar->calls, 12);
  EXPECT_EQ(ar->total_ns, 78);
  EXPECT_EQ(ar->uncovered_ns, 78);
  EXPECT_EQ(ar->bytes, 12u * 64);
  EXPECT_EQ(ar->algorithms.at("ring"), 6);
  EXPECT_EQ(ar->algorithms.at("direct"), 6);
  EXPECT_EQ(ag->uncovered_ns, 0);
  EXPECT_EQ(r.operators[0].name, "matmul");  // sorted by time

  std::string text = FormatReport(r, "synthetic");
  EXPECT_THAT(text, HasSubstr("largest uncovered communication spans"));
  EXPECT_THAT(text, HasSubstr("direct x6, ring x6"));
  EXPECT_THAT(text, HasSubstr("health"));
  nlohmann::json j = ReportToJson(r);
  EXPECT_EQ(j["top_uncovered"].size(), 10u);
  EXPECT_EQ(j["operators"][0]["name"], "matmul");
  EXPECT_EQ(j["overall"]["wall_ns"], r.overall.wall_ns);
  EXPECT_TRUE(j["overall"]["uncovered_verdict"].is_string());
}

// The lines of `text` from the one starting with `title` to the next empty line.
std::vector<std::string> Table(const std::string& text, const std::string& title) {
  std::vector<std::string> rows;
  std::istringstream in(text);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(title, 0) == 0) {
      inside = true;
      continue;
    }
    if (inside && line.empty()) break;
    if (inside) rows.push_back(line);
  }
  return rows;
}

TEST(Analyze, LongNamesKeepTheTablesAligned) {
  const std::string kLong = "all_gather_batch_matmul_with_a_rather_long_name";
  const std::string kAlgo = "ring_with_a_long_algorithm_name/fused";
  Builder b;
  b.Span(0, 1, kC, 0, 100, "matmul");
  b.Span(0, 2, kM, 200, 300, kLong, "ring_with_a_long_algorithm_name", 64);
  b.t.spans.back().pipeline = "fused";
  b.Span(0, 2, kM, 400, 450, "all_reduce", "direct", 64);
  const std::string text = FormatReport(Analyze(b.t), "synthetic");

  // Operators: every row's category and the right edge of its calls count
  // sit where the header's do.
  const auto ops = Table(text, "operators (all ranks):");
  ASSERT_EQ(ops.size(), 4u) << text;
  const size_t cat_at = ops[0].find("category");
  const size_t calls_end = ops[0].find("calls") + 5;
  ASSERT_GT(cat_at, kLong.size()) << ops[0];
  for (size_t i = 1; i < ops.size(); ++i) {
    const std::string& row = ops[i];
    ASSERT_GT(row.size(), calls_end) << row;
    EXPECT_TRUE(row.compare(cat_at, 4, "comm") == 0 || row.compare(cat_at, 7, "compute") == 0)
        << "\n"
        << ops[0] << "\n"
        << row;
    EXPECT_NE(row[calls_end - 1], ' ') << row;
    EXPECT_EQ(row[calls_end], ' ') << row;
  }

  // Uncovered spans: the bytes column ends where its header does.
  const auto spans = Table(text, "largest uncovered communication spans:");
  ASSERT_EQ(spans.size(), 3u) << text;
  const size_t bytes_end = spans[0].find("bytes") + 5;
  EXPECT_GT(spans[0].find("bytes"), spans[0].find("algorithm") + kAlgo.size());
  for (size_t i = 1; i < spans.size(); ++i) {
    ASSERT_GT(spans[i].size(), bytes_end) << spans[i];
    EXPECT_EQ(spans[i].compare(bytes_end - 4, 4, "64 B"), 0) << "\n"
                                                             << spans[0] << "\n"
                                                             << spans[i];
  }
}

TEST(Analyze, ClockOffsetsAreAppliedByAlign) {
  // Rank 1's clock runs 1000 ns ahead of rank 0's.
  Builder b;
  b.Span(0, 1, kC, 0, 100).Span(1, 1, kC, 1000, 1100);
  b.t.ranks[1].clock_offset_ns = 1000;
  b.t.marks.push_back({1, 1, 1050, 3, false});
  Align(b.t);
  EXPECT_EQ(b.t.spans[1].start_ns, 0);
  EXPECT_EQ(b.t.spans[1].end_ns, 100);
  EXPECT_EQ(b.t.marks[0].t_ns, 50);
  EXPECT_EQ(b.t.ranks[1].clock_offset_ns, 0);
}

}  // namespace
}  // namespace mc2::trace
