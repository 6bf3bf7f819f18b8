// `mc2 demo fsdp`: sharded data parallelism (models::FsdpTransformer,
// include/mc2/models.h) on N local ranks (N x T with --tp T: the blocks
// then tensor parallel over TP groups of T ranks, FSDP over the N DP
// ranks): the dense transformer trained with its parameters, gradients
// and AdamW state sharded over the DP ranks,
// each unit all-gathered before use, with prefetch depth 0 (none), 1 and 2,
// beside plain data parallelism (the whole model on every rank), on the
// same steps: step time, the communication share, uncovered communication,
// free time, the speedup of prefetch over none, and the bytes of
// parameters, gradients and optimizer state per rank against plain DP and
// against the formula. Checks that every configuration's losses are bitwise
// identical. Writes each configuration's trace and an SVG timeline.
//
// Outside a job the command is the conductor: it checks the options,
// optionally calibrates the emulated link (--link auto: the bandwidth at
// which the forward's all-gathers take --comm-ratio times the forward's
// compute without prefetch, i.e. a unit's all-gather about its compute),
// launches the job (re-executing itself with --rank-job) and analyses the
// traces. Inside the job each rank builds one model per configuration and
// trains them round-robin, step by step; rank 0 writes the results.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "demo_job.h"
#include "demo_model.h"
#include "demo_results.h"
#include "launcher.h"
#include "mc2/mc2.h"
#include "mc2/models.h"
#include "mc2/trace_file.h"
#include "output_paths.h"
#include "trace_tools/analysis.h"
#include "trace_tools/timeline_svg.h"

namespace mc2::tools {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kCommand = "mc2 demo fsdp";

struct FsdpArgs {
  int nranks = 2;  // ranks launched: dp x tp
  int tp = 1;      // x the tensor-parallel ones: ranks launched
  std::string link = "auto";
  double comm_ratio = 1.0;
  std::string prefetch = "0,1,2";
  bool no_dp = false;
  int iters = 3;
  int warmup = 1;
  ModelDims model{.layers = 4, .hidden = 512, .heads = 8, .ffn = 1536, .seq_len = 64, .batch = 8};
  float lr = 3e-3f;
  std::string out = "mc2-demo-fsdp";
  std::string json_path;
  bool rank_job = false;
  std::string columns;  // internal: "dp,0,1,2"
  std::string results;
};

[[noreturn]] void Usage(const std::string& message) { DemoUsage(kCommand, message); }

int Ranks(const FsdpArgs& a) { return a.nranks; }
// The data-parallel size, over which the model is sharded.
int Dp(const FsdpArgs& a) { return a.nranks / a.tp; }

models::TransformerConfig ModelConfig(const FsdpArgs& a) {
  models::TransformerConfig c = TransformerShape(a.model);
  c.lr = a.lr;
  return c;
}

// "dp" (plain data parallelism) or a prefetch depth "0".."2".
std::vector<std::string> ParseColumns(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item != "dp" && item != "0" && item != "1" && item != "2")
      Usage(fmt::format("--prefetch: '{}' is not a depth (0, 1 or 2)", item));
    if (std::find(out.begin(), out.end(), item) != out.end())
      Usage(fmt::format("--prefetch: '{}' given twice", item));
    out.push_back(item);
  }
  if (out.empty()) Usage("--prefetch: no depth given");
  return out;
}

std::string ColumnName(const std::string& col) {
  return col == "dp" ? "dp" : "prefetch-" + col;
}

// Bytes a forward all-gathers on a rank: every unit (a block: its TP
// rank's slices), padded to N shards.
double GatherBytes(const FsdpArgs& a) {
  const ModelDims& m = a.model;
  const double h = m.hidden, f = m.ffn, V = m.vocab, N = Dp(a), p = a.tp;
  auto padded = [&](double n) { return std::ceil(n / N) * N * 4; };
  return padded(V * h) + m.layers * padded(2 * h + (4 * h * h + 3 * h * f) / p) +
         padded(h + h * V);
}

// ---------------------------------------------------------------------------
// The rank side.

int RunRankJob(const FsdpArgs& a) {
  Group world = Group::FromEnv();
  const bool root = world.rank() == 0;
  const models::TransformerConfig c = ModelConfig(a);
  const std::vector<std::string> cols = ParseColumns(a.columns);
  const size_t nc = cols.size();
  std::vector<std::unique_ptr<models::FsdpTransformer>> models;
  for (const std::string& col : cols) {
    models::FsdpOptions o;
    o.shard = col != "dp";
    o.prefetch = col == "dp" ? 0 : std::stoi(col);
    if (a.tp == 1) {
      models.push_back(std::make_unique<models::FsdpTransformer>(world, c, o));
    } else {
      models.push_back(
          std::make_unique<models::FsdpTransformer>(models::MakeGrid(world, a.tp), c, o));
    }
  }
  struct Acc {
    json step = json::array(), fwd = json::array(), bwd = json::array(),
         fwd_wait = json::array(), gather_wait = json::array(), reduce_wait = json::array(),
         losses = json::array();
  };
  std::vector<Acc> acc(nc);
  // Round robin, the starting configuration rotating, so that a change in
  // the machine's load (it may be shared) falls on all alike. Every model
  // trains the same steps from the same weights.
  const int rounds = a.warmup + a.iters;
  for (int it = 0; it < rounds; ++it) {
    for (size_t j = 0; j < nc; ++j) {
      const size_t k = (j + static_cast<size_t>(it)) % nc;
      const bool traced = it == rounds - 1;
      if (traced) trace::Enable((fs::path(a.out) / ColumnName(cols[k])).string());
      const models::FsdpStepStats st = models[k]->TrainStep(it);
      if (traced) StopTrace();
      Acc& r = acc[k];
      r.losses.push_back(st.loss);
      if (it < a.warmup) continue;
      r.step.push_back(st.seconds);
      r.fwd.push_back(st.forward_seconds);
      r.bwd.push_back(st.backward_seconds);
      r.fwd_wait.push_back(st.forward_gather_wait_seconds);
      r.gather_wait.push_back(st.gather_wait_seconds);
      r.reduce_wait.push_back(st.reduce_wait_seconds);
    }
    PrintRound(root, it, rounds, a.warmup);
  }
  json runs = json::array();
  for (size_t k = 0; k < nc; ++k) {
    const models::FsdpMemory m = models[k]->memory();
    runs.push_back({{"config", cols[k]},
                    {"step_seconds", acc[k].step},
                    {"forward_seconds", acc[k].fwd},
                    {"backward_seconds", acc[k].bwd},
                    {"forward_gather_wait_seconds", acc[k].fwd_wait},
                    {"gather_wait_seconds", acc[k].gather_wait},
                    {"reduce_wait_seconds", acc[k].reduce_wait},
                    {"losses", acc[k].losses},
                    {"parameters", m.parameters},
                    {"unsharded_bytes", m.unsharded_bytes},
                    {"persistent_bytes", m.persistent_bytes},
                    {"window_formula_bytes", m.window_formula_bytes},
                    {"peak_transient_bytes", m.peak_transient_bytes},
                    {"peak_bytes", m.peak_bytes},
                    {"trace_dir", (fs::path(a.out) / ColumnName(cols[k])).string()}});
  }
  if (root) {
    return WriteJobResults(a.results, json{{"ranks", world.size()}, {"runs", runs}}, kCommand);
  }
  return 0;
}

// ---------------------------------------------------------------------------
// The conductor.

std::vector<std::string> RankArgv(const FsdpArgs& a, const std::string& columns, int iters,
                                  int warmup, const std::string& out, const std::string& results) {
  JobArgv v("fsdp", results, out, iters, warmup);
  v.Add("--columns", columns);
  v.Add("--nranks", std::to_string(a.nranks));
  v.Add("--tp", std::to_string(a.tp));
  v.Add("--lr", fmt::format("{:.9g}", a.lr));
  std::vector<std::string> argv = v.Take();
  AppendModelArgs(a.model, argv);
  return argv;
}

std::vector<double> Doubles(const json& j) { return j.get<std::vector<double>>(); }

// Bandwidth at which the forward's all-gathers take comm_ratio times the
// forward's compute, without prefetch: two short runs of prefetch 0, raw
// (the bytes and the compute give a first guess), then at that bandwidth
// (the measured all-gather waits, latencies and skew included, correct
// it). The blocks dominate both the bytes and the compute, so at ratio 1
// a block's all-gather takes about its forward.
std::string Calibrate(const FsdpArgs& a, const fs::path& out) {
  auto measure = [&](const std::string& link, const char* name) {
    const fs::path dir = out / "calibrate" / name;
    fs::create_directories(dir);
    const std::string results = (dir / "results.json").string();
    json res = RunDemoJob(Ranks(a), RankArgv(a, "0", 3, 1, dir.string(), results), link, results,
                          kCommand, "calibration");
    const json& run = res["runs"][0];  // the median of 3 steps after 1 warm-up
    const auto fwd = Doubles(run["forward_seconds"]);
    const auto wait = Doubles(run["forward_gather_wait_seconds"]);
    std::vector<double> compute;
    for (size_t i = 0; i < fwd.size(); ++i) compute.push_back(fwd[i] - wait[i]);
    LinkSample m;
    m.bytes = GatherBytes(a);
    m.compute_s = Median(compute);
    m.comm_s = Median(wait);
    return m;
  };
  return tools::CalibrateLink(a.comm_ratio, Dp(a), measure, kCommand);
}

struct RunSummary {
  std::string config;
  double step_ms = 0, fwd_ms = 0, bwd_ms = 0, gather_wait_ms = 0, reduce_wait_ms = 0;
  double fwd_wait_ms = 0;  // the forward's part of gather_wait_ms
  trace::Breakdown b;
  std::vector<double> losses;
  double persistent = 0, window_formula = 0, peak_transient = 0, peak = 0, unsharded = 0;
  std::string trace_json, svg;
};

void CheckArgs(const FsdpArgs& a) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) Usage(what);
  };
  CheckHeads(a.model, kCommand);
  need(a.nranks % a.tp == 0,
       fmt::format("--tp {} must divide -n {} (the data-parallel size is -n / --tp)", a.tp,
                   a.nranks));
  need(a.model.batch % Dp(a) == 0,
       fmt::format("the data-parallel size -n {} / --tp {} = {} must divide --batch {} (each "
                   "replica trains on its sequences)",
                   a.nranks, a.tp, Dp(a), a.model.batch));
  models::ValidateConfig(ModelConfig(a), a.tp, Dp(a));
  ParseColumns(a.prefetch);
  CheckLinkOption(a.link);
}

std::vector<std::string> OwnOutputs() {
  std::vector<std::string> names = {"results.json"};
  AddCalibrationOutputs(names, "prefetch-0");
  AddRunOutputs(names, {"dp", "prefetch-0", "prefetch-1", "prefetch-2"});
  return names;
}

double MiB(double bytes) { return bytes / (1024.0 * 1024.0); }

// One configuration's run from the job's results and its trace (exported
// to `out`).
RunSummary Summarise(const FsdpArgs& a, const json& run, const fs::path& out,
                     const std::string& link) {
  RunSummary s;
  s.config = run["config"].get<std::string>();
  s.step_ms = Median(Doubles(run["step_seconds"])) * 1e3;
  s.fwd_ms = Median(Doubles(run["forward_seconds"])) * 1e3;
  s.bwd_ms = Median(Doubles(run["backward_seconds"])) * 1e3;
  s.gather_wait_ms = Median(Doubles(run["gather_wait_seconds"])) * 1e3;
  s.fwd_wait_ms = Median(Doubles(run["forward_gather_wait_seconds"])) * 1e3;
  s.reduce_wait_ms = Median(Doubles(run["reduce_wait_seconds"])) * 1e3;
  s.losses = Doubles(run["losses"]);
  s.persistent = run["persistent_bytes"].get<double>();
  s.window_formula = run["window_formula_bytes"].get<double>();
  s.peak_transient = run["peak_transient_bytes"].get<double>();
  s.peak = run["peak_bytes"].get<double>();
  s.unsharded = run["unsharded_bytes"].get<double>();
  const std::string name = ColumnName(s.config);
  const RunTrace t = ExportRunTrace(
      run["trace_dir"].get<std::string>(), out, name,
      fmt::format("mc2 demo fsdp: {}, dp {} x tp {}, {}", name, Dp(a), a.tp, LinkTitle(link)));
  for (const auto& st : t.report.steps) s.b += st.b;
  s.trace_json = t.trace_json;
  s.svg = t.svg;
  return s;
}

// The baseline of the speedups: prefetch 0 (sharded, no prefetch); null
// when it did not run.
const RunSummary* Baseline(const std::vector<RunSummary>& runs) {
  for (const auto& r : runs)
    if (r.config == "0") return &r;
  return nullptr;
}

// The table, one column per configuration.
void PrintTable(const FsdpArgs& a, const std::vector<RunSummary>& runs,
                const std::string& link_label) {
  const ModelDims& m = a.model;
  const RunSummary* base = Baseline(runs);
  const RunTable<RunSummary> table(runs, 36, 13);
  auto pct = [](const trace::Breakdown& b, int64_t ns) { return fmt::format("{:.1f}", b.Pct(ns)); };
  fmt::print(
      "\nmc2 demo fsdp: {} layers, hidden {}, {} heads, ffn {}, vocab {}, f32; {} sequences of "
      "{} tokens per step over {} ranks (dp {} x tp {}); {}; {} timed steps after {} warm-up, "
      "medians\n\n",
      m.layers, m.hidden, m.heads, m.ffn, m.vocab, m.batch, m.seq_len, Ranks(a), Dp(a), a.tp,
      link_label, a.iters, a.warmup);
  table.Row("", [](const RunSummary& r) {
    return r.config == "dp" ? "plain DP" : ColumnName(r.config);
  });
  table.Row("step time (ms)", [](const RunSummary& r) { return fmt::format("{:.1f}", r.step_ms); });
  table.Row("  forward (ms)", [](const RunSummary& r) { return fmt::format("{:.1f}", r.fwd_ms); });
  table.Row("  backward (ms)", [](const RunSummary& r) { return fmt::format("{:.1f}", r.bwd_ms); });
  table.Row("  waiting for all-gathers (ms)",
            [](const RunSummary& r) { return fmt::format("{:.1f}", r.gather_wait_ms); });
  table.Row("  waiting for grad reductions (ms)",
            [](const RunSummary& r) { return fmt::format("{:.1f}", r.reduce_wait_ms); });
  table.Row("communication (%)", [&](const RunSummary& r) { return pct(r.b, r.b.comm_ns); });
  table.Row("uncovered comm (%)", [&](const RunSummary& r) {
    return fmt::format("{} {}", pct(r.b, r.b.uncovered_ns),
                       trace::VerdictName(r.b.UncoveredVerdict()));
  });
  table.Row("free time (%)", [&](const RunSummary& r) { return pct(r.b, r.b.free_ns); });
  if (base != nullptr) {
    table.Row("speedup vs prefetch 0", [&](const RunSummary& r) {
      return fmt::format("{:.2f}x", r.step_ms > 0 ? base->step_ms / r.step_ms : 0.0);
    });
  }
  table.Row("memory per rank, peak (MiB)",
            [](const RunSummary& r) { return fmt::format("{:.1f}", MiB(r.peak)); });
  table.Row("  sharded state (MiB)",
            [](const RunSummary& r) { return fmt::format("{:.1f}", MiB(r.persistent)); });
  table.Row("  gathered window, peak (MiB)",
            [](const RunSummary& r) { return fmt::format("{:.1f}", MiB(r.peak_transient)); });
  table.Row("  formula (MiB)", [](const RunSummary& r) {
    return fmt::format("{:.1f}", MiB(r.persistent + r.window_formula));
  });
  table.Row("  vs unsharded (%)", [](const RunSummary& r) {
    return fmt::format("{:.1f}", r.unsharded > 0 ? 100.0 * r.peak / r.unsharded : 0.0);
  });
}

// What the link turned out to be: without prefetch every all-gather is
// waited for whole, so the forward's waits are its all-gathers' time.
// Printed, and returned (0 without a prefetch-0 run).
double PrintLinkCheck(const std::vector<RunSummary>& runs) {
  const RunSummary* base = Baseline(runs);
  if (base == nullptr || base->fwd_ms <= base->fwd_wait_ms) return 0;
  const double gather_over_compute = base->fwd_wait_ms / (base->fwd_ms - base->fwd_wait_ms);
  fmt::print(
      "\nlink check: without prefetch the forward waited {:.1f} ms for its all-gathers and "
      "computed {:.1f} ms: all-gather / compute = {:.2f}\n",
      base->fwd_wait_ms, base->fwd_ms - base->fwd_wait_ms, gather_over_compute);
  return gather_over_compute;
}

// Below the table: what the memory rows count, the losses and where the
// traces are. Returns whether every column's losses are bitwise the first's.
bool PrintLossesAndFiles(const std::vector<RunSummary>& runs) {
  const RunSummary& first = runs.front();
  bool identical = true;
  for (const auto& r : runs) identical = identical && r.losses == first.losses;
  fmt::print(
      "\nmemory: f32 parameters, gradients and AdamW moments (16 bytes per parameter, {:.1f} "
      "MiB unsharded), counted while held; activations not included (the same in every "
      "column). formula: 16 P / N (padded shards) + (1 + prefetch) gathered units + 2 unit "
      "gradients, of the largest unit.\n",
      MiB(first.unsharded));
  fmt::print("losses bitwise identical across the columns (every step, {} of them): {}{}\n",
             first.losses.size(), identical ? "yes" : "NO",
             first.losses.empty() ? std::string()
                                  : fmt::format(" (first {:.6f}, last {:.6f})",
                                                first.losses.front(), first.losses.back()));
  fmt::print("\nThe traced step: the last one of each column, mean over ranks.\n");
  for (const auto& r : runs)
    fmt::print("{:>11}: trace {}\n             timeline {}\n", ColumnName(r.config), r.trace_json,
               r.svg);
  return identical;
}

json ResultsJson(const FsdpArgs& a, const std::vector<RunSummary>& runs, const std::string& link,
                 bool identical, double gather_over_compute) {
  const ModelDims& m = a.model;
  const RunSummary* base = Baseline(runs);
  json j = {{"mode", "fsdp"},
            {"ranks", Ranks(a)},
            {"dp", Dp(a)},
            {"tp", a.tp},
            {"link", link},
            {"layers", m.layers},
            {"hidden", m.hidden},
            {"heads", m.heads},
            {"ffn", m.ffn},
            {"vocab", m.vocab},
            {"batch", m.batch},
            {"seq_len", m.seq_len},
            {"iters", a.iters},
            {"losses_identical", identical},
            {"gather_over_compute_prefetch0", gather_over_compute}};
  for (const auto& r : runs) {
    j["runs"].push_back(
        {{"config", r.config == "dp" ? "plain-dp" : ColumnName(r.config)},
         {"step_ms", r.step_ms},
         {"forward_ms", r.fwd_ms},
         {"backward_ms", r.bwd_ms},
         {"gather_wait_ms", r.gather_wait_ms},
         {"reduce_wait_ms", r.reduce_wait_ms},
         {"comm_pct", r.b.Pct(r.b.comm_ns)},
         {"uncovered_pct", r.b.Pct(r.b.uncovered_ns)},
         {"free_pct", r.b.Pct(r.b.free_ns)},
         {"speedup_vs_prefetch0", base && r.step_ms > 0 ? base->step_ms / r.step_ms : 0.0},
         {"peak_bytes", r.peak},
         {"persistent_bytes", r.persistent},
         {"peak_transient_bytes", r.peak_transient},
         {"formula_bytes", r.persistent + r.window_formula},
         {"unsharded_bytes", r.unsharded}});
  }
  return j;
}

void Conduct(const FsdpArgs& a) {
  const auto t_start = std::chrono::steady_clock::now();
  CheckArgs(a);
  const fs::path out = PrepareDemoOutput(a.out, a.json_path, OwnOutputs());
  std::string columns = a.no_dp ? "" : "dp";
  for (const std::string& c : ParseColumns(a.prefetch)) columns += (columns.empty() ? "" : ",") + c;

  const DemoLink dl = ResolveLink(
      a.link, [&] { return Calibrate(a, out); },
      "the forward's all-gathers without prefetch (a unit's all-gather ~ its forward)",
      a.comm_ratio);
  fmt::print(stderr, "sharded data parallelism on {} ranks (dp {} x tp {}), {}\n", Ranks(a), Dp(a),
             a.tp, dl.label);

  const std::string results = (out / "results.json").string();
  json res = RunDemoJob(Ranks(a), RankArgv(a, columns, a.iters, a.warmup, out.string(), results),
                        dl.spec, results, kCommand, "training");

  std::vector<RunSummary> runs;
  for (const auto& run : res["runs"]) runs.push_back(Summarise(a, run, out, dl.spec));
  PrintTable(a, runs, dl.label);
  const double gather_over_compute = PrintLinkCheck(runs);
  const bool identical = PrintLossesAndFiles(runs);
  FinishDemo(t_start, a.json_path, ResultsJson(a, runs, dl.spec, identical, gather_over_compute),
             identical, kCommand);
}

}  // namespace

void RegisterDemoFsdp(CLI::App& demo) {
  auto a = std::make_shared<FsdpArgs>();
  CLI::App* cmd = demo.add_subcommand(
      "fsdp",
      "Sharded data parallelism (ZeRO-3 / FSDP): parameters, gradients and optimizer state "
      "sharded over the ranks, all-gathered per layer with prefetch 0, 1, 2, beside plain data "
      "parallelism; step time, overlap and memory per rank");
  cmd->add_option("-n,--nranks", a->nranks,
                  "Ranks to launch: the model is sharded over the -n / --tp data-parallel ranks")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--tp", a->tp,
                  "Tensor-parallel group size: each shard holds pieces of its TP rank's slices")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--link", a->link,
                  "Emulated link: auto (calibrated so that the forward's all-gathers without "
                  "prefetch take --comm-ratio x the forward's compute), none (raw shared memory), "
                  "or a spec such as bw=1GB/s,lat=5us (docs/link-emulation.md)")
      ->capture_default_str();
  cmd->add_option("--comm-ratio", a->comm_ratio, "--link auto: all-gather time over compute")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 20.0));
  cmd->add_option("--prefetch", a->prefetch,
                  "Prefetch depths to compare, comma-separated, of 0 (none, the speedups' "
                  "baseline), 1, 2")
      ->capture_default_str();
  cmd->add_flag("--no-dp", a->no_dp, "Leave out the plain data-parallel column");
  cmd->add_option("-i,--iters", a->iters, "Timed steps per configuration")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  cmd->add_option("-w,--warmup", a->warmup, "Untimed steps first")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  AddModelOptions(
      *cmd, a->model,
      {.batch = "Sequences per step (global; the data-parallel size -n / --tp must divide it)",
       .batch_first = true});
  AddSeedOption(*cmd, a->model, "Seed of the weights and the data");
  cmd->add_option("--lr", a->lr, "AdamW learning rate")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--columns", a->columns)->group("");  // internal
  AddDemoEntry(cmd, kCommand,
               {&a->out, &a->json_path, &a->rank_job, &a->results, [a] { return RunRankJob(*a); },
                [a] { Conduct(*a); }});
}

}  // namespace mc2::tools
