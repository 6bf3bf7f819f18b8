// `mc2 bench ops`: what rank 0 prints (the table, the best row, the
// confirmation, the tracing overhead) and the JSON file.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench.h"
#include "bench_ops.h"
#include "output_paths.h"

namespace mc2::tools::bench_ops {

double Bounds::Floor() const { return std::max(tc, tm); }

std::optional<double> Bounds::Overlap(double t) const {
  const double hide = std::min(tc, tm);
  if (hide <= 0 || BelowFloor(t)) return std::nullopt;
  // (tc + tm - t) / hide, written so that t >= floor gives at most 1
  // exactly, whatever the rounding.
  return 1.0 - (t - Floor()) / hide;
}

double Bounds::Model(int stages) const {
  if (stages == 0) return tc + tm;
  return std::max(tc, tm) + std::min(tc, tm) / stages;
}

namespace {

// "93%", "noise" (below the floor) or "-" (nothing to hide).
std::string OverlapText(const Bounds& b, double t) {
  if (b.BelowFloor(t)) return "noise";
  std::optional<double> o = b.Overlap(t);
  return o ? fmt::format("{:.0f}%", 100 * *o) : "-";
}

nlohmann::json OverlapJson(const Bounds& b, double t) {
  std::optional<double> o = b.Overlap(t);
  return o ? nlohmann::json(*o) : nlohmann::json(nullptr);
}

int ModelStages(const Row& r) { return r.serial ? 0 : r.stages; }

void PrintConfirmed(const OpsConfig& cfg, const Results& res) {
  const Confirmed& c = *res.confirmed;
  const Row& best = res.rows[res.best_row];
  fmt::print(
      "# confirmed ({} fresh round-robin iterations; the sweep's minimum is biased "
      "low): compute-only {:.2f} ms, comm-only {:.2f} ms, floor {:.2f} ms, serial {:.2f} "
      "ms, best {:.2f} ms = {:.2f}x serial, {:.2f}x the floor (median of the iterations' "
      "ratios: {:.3f}x serial, {:.3f}x the floor), overlap {}, model {:.2f} ms",
      cfg.confirm, c.bounds.tc * 1e3, c.bounds.tm * 1e3, c.bounds.Floor() * 1e3, c.serial * 1e3,
      c.best * 1e3, c.serial / c.best, c.best / c.bounds.Floor(), c.serial_over_best_paired,
      c.best_over_floor_paired, OverlapText(c.bounds, c.best),
      c.bounds.Model(ModelStages(best)) * 1e3);
  if (res.auto_row)
    fmt::print(
        "; auto ({}) {:.2f} ms = {:.2f}x the best, {:.2f}x serial (median of "
        "the iterations' ratios: {:.3f}x the best, {:.3f}x serial)",
        res.rows[*res.auto_row].chosen, c.automatic * 1e3, c.automatic / c.best,
        c.automatic / c.serial, c.auto_over_best_paired, c.auto_over_serial_paired);
  fmt::print("\n");
}

// Each row's traced and untraced medians come from the same iterations,
// interleaved: the ratio is side by side.
void PrintTraceAb(const OpsConfig& cfg, const Results& res) {
  fmt::print(
      "#\n# tracing overhead (--trace-ab {}: each iteration timed traced and "
      "untraced, alternating order)\n",
      cfg.trace_ab);
  fmt::print("# {:>8}  {:>6}  {:>10}  {:>10}  {:>7}\n", "pipeline", "splits", "off_ms", "on_ms",
             "on/off");
  std::vector<double> ratios;
  for (const Row& r : res.rows) {
    ratios.push_back(r.traced_s / r.time_s);
    fmt::print("  {:>8}  {:>6}  {:>10.2f}  {:>10.2f}  {:>7.3f}\n", r.pipeline, r.splits,
               r.time_s * 1e3, r.traced_s * 1e3, ratios.back());
  }
  fmt::print("# tracing on/off, median over rows: {:.3f}\n", bench::Median(ratios));
}

nlohmann::json ConfirmedJson(const OpsConfig& cfg, const Results& res) {
  const Confirmed& c = *res.confirmed;
  const Row& best = res.rows[res.best_row];
  nlohmann::json j = {{"iters", cfg.confirm},
                      {"compute_ms", c.bounds.tc * 1e3},
                      {"comm_ms", c.bounds.tm * 1e3},
                      {"floor_ms", c.bounds.Floor() * 1e3},
                      {"serial_ms", c.serial * 1e3},
                      {"best_pipeline", best.pipeline},
                      {"best_splits", best.splits},
                      {"best_stages", best.stages},
                      {"best_ms", c.best * 1e3},
                      {"serial_over_best_paired", c.serial_over_best_paired},
                      {"best_over_floor_paired", c.best_over_floor_paired},
                      {"best_below_floor", c.bounds.BelowFloor(c.best)},
                      {"best_overlap", OverlapJson(c.bounds, c.best)},
                      {"best_model_ms", c.bounds.Model(ModelStages(best)) * 1e3}};
  auto ms = [](const std::vector<double>& v) {
    std::vector<double> out;
    for (double t : v) out.push_back(t * 1e3);
    return out;
  };
  j["iterations_ms"] = {{"compute", ms(c.compute_times)}, {"comm", ms(c.comm_times)},
                        {"serial", ms(c.serial_times)}, {"best", ms(c.best_times)},
                        {"auto", ms(c.auto_times)}};
  if (res.auto_row) {
    j["auto_ran"] = res.rows[*res.auto_row].chosen;
    j["auto_ms"] = c.automatic * 1e3;
    j["auto_over_best_paired"] = c.auto_over_best_paired;
    j["auto_over_serial_paired"] = c.auto_over_serial_paired;
  }
  return j;
}

}  // namespace

void PrintHeader(const OpsConfig& cfg, const Results& res) {
  const OpRunner& runner = *FindRunner(cfg.op);
#ifndef NDEBUG
  fmt::print("# WARNING: debug build, figures are not representative\n");
#endif
  fmt::print(
      "# mc2 bench ops {}: {} ranks, dtype {}, M={} K={} N={} ({}), {:.2f} GFLOP per "
      "rank, iters {}, warmup {}, deterministic {}\n",
      cfg.op, res.ranks, DTypeName(cfg.dtype), cfg.m, cfg.k, cfg.n, runner.shapes,
      GemmFlops(cfg.m, cfg.n, cfg.k) / 1e9, cfg.iters, cfg.warmup, res.deterministic ? 1 : 0);
  if (res.link != "none")
    fmt::print("# emulated link: {}{}\n", res.link,
               cfg.link_auto ? " (--link auto: comm-only calibrated to compute-only)" : "");
  else
    // Shared memory inside a host; across hosts (an mpirun job) the real links.
    fmt::print("# no link emulation\n");
  const Bounds& b = res.bounds;
  fmt::print(
      "# compute-only {:.2f} ms, comm-only {:.2f} ms, floor {:.2f} ms (medians of {} "
      "round-robin iterations with the pipelines, slowest rank)\n",
      b.tc * 1e3, b.tm * 1e3, b.Floor() * 1e3, cfg.iters);
  fmt::print(
      "# floor = max(compute-only, comm-only): no pipeline can be faster; overlap = "
      "(compute-only + comm-only - time) / min(compute-only, comm-only), at most 100% "
      "unless the time beats the floor, then marked noise; model = the pipeline-fill "
      "prediction max + min / stages, not a bound\n");
  fmt::print("#\n# {:>8}  {:>6}  {:>6}  {:>10}  {:>10}  {:>8}  {:>8}  {:>10}  {:>7}  {:>7}  {}\n",
             "pipeline", "splits", "stages", "time_ms", "floor_ms", "vs_floor", "overlap",
             "model_ms", "speedup", "#wrong", "ran");
}

void PrintRow(const Results& res, const Row& r) {
  const Bounds& b = res.bounds;
  fmt::print(
      "  {:>8}  {:>6}  {:>6}  {:>10.2f}  {:>10.2f}  {:>8.2f}  {:>8}  {:>10.2f}  {:>7.2f}  "
      "{:>7}  {}\n",
      r.pipeline, r.splits, r.stages, r.time_s * 1e3, b.Floor() * 1e3, r.time_s / b.Floor(),
      OverlapText(b, r.time_s), b.Model(ModelStages(r)) * 1e3, res.serial_s / r.time_s, r.wrong,
      r.chosen);
}

void PrintSummary(const OpsConfig& cfg, const Results& res) {
  const Row& best = res.rows[res.best_row];
  fmt::print("#\n# best: {} ({}), {:.2f}x serial, {:.2f}x the floor, overlap {}\n", best.pipeline,
             best.chosen, res.serial_s / best.time_s, best.time_s / res.bounds.Floor(),
             OverlapText(res.bounds, best.time_s));
  if (res.confirmed) PrintConfirmed(cfg, res);
  fmt::print("# Out of bounds values : {} {}\n", res.wrong, res.wrong == 0 ? "OK" : "FAILED");
  if (!cfg.trace_ab.empty()) PrintTraceAb(cfg, res);
}

bool WriteJson(const OpsConfig& cfg, const Results& res) {
  const Bounds& b = res.bounds;
  nlohmann::json j = {{"op", cfg.op},
                      {"ranks", res.ranks},
                      {"dtype", DTypeName(cfg.dtype)},
                      {"M", cfg.m},
                      {"K", cfg.k},
                      {"N", cfg.n},
                      {"link", res.link},
                      {"link_auto", cfg.link_auto},
                      {"compute_ms", b.tc * 1e3},
                      {"comm_ms", b.tm * 1e3},
                      {"floor_ms", b.Floor() * 1e3},
                      {"serial_ms", res.serial_s * 1e3}};
  for (const Row& r : res.rows) {
    j["rows"].push_back({{"pipeline", r.pipeline},
                         {"splits", r.splits},
                         {"stages", r.stages},
                         {"time_ms", r.time_s * 1e3},
                         {"floor_ms", b.Floor() * 1e3},
                         {"vs_floor", r.time_s / b.Floor()},
                         {"below_floor", b.BelowFloor(r.time_s)},
                         {"overlap", OverlapJson(b, r.time_s)},
                         {"model_ms", b.Model(ModelStages(r)) * 1e3},
                         {"speedup", res.serial_s / r.time_s},
                         {"wrong", r.wrong},
                         {"ran", r.chosen}});
    if (!cfg.trace_ab.empty()) j["rows"].back()["traced_ms"] = r.traced_s * 1e3;
  }
  if (res.confirmed) j["confirm"] = ConfirmedJson(cfg, res);
  const std::string text = j.dump(2) + "\n";
  const std::string err = WriteOutputFile(cfg.json_path, text);
  if (err.empty()) return true;
  fmt::print(stderr, "mc2 bench ops: cannot write --json {}: {}\n", cfg.json_path, err);
  return false;
}

}  // namespace mc2::tools::bench_ops
