// `mc2 demo`: the main demonstration. Trains the reference transformer
// (include/mc2/models.h) on N local ranks over an emulated accelerator link,
// once per pipeline (serial, then the overlapped ones), and prints them side
// by side: step time, communication share, uncovered communication, free
// time, compute utilisation, tokens/s, speedup, and whether the losses are
// bitwise identical. Writes each run's trace and an SVG timeline.
//
// Outside a job the command is the conductor: it calibrates the link (a
// short serial run with no emulation, traced, gives each rank's compute time
// and bytes communicated per step; the emulated bandwidth is set so that the
// communication of a step takes as long as its compute, the case where
// hiding it matters most), launches the training job (re-executing itself
// with --rank-job under the launcher), then analyses the traces. Inside the
// job each rank trains every pipeline in turn; rank 0 writes the results.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
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
#include "demo_grad_sync.h"
#include "trace_tools/analysis.h"
#include "trace_tools/timeline_svg.h"

namespace mc2::tools {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The split count of the chunked and fused pipelines when --splits is not
// given: the smallest that keeps both the speedup and the uncovered
// communication targets on the default model (docs/benchmarks.md). The
// demo's GEMMs are large enough that finer chunks hide more of the link
// than the fused operators' default (4) does.
constexpr int kModelSplits = 16;

struct DemoArgs {
  // Two ranks by default: one per core here, so that what overlaps is the
  // link and the compute, not two ranks time-sharing a core.
  int nranks = 2;
  int tp = 0;  // 0: every rank in one TP group (or -n / --dp)
  int dp = 0;  // 0: -n / --tp
  std::string link = "auto";
  double comm_ratio = 0.75;  // --link auto: communication / compute per step
  std::string pipelines = "serial,chunked,fused,auto";
  int splits = 0;  // 0: the model's own split count, kModelSplits
  int steps = 3;
  int warmup = 1;
  ModelDims model;  // its defaults are the demo's
  std::string dtype = "f32";                  // of the GEMM inputs: f32 or bf16
  int moe_experts = 0, moe_topk = 2, ep = 1;  // MoE MLPs (0: dense) and the EP size
  // AdamW's learning rate. Lower than the library's default (tuned on small
  // models): Adam's first steps move every weight by about lr at once, a
  // large fraction of its scale at hidden 1024, and the loss then jumps
  // instead of falling.
  float lr = 3e-4f;
  std::string out = "mc2-demo";
  std::string json_path;
  // Internal: the rank side of the job, and where rank 0 leaves results.
  bool rank_job = false;
  std::string results;
};

[[noreturn]] void Usage(const std::string& message) { DemoUsage("mc2 demo", message); }

models::TransformerConfig ModelConfig(const DemoArgs& a) {
  models::TransformerConfig c = TransformerShape(a.model);
  c.lr = a.lr;
  c.gemm_dtype = a.dtype == "bf16" ? DType::kBF16 : DType::kF32;
  c.fused.splits = a.splits ? a.splits : kModelSplits;
  c.moe_experts = a.moe_experts;
  c.moe_topk = a.moe_topk;
  return c;
}

// ---------------------------------------------------------------------------
// The rank side: train every pipeline from the same initial weights.

int RunRankJob(const DemoArgs& a) {
  Group world = Group::FromEnv();
  const bool root = world.rank() == 0;
  const int tp = a.tp ? a.tp : world.size();
  json results = json::array();
  for (Pipeline p : ParsePipelines(a.pipelines, "mc2 demo")) {
    models::TransformerConfig c = ModelConfig(a);
    c.fused.pipeline = p;
    const std::string dir = (fs::path(a.out) / PipelineName(p)).string();
    const int total = a.warmup + a.steps;
    json losses = json::array(), seconds = json::array();
    std::vector<double> block_ms;
    int64_t tokens = 0;
    auto t0 = std::chrono::steady_clock::now();
    if (a.warmup == 0) trace::Enable(dir);  // no warm-up: every step is traced
    models::TrainSteps(world, c, tp, a.ep, total, [&](const models::StepStats& s) {
      losses.push_back(s.loss);
      // The warm-up steps pay for first-call set-up (GEMM primitives, heap):
      // tracing starts after them, so the reports cover only timed steps.
      if (s.step + 1 == a.warmup) trace::Enable(dir);
      if (s.step >= a.warmup) {
        seconds.push_back(s.seconds);
        tokens = s.tokens;
        if (block_ms.empty()) block_ms.assign(s.block_forward_seconds.size(), 0.0);
        for (size_t l = 0; l < block_ms.size(); ++l)
          block_ms[l] += (s.block_forward_seconds[l] + s.block_backward_seconds[l]) * 1e3 /
                         a.steps;
      }
      if (root) {
        double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        fmt::print(stderr, "  {:>8}  step {}/{}{}  loss {:.5f}  {:7.1f} ms  ({:.0f} s)\n",
                   PipelineName(p), s.step + 1, total, s.step < a.warmup ? " (warm-up)" : "",
                   s.loss, s.seconds * 1e3, el);
      }
    });
    trace::Flush();
    trace::Disable();
    results.push_back({{"pipeline", PipelineName(p)},
                       {"losses", losses},
                       {"step_seconds", seconds},
                       {"block_ms", block_ms},
                       {"tokens", tokens},
                       {"trace_dir", dir}});
  }
  if (root) {
    return WriteJobResults(a.results, json{{"ranks", world.size()}, {"tp", tp}, {"runs", results}},
                           "mc2 demo");
  }
  return 0;
}

// ---------------------------------------------------------------------------
// The conductor.

std::vector<std::string> RankArgv(const DemoArgs& a, const std::string& pipelines, int steps,
                                  int warmup, const std::string& out,
                                  const std::string& results) {
  JobArgv v(nullptr, results, out, steps, warmup);
  v.Add("--pipelines", pipelines);
  v.Add("--splits", std::to_string(a.splits ? a.splits : kModelSplits));
  v.Add("--tp", std::to_string(a.tp));
  v.Add("--lr", fmt::format("{:.9g}", a.lr));
  v.Add("--dtype", a.dtype);
  if (a.moe_experts > 0) {
    v.Add("--moe-experts", std::to_string(a.moe_experts));
    v.Add("--moe-topk", std::to_string(a.moe_topk));
    v.Add("--ep", std::to_string(a.ep));
  }
  std::vector<std::string> argv = v.Take();
  AppendModelArgs(a.model, argv);
  return argv;
}

// Emulated link at which a step's communication takes `comm_ratio` times
// its compute (measured in serial mode over the whole run), so that hiding
// the communication is what decides the step time.
std::string CalibrateLink(const DemoArgs& a, const fs::path& out) {
  auto measure = [&](const std::string& link, const char* name) {
    trace::Report r = CalibrationRun(
        out / "calibrate" / name, [&](const std::string& dir, const std::string& results) {
          return LaunchDemoJob(a.nranks, RankArgv(a, "serial", 1, 1, dir, results), link);
        });
    LinkSample m;
    m.bytes = CommBytesPerRank(r);
    m.compute_s = r.overall.compute_ns * 1e-9;
    m.comm_s = r.overall.comm_ns * 1e-9;
    if (m.compute_s <= 0 || m.bytes <= 0)
      throw Error(ErrorCode::kInternal,
                  "mc2 demo: the calibration run recorded no compute or no communication");
    return m;
  };
  // With TP groups of tp > 1 the TP collectives dominate, n = tp; with
  // tp == 1 every collective is a DP, EP or world one: n = the world (tp
  // alone would give a factor of 0, hence a bandwidth of 0).
  const int tp = a.tp ? a.tp : a.nranks;
  return tools::CalibrateLink(a.comm_ratio, tp > 1 ? tp : a.nranks, measure, "mc2 demo");
}

struct RunSummary {
  std::string pipeline;
  double step_ms = 0;
  double block_ms = 0;
  double tokens_per_s = 0;
  trace::Breakdown b;
  GradSyncOverlap grad;  // the gradient all-reduces and what hid them
  int timed_steps = 0;
  std::string ran;  // the pipelines the fused operators reported
  std::vector<double> losses;
  std::string trace_json, svg;

  // The gradient all-reduces' time per step and rank.
  double GradMs() const {
    return grad.comm_ns / 1e6 / (std::max(1, grad.ranks) * std::max(1, timed_steps));
  }
};

// Every relation between the options that the model needs, named as the
// user typed them; models::ValidateConfig (which names the config fields)
// stays the final word.
void CheckArgs(const DemoArgs& a) {
  const ModelDims& m = a.model;
  const int tp = a.tp ? a.tp : a.nranks;
  const int dp = a.nranks / tp;
  auto need = [](bool ok, const std::string& what) {
    if (!ok) Usage(what);
  };
  need(a.nranks % tp == 0, fmt::format("--tp {} must divide -n {}", tp, a.nranks));
  CheckHeads(m, "mc2 demo");
  need(m.heads % tp == 0,
       fmt::format("--tp {} must divide --heads {} (heads are split across the TP ranks)", tp,
                   m.heads));
  need(m.ffn % tp == 0, fmt::format("--tp {} must divide --ffn {}", tp, m.ffn));
  need(m.seq_len % tp == 0,
       fmt::format("--tp {} must divide --seq-len {} (the sequence is sharded across the TP "
                   "ranks)",
                   tp, m.seq_len));
  need(m.batch % dp == 0,
       fmt::format("the data-parallel size -n {} / --tp {} = {} must divide --batch {}", a.nranks,
                   tp, dp, m.batch));
  need(dp % a.ep == 0,
       fmt::format("--ep {} must divide the data-parallel size -n {} / --tp {} = {}", a.ep,
                   a.nranks, tp, dp));
  need(a.ep == 1 || a.moe_experts > 0,
       fmt::format("--ep {} needs --moe-experts > 0 (a dense model has nothing to spread)", a.ep));
  if (a.moe_experts > 0) {
    need(a.moe_experts % a.ep == 0,
         fmt::format("--ep {} must divide --moe-experts {}", a.ep, a.moe_experts));
    need(a.moe_topk >= 1 && a.moe_topk <= a.moe_experts,
         fmt::format("--moe-topk {} must be in 1..--moe-experts {}", a.moe_topk, a.moe_experts));
  }
  models::ValidateConfig(ModelConfig(a), tp, dp, a.ep);
  ParsePipelines(a.pipelines, "mc2 demo");
  CheckLinkOption(a.link);
}

// What a demo run writes into its --output directory (output_paths.h): only
// these are removed when a directory of an earlier run is reused.
std::vector<std::string> OwnOutputs() {
  std::vector<std::string> names = {"results.json"};
  AddRunOutputs(names, {"serial", "chunked", "fused", "auto"});
  AddCalibrationOutputs(names, "serial");
  return names;
}

// One pipeline's run from the job's results and its trace (exported to
// `out`).
RunSummary Summarise(const DemoArgs& a, const json& run, const fs::path& out,
                     const std::string& link) {
  RunSummary s;
  s.pipeline = run["pipeline"].get<std::string>();
  s.losses = run["losses"].get<std::vector<double>>();
  auto secs = run["step_seconds"].get<std::vector<double>>();
  s.step_ms = Median(secs) * 1e3;
  auto blocks = run["block_ms"].get<std::vector<double>>();
  for (double b : blocks) s.block_ms += b / std::max<size_t>(blocks.size(), 1);
  s.tokens_per_s = s.step_ms > 0 ? run["tokens"].get<double>() / (s.step_ms * 1e-3) : 0;
  const RunTrace t = ExportRunTrace(
      run["trace_dir"].get<std::string>(), out, s.pipeline,
      fmt::format("mc2 demo: {} pipeline, {} ranks, {}", s.pipeline, a.nranks, LinkTitle(link)),
      /*last_step_only=*/true);
  s.b = t.report.overall;
  s.grad = AnalyzeGradSync(t.data);
  s.timed_steps = static_cast<int>(t.report.steps.size());
  std::map<std::string, int64_t> ran;
  for (const auto& op : t.report.operators)
    for (const auto& [name, calls] : op.pipelines) ran[name] += calls;
  for (const auto& [name, calls] : ran)
    s.ran += fmt::format("{}{} ({} calls)", s.ran.empty() ? "" : ", ", name, calls);
  if (s.ran.empty()) s.ran = "-";
  s.trace_json = t.trace_json;
  s.svg = t.svg;
  return s;
}

// The table, one column per pipeline.
void PrintTable(const DemoArgs& a, const std::vector<RunSummary>& runs,
                const std::string& link_label) {
  const ModelDims& m = a.model;
  const int tp = a.tp ? a.tp : a.nranks;
  const RunSummary& base = runs.front();
  const RunTable<RunSummary> table(runs, 30, 14);
  fmt::print(
      "\nmc2 demo: {} layers, hidden {}, {} heads, ffn {}, {} x {} tokens per step, {} "
      "GEMMs, {} ranks (tp {}, dp {})\n{}; {} timed steps after {} warm-up, medians\n\n",
      m.layers, m.hidden, m.heads, m.ffn, m.batch, m.seq_len, a.dtype, a.nranks, tp, a.nranks / tp,
      link_label, a.steps, a.warmup);
  table.Row("", [](const RunSummary& r) { return r.pipeline; });
  table.Row("step time (ms)", [](const RunSummary& r) { return fmt::format("{:.1f}", r.step_ms); });
  table.Row("fwd+bwd per block (ms)",
            [](const RunSummary& r) { return fmt::format("{:.1f}", r.block_ms); });
  table.Row("communication (% of step)",
            [](const RunSummary& r) { return fmt::format("{:.1f}", r.b.Pct(r.b.comm_ns)); });
  table.Row("uncovered comm (% of step)", [](const RunSummary& r) {
    return fmt::format("{:.1f} {}", r.b.Pct(r.b.uncovered_ns),
                       trace::VerdictName(r.b.UncoveredVerdict()));
  });
  table.Row("free time (% of step)", [](const RunSummary& r) {
    return fmt::format("{:.1f} {}", r.b.Pct(r.b.free_ns), trace::VerdictName(r.b.FreeVerdict()));
  });
  table.Row("compute utilisation (%)",
            [](const RunSummary& r) { return fmt::format("{:.1f}", r.b.Pct(r.b.compute_ns)); });
  // The gradient all-reduces (GradSync): their time per step and rank, and
  // the share of it the backward's compute hid.
  table.Row("gradient all-reduce (ms)", [](const RunSummary& r) {
    return r.grad.calls ? fmt::format("{:.1f}", r.GradMs()) : std::string("-");
  });
  table.Row("  hidden under compute (%)", [](const RunSummary& r) {
    return r.grad.calls ? fmt::format("{:.1f}", r.grad.HiddenPct()) : std::string("-");
  });
  table.Row("tokens/s", [](const RunSummary& r) { return fmt::format("{:.0f}", r.tokens_per_s); });
  table.Row("speedup vs serial", [&](const RunSummary& r) {
    return fmt::format("{:.2f}x", r.step_ms > 0 ? base.step_ms / r.step_ms : 0.0);
  });
}

// Below the table: the losses, what the fused operators ran and where the
// traces are. Returns whether every pipeline's losses are bitwise the
// serial run's.
bool PrintLossesAndFiles(const std::vector<RunSummary>& runs, const fs::path& out) {
  const RunSummary& base = runs.front();
  bool identical = true;
  for (const auto& r : runs) identical = identical && r.losses == base.losses;
  fmt::print("\nlosses identical across pipelines (every step, bitwise): {}\n",
             identical ? "yes" : "NO");
  std::string loss_line;
  for (double l : base.losses) loss_line += fmt::format(" {:.5f}", l);
  fmt::print("losses by step:{}\n", loss_line);
  fmt::print("\nWhat the fused operators ran:\n");
  for (const auto& r : runs) fmt::print("{:>8}: {}\n", r.pipeline, r.ran);
  fmt::print("\nPer rank, mean over ranks, timed steps only (mc2 trace report {} for details).\n",
             (out / runs.back().pipeline).string());
  for (const auto& r : runs) fmt::print("{:>8}: trace {}\n          timeline {}\n", r.pipeline,
                                        r.trace_json, r.svg);
  return identical;
}

json ResultsJson(const DemoArgs& a, const std::vector<RunSummary>& runs, const std::string& link,
                 bool identical) {
  const int tp = a.tp ? a.tp : a.nranks;
  const RunSummary& base = runs.front();
  json j = {{"ranks", a.nranks}, {"tp", tp},     {"dp", a.nranks / tp},
            {"link", link},      {"losses_identical", identical}};
  for (const auto& r : runs)
    j["runs"].push_back({{"pipeline", r.pipeline}, {"ran", r.ran}, {"step_ms", r.step_ms},
                         {"block_ms", r.block_ms}, {"tokens_per_s", r.tokens_per_s},
                         {"comm_pct", r.b.Pct(r.b.comm_ns)},
                         {"uncovered_pct", r.b.Pct(r.b.uncovered_ns)},
                         {"free_pct", r.b.Pct(r.b.free_ns)},
                         {"compute_pct", r.b.Pct(r.b.compute_ns)},
                         {"speedup", r.step_ms > 0 ? base.step_ms / r.step_ms : 0.0},
                         {"grad_all_reduces", r.grad.calls},
                         {"grad_all_reduce_ms", r.GradMs()},
                         {"grad_hidden_pct", r.grad.HiddenPct()},
                         {"losses", r.losses}});
  return j;
}

void Conduct(const DemoArgs& a) {
  const auto t_start = std::chrono::steady_clock::now();
  // Every argument is checked before the file system is touched, and no
  // rank starts before both.
  CheckArgs(a);
  const fs::path out = PrepareDemoOutput(a.out, a.json_path, OwnOutputs());
  const int tp = a.tp ? a.tp : a.nranks;
  auto pipelines = ParsePipelines(a.pipelines, "mc2 demo");

  const DemoLink dl = ResolveLink(
      a.link, [&] { return CalibrateLink(a, out); }, "communication per serial step",
      a.comm_ratio);
  fmt::print(stderr, "training on {} ranks (tp {}), {}\n", a.nranks, tp, dl.label);

  const std::string results = (out / "results.json").string();
  json res = RunDemoJob(
      a.nranks, RankArgv(a, PipelineList(pipelines), a.steps, a.warmup, out.string(), results),
      dl.spec, results, "mc2 demo", "training");

  std::vector<RunSummary> runs;
  for (const auto& run : res["runs"]) runs.push_back(Summarise(a, run, out, dl.spec));
  PrintTable(a, runs, dl.label);
  const bool identical = PrintLossesAndFiles(runs, out);
  FinishDemo(t_start, a.json_path, ResultsJson(a, runs, dl.spec, identical), identical,
             "mc2 demo");
}

// --dp: the TP size follows (or must agree).
void ResolveDp(DemoArgs& a) {
  if (a.dp == 0) return;
  if (a.nranks % a.dp != 0) Usage(fmt::format("--dp {} must divide -n {}", a.dp, a.nranks));
  if (a.tp == 0) a.tp = a.nranks / a.dp;
  if (a.tp * a.dp != a.nranks)
    Usage(fmt::format("--tp {} x --dp {} must be -n {}", a.tp, a.dp, a.nranks));
}

}  // namespace

void RegisterDemo(CLI::App& app) {
  auto a = std::make_shared<DemoArgs>();
  CLI::App* cmd = app.add_subcommand(
      "demo",
      "Train a tensor+sequence-parallel transformer on local ranks over an emulated link, "
      "serially and with communication hidden behind computation, and compare them");
  cmd->add_option("-n,--nranks", a->nranks, "Ranks to launch")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--tp", a->tp, "Tensor-parallel group size (default: all ranks, or -n / --dp)")
      ->check(CLI::Range(0, 64));
  cmd->add_option("--dp", a->dp,
                  "Data-parallel size (default: -n / --tp); --dp alone sets --tp to -n / --dp")
      ->check(CLI::Range(0, 64));
  cmd->add_option("--link", a->link,
                  "Emulated link: auto (calibrated so that a step's communication takes as long "
                  "as its compute), none (raw shared memory), or a spec such as "
                  "bw=10GB/s,lat=5us (docs/link-emulation.md)")
      ->capture_default_str();
  cmd->add_option("--comm-ratio", a->comm_ratio,
                  "--link auto: a serial step's communication time over its compute time")
      ->capture_default_str()->check(CLI::Range(0.05, 20.0));
  cmd->add_option("--pipelines", a->pipelines,
                  "Pipelines to compare, comma-separated: serial, chunked, fused, auto (serial "
                  "always runs first, as the baseline)")
      ->capture_default_str();
  cmd->add_option("--splits", a->splits,
                  fmt::format("Chunks of the chunked and fused pipelines (1-16; default: the "
                              "model's own, {})",
                              kModelSplits))
      ->check(CLI::Range(1, 16));
  cmd->add_option("-i,--iters", a->steps, "Timed training steps per pipeline")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  cmd->add_option("-w,--warmup", a->warmup,
                  "Untimed steps first (first-call set-up; 0: every step is timed and traced)")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  AddModelOptions(*cmd, a->model,
                  {.heads = "Attention heads (the TP size must divide it)",
                   .min_vocab = 1,
                   .max_tokens = 1 << 20});
  cmd->add_option("-d,--dtype", a->dtype,
                  "GEMM inputs: f32, or bf16 (f32 accumulation and master weights)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--moe-experts", a->moe_experts,
                  "MoE: experts per MLP (0: dense MLPs; docs/models.md)")
      ->capture_default_str()->check(CLI::Range(0, 1024));
  cmd->add_option("--moe-topk", a->moe_topk, "MoE: experts per token")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--ep", a->ep, "MoE: expert-parallel group size (divides the DP size)")
      ->capture_default_str()->check(CLI::Range(1, 64));
  AddSeedOption(*cmd, a->model, "Seed of the weights and the data");
  cmd->add_option("--lr", a->lr, "AdamW learning rate")->capture_default_str()
      ->check(CLI::PositiveNumber);
  // The modes below run their own; AddDemoEntry leaves the work to them.
  AddDemoEntry(cmd, "mc2 demo",
               {&a->out, &a->json_path, &a->rank_job, &a->results, [a] { return RunRankJob(*a); },
                [a] {
                  ResolveDp(*a);
                  Conduct(*a);
                }});
  RegisterDemoInfer(*cmd);
  RegisterDemoFsdp(*cmd);
  RegisterDemoPp(*cmd);
  RegisterDemoCp(*cmd);
}

}  // namespace mc2::tools
