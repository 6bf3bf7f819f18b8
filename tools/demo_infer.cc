// `mc2 demo infer`: tensor-parallel inference of the reference transformer
// (models::InferenceModel, include/mc2/models.h) on N local ranks: a batch
// of prompts prefilled, then greedy decoding token by token with a KV cache
// per rank, with every pipeline of the fused operators (serial, the
// baseline, and the overlapped ones, on the same weights), side by side: time to first
// token, per-token latency (p50, p99), tokens/s, the communication share
// and uncovered communication of each phase, the pipeline the fused
// operators ran in each phase, and whether the generated tokens (and the
// logits they came from) are bitwise identical. Writes each run's trace
// and an SVG timeline.
//
// Outside a job the command is the conductor: it checks the options,
// optionally calibrates the emulated link (--link auto: the bandwidth at
// which a serial prefill's communication takes --comm-ratio times its
// compute, CalibrateLink), launches the job (re-executing itself
// with --rank-job) and analyses the traces. Inside the job each rank
// generates with every pipeline in turn, round after round, on one model
// (InferenceModel::SetFusedOptions); rank 0 writes the results.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
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
#include "trace_tools/analysis.h"
#include "trace_tools/timeline_svg.h"

namespace mc2::tools {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;


struct InferArgs {
  int nranks = 2;
  int tp = 0;  // 0: every rank in one TP group
  std::string link = "auto";
  double comm_ratio = 0.75;
  std::string pipelines = "serial,chunked,fused,auto";
  int splits = 4;
  int iters = 3;   // timed generations per pipeline
  int warmup = 1;  // untimed generations first
  ModelDims model{.seq_len = 0};  // the batch: prompts
  int prompt_len = 128, new_tokens = 32;
  bool no_sp = false;
  std::string dtype = "f32";
  int train_steps = 0;  // train on the task first (0: the seed's weights)
  float lr = 3e-3f;
  std::string out = "mc2-demo-infer";
  std::string json_path;
  bool rank_job = false;
  std::string results;
};

[[noreturn]] void Usage(const std::string& message) { DemoUsage("mc2 demo infer", message); }

int TpOf(const InferArgs& a) { return a.tp ? a.tp : a.nranks; }

models::TransformerConfig ModelConfig(const InferArgs& a) {
  models::TransformerConfig c = TransformerShape(a.model);
  c.seq_len = TpOf(a);  // not used by inference; valid for the grid
  c.gemm_dtype = a.dtype == "bf16" ? DType::kBF16 : DType::kF32;
  c.fused.splits = a.splits;
  return c;
}

models::InferenceConfig InferConfig(const InferArgs& a) {
  models::InferenceConfig in;
  in.prompt_step = a.train_steps;  // a batch the training did not see
  in.prompt_len = a.prompt_len;
  in.new_tokens = a.new_tokens;
  in.sequence_parallel = !a.no_sp;
  in.keep_logits = true;  // compared across pipelines
  return in;
}

// FNV-1a of the bytes: the logits compared across pipelines without
// shipping them.
std::string Fingerprint(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return fmt::format("{:016x}", h);
}

json Counts(const std::map<std::string, int>& m) {
  json j = json::object();
  for (const auto& [k, v] : m) j[k] = v;
  return j;
}

// ---------------------------------------------------------------------------
// The rank side.

int RunRankJob(const InferArgs& a) {
  Group world = Group::FromEnv();
  const bool root = world.rank() == 0;
  const int tp = TpOf(a);
  models::ProcessGrid grid = models::MakeGrid(world, tp);
  const models::TransformerConfig c = ModelConfig(a);
  models::InferenceModel model(grid, c, InferConfig(a));
  if (a.train_steps > 0) {
    // Sequences as long as prompt and continuation (a multiple of tp).
    models::TransformerConfig tc = c;
    tc.seq_len = (a.prompt_len + a.new_tokens + tp - 1) / tp * tp;
    tc.lr = a.lr;
    models::Transformer train(grid, tc);
    models::StepStats st;
    for (int step = 0; step < a.train_steps; ++step) st = train.TrainStep(step);
    if (root) {
      fmt::print(stderr, "  trained {} steps on {}, loss {:.4f}\n", a.train_steps,
                 models::TaskName(tc.task), st.loss);
    }
    model.LoadWeights(train);
  }
  const std::vector<Pipeline> pipelines = ParsePipelines(a.pipelines, "mc2 demo infer");
  const size_t np = pipelines.size();
  struct Acc {
    json prefill_s = json::array(), token_s = json::array(), decode_s = json::array();
    models::Generation last;
  };
  std::vector<Acc> acc(np);
  // Round robin over the pipelines, the starting one rotating, so that a
  // change in the machine's load (it may be shared) falls on all alike.
  const int rounds = a.warmup + a.iters;
  for (int it = 0; it < rounds; ++it) {
    for (size_t j = 0; j < np; ++j) {
      const size_t k = (j + static_cast<size_t>(it)) % np;
      FusedOptions f = c.fused;
      f.pipeline = pipelines[k];
      model.SetFusedOptions(f);
      // The warm-up pays for first-call set-up; only the last round is
      // traced (its steps: 0 the prefill, 1.. the decode).
      const bool traced = it == rounds - 1;
      if (traced) trace::Enable((fs::path(a.out) / PipelineName(pipelines[k])).string());
      models::Generation g = model.Generate();
      if (traced) StopTrace();
      if (it < a.warmup) continue;
      Acc& r = acc[k];
      r.prefill_s.push_back(g.prefill_seconds);
      double decode = 0;
      for (double s : g.token_seconds) {
        r.token_s.push_back(s);
        decode += s;
      }
      r.decode_s.push_back(decode);
      r.last = std::move(g);
    }
    PrintRound(root, it, rounds, a.warmup);
  }
  json runs = json::array();
  for (size_t k = 0; k < np; ++k) {
    const models::Generation& g = acc[k].last;
    runs.push_back(
        {{"pipeline", PipelineName(pipelines[k])},
         {"prefill_seconds", acc[k].prefill_s},
         {"token_seconds", acc[k].token_s},
         {"decode_seconds", acc[k].decode_s},
         {"tokens", g.tokens},
         {"expected", g.expected},
         {"logits_fingerprint", Fingerprint(g.logits.data(), g.logits.size() * sizeof(float))},
         {"prefill_pipelines", Counts(g.prefill_pipelines)},
         {"decode_pipelines", Counts(g.decode_pipelines)},
         {"trace_dir", (fs::path(a.out) / PipelineName(pipelines[k])).string()}});
  }
  if (root) {
    return WriteJobResults(a.results, json{{"ranks", world.size()}, {"tp", tp}, {"runs", runs}},
                           "mc2 demo infer");
  }
  return 0;
}

// ---------------------------------------------------------------------------
// The conductor.

std::vector<std::string> RankArgv(const InferArgs& a, const std::string& pipelines, int iters,
                                  int warmup, const std::string& out, const std::string& results) {
  JobArgv v("infer", results, out, iters, warmup);
  v.Add("--pipelines", pipelines);
  v.Add("--splits", std::to_string(a.splits));
  v.Add("--prompt-len", std::to_string(a.prompt_len));
  v.Add("--new-tokens", std::to_string(a.new_tokens));
  v.Add("--tp", std::to_string(a.tp));
  v.Add("--dtype", a.dtype);
  v.Add("--train-steps", std::to_string(a.train_steps));
  v.Add("--lr", fmt::format("{:.9g}", a.lr));
  if (a.no_sp) v.Add("--no-sp");
  std::vector<std::string> argv = v.Take();
  AppendModelArgs(a.model, argv);
  return argv;
}

// Bandwidth at which the prefill's communication takes comm_ratio times
// its compute, in serial mode (the decode's calls are latency-bound: the
// bandwidth hardly matters to them). Two short traced serial runs, as
// `mc2 demo` calibrates: without emulation (the bytes a rank sends and the
// prefill's compute give a first guess), then at that bandwidth (the
// prefill's measured communication, latencies and skew included,
// corrects it).
std::string CalibrateLink(const InferArgs& a, const fs::path& out) {
  auto measure = [&](const std::string& link, const char* name) {
    trace::Report r = CalibrationRun(
        out / "calibrate" / name, [&](const std::string& dir, const std::string& results) {
          return LaunchDemoJob(a.nranks, RankArgv(a, "serial", 1, 1, dir, results), link);
        });
    LinkSample m;
    m.bytes = CommBytesPerRank(r);
    for (const auto& st : r.steps) {
      if (st.step != 0) continue;
      m.compute_s = st.b.compute_ns * 1e-9;
      m.comm_s = st.b.comm_ns * 1e-9;
    }
    if (m.compute_s <= 0 || m.bytes <= 0)
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("mc2 demo infer: --link auto cannot calibrate: the serial run "
                              "recorded {:.0f} bytes per rank and no prefill compute (one "
                              "rank communicates nothing); give a link spec or none",
                              m.bytes));
    return m;
  };
  return tools::CalibrateLink(a.comm_ratio, TpOf(a) > 1 ? TpOf(a) : a.nranks, measure,
                             "mc2 demo infer");
}

// The nearest-rank percentile q (0..100).
double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(q / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank > 0 ? rank - 1 : 0)];
}

struct RunSummary {
  std::string pipeline;
  double ttft_ms = 0, p50_ms = 0, p99_ms = 0, decode_tps = 0, e2e_tps = 0;
  trace::Breakdown prefill, decode;
  std::string prefill_ran, decode_ran;
  std::vector<int> tokens, expected;
  std::string fingerprint;
  std::string trace_json, svg;
};

std::string RanText(const json& counts) {
  std::string s;
  for (const auto& [name, calls] : counts.items())
    s += fmt::format("{}{} ({} calls)", s.empty() ? "" : ", ", name, calls.get<int>());
  return s.empty() ? "-" : s;
}

void CheckArgs(const InferArgs& a) {
  const ModelDims& m = a.model;
  const int tp = TpOf(a);
  auto need = [](bool ok, const std::string& what) {
    if (!ok) Usage(what);
  };
  need(a.nranks % tp == 0, fmt::format("--tp {} must divide -n {}", tp, a.nranks));
  CheckHeads(m, "mc2 demo infer");
  need(m.heads % tp == 0, fmt::format("--tp {} must divide --heads {} (each TP rank holds its "
                                      "heads and their KV cache)",
                                      tp, m.heads));
  need(m.ffn % tp == 0, fmt::format("--tp {} must divide --ffn {}", tp, m.ffn));
  const int dp = a.nranks / tp;
  need(m.batch % dp == 0, fmt::format("the data-parallel size -n {} / --tp {} = {} must divide "
                                      "--batch {}",
                                      a.nranks, tp, dp, m.batch));
  models::ValidateConfig(ModelConfig(a), tp, dp);
  ParsePipelines(a.pipelines, "mc2 demo infer");
  CheckLinkOption(a.link);
}

std::vector<std::string> OwnOutputs() {
  std::vector<std::string> names = {"results.json"};
  AddCalibrationOutputs(names, "serial");
  AddRunOutputs(names, {"serial", "chunked", "fused", "auto"});
  return names;
}

// One pipeline's run from the job's results and its trace (exported to
// `out`).
RunSummary Summarise(const InferArgs& a, const json& run, const fs::path& out,
                     const std::string& link) {
  RunSummary s;
  s.pipeline = run["pipeline"].get<std::string>();
  const auto prefill = run["prefill_seconds"].get<std::vector<double>>();
  const auto tokens = run["token_seconds"].get<std::vector<double>>();
  const auto decode = run["decode_seconds"].get<std::vector<double>>();
  s.ttft_ms = Median(prefill) * 1e3;
  s.p50_ms = Percentile(tokens, 50) * 1e3;
  s.p99_ms = Percentile(tokens, 99) * 1e3;
  const double decode_s = Median(decode);
  s.decode_tps = decode_s > 0 ? a.model.batch * (a.new_tokens - 1) / decode_s : 0;
  s.e2e_tps = a.model.batch * a.new_tokens / (Median(prefill) + decode_s);
  s.tokens = run["tokens"].get<std::vector<int>>();
  s.expected = run["expected"].get<std::vector<int>>();
  s.fingerprint = run["logits_fingerprint"].get<std::string>();
  s.prefill_ran = RanText(run["prefill_pipelines"]);
  s.decode_ran = RanText(run["decode_pipelines"]);
  const RunTrace t = ExportRunTrace(run["trace_dir"].get<std::string>(), out, s.pipeline,
                                    fmt::format("mc2 demo infer: {} pipeline, {} ranks, {}",
                                                s.pipeline, a.nranks, LinkTitle(link)));
  for (const auto& st : t.report.steps) (st.step == 0 ? s.prefill : s.decode) += st.b;
  s.trace_json = t.trace_json;
  s.svg = t.svg;
  return s;
}

// The table, one column per pipeline.
void PrintTable(const InferArgs& a, const std::vector<RunSummary>& runs,
                const std::string& link_label) {
  const ModelDims& m = a.model;
  const int tp = TpOf(a);
  const RunSummary& base = runs.front();
  const RunTable<RunSummary> table(runs, 34, 14);
  auto pct = [](const trace::Breakdown& b, int64_t ns) { return fmt::format("{:.1f}", b.Pct(ns)); };
  fmt::print(
      "\nmc2 demo infer: {} layers, hidden {}, {} heads, ffn {}, vocab {}, {} GEMMs; {} "
      "prompts of {} tokens, {} new tokens each; {} ranks (tp {}, dp {}), prefill {}\n"
      "{}; {} timed generations after {} warm-up, medians\n\n",
      m.layers, m.hidden, m.heads, m.ffn, m.vocab, a.dtype, m.batch, a.prompt_len, a.new_tokens,
      a.nranks, tp, a.nranks / tp, a.no_sp ? "without sequence parallelism" : "sequence-parallel",
      link_label, a.iters, a.warmup);
  table.Row("", [](const RunSummary& r) { return r.pipeline; });
  table.Row("time to first token (ms)",
            [](const RunSummary& r) { return fmt::format("{:.2f}", r.ttft_ms); });
  table.Row("per-token latency p50 (ms)",
            [](const RunSummary& r) { return fmt::format("{:.3f}", r.p50_ms); });
  table.Row("per-token latency p99 (ms)",
            [](const RunSummary& r) { return fmt::format("{:.3f}", r.p99_ms); });
  table.Row("decode tokens/s",
            [](const RunSummary& r) { return fmt::format("{:.0f}", r.decode_tps); });
  table.Row("end-to-end tokens/s",
            [](const RunSummary& r) { return fmt::format("{:.0f}", r.e2e_tps); });
  table.Row("prefill: communication (%)",
            [&](const RunSummary& r) { return pct(r.prefill, r.prefill.comm_ns); });
  table.Row("prefill: uncovered comm (%)", [&](const RunSummary& r) {
    return fmt::format("{} {}", pct(r.prefill, r.prefill.uncovered_ns),
                       trace::VerdictName(r.prefill.UncoveredVerdict()));
  });
  table.Row("prefill: free time (%)",
            [&](const RunSummary& r) { return pct(r.prefill, r.prefill.free_ns); });
  table.Row("decode: communication (%)",
            [&](const RunSummary& r) { return pct(r.decode, r.decode.comm_ns); });
  table.Row("decode: uncovered comm (%)",
            [&](const RunSummary& r) { return pct(r.decode, r.decode.uncovered_ns); });
  table.Row("decode: free time (%)",
            [&](const RunSummary& r) { return pct(r.decode, r.decode.free_ns); });
  table.Row("TTFT speedup vs serial", [&](const RunSummary& r) {
    return fmt::format("{:.2f}x", r.ttft_ms > 0 ? base.ttft_ms / r.ttft_ms : 0.0);
  });
  table.Row("decode speedup vs serial", [&](const RunSummary& r) {
    return fmt::format("{:.2f}x", r.decode_tps > 0 ? r.decode_tps / base.decode_tps : 0.0);
  });
}

// Whether every pipeline generated the serial run's tokens from bitwise
// the same logits.
bool Identical(const std::vector<RunSummary>& runs) {
  const RunSummary& base = runs.front();
  bool identical = true;
  for (const auto& r : runs)
    identical = identical && r.tokens == base.tokens && r.fingerprint == base.fingerprint;
  return identical;
}

// Below the table: whether the runs agree, how many generated tokens
// continue the task, what the fused operators ran and where the traces
// are. Returns the share of correct tokens.
double PrintTokensAndFiles(const InferArgs& a, const std::vector<RunSummary>& runs,
                           bool identical) {
  const RunSummary& base = runs.front();
  fmt::print("\ngenerated tokens identical across pipelines (and their logits, bitwise): {}\n",
             identical ? "yes" : "NO");
  size_t correct = 0;
  for (size_t i = 0; i < base.tokens.size() && i < base.expected.size(); ++i)
    correct += base.tokens[i] == base.expected[i];
  const double accuracy =
      base.tokens.empty() ? 0.0 : static_cast<double>(correct) / base.tokens.size();
  fmt::print("generated tokens that continue the task ({}) correctly: {} of {} ({:.0f}%){}\n",
             models::TaskName(models::TransformerConfig{}.task), correct, base.tokens.size(),
             accuracy * 100,
             a.train_steps > 0 ? fmt::format(", after {} training steps", a.train_steps)
                               : std::string(" (untrained weights: --train-steps trains first)"));
  fmt::print("\nWhat the fused operators ran, per phase:\n");
  for (const auto& r : runs)
    fmt::print("{:>8}: prefill {}\n          decode  {}\n", r.pipeline, r.prefill_ran,
               r.decode_ran);
  fmt::print(
      "\nPhases: the traced generation's step 0 (prefill) and steps 1.. (decode), mean over "
      "ranks.\n");
  for (const auto& r : runs)
    fmt::print("{:>8}: trace {}\n          timeline {}\n", r.pipeline, r.trace_json, r.svg);
  return accuracy;
}

json ResultsJson(const InferArgs& a, const std::vector<RunSummary>& runs, const std::string& link,
                 bool identical, double accuracy) {
  const RunSummary& base = runs.front();
  json j = {{"mode", "infer"},
            {"ranks", a.nranks},
            {"tp", TpOf(a)},
            {"link", link},
            {"batch", a.model.batch},
            {"prompt_len", a.prompt_len},
            {"new_tokens", a.new_tokens},
            {"sequence_parallel", !a.no_sp},
            {"tokens_identical", identical},
            {"train_steps", a.train_steps},
            {"task_accuracy", accuracy}};
  for (const auto& r : runs) {
    j["runs"].push_back(
        {{"pipeline", r.pipeline},
         {"ttft_ms", r.ttft_ms},
         {"token_p50_ms", r.p50_ms},
         {"token_p99_ms", r.p99_ms},
         {"decode_tokens_per_s", r.decode_tps},
         {"tokens_per_s", r.e2e_tps},
         {"prefill_comm_pct", r.prefill.Pct(r.prefill.comm_ns)},
         {"prefill_uncovered_pct", r.prefill.Pct(r.prefill.uncovered_ns)},
         {"decode_comm_pct", r.decode.Pct(r.decode.comm_ns)},
         {"decode_uncovered_pct", r.decode.Pct(r.decode.uncovered_ns)},
         {"prefill_ran", r.prefill_ran},
         {"decode_ran", r.decode_ran},
         {"ttft_speedup", r.ttft_ms > 0 ? base.ttft_ms / r.ttft_ms : 0.0},
         {"decode_speedup", base.decode_tps > 0 ? r.decode_tps / base.decode_tps : 0.0}});
  }
  return j;
}

void Conduct(const InferArgs& a) {
  const auto t_start = std::chrono::steady_clock::now();
  CheckArgs(a);
  const fs::path out = PrepareDemoOutput(a.out, a.json_path, OwnOutputs());
  const int tp = TpOf(a);
  const auto pipelines = ParsePipelines(a.pipelines, "mc2 demo infer");

  const DemoLink dl = ResolveLink(
      a.link, [&] { return CalibrateLink(a, out); }, "the serial prefill's communication",
      a.comm_ratio);
  fmt::print(stderr, "inference on {} ranks (tp {}), {}\n", a.nranks, tp, dl.label);

  const std::string results = (out / "results.json").string();
  json res = RunDemoJob(
      a.nranks, RankArgv(a, PipelineList(pipelines), a.iters, a.warmup, out.string(), results),
      dl.spec, results, "mc2 demo infer", "inference");

  std::vector<RunSummary> runs;
  for (const auto& run : res["runs"]) runs.push_back(Summarise(a, run, out, dl.spec));
  PrintTable(a, runs, dl.label);
  const bool identical = Identical(runs);
  const double accuracy = PrintTokensAndFiles(a, runs, identical);
  FinishDemo(t_start, a.json_path, ResultsJson(a, runs, dl.spec, identical, accuracy), identical,
             "mc2 demo infer");
}

}  // namespace

void RegisterDemoInfer(CLI::App& demo) {
  auto a = std::make_shared<InferArgs>();
  CLI::App* cmd = demo.add_subcommand(
      "infer",
      "Tensor-parallel inference: prefill a batch of prompts, then greedy decoding with a KV "
      "cache, with every pipeline; time to first token, per-token latency, tokens/s");
  cmd->add_option("-n,--nranks", a->nranks, "Ranks to launch")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--tp", a->tp,
                  "Tensor-parallel group size (default: all ranks; the others "
                  "are data-parallel replicas)")
      ->check(CLI::Range(0, 64));
  cmd->add_option("--link", a->link,
                  "Emulated link: auto (calibrated so that a serial prefill's communication "
                  "takes --comm-ratio x its compute), none (raw shared memory), or a spec such as "
                  "bw=10GB/s,lat=5us (docs/link-emulation.md)")
      ->capture_default_str();
  cmd->add_option("--comm-ratio", a->comm_ratio, "--link auto: communication over compute")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 20.0));
  cmd->add_option("--pipelines", a->pipelines,
                  "Pipelines to compare, comma-separated: serial, chunked, fused, auto (serial "
                  "always runs first, as the baseline)")
      ->capture_default_str();
  cmd->add_option("--splits", a->splits, "Chunks of the chunked and fused pipelines (1-16)")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  cmd->add_option("-i,--iters", a->iters, "Timed generations per pipeline")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  cmd->add_option("-w,--warmup", a->warmup, "Untimed generations first")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  AddModelOptions(*cmd, a->model,
                  {.heads = "Attention heads (the TP size must divide it)",
                   .batch = "Prompts (global)"});
  cmd->add_option("--prompt-len", a->prompt_len, "Tokens per prompt")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--new-tokens", a->new_tokens, "Tokens generated per prompt")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_flag("--no-sp", a->no_sp,
                "Prefill without sequence parallelism (o and down end in MatmulAllReduce, as "
                "in decode)");
  cmd->add_option("-d,--dtype", a->dtype, "GEMM inputs: f32 or bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  AddSeedOption(*cmd, a->model, "Seed of the weights and the prompts");
  cmd->add_option("--train-steps", a->train_steps,
                  "Train the model on its task (modadd) for this many steps first, so that the "
                  "generated tokens can be checked against the task's continuation (0: the "
                  "seed's weights)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  cmd->add_option("--lr", a->lr, "--train-steps: AdamW learning rate")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  AddDemoEntry(cmd, "mc2 demo infer",
               {&a->out, &a->json_path, &a->rank_job, &a->results, [a] { return RunRankJob(*a); },
                [a] { Conduct(*a); }});
}

}  // namespace mc2::tools
