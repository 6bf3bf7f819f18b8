// `mc2 demo pp`: pipeline-parallel training of the reference transformer
// (models::PipelineTransformer, include/mc2/models.h) on a DP x CP x TP x PP grid
// of local ranks, with each schedule (1F1B, eager 1F1B and interleaved)
// side by side: step time, the pipeline phase, each stage's compute, its
// waits for inputs and the part of them that was transfer not hidden
// behind compute, the micro-batches it held in flight (activation memory), the
// bubble measured from the schedule's own timestamps against its formula,
// the library's collectives (TP operators, DP gradient exchange) from the
// traces, and whether every schedule gave bitwise the same losses. Writes
// each schedule's trace and an SVG timeline.
//
// Outside a job the command is the conductor: it checks the options,
// optionally calibrates the emulated link (--link auto: the bandwidth at
// which one micro-batch's activations take --comm-ratio times a chunk's
// forward to cross it, from one untimed run without emulation), launches
// the job (re-executing itself with --rank-job) and prints the table.
// Inside the job each rank trains every schedule from the same seed, a
// step of each in turn; rank 0 writes the results.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
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


struct PpArgs {
  int nranks = 0;  // 0: pp x dp x cp x tp
  int pp = 2, tp = 1, cp = 1;
  int dp = 0;                                 // 0: -n / (pp x cp x tp), or 1
  int moe_experts = 0, moe_topk = 2, ep = 1;  // MoE MLPs (0: dense), EP groups inside each stage
  int micro_batches = 8;
  std::string schedules = "1f1b,eager-1f1b,interleaved";
  int virtual_stages = 2;
  std::string link = "auto";
  double comm_ratio = 0.5;
  int iters = 3, warmup = 1;
  ModelDims model{.layers = 8, .hidden = 256, .heads = 8, .ffn = 512, .seq_len = 64, .batch = 16};
  std::string dtype = "f32";
  int splits = 4;
  std::string pipeline = "auto";  // the fused operators' (TP > 1): one pipeline
  std::string out = "mc2-demo-pp";
  std::string json_path;
  bool rank_job = false;
  std::string results;
};

[[noreturn]] void Usage(const std::string& message) { DemoUsage("mc2 demo pp", message); }

int Ranks(const PpArgs& a) { return a.pp * a.tp * a.dp * a.cp; }

// ", 4 MoE experts top-2 over ep 2" (empty for a dense model).
std::string MoeLabel(const PpArgs& a) {
  if (a.moe_experts == 0) return "";
  return fmt::format(", {} MoE experts top-{} over ep {}", a.moe_experts, a.moe_topk, a.ep);
}

models::TransformerConfig ModelConfig(const PpArgs& a) {
  models::TransformerConfig c = TransformerShape(a.model);
  c.gemm_dtype = a.dtype == "bf16" ? DType::kBF16 : DType::kF32;
  c.fused.splits = a.splits;
  c.fused.pipeline = *ParsePipeline(a.pipeline);
  c.moe_experts = a.moe_experts;
  c.moe_topk = a.moe_topk;
  return c;
}

std::vector<models::PipelineSchedule> Schedules(const std::string& text) {
  std::vector<models::PipelineSchedule> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string name = text.substr(pos, comma - pos);
    auto s = models::ParseSchedule(name);
    if (!s)
      Usage(fmt::format("--schedules: unknown schedule '{}' (1f1b, eager-1f1b, interleaved)",
                        name));
    if (std::find(out.begin(), out.end(), *s) != out.end())
      Usage(fmt::format("--schedules: '{}' given twice", name));
    out.push_back(*s);
    pos = comma + 1;
  }
  return out;
}

models::PipelineConfig PipeConfig(const PpArgs& a, models::PipelineSchedule s) {
  models::PipelineConfig p;
  p.micro_batches = a.micro_batches;
  p.schedule = s;
  p.virtual_stages = s == models::PipelineSchedule::kInterleaved ? a.virtual_stages : 1;
  return p;
}

// ---------------------------------------------------------------------------
// The rank side.

// Per rank and timed step: what the table needs, gathered to rank 0.
enum Field {
  kStep, kPhase, kBusy, kRecvWait, kUncovered, kSendWait, kBubble, kDpSync, kOptimizer,
  kFwdOp, kPeakInFlight, kFields
};

int RunRankJob(const PpArgs& a) {
  Group world = Group::FromEnv();
  const bool root = world.rank() == 0;
  models::ProcessGrid grid =
      models::MakeGrid3D(world, {.dp = a.dp, .tp = a.tp, .pp = a.pp, .ep = a.ep, .cp = a.cp});
  const models::TransformerConfig c = ModelConfig(a);
  // Every schedule's model, trained step by step in turn (step 0 of each,
  // then step 1 of each, ...): a machine whose load drifts during the run
  // weighs on every schedule alike. The models take turns, so their
  // messages never meet.
  struct Run {
    models::PipelineSchedule s;
    models::PipelineConfig pipe;
    std::unique_ptr<models::PipelineTransformer> model;
    std::string dir;
    std::vector<double> losses;
    std::vector<std::vector<double>> fields;  // by timed step: every rank's kFields
  };
  std::vector<Run> runs;
  for (models::PipelineSchedule s : Schedules(a.schedules)) {
    Run r;
    r.s = s;
    r.pipe = PipeConfig(a, s);
    r.model = std::make_unique<models::PipelineTransformer>(grid, c, r.pipe);
    r.dir = (fs::path(a.out) / models::ScheduleName(s)).string();
    runs.push_back(std::move(r));
  }
  const int steps = a.warmup + a.iters;
  for (int step = 0; step < steps; ++step) {
    for (Run& r : runs) {
      const bool traced = step == steps - 1;
      if (traced) trace::Enable(r.dir);
      models::PipelineStepStats st = r.model->TrainStep(step);
      if (traced) {
        trace::EndStep();
        StopTrace();
      }
      r.losses.push_back(st.step.loss);
      if (step < a.warmup) continue;
      double fwd = 0;
      int nfwd = 0;
      for (const auto& op : st.ops) {
        if (!op.forward) continue;
        fwd += op.end - op.start;
        ++nfwd;
      }
      std::vector<double> mine(kFields);
      mine[kStep] = st.step.seconds;
      mine[kPhase] = st.pipeline_seconds;
      mine[kBusy] = st.busy_seconds;
      mine[kRecvWait] = st.recv_wait_seconds;
      mine[kUncovered] = st.uncovered_seconds;
      mine[kSendWait] = st.send_wait_seconds;
      mine[kBubble] = st.bubble;
      mine[kDpSync] = st.dp_sync_seconds;
      mine[kOptimizer] = st.optimizer_seconds;
      mine[kFwdOp] = nfwd ? fwd / nfwd : 0;
      mine[kPeakInFlight] = st.peak_in_flight;
      std::vector<double> all(kFields * world.size());
      AllGather(world, mine.data(), all.data(), kFields, DType::kF64).Wait();
      r.fields.push_back(all);
    }
  }
  json out = json::array();
  for (const Run& r : runs) {
    if (root) {
      fmt::print(stderr, "  {}: {} steps, loss {:.4f}\n", models::ScheduleName(r.s), steps,
                 r.losses.empty() ? 0.0 : r.losses.back());
    }
    out.push_back({{"schedule", models::ScheduleName(r.s)},
                   {"virtual_stages", r.pipe.virtual_stages},
                   {"bubble_formula", models::BubbleFormula(r.pipe, a.pp)},
                   {"losses", r.losses},
                   {"fields", r.fields},
                   {"trace_dir", r.dir}});
  }
  if (root) {
    const size_t message_bytes =
        static_cast<size_t>(a.model.batch / a.dp / a.micro_batches) * a.model.seq_len / a.cp /
        a.tp * a.model.hidden * 4;
    return WriteJobResults(
        a.results, json{{"ranks", world.size()}, {"message_bytes", message_bytes}, {"runs", out}},
        "mc2 demo pp");
  }
  return 0;
}

// ---------------------------------------------------------------------------
// The conductor.

std::vector<std::string> RankArgv(const PpArgs& a, const std::string& schedules, int iters,
                                  int warmup, const std::string& out, const std::string& results) {
  JobArgv v("pp", results, out, iters, warmup);
  v.Add("--schedules", schedules);
  v.Add("--pp", std::to_string(a.pp));
  v.Add("--tp", std::to_string(a.tp));
  v.Add("--dp", std::to_string(a.dp));
  v.Add("--cp", std::to_string(a.cp));
  if (a.moe_experts > 0) {
    v.Add("--moe-experts", std::to_string(a.moe_experts));
    v.Add("--moe-topk", std::to_string(a.moe_topk));
    v.Add("--ep", std::to_string(a.ep));
  }
  v.Add("--micro-batches", std::to_string(a.micro_batches));
  v.Add("--virtual-stages", std::to_string(a.virtual_stages));
  v.Add("--dtype", a.dtype);
  v.Add("--splits", std::to_string(a.splits));
  v.Add("--pipelines", a.pipeline);
  std::vector<std::string> argv = v.Take();
  AppendModelArgs(a.model, argv);
  return argv;
}

// The field `f` of rank r in a timed step's gathered row.
double Field(const json& row, int r, int f) { return row[static_cast<size_t>(r * kFields + f)]; }

// --link auto: one untimed 1F1B run without emulation; the bandwidth at
// which a micro-batch's activations (one message) take comm_ratio times
// the median forward of one chunk.
std::string CalibrateLink(const PpArgs& a, const fs::path& out) {
  const fs::path dir = out / "calibrate";
  fs::create_directories(dir);
  const std::string results = (dir / "results.json").string();
  json res = RunDemoJob(Ranks(a), RankArgv(a, "1f1b", 1, 1, dir.string(), results), "", results,
                        "mc2 demo pp", "calibration");
  const double bytes = res["message_bytes"].get<double>();
  std::vector<double> fwd;
  for (const auto& row : res["runs"][0]["fields"])
    for (int r = 0; r < Ranks(a); ++r) fwd.push_back(Field(row, r, kFwdOp));
  const double f = Median(fwd);
  if (f <= 0 || bytes <= 0)
    throw Error(ErrorCode::kInvalidArgument,
                "mc2 demo pp: --link auto cannot calibrate (no forward measured); give a link "
                "spec or none");
  const double bw = bytes / (a.comm_ratio * f);
  return fmt::format("bw={:.6g}MB/s,lat=5us", bw / 1e6);
}

// -n fixes the rank count, pp x dp x cp x tp: the DP size follows from it
// unless --dp is given too, when the two must agree.
void ResolveRanks(PpArgs& a) {
  if (a.nranks == 0) {
    if (a.dp == 0) a.dp = 1;
    return;
  }
  const int others = a.pp * a.cp * a.tp;
  if (a.nranks % others != 0)
    Usage(
        fmt::format("--pp {} x --cp {} x --tp {} = {} must divide -n {} (the ranks are pp x dp "
                    "x cp x tp)",
                    a.pp, a.cp, a.tp, others, a.nranks));
  if (a.dp == 0) a.dp = a.nranks / others;
  if (a.dp * others != a.nranks)
    Usage(fmt::format("--pp {} x --dp {} x --cp {} x --tp {} must be -n {}", a.pp, a.dp, a.cp, a.tp,
                      a.nranks));
}

void CheckArgs(const PpArgs& a) {
  if (a.pipeline.find(',') != std::string::npos)
    Usage(fmt::format("--pipelines {}: demo pp runs one pipeline: serial, chunked, fused or auto",
                      a.pipeline));
  if (!ParsePipeline(a.pipeline)) Usage(fmt::format("--pipelines: unknown '{}'", a.pipeline));
  const auto schedules = Schedules(a.schedules);
  if (a.pp < 2) Usage(fmt::format("--pp {} must be >= 2 (a pipeline has stages)", a.pp));
  // The EP grid inside each stage: named here, in the demo's own options.
  if (a.dp % a.ep != 0)
    Usage(fmt::format("--ep {} must divide --dp {} (the EP groups are made of each stage's DP "
                      "ranks)", a.ep, a.dp));
  if (a.ep > 1 && a.moe_experts == 0)
    Usage(fmt::format("--ep {} needs --moe-experts > 0 (a dense model has nothing to spread)",
                      a.ep));
  if (a.ep > 1 && a.cp > 1)
    Usage(fmt::format("--ep {} with --cp {}: expert parallelism is not combined with context "
                      "parallelism", a.ep, a.cp));
  if (a.moe_experts > 0) {
    if (a.moe_experts % a.ep != 0)
      Usage(fmt::format("--ep {} must divide --moe-experts {}", a.ep, a.moe_experts));
    if (a.moe_topk < 1 || a.moe_topk > a.moe_experts)
      Usage(fmt::format("--moe-topk {} must be in 1..--moe-experts {}", a.moe_topk,
                        a.moe_experts));
  }
  const models::TransformerConfig c = ModelConfig(a);
  for (auto s : schedules)
    models::ValidatePipeline(c, PipeConfig(a, s),
                             {.dp = a.dp, .tp = a.tp, .pp = a.pp, .ep = a.ep, .cp = a.cp});
  CheckLinkOption(a.link);
}

std::vector<std::string> OwnOutputs() {
  std::vector<std::string> names = {"results.json", "calibrate/results.json", "calibrate/1f1b/",
                                    "calibrate/"};
  AddRunOutputs(names, {"1f1b", "eager-1f1b", "interleaved"});
  return names;
}

struct RunSummary {
  std::string schedule;
  int v = 1;
  double formula = 0;
  std::vector<double> losses;
  double step_ms = 0, phase_ms = 0, dp_ms = 0, opt_ms = 0;
  std::vector<double> busy, wait, uncovered, bubble;  // per stage, % of the phase (bubble: fraction)
  std::vector<int> peak;  // per stage: the most micro-batches in flight (max over its ranks and steps)
  double bubble_mean = 0;
  trace::Breakdown b;
  std::string trace_json, svg;
};

// One schedule's run: the gathered per-rank fields of its timed steps,
// reduced to the slowest rank's step, the phase, and each stage's mean over
// its ranks (medians over the steps), and its trace (exported to `out`).
RunSummary Summarise(const PpArgs& a, const json& run, const fs::path& out,
                     const std::string& link) {
  const int n = Ranks(a);
  const int stage_ranks = a.tp * a.dp * a.cp;
  RunSummary s;
  s.schedule = run["schedule"].get<std::string>();
  s.v = run["virtual_stages"].get<int>();
  s.formula = run["bubble_formula"].get<double>();
  s.losses = run["losses"].get<std::vector<double>>();
  std::vector<double> step, phase, dps, opt;
  std::vector<std::vector<double>> busy(a.pp), wait(a.pp), unc(a.pp), bub(a.pp);
  s.peak.assign(a.pp, 0);
  for (const auto& row : run["fields"]) {
    double st = 0, dp = 0, op = 0;
    for (int r = 0; r < n; ++r) {
      st = std::max(st, Field(row, r, kStep));
      dp += Field(row, r, kDpSync) / n;
      op += Field(row, r, kOptimizer) / n;
    }
    const double ph = Field(row, 0, kPhase);
    step.push_back(st);
    phase.push_back(ph);
    dps.push_back(dp);
    opt.push_back(op);
    for (int stg = 0; stg < a.pp; ++stg) {
      double bu = 0, wa = 0, un = 0, bb = 0;
      for (int k = 0; k < stage_ranks; ++k) {
        const int r = stg * stage_ranks + k;
        bu += Field(row, r, kBusy) / stage_ranks;
        wa += Field(row, r, kRecvWait) / stage_ranks;
        un += Field(row, r, kUncovered) / stage_ranks;
        bb += Field(row, r, kBubble) / stage_ranks;
        s.peak[stg] = std::max(s.peak[stg], static_cast<int>(Field(row, r, kPeakInFlight)));
      }
      busy[stg].push_back(100 * bu / ph);
      wait[stg].push_back(100 * wa / ph);
      unc[stg].push_back(100 * un / ph);
      bub[stg].push_back(bb);
    }
  }
  s.step_ms = Median(step) * 1e3;
  s.phase_ms = Median(phase) * 1e3;
  s.dp_ms = Median(dps) * 1e3;
  s.opt_ms = Median(opt) * 1e3;
  for (int stg = 0; stg < a.pp; ++stg) {
    s.busy.push_back(Median(busy[stg]));
    s.wait.push_back(Median(wait[stg]));
    s.uncovered.push_back(Median(unc[stg]));
    s.bubble.push_back(Median(bub[stg]));
    s.bubble_mean += s.bubble.back() / a.pp;
  }
  const RunTrace t = ExportRunTrace(
      run["trace_dir"].get<std::string>(), out, s.schedule,
      fmt::format("mc2 demo pp: {} schedule, pp {} x dp {} x cp {} x tp {}, {}", s.schedule, a.pp,
                  a.dp, a.cp, a.tp, LinkTitle(link)));
  for (const auto& st : t.report.steps) s.b += st.b;
  s.trace_json = t.trace_json;
  s.svg = t.svg;
  return s;
}

// The table, one column per schedule.
void PrintTable(const PpArgs& a, const std::vector<RunSummary>& runs,
                const std::string& link_label) {
  const ModelDims& m = a.model;
  const RunSummary& base = runs.front();
  const RunTable<RunSummary> table(runs, 38, 16);
  fmt::print(
      "\nmc2 demo pp: {} layers, hidden {}, {} heads, ffn {}, vocab {}, {} GEMMs; batch {} x {} "
      "tokens in {} micro-batches; pp {} x dp {} x cp {} x tp {} ({} ranks){}\n{}; {} timed steps "
      "after {} "
      "warm-up, medians\n\n",
      m.layers, m.hidden, m.heads, m.ffn, m.vocab, a.dtype, m.batch, m.seq_len, a.micro_batches,
      a.pp, a.dp, a.cp, a.tp, Ranks(a), MoeLabel(a), link_label, a.iters, a.warmup);
  table.Row("", [](const RunSummary& r) {
    return r.v > 1 ? fmt::format("{} v={}", r.schedule, r.v) : r.schedule;
  });
  table.Row("step time (ms)", [](const RunSummary& r) { return fmt::format("{:.2f}", r.step_ms); });
  table.Row("pipeline phase (ms)",
            [](const RunSummary& r) { return fmt::format("{:.2f}", r.phase_ms); });
  table.Row("DP gradient sync + AdamW (ms)",
            [](const RunSummary& r) { return fmt::format("{:.2f}", r.dp_ms + r.opt_ms); });
  table.Row("bubble: formula (%)",
            [](const RunSummary& r) { return fmt::format("{:.1f}", 100 * r.formula); });
  table.Row("bubble: measured, mean of stages (%)",
            [](const RunSummary& r) { return fmt::format("{:.1f}", 100 * r.bubble_mean); });
  for (int stg = 0; stg < a.pp; ++stg) {
    table.Row(fmt::format("stage {}: compute (% of phase)", stg),
              [&](const RunSummary& r) { return fmt::format("{:.1f}", r.busy[stg]); });
    table.Row(fmt::format("stage {}: waiting for inputs (%)", stg),
              [&](const RunSummary& r) { return fmt::format("{:.1f}", r.wait[stg]); });
    table.Row(fmt::format("stage {}: uncovered send/recv (%)", stg),
              [&](const RunSummary& r) { return fmt::format("{:.2f}", r.uncovered[stg]); });
    table.Row(fmt::format("stage {}: bubble (%)", stg),
              [&](const RunSummary& r) { return fmt::format("{:.1f}", 100 * r.bubble[stg]); });
    table.Row(fmt::format("stage {}: micro-batches in flight (peak)", stg),
              [&](const RunSummary& r) { return fmt::format("{}", r.peak[stg]); });
  }
  auto pct = [](const trace::Breakdown& b, int64_t ns) { return fmt::format("{:.1f}", b.Pct(ns)); };
  table.Row("collectives: communication (%)",
            [&](const RunSummary& r) { return pct(r.b, r.b.comm_ns); });
  table.Row("collectives: uncovered comm (%)",
            [&](const RunSummary& r) { return pct(r.b, r.b.uncovered_ns); });
  table.Row("free time (%)", [&](const RunSummary& r) { return pct(r.b, r.b.free_ns); });
  table.Row("speedup vs first schedule", [&](const RunSummary& r) {
    return fmt::format("{:.2f}x", r.step_ms > 0 ? base.step_ms / r.step_ms : 0.0);
  });
}

// Below the table: the losses, what the rows mean and where the traces
// are. Returns whether every schedule's losses are bitwise the first's.
bool PrintLossesAndFiles(const std::vector<RunSummary>& runs) {
  const RunSummary& base = runs.front();
  bool identical = true;
  for (const auto& r : runs) identical = identical && r.losses == base.losses;
  fmt::print("\nlosses identical across schedules (bitwise): {} (last {:.6f})\n",
             identical ? "yes" : "NO", base.losses.empty() ? 0.0 : base.losses.back());
  fmt::print(
      "\nBubble: a stage's idle share of the pipeline phase (not computing, not waiting for a "
      "transfer that\nwas still moving after its sender finished), from the schedule's own "
      "timestamps. Uncovered send/recv:\nthat transfer wait. In flight: micro-batches whose "
      "activations a stage held at once\n(forward done, backward not yet). Collectives (the TP "
      "operators, the DP exchange, the loss): from\nthe traced step.\n");
  for (const auto& r : runs)
    fmt::print("{:>12}: trace {}\n              timeline {}\n", r.schedule, r.trace_json, r.svg);
  return identical;
}

json ResultsJson(const PpArgs& a, const std::vector<RunSummary>& runs, const std::string& link,
                 bool identical) {
  const ModelDims& m = a.model;
  const RunSummary& base = runs.front();
  json j = {{"mode", "pp"},          {"ranks", Ranks(a)},
            {"pp", a.pp},            {"tp", a.tp},
            {"dp", a.dp},            {"cp", a.cp},
            {"ep", a.ep},            {"moe_experts", a.moe_experts},
            {"moe_topk", a.moe_topk},
            {"micro_batches", a.micro_batches},
            {"link", link},          {"layers", m.layers},
            {"hidden", m.hidden},    {"batch", m.batch},
            {"seq_len", m.seq_len},  {"losses_identical", identical}};
  for (const auto& r : runs) {
    j["runs"].push_back({{"schedule", r.schedule},
                         {"virtual_stages", r.v},
                         {"step_ms", r.step_ms},
                         {"pipeline_ms", r.phase_ms},
                         {"bubble_formula", r.formula},
                         {"bubble_measured", r.bubble_mean},
                         {"stage_bubble", r.bubble},
                         {"stage_compute_pct", r.busy},
                         {"stage_input_wait_pct", r.wait},
                         {"stage_uncovered_pct", r.uncovered},
                         {"stage_peak_in_flight", r.peak},
                         {"comm_pct", r.b.Pct(r.b.comm_ns)},
                         {"uncovered_pct", r.b.Pct(r.b.uncovered_ns)},
                         {"free_pct", r.b.Pct(r.b.free_ns)},
                         {"speedup", r.step_ms > 0 ? base.step_ms / r.step_ms : 0.0}});
  }
  return j;
}

void Conduct(const PpArgs& a) {
  const auto t_start = std::chrono::steady_clock::now();
  CheckArgs(a);
  const fs::path out = PrepareDemoOutput(a.out, a.json_path, OwnOutputs());
  const int n = Ranks(a);
  const DemoLink dl = ResolveLink(
      a.link, [&] { return CalibrateLink(a, out); },
      "one micro-batch's activation transfer", a.comm_ratio);
  fmt::print(stderr, "pipeline training on {} ranks (pp {} x dp {} x cp {} x tp {}{}), {}\n", n,
             a.pp, a.dp, a.cp, a.tp, MoeLabel(a), dl.label);
  const std::string results = (out / "results.json").string();
  json res = RunDemoJob(n, RankArgv(a, a.schedules, a.iters, a.warmup, out.string(), results),
                        dl.spec, results, "mc2 demo pp", "pipeline");

  std::vector<RunSummary> runs;
  for (const auto& run : res["runs"]) runs.push_back(Summarise(a, run, out, dl.spec));
  PrintTable(a, runs, dl.label);
  const bool identical = PrintLossesAndFiles(runs);
  FinishDemo(t_start, a.json_path, ResultsJson(a, runs, dl.spec, identical), identical,
             "mc2 demo pp");
}

}  // namespace

void RegisterDemoPp(CLI::App& demo) {
  auto a = std::make_shared<PpArgs>();
  CLI::App* cmd = demo.add_subcommand(
      "pp",
      "Pipeline-parallel training (DP x CP x TP x PP) with the 1F1B, eager 1F1B and interleaved "
      "schedules side by side: step time, bubble measured against its formula, uncovered "
      "send/recv and micro-batches in flight per stage");
  auto range = [](int lo, int hi) { return CLI::Range(lo, hi); };
  cmd->add_option("-n,--nranks", a->nranks,
                  "Ranks to launch, pp x dp x cp x tp (default: --pp x --dp x --cp x --tp)")
      ->check(range(1, 64));
  cmd->add_option("--pp", a->pp, "Pipeline stages")->capture_default_str()->check(range(1, 64));
  cmd->add_option("--tp", a->tp, "Tensor-parallel group size of each stage")
      ->capture_default_str()
      ->check(range(1, 64));
  cmd->add_option("--dp", a->dp, "Data-parallel replicas (default: -n / (pp x cp x tp), or 1)")
      ->check(range(1, 64));
  cmd->add_option("--cp", a->cp,
                  "Context-parallel group size of each stage (ring attention over the sequence)")
      ->capture_default_str()
      ->check(range(1, 64));
  cmd->add_option("--moe-experts", a->moe_experts,
                  "MoE: experts per MLP (0: dense MLPs; docs/models.md)")
      ->capture_default_str()
      ->check(range(0, 1024));
  cmd->add_option("--moe-topk", a->moe_topk, "MoE: experts per token")
      ->capture_default_str()
      ->check(range(1, 1 << 16));
  cmd->add_option("--ep", a->ep,
                  "MoE: expert-parallel group size inside each stage (divides --dp)")
      ->capture_default_str()
      ->check(range(1, 64));
  cmd->add_option("--micro-batches", a->micro_batches, "Micro-batches per step")
      ->capture_default_str()
      ->check(range(1, 1 << 16));
  cmd->add_option("--schedules", a->schedules,
                  "Schedules to compare, comma-separated: 1f1b, eager-1f1b, interleaved")
      ->capture_default_str();
  cmd->add_option("-v,--virtual-stages", a->virtual_stages,
                  "Chunks per stage of the interleaved schedule (>= 2)")
      ->capture_default_str()
      ->check(range(2, 64));
  cmd->add_option("--link", a->link,
                  "Emulated link: auto (calibrated so that one micro-batch's activations take "
                  "--comm-ratio x a chunk's forward to cross it), none (raw shared memory), or a "
                  "spec such as bw=1GB/s,lat=5us (docs/link-emulation.md)")
      ->capture_default_str();
  cmd->add_option("--comm-ratio", a->comm_ratio, "--link auto: transfer over forward")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 20.0));
  cmd->add_option("-i,--iters", a->iters, "Timed steps per schedule")
      ->capture_default_str()
      ->check(range(1, 10000));
  cmd->add_option("-w,--warmup", a->warmup, "Untimed steps first")
      ->capture_default_str()
      ->check(range(0, 100));
  AddModelOptions(*cmd, a->model);
  cmd->add_option("-d,--dtype", a->dtype, "GEMM inputs: f32 or bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--splits", a->splits, "Chunks of the fused operators' pipelines (1-16)")
      ->capture_default_str()
      ->check(range(1, 16));
  cmd->add_option("--pipelines", a->pipeline,
                  "The fused operators' pipeline (tp > 1), one of serial, chunked, fused, auto")
      ->capture_default_str();
  AddSeedOption(*cmd, a->model, "Seed of the weights and the data");
  AddDemoEntry(cmd, "mc2 demo pp",
               {&a->out, &a->json_path, &a->rank_job, &a->results, [a] { return RunRankJob(*a); },
                [a] {
                  ResolveRanks(*a);
                  Conduct(*a);
                }});
}

}  // namespace mc2::tools
