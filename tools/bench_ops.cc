// `mc2 bench ops`: benchmarks of the fused compute+communication operators
// (include/mc2/ops.h), and the tuning of their cost model (--tune): the
// command line, and outside an mc2 job the launches.
//
//   mc2 bench ops [-n N] --operator all_gather_matmul|matmul_reduce_scatter|
//       matmul_all_reduce|all_gather_batch_matmul|moe|moe_mlp [-m M -k K -N N]
//       [-d f32|bf16] [--pipelines LIST|all] [--splits s|LIST|sweep]
//       [--link SPEC|auto|none] [-i I] [-w W] [--confirm C] [--json FILE]
//   mc2 bench ops [-n N] --tune [--output FILE] [-m M -k K -N N]
//
// -m, -k and -N are element counts (plain integers, no size suffixes: a
// suffix would suggest bytes). Per configuration rank 0 prints one row per
// pipeline and split count: its time (the median over -i round-robin
// iterations of the slowest rank), the floor max(compute-only, comm-only),
// the overlap, the pipeline-fill model (bench_ops.h defines the three),
// the speedup against serial and #wrong: elements that differ (bitwise)
// from the serial pipeline's result, summed over ranks (deterministic mode
// makes every pipeline bitwise equal to serial). Then the best fixed
// configuration, and its figures re-measured by --confirm: C fresh
// round-robin iterations of compute-only, comm-only, serial, the best and
// auto (odd iterations in reverse order), with auto's ratios to the best
// and to serial also as medians of the iterations' ratios (paired: a slow
// spell of the host slows both sides alike). The sweep's best is the
// minimum of many noisy medians, which its own noise helped make the
// minimum, so ratios against it are biased; the confirmed ones are not.
//
// Like `mc2 bench`, outside an mc2 job the command re-executes itself under
// the launcher with N ranks and a heap sized for the shapes; inside a job
// (`mc2 run -n N mc2 bench ops ...`, or a job of mpirun / `mc2 run --hosts`
// across hosts) it runs on the job's ranks.
// `--link auto` first launches short calibration jobs (compute-only and
// comm-only times) and picks the emulated bandwidth that makes the comm-only
// time equal the compute-only time, then launches the benchmark with it; so
// it needs the benchmark to start its own ranks.
#include "bench_ops.h"

#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench.h"
#include "commands.h"
#include "core/env.h"
#include "core/link_config.h"
#include "launcher.h"
#include "output_paths.h"

namespace mc2::tools {

namespace {

using bench_ops::FindRunner;
using bench_ops::OpsConfig;
using nlohmann::json;

constexpr int kDefaultRanks = 2;
constexpr int kSweepSplits[] = {1, 2, 3, 4, 6, 8, 12, 16};
constexpr size_t kMaxDim = size_t{1} << 24;
constexpr int kMaxIters = 1000000;

struct OpsArgs {
  std::string op;
  std::string old_op;  // --op: refused with a hint
  int nranks = 0;
  std::string dtype = "f32";
  size_t m = 2048, k = 2048, n = 1024;
  std::string pipelines = "all";
  std::string splits = "4";
  std::string link = "none";
  int iters = 5, warmup = 2;
  int confirm = -1;  // -1: as many as --iters
  std::string json;
  bool tune = false;
  std::string output;
  std::string calibrate_out;  // internal: a calibration job writes Tc/Tm here
  std::string trace_ab;       // --trace-ab DIR
};

[[noreturn]] void Usage(const std::string& message) {
  fmt::print(stderr, "mc2 bench ops: {}\n", message);
  throw CLI::RuntimeError(bench::kExitUsage);
}

// Fails before any work when `path` cannot be written (output_paths.h).
// Rank 0 writes the outputs; inside a job the other ranks leave the check
// to it, so that no two ranks probe the same path at once.
void CheckOutput(const std::string& path, const char* flag) {
  if (Group::LaunchedByMc2() && core::GetEnv("MC2_RANK") != "0") return;
  if (Group::LaunchedByMpi() && core::GetEnv("OMPI_COMM_WORLD_RANK").value_or("0") != "0") return;
  try {
    CheckWritableFile(path, flag);
  } catch (const Error& e) {
    Usage(e.message());
  }
}

// "4", "2,4,8" (each 1 to 16) or "sweep"; nullopt if malformed.
std::optional<std::vector<int>> ParseSplits(const std::string& text) {
  if (text == "sweep") return std::vector<int>(std::begin(kSweepSplits), std::end(kSweepSplits));
  std::vector<int> splits;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty() || item.size() > 2 ||
        item.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    const int s = std::stoi(item);
    if (s < 1 || s > 16) return std::nullopt;
    splits.push_back(s);
  }
  if (splits.empty()) return std::nullopt;
  return splits;
}

const CLI::Validator kSplitsValidator(
    [](std::string& text) -> std::string {
      return ParseSplits(text) ? "" : "expected 1 to 16, a list such as 2,4,8, or sweep";
    },
    "1-16|LIST|sweep");

// "all" (chunked, fused and auto) or a comma-separated list of pipelines,
// each once; serial, which always runs as the baseline, is dropped from a
// longer list. Sets *error and returns {} when malformed.
std::vector<Pipeline> ParsePipelineList(const std::string& text, std::string* error = nullptr) {
  if (text == "all") return {Pipeline::kChunked, Pipeline::kFused, Pipeline::kAuto};
  std::vector<Pipeline> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const auto p = ParsePipeline(item);
    std::string why;
    if (!p)
      why =
          fmt::format("'{}' is not a pipeline: expected serial, chunked, fused, auto or all", item);
    else if (std::find(out.begin(), out.end(), *p) != out.end())
      why = fmt::format("'{}' is listed twice", item);
    if (!why.empty()) {
      if (error) *error = why;
      return {};
    }
    out.push_back(*p);
  }
  if (out.empty() && error)
    *error = "expected serial, chunked, fused, auto or a list of them, or all";
  if (out.size() > 1) std::erase(out, Pipeline::kSerial);
  return out;
}

const CLI::Validator kPipelinesValidator(
    [](std::string& text) -> std::string {
      std::string error;
      ParsePipelineList(text, &error);
      return error;
    },
    "LIST|all");

const CLI::Validator kLinkValidator(
    [](std::string& text) -> std::string {
      if (text == "auto" || text == "none") return "";
      try {
        (void)core::ParseLinkConfig(text, "--link");
      } catch (const Error& e) {
        return e.message();
      }
      return "";
    },
    "SPEC|auto|none");

// -m, -k and -N: element counts, so plain integers (a size suffix would
// read as bytes).
const CLI::Validator kDimValidator(
    [](std::string& text) -> std::string {
      const bool digits = !text.empty() && text.size() <= 8 &&
                          text.find_first_not_of("0123456789") == std::string::npos;
      if (digits && std::stoul(text) >= 1 && std::stoul(text) <= kMaxDim) return "";
      return fmt::format("'{}' is invalid: expected an element count from 1 to {}, a plain integer",
                         text, kMaxDim);
    },
    "COUNT");

// The checks CLI11's validators cannot make, and the parsed forms.
OpsConfig Validate(const OpsArgs& a) {
  OpsConfig c;
  if (!a.old_op.empty())
    Usage(
        "--op is the reduction in mc2's other commands; choose the fused operator with "
        "--operator");
  if (!a.tune && a.op.empty())
    Usage(fmt::format("missing --operator: expected one of {}",
                      fmt::join(bench_ops::RunnerNames(), ", ")));
  c.op = a.op;
  c.nranks = a.nranks;
  c.dtype = *ParseDType(a.dtype);
  c.m = a.m;
  c.k = a.k;
  c.n = a.n;
  c.pipelines = ParsePipelineList(a.pipelines);
  c.splits = *ParseSplits(a.splits);
  c.link = a.link;
  c.iters = a.iters;
  c.warmup = a.warmup;
  c.confirm = a.confirm == -1 ? a.iters : a.confirm;
  c.json_path = a.json;
  c.calibrate_out = a.calibrate_out;
  c.trace_ab = a.trace_ab;
  return c;
}

// The arguments of a job that runs `c` (the launched ranks re-parse them).
std::vector<std::string> JobArgs(const OpsConfig& c, const std::string& link, bool link_auto,
                                 const std::string& extra_flag = {},
                                 const std::string& extra_value = {}) {
  std::vector<std::string> v = {SelfExe(), "bench", "ops", "--operator", c.op};
  auto add = [&v](const char* flag, std::string value) {
    v.push_back(flag);
    v.push_back(std::move(value));
  };
  add("-m", std::to_string(c.m));
  add("-k", std::to_string(c.k));
  add("-N", std::to_string(c.n));
  add("--dtype", DTypeName(c.dtype));
  add("--link", link);
  add("--iters", std::to_string(c.iters));
  add("--warmup", std::to_string(c.warmup));
  add("--confirm", std::to_string(c.confirm));
  std::vector<std::string> names;
  for (Pipeline p : c.pipelines) names.push_back(PipelineName(p));
  add("--pipelines", fmt::format("{}", fmt::join(names, ",")));
  add("--splits", fmt::format("{}", fmt::join(c.splits, ",")));
  if (!c.json_path.empty()) v.insert(v.end(), {"--json", c.json_path});
  if (!c.trace_ab.empty()) v.insert(v.end(), {"--trace-ab", c.trace_ab});
  if (link_auto) v.push_back("--link-was-auto");
  if (!extra_flag.empty()) v.insert(v.end(), {extra_flag, extra_value});
  return v;
}

int Launch(int nranks, std::vector<std::string> argv, size_t heap) {
  LaunchOptions lo;
  lo.nranks = nranks;
  lo.argv = std::move(argv);
  lo.prefix_output = false;
  lo.direct_output = true;
  lo.heap_bytes = heap;
  return RunLaunch(lo);
}

// --link auto: the bandwidth that makes comm-only equal compute-only.
// Launch 1 (no link) gives Tc and the raw comm time Tm0; the serial
// collective puts P bytes on a port (the cost model's ring accounting), so
// the first guess is bw = P / (Tc - Tm0). Three launches under a link then
// refine it (see below).
std::optional<std::string> CalibrateLink(const OpsConfig& c, int nranks, size_t heap) {
  const bench_ops::OpRunner& runner = *FindRunner(c.op);
  const std::string tmp =
      (std::filesystem::temp_directory_path() / fmt::format("mc2-calib-{}.json", getpid()))
          .string();
  OpsConfig quick = c;
  quick.iters = 3;
  quick.warmup = 1;
  quick.json_path.clear();
  quick.trace_ab.clear();
  auto measure = [&](const std::string& link) -> std::optional<std::pair<double, double>> {
    std::filesystem::remove(tmp);
    if (Launch(nranks, JobArgs(quick, link, false, "--calibrate-out", tmp), heap) != 0)
      return std::nullopt;
    std::ifstream in(tmp);
    json j;
    try {
      in >> j;
    } catch (...) {
      return std::nullopt;
    }
    std::filesystem::remove(tmp);
    return std::pair{j.at("compute_s").get<double>(), j.at("comm_s").get<double>()};
  };
  auto raw = measure("none");
  if (!raw) return std::nullopt;
  auto [tc, tm0] = *raw;
  // Port bytes: the model's link time at 1 byte/s without latency.
  ops::Environment unit;
  unit.link_bytes_per_second = 1;
  const double port = runner.port_bytes ? runner.port_bytes(c, nranks)
                                        : ops::Predict(ops::CostParams::Defaults(), unit,
                                                       bench_ops::ProblemOf(runner, c, nranks),
                                                       Pipeline::kSerial, 1)
                                              .comm_link_s;
  if (tc <= tm0 * 1.05 || port <= 0) {
    fmt::print(stderr,
               "mc2 bench ops: --link auto: comm-only on raw shm ({:.2f} ms) already takes as "
               "long as compute-only ({:.2f} ms): no emulated link can balance them; use a "
               "larger K or --link none\n",
               tm0 * 1e3, tc * 1e3);
    return std::nullopt;
  }
  const std::string lat = "lat=5us";
  auto spec = [&](double t) { return fmt::format("bw={:.0f}B/s,{}", port / t, lat); };
  // Comm-only under a link of time L (port / bw) is modelled as tm0 + k L:
  // the link's time plus the copies, which do not add exactly (k != 1).
  // Each launch measures k at its L, and the next L solves tm0 + k L = Tc
  // with Tc the mean of every launch's compute-only, since one launch's Tc
  // is only 3 iterations and a busy phase of the host can move it. Three
  // launches under a link; the last L is used.
  std::vector<double> tcs = {tc};
  auto mean_tc = [&] { return std::accumulate(tcs.begin(), tcs.end(), 0.0) / double(tcs.size()); };
  double link_time = tc - tm0;
  for (int step = 0; step < 3; ++step) {
    auto emu = measure(spec(link_time));
    if (!emu) return std::nullopt;
    tcs.push_back(emu->first);
    const double k = std::max(0.2, (emu->second - tm0) / link_time);
    fmt::print(stderr,
               "mc2 bench ops: --link auto: at {} Tc {:.2f} ms, Tm {:.2f} ms (mean Tc so far "
               "{:.2f} ms)\n",
               spec(link_time), emu->first * 1e3, emu->second * 1e3, mean_tc() * 1e3);
    // At most a factor 2 per step: one noisy measurement cannot swing it.
    link_time = std::clamp((mean_tc() - tm0) / k, link_time / 2, link_time * 2);
  }
  return spec(link_time);
}

// --tune: in a job, measure on its ranks; outside, launch them.
void RunTune(const OpsArgs& a, const OpsConfig& cfg) {
  std::string path = a.output;
  if (path.empty()) {
    // The default file lives in mc2's own cache directory, made if needed.
    path = ops::CostParamsPath();
    if (path.empty()) Usage("--tune: no output path (set --output or HOME)");
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  }
  CheckOutput(path, "--output");
  if (Group::LaunchedByMc2()) {
    const int status = bench_ops::RunTuneRank(cfg, path);
    if (status != 0) throw CLI::RuntimeError(status);
    return;
  }
  const int nr = cfg.nranks ? cfg.nranks : kDefaultRanks;
  std::vector<std::string> argv = {SelfExe(),  "bench",
                                   "ops",      "--tune",
                                   "--output", path,
                                   "-m",       std::to_string(cfg.m),
                                   "-k",       std::to_string(cfg.k),
                                   "-N",       std::to_string(cfg.n)};
  const int status = Launch(nr, argv, tools::kDefaultHeapBytes);
  if (status != 0) throw CLI::RuntimeError(status);
}

void RunOpsCallback(const OpsArgs& a, bool link_was_auto) {
  OpsConfig cfg = Validate(a);
  if (a.tune) return RunTune(a, cfg);
  if (!cfg.json_path.empty()) CheckOutput(cfg.json_path, "--json");
  // Inside a job of `mc2 run`, or of mpirun / `mc2 run --hosts` (ranks on
  // several hosts: the operators run over the real links between them).
  if (Group::LaunchedByMc2() || Group::LaunchedByMpi()) {
    if (cfg.link == "auto")
      Usage("--link auto needs to start its own ranks (run `mc2 bench ops` outside `mc2 run`)");
    cfg.link_auto = link_was_auto;
    ReserveStdoutForJson(cfg.json_path);
    const int status = bench_ops::RunOpsRank(cfg);
    if (status != 0) throw CLI::RuntimeError(status);
    return;
  }
  const int nr = cfg.nranks ? cfg.nranks : kDefaultRanks;
  const size_t heap = bench_ops::HeapBytesFor(*FindRunner(cfg.op), cfg, nr);
  std::string link = cfg.link;
  bool was_auto = false;
  if (link == "auto") {
    if (nr < 2) Usage("--link auto needs at least 2 ranks");
    auto spec = CalibrateLink(cfg, nr, heap);
    if (!spec) throw CLI::RuntimeError(bench::kExitWrong);
    link = *spec;
    was_auto = true;
  }
  const int status = Launch(nr, JobArgs(cfg, link, was_auto), heap);
  if (status != 0) throw CLI::RuntimeError(status);
}

constexpr const char* kColumns =
    "Columns:\n"
    "  time_ms   median over round-robin iterations of the slowest rank's time\n"
    "  floor_ms  max(compute-only, comm-only), timed in the same iterations: no pipeline can\n"
    "            be faster\n"
    "  vs_floor  time / floor\n"
    "  overlap   (compute-only + comm-only - time) / min(compute-only, comm-only): at most\n"
    "            100%; `noise` when a time beats the floor (only the medians' noise can)\n"
    "  model_ms  the pipeline-fill prediction max + min / stages (stages = splits for chunked,\n"
    "            ranks x splits for fused): a prediction, not a bound\n"
    "  speedup   serial / time\n"
    "  #wrong    elements that differ bitwise from serial's result, summed over ranks\n"
    "-m, -k and -N are element counts: plain integers, no size suffixes.";

}  // namespace

void RegisterBenchOps(CLI::App& bench) {
  auto a = std::make_shared<OpsArgs>();
  auto link_was_auto = std::make_shared<bool>(false);
  CLI::App* cmd = bench.add_subcommand(
      "ops",
      "Benchmark a fused operator's pipelines against compute-only, comm-only and their floor, "
      "or --tune the `auto` pipeline's cost model");
  cmd->footer(kColumns);
  cmd->add_option("--operator", a->op, "The fused operator")
      ->check(CLI::IsMember(bench_ops::RunnerNames()));
  cmd->add_option("--op", a->old_op)->group("");  // refused with a hint
  cmd->add_option("-n,--nranks", a->nranks, "Ranks (default 2; inside a job: the job's size)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("-d,--dtype", a->dtype, "Element type of A and B")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("-m", a->m, "Rows M of the per-rank GEMM (an element count)")
      ->check(kDimValidator)
      ->capture_default_str();
  cmd->add_option("-k", a->k, "Inner dimension K of the per-rank GEMM (an element count)")
      ->check(kDimValidator)
      ->capture_default_str();
  cmd->add_option("-N", a->n, "Columns N of the per-rank GEMM (an element count)")
      ->check(kDimValidator)
      ->capture_default_str();
  cmd->add_option("--pipelines", a->pipelines,
                  "Pipelines to time besides serial, comma-separated: chunked, fused, auto "
                  "(serial alone: only serial); all: chunked,fused,auto")
      ->check(kPipelinesValidator)
      ->capture_default_str();
  cmd->add_option("--splits", a->splits, "Chunks per block, 1-16, a list (2,4,8), or sweep")
      ->check(kSplitsValidator)
      ->capture_default_str();
  cmd->add_option("--link", a->link,
                  "Emulated link (e.g. bw=10GB/s,lat=5us), auto (comm-only = compute-only) or "
                  "none")
      ->check(kLinkValidator)
      ->capture_default_str();
  cmd->add_option("-i,--iters", a->iters, "Timed iterations")
      ->check(CLI::Range(1, kMaxIters))
      ->capture_default_str();
  cmd->add_option("-w,--warmup", a->warmup, "Untimed iterations")
      ->check(CLI::Range(0, kMaxIters))
      ->capture_default_str();
  cmd->add_option("--confirm", a->confirm,
                  "After the sweep, re-time compute-only, comm-only, serial, the best and auto "
                  "side by side for this many iterations (default: --iters; 0: off), since the "
                  "best of many noisy medians is biased low")
      ->check(CLI::Range(0, kMaxIters));
  cmd->add_option("--json", a->json,
                  "Also write the rows to this JSON file (- for standard output; checked writable before the run)");
  cmd->add_option("--trace-ab", a->trace_ab,
                  "Measure tracing's cost: time every configuration traced (into this "
                  "directory) and untraced in each iteration, alternating, and print both");
  cmd->add_flag("--tune", a->tune,
                "Measure the cost model's parameters (GEMM rate, collectives, per-step costs, "
                "raw-shm overlap) and write the operator tuning file");
  cmd->add_option("-o,--output", a->output,
                  "--tune: the file to write (default MC2_OPS_TUNING_FILE, else "
                  "~/.cache/mc2/ops_tuning.json; checked writable before the run)");
  cmd->add_option("--calibrate-out", a->calibrate_out)->group("");  // internal
  cmd->add_flag("--link-was-auto", *link_was_auto)->group("");     // internal
  cmd->callback([a, link_was_auto] { RunOpsCallback(*a, *link_was_auto); });
}

}  // namespace mc2::tools
