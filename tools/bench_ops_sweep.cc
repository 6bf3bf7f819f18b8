// `mc2 bench ops`: the measurement on every rank of the job.
//
// What is timed: compute-only, comm-only, serial, then every pipeline and
// split count asked for. They are timed round-robin (iteration i of every
// candidate, then i+1, ...), so that a change in the machine's load hits
// all of them alike; every time is the slowest rank's. Serial's result is
// the reference: every pipeline's first run is checked against it, bit for
// bit. Then --confirm re-times the figures the verdicts rest on.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench.h"
#include "bench_ops.h"
#include "core/link_config.h"

namespace mc2::tools::bench_ops {

namespace {

using Clock = std::chrono::steady_clock;

// Elements of `a` that differ bitwise from `b`, summed over ranks.
int64_t CountWrongAll(const Group& g, std::span<const float> a, const std::vector<float>& b) {
  int64_t wrong =
      static_cast<int64_t>(a.size() == b.size() ? bench::CountWrong(a.data(), b.data(), a.size(), 4)
                                                : std::max(a.size(), b.size()));
  int64_t sum = 0;
  AllReduce(g, &wrong, &sum, 1, DType::kI64, ReduceOp::kSum).Wait();
  return sum;
}

// One timed configuration: a baseline or an operator call.
struct Candidate {
  std::function<void()> fn;
  FusedOptions options;
  bool is_op = false;
  FusedReport report;
  int64_t wrong = 0;
  std::vector<double> times;
  std::vector<double> traced_times;  // --trace-ab
};

// The candidates of one run and their round-robin timing. Candidate 0 is
// compute-only, candidate 1 comm-only (with more than one rank), then
// serial (serial_idx) and the pipelines.
class Sweep {
 public:
  Sweep(const Group& g, const OpsConfig& cfg, OpCase& op, const CollectiveOptions& co)
      : g_(g), cfg_(cfg), op_(op), co_(co), ab_(!cfg.trace_ab.empty()) {
    cands_.reserve(3 + cfg.pipelines.size() * cfg.splits.size() + 1);
    cands_.emplace_back().fn = [this] { op_.ComputeOnly(); };
    if (g.size() > 1) cands_.emplace_back().fn = [this] { op_.CommOnly(co_); };
    AddOp(Pipeline::kSerial, 0);
    serial_idx_ = cands_.size() - 1;
    for (Pipeline p : cfg.pipelines) {
      if (p == Pipeline::kSerial) continue;
      if (p == Pipeline::kAuto)
        AddOp(p, 0);
      else
        for (int s : cfg.splits) AddOp(p, s);
    }
  }

  // Runs serial, then every pipeline once, counting its elements that
  // differ from serial's (also a warm-up); then the --warmup iterations.
  void CheckAndWarmUp() {
    cands_[serial_idx_].fn();
    std::vector<float> reference(op_.Output().begin(), op_.Output().end());
    for (auto& c : cands_) {
      if (!c.is_op) continue;
      c.fn();
      c.wrong = CountWrongAll(g_, op_.Output(), reference);
    }
    for (int w = 0; w < cfg_.warmup; ++w)
      for (auto& c : cands_) c.fn();
  }

  void TimeRoundRobin() {
    for (int i = 0; i < cfg_.iters; ++i) {
      for (auto& c : cands_) {
        if (!ab_) {
          TimeOnce(c, false);
        } else {
          // Alternate which half goes first, so drift and caches favour
          // neither.
          TimeOnce(c, i % 2 == 1);
          TimeOnce(c, i % 2 == 0);
        }
      }
    }
    if (ab_) trace::Disable();
  }

  Bounds MedianBounds() const {
    return {bench::Median(cands_[0].times), g_.size() > 1 ? bench::Median(cands_[1].times) : 0.0};
  }

  // The table's rows (serial first), from the round-robin medians.
  std::vector<Row> MakeRows() const {
    std::vector<Row> rows;
    for (size_t i = serial_idx_; i < cands_.size(); ++i) {
      const Candidate& c = cands_[i];
      const FusedReport& rep = c.report;
      Row r;
      r.pipeline = PipelineName(c.options.pipeline);
      r.time_s = bench::Median(c.times);
      if (ab_) r.traced_s = bench::Median(c.traced_times);
      r.wrong = c.wrong;
      r.splits = rep.splits;
      r.serial = rep.pipeline == Pipeline::kSerial;
      r.stages = rep.pipeline == Pipeline::kFused     ? g_.size() * rep.splits
                 : rep.pipeline == Pipeline::kChunked ? rep.splits
                                                      : 1;
      r.chosen = fmt::format("{} s={}", PipelineName(rep.pipeline), rep.splits);
      rows.push_back(r);
    }
    return rows;
  }

  // Fresh round-robin iterations of compute-only, comm-only, serial, the
  // best fixed row and auto (row indices as MakeRows's).
  Confirmed Confirm(size_t best_row, std::optional<size_t> auto_row) {
    std::vector<size_t> set = {0};
    if (g_.size() > 1) set.push_back(1);
    set.push_back(serial_idx_);
    if (best_row != 0) set.push_back(serial_idx_ + best_row);
    if (auto_row) set.push_back(serial_idx_ + *auto_row);
    for (size_t idx : set) cands_[idx].times.clear();
    // Odd iterations run the set backwards, so neither the best nor auto
    // always runs right after the other (or after serial).
    for (int i = 0; i < cfg_.confirm; ++i) {
      if (i % 2 == 0)
        for (size_t idx : set) TimeOnce(cands_[idx], false);
      else
        for (auto it = set.rbegin(); it != set.rend(); ++it) TimeOnce(cands_[*it], false);
    }
    Confirmed c;
    c.bounds = MedianBounds();
    c.compute_times = cands_[0].times;
    if (g_.size() > 1) c.comm_times = cands_[1].times;
    c.serial_times = cands_[serial_idx_].times;
    c.best_times = cands_[serial_idx_ + best_row].times;
    const std::vector<double>& ts = c.serial_times;
    const std::vector<double>& tb = c.best_times;
    c.serial = bench::Median(ts);
    c.best = bench::Median(tb);
    // The median over iterations of num[i] / den[i].
    auto paired = [](const std::vector<double>& num, const std::vector<double>& den) {
      std::vector<double> r;
      for (size_t i = 0; i < num.size(); ++i) r.push_back(num[i] / den[i]);
      return bench::Median(r);
    };
    std::vector<double> floor = c.compute_times;
    for (size_t i = 0; i < c.comm_times.size(); ++i) floor[i] = std::max(floor[i], c.comm_times[i]);
    c.serial_over_best_paired = paired(ts, tb);
    c.best_over_floor_paired = paired(tb, floor);
    if (auto_row) {
      c.auto_times = cands_[serial_idx_ + *auto_row].times;
      c.automatic = bench::Median(c.auto_times);
      c.auto_over_best_paired = paired(c.auto_times, tb);
      c.auto_over_serial_paired = paired(c.auto_times, ts);
    }
    return c;
  }

 private:
  void AddOp(Pipeline p, int s) {
    Candidate& c = cands_.emplace_back();
    c.options.pipeline = p;
    if (s > 0) c.options.splits = s;
    c.is_op = true;
    // cands_ never reallocates (reserved), so the reference stays valid.
    c.fn = [this, &c] { c.report = op_.Run(c.options); };
  }

  void TimeOnce(Candidate& c, bool traced) {
    // Every rank toggles at the same point of the same iteration, so a
    // traced run is traced on every rank.
    if (ab_) {
      if (traced)
        trace::Enable(cfg_.trace_ab);
      else
        trace::Disable();
    }
    Barrier(g_).Wait();
    auto t0 = Clock::now();
    c.fn();
    double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    double worst = 0;
    AllReduce(g_, &dt, &worst, 1, DType::kF64, ReduceOp::kMax).Wait();
    (traced ? c.traced_times : c.times).push_back(worst);
  }

  const Group& g_;
  const OpsConfig& cfg_;
  OpCase& op_;
  CollectiveOptions co_;
  bool ab_;
  std::vector<Candidate> cands_;
  size_t serial_idx_ = 0;
};

// The best fixed row (auto is what is judged against it) and auto's row.
// Every rank holds the same (max-reduced) times, so all pick the same.
void PickBest(Results& res) {
  res.best_row = 0;  // serial's
  for (size_t i = 0; i < res.rows.size(); ++i) {
    if (res.rows[i].pipeline == PipelineName(Pipeline::kAuto))
      res.auto_row = i;
    else if (res.rows[i].time_s < res.rows[res.best_row].time_s)
      res.best_row = i;
  }
}

int WriteCalibration(const Group& g, const OpsConfig& cfg, const Bounds& b) {
  if (g.rank() != 0) return 0;
  nlohmann::json j = {{"compute_s", b.tc}, {"comm_s", b.tm}};
  std::ofstream out(cfg.calibrate_out);
  out << j.dump() << "\n";
  return out.good() ? 0 : bench::kExitWrong;
}

int Measure(const Group& g, const OpsConfig& cfg, const core::LinkConfig& link) {
  const OpRunner& runner = *FindRunner(cfg.op);
  std::unique_ptr<OpCase> op = runner.make(g, cfg);
  Sweep sweep(g, cfg, *op, OpCollectiveOptions(link.enabled));
  sweep.CheckAndWarmUp();
  sweep.TimeRoundRobin();
  Results res;
  res.bounds = sweep.MedianBounds();
  if (!cfg.calibrate_out.empty()) return WriteCalibration(g, cfg, res.bounds);
  const bool lead = g.rank() == 0;
  res.ranks = g.size();
  res.deterministic = g.deterministic();
  res.link = link.enabled ? link.Describe() : "none";
  res.rows = sweep.MakeRows();
  res.serial_s = res.rows[0].time_s;
  if (lead) {
    PrintHeader(cfg, res);
    for (const Row& r : res.rows) PrintRow(res, r);
  }
  for (const Row& r : res.rows) res.wrong += r.wrong;
  PickBest(res);
  if (cfg.confirm > 0 && cfg.trace_ab.empty())
    res.confirmed = sweep.Confirm(res.best_row, res.auto_row);
  if (lead) {
    PrintSummary(cfg, res);
    std::fflush(stdout);
    if (!cfg.json_path.empty() && !WriteJson(cfg, res)) return bench::kExitWrong;
  }
  return res.wrong == 0 ? 0 : bench::kExitWrong;
}

}  // namespace

int RunOpsRank(const OpsConfig& cfg) {
  WorldOptions wo;
  wo.link = cfg.link;
  Group g;
  try {
    g = Group::FromEnv(wo);
  } catch (const Error& e) {
    fmt::print(stderr, "mc2 bench ops: cannot join the job: {}\n", e.what());
    return bench::kExitWrong;
  }
  if (cfg.nranks != 0 && cfg.nranks != g.size()) {
    if (g.rank() == 0)
      fmt::print(stderr, "mc2 bench ops: -n {} does not match the job's {} ranks\n", cfg.nranks,
                 g.size());
    return bench::kExitUsage;
  }
  try {
    return Measure(g, cfg, core::ParseLinkConfig(cfg.link, "--link"));
  } catch (const Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "\nmc2 bench ops: rank {}: {}\n", g.rank(), e.what());
    return e.code() == ErrorCode::kInvalidArgument ? bench::kExitUsage : bench::kExitWrong;
  }
}

}  // namespace mc2::tools::bench_ops
