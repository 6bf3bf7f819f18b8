// Overlap analysis of a trace: how much of each rank's time went to
// compute, to communication, to both at once, to communication that no
// compute hid, and to neither.
//
// Works as follows. For each rank, the compute spans of all its threads are
// projected onto one time line and merged into a union of disjoint
// intervals; the same for its communication spans. Within a window (the
// rank's whole trace, or one marked step):
//
//   compute      = |C|              communication = |M|
//   overlapped   = |M ∩ C|          uncovered     = |M \ C|
//   free         = wall - |M ∪ C|   (wait and host spans count as free)
//
// and the health criteria of the profiling method (docs/tracing.md):
// uncovered communication <= 10% of the wall time PASS, > 20% FAIL, WARN in
// between; free time < 3% PASS, else FAIL. Spans that cross a window's edge
// count only for the part inside it. Cost: O(S log S) for S spans.
#ifndef MC2_TRACE_TOOLS_ANALYSIS_H_
#define MC2_TRACE_TOOLS_ANALYSIS_H_

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mc2/trace_file.h"

namespace mc2::trace {

// Half-open [lo, hi), in nanoseconds.
struct Interval {
  int64_t lo = 0;
  int64_t hi = 0;
  bool operator==(const Interval&) const = default;
};
// Sorted, disjoint, non-empty, non-adjacent intervals (the output of Union).
using Intervals = std::vector<Interval>;

Intervals Union(Intervals v);
Intervals Intersect(const Intervals& a, const Intervals& b);
Intervals Subtract(const Intervals& a, const Intervals& b);
Intervals Clip(const Intervals& a, int64_t lo, int64_t hi);
int64_t Length(const Intervals& a);

enum class Verdict { kNone, kPass, kWarn, kFail };  // kNone: nothing to judge
const char* VerdictName(Verdict v);                 // "-", "PASS", "WARN", "FAIL"

inline constexpr double kUncoveredPassPct = 10;
inline constexpr double kUncoveredFailPct = 20;
inline constexpr double kFreePassPct = 3;

struct Breakdown {
  int64_t wall_ns = 0;
  int64_t compute_ns = 0;
  int64_t comm_ns = 0;
  int64_t overlapped_ns = 0;
  int64_t uncovered_ns = 0;
  int64_t free_ns = 0;

  double Pct(int64_t ns) const { return wall_ns > 0 ? 100.0 * ns / wall_ns : 0.0; }
  Verdict UncoveredVerdict() const;
  Verdict FreeVerdict() const;
  Breakdown& operator+=(const Breakdown& o);
};

// The breakdown of one rank's intervals over [lo, hi).
Breakdown BreakDown(const Intervals& compute, const Intervals& comm, int64_t lo, int64_t hi);

struct StepBreakdown {
  int64_t step = -1;
  int64_t start_ns = 0;  // earliest start among the ranks (overall rows)
  int64_t end_ns = 0;    // latest end
  int ranks = 0;         // how many ranks marked it
  Breakdown b;
};

struct RankReport {
  int rank = 0;
  int64_t start_ns = 0;  // the rank's first and last recorded instant
  int64_t end_ns = 0;
  size_t spans = 0;
  Breakdown total;  // over the marked steps if any, else [start, end)
  std::vector<StepBreakdown> steps;
};

struct OperatorSummary {
  std::string name;
  Category cat = Category::kComm;
  int64_t calls = 0;
  int64_t total_ns = 0;      // inside the analysed windows
  int64_t uncovered_ns = 0;  // comm only: the part no compute hid
  uint64_t bytes = 0;
  uint64_t flops = 0;
  std::map<std::string, int64_t> algorithms;  // name -> calls
  std::map<std::string, int64_t> pipelines;
};

struct UncoveredSpan {
  int rank = 0;
  int64_t step = -1;
  std::string name;
  std::string algorithm;
  std::string pipeline;
  uint64_t bytes = 0;
  int64_t start_ns = 0;  // relative to the trace's first instant
  int64_t dur_ns = 0;
  int64_t uncovered_ns = 0;
};

struct Report {
  int64_t origin_ns = 0;  // the trace's first instant; reported times are relative to it
  bool steps_marked = false;
  size_t spans = 0;
  std::vector<RankReport> ranks;
  // Mean over ranks (each field is the sum over ranks divided by their
  // number; the percentages are those of the sums).
  Breakdown overall;
  std::vector<StepBreakdown> steps;          // mean over the ranks that marked each step
  std::vector<OperatorSummary> operators;    // by total time, descending
  std::vector<UncoveredSpan> top_uncovered;  // by uncovered time, descending
  uint64_t dropped = 0;
};

// Per-rank interval sets (within the analysed windows), for plotting.
struct RankIntervals {
  Intervals windows;  // the analysed windows (steps, or the whole rank)
  Intervals compute;
  Intervals comm;
  Intervals uncovered;  // comm \ compute
};
std::map<int, RankIntervals> ComputeRankIntervals(const TraceData& t);

Report Analyze(const TraceData& t, size_t top_n = 10);
// The text tables of `mc2 trace report`.
std::string FormatReport(const Report& r, const std::string& source);
// The --json form (times in nanoseconds, percentages of the wall time).
nlohmann::json ReportToJson(const Report& r);

}  // namespace mc2::trace

#endif  // MC2_TRACE_TOOLS_ANALYSIS_H_
