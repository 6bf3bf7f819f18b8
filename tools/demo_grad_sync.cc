#include "demo_grad_sync.h"

#include <algorithm>
#include <map>
#include <vector>

#include "trace_tools/analysis.h"

namespace mc2::tools {

GradSyncOverlap AnalyzeGradSync(const trace::TraceData& t) {
  // Per rank: the starts of its backward and forward spans, sorted.
  std::map<int, std::vector<int64_t>> backward, forward;
  for (const trace::SpanRecord& s : t.spans) {
    if (s.name == "backward") backward[s.rank].push_back(s.start_ns);
    if (s.name == "forward") forward[s.rank].push_back(s.start_ns);
  }
  for (auto* m : {&backward, &forward})
    for (auto& [rank, v] : *m) std::sort(v.begin(), v.end());
  std::map<int, trace::Intervals> grads;
  GradSyncOverlap out;
  for (const trace::SpanRecord& s : t.spans) {
    // GradSync's exchanges: a bucket's all-reduce, or one Batch of several
    // small buckets.
    if ((s.name != "all_reduce" && s.name != "batch") || s.cat != trace::Category::kComm)
      continue;
    const std::vector<int64_t>& b = backward[s.rank];
    auto it = std::upper_bound(b.begin(), b.end(), s.start_ns);
    if (it == b.begin()) continue;  // before any backward
    const int64_t began = *(it - 1);
    const std::vector<int64_t>& f = forward[s.rank];
    auto next = std::upper_bound(f.begin(), f.end(), began);
    if (next != f.end() && *next <= s.start_ns) continue;  // a forward's
    grads[s.rank].push_back({s.start_ns, s.end_ns});
  }
  const std::map<int, trace::RankIntervals> ranks = trace::ComputeRankIntervals(t);
  for (auto& [rank, v] : grads) {
    auto r = ranks.find(rank);
    if (r == ranks.end()) continue;
    const trace::Intervals& windows = r->second.windows;
    for (const trace::Interval& span : v)
      if (span.hi > span.lo && trace::Length(trace::Intersect({span}, windows)) > 0) ++out.calls;
    trace::Intervals g = trace::Intersect(trace::Union(std::move(v)), windows);
    if (g.empty()) continue;
    ++out.ranks;
    out.comm_ns += trace::Length(g);
    out.hidden_ns += trace::Length(trace::Intersect(g, r->second.compute));
  }
  return out;
}

}  // namespace mc2::tools
