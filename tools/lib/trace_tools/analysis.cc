#include "trace_tools/analysis.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <string_view>

namespace mc2::trace {

Intervals Union(Intervals v) {
  std::sort(v.begin(), v.end(), [](const Interval& a, const Interval& b) { return a.lo < b.lo; });
  Intervals out;
  for (const Interval& x : v) {
    if (x.hi <= x.lo) continue;
    if (!out.empty() && x.lo <= out.back().hi)
      out.back().hi = std::max(out.back().hi, x.hi);
    else
      out.push_back(x);
  }
  return out;
}

Intervals Intersect(const Intervals& a, const Intervals& b) {
  Intervals out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    int64_t lo = std::max(a[i].lo, b[j].lo), hi = std::min(a[i].hi, b[j].hi);
    if (lo < hi) out.push_back({lo, hi});
    if (a[i].hi < b[j].hi)
      ++i;
    else
      ++j;
  }
  return out;
}

Intervals Subtract(const Intervals& a, const Intervals& b) {
  Intervals out;
  size_t j = 0;
  for (Interval x : a) {
    while (j < b.size() && b[j].hi <= x.lo) ++j;
    int64_t lo = x.lo;
    for (size_t k = j; k < b.size() && b[k].lo < x.hi; ++k) {
      if (b[k].lo > lo) out.push_back({lo, b[k].lo});
      lo = std::max(lo, b[k].hi);
    }
    if (lo < x.hi) out.push_back({lo, x.hi});
  }
  return out;
}

Intervals Clip(const Intervals& a, int64_t lo, int64_t hi) {
  return Intersect(a, hi > lo ? Intervals{{lo, hi}} : Intervals{});
}

int64_t Length(const Intervals& a) {
  int64_t n = 0;
  for (const Interval& x : a) n += x.hi - x.lo;
  return n;
}

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kNone:
      return "-";
    case Verdict::kPass:
      return "PASS";
    case Verdict::kWarn:
      return "WARN";
    case Verdict::kFail:
      return "FAIL";
  }
  return "-";
}

Verdict Breakdown::UncoveredVerdict() const {
  if (wall_ns <= 0) return Verdict::kNone;
  double p = Pct(uncovered_ns);
  return p <= kUncoveredPassPct  ? Verdict::kPass
         : p > kUncoveredFailPct ? Verdict::kFail
                                 : Verdict::kWarn;
}

Verdict Breakdown::FreeVerdict() const {
  if (wall_ns <= 0) return Verdict::kNone;
  return Pct(free_ns) < kFreePassPct ? Verdict::kPass : Verdict::kFail;
}

Breakdown& Breakdown::operator+=(const Breakdown& o) {
  wall_ns += o.wall_ns;
  compute_ns += o.compute_ns;
  comm_ns += o.comm_ns;
  overlapped_ns += o.overlapped_ns;
  uncovered_ns += o.uncovered_ns;
  free_ns += o.free_ns;
  return *this;
}

Breakdown BreakDown(const Intervals& compute, const Intervals& comm, int64_t lo, int64_t hi) {
  Breakdown b;
  if (hi <= lo) return b;
  Intervals c = Clip(compute, lo, hi), m = Clip(comm, lo, hi);
  b.wall_ns = hi - lo;
  b.compute_ns = Length(c);
  b.comm_ns = Length(m);
  b.overlapped_ns = Length(Intersect(c, m));
  b.uncovered_ns = b.comm_ns - b.overlapped_ns;
  b.free_ns = b.wall_ns - (b.compute_ns + b.comm_ns - b.overlapped_ns);
  return b;
}

namespace {

// |x ∩ set| for a sorted disjoint set, by binary search.
int64_t LengthWithin(Interval x, const Intervals& set) {
  auto it = std::lower_bound(set.begin(), set.end(), x.lo,
                             [](const Interval& s, int64_t v) { return s.hi <= v; });
  int64_t n = 0;
  for (; it != set.end() && it->lo < x.hi; ++it)
    n += std::min(x.hi, it->hi) - std::max(x.lo, it->lo);
  return n;
}

bool Inside(int64_t t, const Intervals& set) {
  auto it = std::lower_bound(set.begin(), set.end(), t,
                             [](const Interval& s, int64_t v) { return s.hi <= v; });
  return it != set.end() && it->lo <= t;
}

struct StepWindow {
  int64_t step;
  int64_t lo, hi;
};

struct RankWork {
  int rank = 0;
  std::vector<const SpanRecord*> spans;
  std::vector<StepMark> marks;
  int64_t start = 0, end = 0;
  std::vector<StepWindow> steps;  // empty: the whole rank is one window
  Intervals windows, compute, comm;
};

std::map<int, RankWork> Prepare(const TraceData& t) {
  std::map<int, RankWork> ranks;
  for (const auto& s : t.spans) ranks[s.rank].spans.push_back(&s);
  for (const auto& m : t.marks) ranks[m.rank].marks.push_back(m);
  // Not a structured binding: lambdas below capture `w`, which clang
  // before 16 does not allow for bindings (the fuzz build uses clang 14).
  for (auto& entry : ranks) {
    const int rank = entry.first;
    RankWork& w = entry.second;
    w.rank = rank;
    bool any = false;
    auto see = [&](int64_t lo, int64_t hi) {
      w.start = any ? std::min(w.start, lo) : lo;
      w.end = any ? std::max(w.end, hi) : hi;
      any = true;
    };
    Intervals compute, comm;
    for (const SpanRecord* s : w.spans) {
      see(s->start_ns, std::max(s->start_ns, s->end_ns));
      if (s->cat == Category::kCompute) compute.push_back({s->start_ns, s->end_ns});
      if (s->cat == Category::kComm) comm.push_back({s->start_ns, s->end_ns});
    }
    for (const StepMark& m : w.marks) see(m.t_ns, m.t_ns);
    w.compute = Union(std::move(compute));
    w.comm = Union(std::move(comm));
    // Steps: each begin marker opens a step and closes the open one; an end
    // marker closes it; the last open step ends with the rank's last instant.
    std::stable_sort(w.marks.begin(), w.marks.end(),
                     [](const StepMark& a, const StepMark& b) { return a.t_ns < b.t_ns; });
    bool open = false;
    StepWindow cur{};
    for (const StepMark& m : w.marks) {
      if (open && m.t_ns > cur.lo) w.steps.push_back({cur.step, cur.lo, m.t_ns});
      open = !m.end;
      if (open) cur = {m.step, m.t_ns, 0};
    }
    if (open && w.end > cur.lo) w.steps.push_back({cur.step, cur.lo, w.end});
    Intervals win;
    if (w.marks.empty()) win.push_back({w.start, w.end});
    for (const StepWindow& s : w.steps) win.push_back({s.lo, s.hi});
    w.windows = Union(std::move(win));
  }
  return ranks;
}

std::string Duration(int64_t ns) {
  double a = static_cast<double>(ns < 0 ? -ns : ns);
  if (a < 1e3) return fmt::format("{} ns", ns);
  if (a < 1e6) return fmt::format("{:.2f} us", ns / 1e3);
  if (a < 1e9) return fmt::format("{:.3f} ms", ns / 1e6);
  return fmt::format("{:.3f} s", ns / 1e9);
}

std::string Bytes(uint64_t b) {
  if (b < 1024) return fmt::format("{} B", b);
  if (b < (1u << 20)) return fmt::format("{:.1f} KiB", b / 1024.0);
  if (b < (1ull << 30)) return fmt::format("{:.1f} MiB", b / 1048576.0);
  return fmt::format("{:.2f} GiB", b / 1073741824.0);
}

std::string Counts(const std::map<std::string, int64_t>& m) {
  std::string s;
  for (const auto& [name, n] : m) s += fmt::format("{}{} x{}", s.empty() ? "" : ", ", name, n);
  return s;
}

nlohmann::json BreakdownJson(const Breakdown& b) {
  return {{"wall_ns", b.wall_ns},
          {"compute_ns", b.compute_ns},
          {"comm_ns", b.comm_ns},
          {"overlapped_ns", b.overlapped_ns},
          {"uncovered_ns", b.uncovered_ns},
          {"free_ns", b.free_ns},
          {"compute_pct", b.Pct(b.compute_ns)},
          {"comm_pct", b.Pct(b.comm_ns)},
          {"overlapped_pct", b.Pct(b.overlapped_ns)},
          {"uncovered_pct", b.Pct(b.uncovered_ns)},
          {"free_pct", b.Pct(b.free_ns)},
          {"uncovered_verdict", VerdictName(b.UncoveredVerdict())},
          {"free_verdict", VerdictName(b.FreeVerdict())}};
}

Breakdown Mean(Breakdown sum, int n) {
  if (n <= 1) return sum;
  sum.wall_ns /= n;
  sum.compute_ns /= n;
  sum.comm_ns /= n;
  sum.overlapped_ns /= n;
  sum.uncovered_ns /= n;
  sum.free_ns /= n;
  return sum;
}

}  // namespace

std::map<int, RankIntervals> ComputeRankIntervals(const TraceData& t) {
  std::map<int, RankIntervals> out;
  for (auto& [rank, w] : Prepare(t)) {
    RankIntervals& r = out[rank];
    r.windows = w.windows;
    r.compute = Intersect(w.compute, w.windows);
    r.comm = Intersect(w.comm, w.windows);
    r.uncovered = Subtract(r.comm, r.compute);
  }
  return out;
}

Report Analyze(const TraceData& t, size_t top_n) {
  Report rep;
  rep.spans = t.spans.size();
  for (const auto& [rank, info] : t.ranks) rep.dropped += info.dropped;
  auto ranks = Prepare(t);
  bool first = true;
  for (const auto& [rank, w] : ranks) {
    rep.origin_ns = first ? w.start : std::min(rep.origin_ns, w.start);
    first = false;
    rep.steps_marked |= !w.marks.empty();
  }
  std::map<std::pair<std::string, Category>, OperatorSummary> ops;
  std::vector<UncoveredSpan> uncovered;
  std::map<int64_t, StepBreakdown> steps;
  Breakdown sum;
  for (const auto& [rank, w] : ranks) {
    RankReport rr;
    rr.rank = rank;
    rr.start_ns = w.start;
    rr.end_ns = w.end;
    rr.spans = w.spans.size();
    if (w.marks.empty()) {
      rr.total = BreakDown(w.compute, w.comm, w.start, w.end);
    } else {
      for (const StepWindow& s : w.steps) {
        StepBreakdown sb;
        sb.step = s.step;
        sb.start_ns = s.lo;
        sb.end_ns = s.hi;
        sb.ranks = 1;
        sb.b = BreakDown(w.compute, w.comm, s.lo, s.hi);
        rr.total += sb.b;
        rr.steps.push_back(sb);
        auto [it, fresh] = steps.try_emplace(s.step, sb);
        if (!fresh) {
          it->second.start_ns = std::min(it->second.start_ns, s.lo);
          it->second.end_ns = std::max(it->second.end_ns, s.hi);
          it->second.ranks += 1;
          it->second.b += sb.b;
        }
      }
    }
    sum += rr.total;
    rep.ranks.push_back(std::move(rr));

    Intervals hidden = Intersect(w.windows, w.compute);
    for (const SpanRecord* s : w.spans) {
      Interval x{s->start_ns, std::max(s->start_ns, s->end_ns)};
      int64_t inside = LengthWithin(x, w.windows);
      if (inside == 0 && !(x.hi == x.lo && Inside(x.lo, w.windows))) continue;
      OperatorSummary& op = ops[{s->name, s->cat}];
      op.name = s->name;
      op.cat = s->cat;
      op.calls += 1;
      op.total_ns += inside;
      op.bytes += s->bytes;
      op.flops += s->flops;
      if (!s->algorithm.empty()) op.algorithms[s->algorithm] += 1;
      if (!s->pipeline.empty()) op.pipelines[s->pipeline] += 1;
      if (s->cat != Category::kComm) continue;
      int64_t unc = inside - LengthWithin(x, hidden);
      op.uncovered_ns += unc;
      if (unc <= 0) continue;
      UncoveredSpan u;
      u.rank = rank;
      u.step = s->step;
      // The step whose window holds the span's start (steps are sorted).
      auto sw = std::upper_bound(w.steps.begin(), w.steps.end(), x.lo,
                                 [](int64_t v, const StepWindow& s) { return v < s.lo; });
      if (sw != w.steps.begin() && x.lo < std::prev(sw)->hi) u.step = std::prev(sw)->step;
      u.name = s->name;
      u.algorithm = s->algorithm;
      u.pipeline = s->pipeline;
      u.bytes = s->bytes;
      u.start_ns = s->start_ns - rep.origin_ns;
      u.dur_ns = x.hi - x.lo;
      u.uncovered_ns = unc;
      uncovered.push_back(std::move(u));
    }
  }
  rep.overall = Mean(sum, static_cast<int>(ranks.size()));
  for (auto& [step, sb] : steps) {
    sb.b = Mean(sb.b, sb.ranks);
    rep.steps.push_back(sb);
  }
  for (auto& [key, op] : ops) rep.operators.push_back(std::move(op));
  std::stable_sort(
      rep.operators.begin(), rep.operators.end(),
      [](const OperatorSummary& a, const OperatorSummary& b) { return a.total_ns > b.total_ns; });
  std::stable_sort(uncovered.begin(), uncovered.end(),
                   [](const UncoveredSpan& a, const UncoveredSpan& b) {
                     return a.uncovered_ns > b.uncovered_ns;
                   });
  if (uncovered.size() > top_n) uncovered.resize(top_n);
  rep.top_uncovered = std::move(uncovered);
  return rep;
}

std::string FormatReport(const Report& r, const std::string& source) {
  std::string o;
  auto put = [&]<typename... T>(fmt::format_string<T...> f, T&&... args) {
    fmt::format_to(std::back_inserter(o), f, std::forward<T>(args)...);
  };
  put("mc2 trace report: {}\n", source);
  put("{} rank(s), {} spans{}{}\n", r.ranks.size(), r.spans,
      r.steps_marked
          ? fmt::format(", {} marked step(s): times are over the marked steps", r.steps.size())
          : ", no steps marked: times are over each rank's whole trace",
      r.dropped ? fmt::format(", {} spans DROPPED (buffers full)", r.dropped) : "");
  if (r.ranks.empty()) {
    put("no spans recorded\n");
    return o;
  }
  auto header = [&](const char* first) {
    put("\n{:>6} {:>12} {:>12} {:>12} {:>12} {:>20} {:>18}  {:<9} {:<4}\n", first, "wall",
        "compute", "comm", "overlapped", "uncovered (% wall)", "free (% wall)", "uncovered",
        "free");
  };
  auto row = [&](const std::string& label, const Breakdown& b) {
    put("{:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>6.1f}% {:>10} {:>6.1f}%  {:<9} {:<4}\n", label,
        Duration(b.wall_ns), Duration(b.compute_ns), Duration(b.comm_ns), Duration(b.overlapped_ns),
        Duration(b.uncovered_ns), b.Pct(b.uncovered_ns), Duration(b.free_ns), b.Pct(b.free_ns),
        VerdictName(b.UncoveredVerdict()), VerdictName(b.FreeVerdict()));
  };
  header("rank");
  for (const RankReport& rr : r.ranks) row(std::to_string(rr.rank), rr.total);
  row("mean", r.overall);
  if (r.steps_marked && !r.steps.empty()) {
    put("\nper step (mean over the ranks that marked it):");
    header("step");
    constexpr size_t kMaxRows = 200;
    for (size_t i = 0; i < r.steps.size() && i < kMaxRows; ++i)
      row(std::to_string(r.steps[i].step), r.steps[i].b);
    if (r.steps.size() > kMaxRows)
      put("... {} more steps (see --json)\n", r.steps.size() - kMaxRows);
  }
  put("\nhealth (mean of ranks): uncovered communication {:.1f}% of wall time: {} "
      "(<= {:g}% PASS, > {:g}% FAIL); free time {:.1f}%: {} (< {:g}% PASS)\n",
      r.overall.Pct(r.overall.uncovered_ns), VerdictName(r.overall.UncoveredVerdict()),
      kUncoveredPassPct, kUncoveredFailPct, r.overall.Pct(r.overall.free_ns),
      VerdictName(r.overall.FreeVerdict()), kFreePassPct);

  // Text columns are as wide as their longest entry (at least 20), so that
  // a long operator name pushes its column out instead of the rest of its row.
  put("\nlargest uncovered communication spans:\n");
  auto algo_of = [](const UncoveredSpan& u) {
    std::string algo = u.algorithm;
    if (!u.pipeline.empty()) algo += (algo.empty() ? "" : "/") + u.pipeline;
    return algo.empty() ? std::string("-") : algo;
  };
  size_t name_w = 20, algo_w = 20;
  for (const UncoveredSpan& u : r.top_uncovered) {
    name_w = std::max(name_w, u.name.size());
    algo_w = std::max(algo_w, algo_of(u).size());
  }
  if (r.top_uncovered.empty())
    put("  none: all communication was hidden by compute\n");
  else
    put("{:>3} {:>5} {:>5}  {:<{}} {:<{}} {:>10} {:>12} {:>12} {:>12}\n", "#", "rank", "step",
        "name", name_w, "algorithm", algo_w, "bytes", "start", "duration", "uncovered");
  for (size_t i = 0; i < r.top_uncovered.size(); ++i) {
    const UncoveredSpan& u = r.top_uncovered[i];
    put("{:>3} {:>5} {:>5}  {:<{}} {:<{}} {:>10} {:>12} {:>12} {:>12}\n", i + 1, u.rank,
        u.step >= 0 ? std::to_string(u.step) : "-", u.name, name_w, algo_of(u), algo_w,
        Bytes(u.bytes), Duration(u.start_ns), Duration(u.dur_ns), Duration(u.uncovered_ns));
  }

  put("\noperators (all ranks):\n");
  size_t op_w = 20, cat_w = 8;
  for (const OperatorSummary& op : r.operators) {
    op_w = std::max(op_w, op.name.size());
    cat_w = std::max(cat_w, std::string_view(CategoryName(op.cat)).size());
  }
  put("{:<{}} {:<{}} {:>7} {:>12} {:>12} {:>10}  {}\n", "name", op_w, "category", cat_w, "calls",
      "time", "uncovered", "bytes", "algorithm / pipeline that ran");
  for (const OperatorSummary& op : r.operators) {
    std::string what = Counts(op.algorithms);
    if (!op.pipelines.empty()) what += (what.empty() ? "" : "; pipeline ") + Counts(op.pipelines);
    put("{:<{}} {:<{}} {:>7} {:>12} {:>12} {:>10}  {}\n", op.name, op_w, CategoryName(op.cat),
        cat_w, op.calls, Duration(op.total_ns),
        op.cat == Category::kComm ? Duration(op.uncovered_ns) : "-",
        op.bytes ? Bytes(op.bytes) : "-", what.empty() ? "-" : what);
  }
  return o;
}

nlohmann::json ReportToJson(const Report& r) {
  using Json = nlohmann::json;
  Json j;
  j["origin_ns"] = r.origin_ns;
  j["spans"] = r.spans;
  j["dropped"] = r.dropped;
  j["steps_marked"] = r.steps_marked;
  j["thresholds"] = {{"uncovered_pass_pct", kUncoveredPassPct},
                     {"uncovered_fail_pct", kUncoveredFailPct},
                     {"free_pass_pct", kFreePassPct}};
  j["overall"] = BreakdownJson(r.overall);
  auto step_json = [](const StepBreakdown& s) {
    Json x = BreakdownJson(s.b);
    x["step"] = s.step;
    x["start_ns"] = s.start_ns;
    x["end_ns"] = s.end_ns;
    x["ranks"] = s.ranks;
    return x;
  };
  j["ranks"] = Json::array();
  for (const RankReport& rr : r.ranks) {
    Json x = BreakdownJson(rr.total);
    x["rank"] = rr.rank;
    x["start_ns"] = rr.start_ns;
    x["end_ns"] = rr.end_ns;
    x["spans"] = rr.spans;
    x["steps"] = Json::array();
    for (const StepBreakdown& s : rr.steps) x["steps"].push_back(step_json(s));
    j["ranks"].push_back(std::move(x));
  }
  j["steps"] = Json::array();
  for (const StepBreakdown& s : r.steps) j["steps"].push_back(step_json(s));
  j["top_uncovered"] = Json::array();
  for (const UncoveredSpan& u : r.top_uncovered)
    j["top_uncovered"].push_back({{"rank", u.rank},
                                  {"step", u.step},
                                  {"name", u.name},
                                  {"algorithm", u.algorithm},
                                  {"pipeline", u.pipeline},
                                  {"bytes", u.bytes},
                                  {"start_ns", u.start_ns},
                                  {"dur_ns", u.dur_ns},
                                  {"uncovered_ns", u.uncovered_ns}});
  j["operators"] = Json::array();
  for (const OperatorSummary& op : r.operators)
    j["operators"].push_back({{"name", op.name},
                              {"category", CategoryName(op.cat)},
                              {"calls", op.calls},
                              {"total_ns", op.total_ns},
                              {"uncovered_ns", op.uncovered_ns},
                              {"bytes", op.bytes},
                              {"flops", op.flops},
                              {"algorithms", op.algorithms},
                              {"pipelines", op.pipelines}});
  return j;
}

}  // namespace mc2::trace
