// `mc2 demo cp`: context parallelism with ring attention
// (models::RingAttention, include/mc2/models.h) on cp x tp local ranks: the
// attention layer of a transformer whose heads are split over TP groups of
// tp ranks and whose sequence is split over CP groups of cp ranks (world
// rank = cp_index * tp + tp_index; each TP rank runs its heads' ring over
// its CP group). Forward and backward, with the ring's transfers waited
// for before each block's compute (no overlap, the baseline) and posted
// ahead of it (overlap), side by side on the same inputs: step time,
// communication share, uncovered communication, free time, the speedup of
// the overlapped ring, and whether both give the same bits. Writes each
// run's trace and an SVG timeline.
//
// Outside a job the command is the conductor: it checks the options,
// optionally calibrates the emulated link (--link auto: the bandwidth at
// which one block's transfer takes --comm-ratio times one block's compute,
// about equal at the default 1), launches the job (re-executing itself with
// --rank-job) and analyses the traces. Inside the job each rank runs both
// variants in turn, round after round; rank 0 writes the results.
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

constexpr const char* kCommand = "mc2 demo cp";

struct CpArgs {
  int nranks = 0;  // 0: cp x tp
  int cp = 0;      // 0: -n / --tp, or 2
  int tp = 1;
  int seq_len = 2048, heads = 8, head_dim = 64, batch = 1;
  bool no_causal = false;
  std::string overlap = "both";  // off, on, both
  std::string link = "auto";
  double comm_ratio = 1.0;
  int iters = 5, warmup = 1;
  uint64_t seed = 1;
  std::string out = "mc2-demo-cp";
  std::string json_path;
  bool rank_job = false;
  std::string results;
};

[[noreturn]] void Usage(const std::string& message) { DemoUsage(kCommand, message); }

const char* ModeName(bool overlap) { return overlap ? "overlap" : "no-overlap"; }

std::vector<bool> Modes(const std::string& overlap) {
  if (overlap == "off") return {false};
  if (overlap == "on") return {true};
  return {false, true};  // the baseline first
}

models::RingAttentionConfig RingConfig(const CpArgs& a, bool overlap) {
  models::RingAttentionConfig c;
  c.batch = a.batch;
  c.seq_len = a.seq_len;
  c.heads = a.heads / a.tp;
  c.head_dim = a.head_dim;
  c.causal = !a.no_causal;
  c.overlap = overlap;
  return c;
}

// A seeded value in [-1, 1) per (stream, global index) (splitmix64).
float Uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (stream << 56) ^ index;
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

uint64_t Fnv(uint64_t h, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// ---------------------------------------------------------------------------
// The rank side.

int RunRankJob(const CpArgs& a) {
  Group world = Group::FromEnv();
  const bool root = world.rank() == 0;
  const int tp_index = world.rank() % a.tp, cp_index = world.rank() / a.tp;
  Group cp = world.Split(/*color=*/tp_index, /*key=*/cp_index);
  const std::vector<bool> modes = Modes(a.overlap);
  std::vector<std::unique_ptr<models::RingAttention>> rings;
  for (bool m : modes)
    rings.push_back(std::make_unique<models::RingAttention>(cp, RingConfig(a, m)));
  const models::RingAttention& r0 = *rings.front();
  const size_t HD = static_cast<size_t>(a.heads / a.tp) * a.head_dim;
  const size_t rows = static_cast<size_t>(r0.local_len()) * a.batch, n = rows * HD;
  // This rank's rows of seeded global tensors (its heads, its positions).
  std::vector<float> q(n), k(n), v(n), dout(n), out(n), dq(n), dk(n), dv(n);
  for (size_t row = 0; row < rows; ++row) {
    const int64_t pos = r0.Position(static_cast<int>(row / a.batch));
    const size_t b = row % a.batch;
    for (size_t c = 0; c < HD; ++c) {
      const uint64_t g = ((static_cast<uint64_t>(pos) * a.batch + b) * a.heads +
                          static_cast<uint64_t>(tp_index) * (a.heads / a.tp)) *
                             a.head_dim +
                         c;
      q[row * HD + c] = Uniform(a.seed, 1, g);
      k[row * HD + c] = Uniform(a.seed, 2, g);
      v[row * HD + c] = Uniform(a.seed, 3, g);
      dout[row * HD + c] = Uniform(a.seed, 4, g);
    }
  }
  struct Acc {
    json step_s = json::array(), fwd_s = json::array(), bwd_s = json::array();
    json wait_s = json::array();
    uint64_t fingerprint = 0;
  };
  std::vector<Acc> acc(modes.size());
  const int rounds = a.warmup + a.iters;
  for (int it = 0; it < rounds; ++it) {
    for (size_t j = 0; j < modes.size(); ++j) {
      // The starting variant rotates, so a change in the machine's load
      // (it may be shared) falls on both alike.
      const size_t m = (j + static_cast<size_t>(it)) % modes.size();
      models::RingAttention& ring = *rings[m];
      const bool traced = it == rounds - 1;
      const std::string dir = (fs::path(a.out) / ModeName(modes[m])).string();
      Barrier(world).Wait();
      if (traced) {
        trace::Enable(dir);
        trace::MarkStep(0);
      }
      const auto t0 = std::chrono::steady_clock::now();
      ring.Forward(q.data(), HD, k.data(), HD, v.data(), HD, out.data(), HD);
      const auto t1 = std::chrono::steady_clock::now();
      ring.Backward(dout.data(), HD, dq.data(), HD, dk.data(), HD, dv.data(), HD);
      const auto t2 = std::chrono::steady_clock::now();
      if (traced) {
        trace::EndStep();
        StopTrace();
      }
      // The step's time is the slowest rank's.
      double t[3] = {std::chrono::duration<double>(t2 - t0).count(),
                     std::chrono::duration<double>(t1 - t0).count(),
                     std::chrono::duration<double>(t2 - t1).count()};
      AllReduce(world, t, t, 3, DType::kF64, ReduceOp::kMax).Wait();
      if (it < a.warmup) continue;
      acc[m].step_s.push_back(t[0]);
      acc[m].fwd_s.push_back(t[1]);
      acc[m].bwd_s.push_back(t[2]);
      acc[m].wait_s.push_back(ring.forward_wait_seconds() + ring.backward_wait_seconds());
      uint64_t h = 1469598103934665603ull;
      for (const auto* x : {&out, &dq, &dk, &dv}) h = Fnv(h, x->data(), x->size() * sizeof(float));
      acc[m].fingerprint = h;
    }
    PrintRound(root, it, rounds, a.warmup);
  }
  // Same bits on every rank for both variants: combine the ranks' hashes.
  std::vector<uint64_t> fps(modes.size()), all(modes.size() * world.size());
  for (size_t m = 0; m < modes.size(); ++m) fps[m] = acc[m].fingerprint;
  AllGather(world, fps.data(), all.data(), fps.size(), DType::kI64).Wait();
  json runs = json::array();
  for (size_t m = 0; m < modes.size(); ++m) {
    uint64_t h = 1469598103934665603ull;
    for (int r = 0; r < world.size(); ++r) h = Fnv(h, &all[r * modes.size() + m], sizeof(uint64_t));
    runs.push_back({{"overlap", static_cast<bool>(modes[m])},
                    {"step_seconds", acc[m].step_s},
                    {"forward_seconds", acc[m].fwd_s},
                    {"backward_seconds", acc[m].bwd_s},
                    {"wait_seconds", acc[m].wait_s},
                    {"fingerprint", fmt::format("{:016x}", h)},
                    {"trace_dir", (fs::path(a.out) / ModeName(modes[m])).string()}});
  }
  if (root) {
    return WriteJobResults(a.results, json{{"ranks", world.size()}, {"runs", runs}}, kCommand);
  }
  return 0;
}

// ---------------------------------------------------------------------------
// The conductor.

std::vector<std::string> RankArgv(const CpArgs& a, const std::string& overlap, int iters,
                                  int warmup, const std::string& out, const std::string& results) {
  JobArgv v("cp", results, out, iters, warmup);
  v.Add("--overlap", overlap);
  v.Add("--cp", std::to_string(a.cp));
  v.Add("--tp", std::to_string(a.tp));
  v.Add("--seq-len", std::to_string(a.seq_len));
  v.Add("--heads", std::to_string(a.heads));
  v.Add("--head-dim", std::to_string(a.head_dim));
  v.Add("--batch", std::to_string(a.batch));
  v.Add("--seed", std::to_string(a.seed));
  if (a.no_causal) v.Add("--no-causal");
  return v.Take();
}

// The bandwidth at which one block's transfer takes comm_ratio times one
// block's compute (the mean of the 2N blocks, N forward and N backward, a
// rank computes), from two short traced non-overlapped runs, as `mc2 demo`
// calibrates. The ring passes fewer blocks than it computes (N-1 forward,
// 2N-3 backward), so the runs' bytes and transfer time are scaled to 2N
// transfers; the trace counts each block once as sent and once as
// received, so n = 2 halves the bytes to those a rank's port sends.
std::string Calibrate(const CpArgs& a, const fs::path& out) {
  auto measure = [&](const std::string& link, const char* name) {
    trace::Report r = CalibrationRun(
        out / "calibrate" / name, [&](const std::string& dir, const std::string& results) {
          const fs::path d(dir);
          int status = LaunchDemoJob(a.cp * a.tp, RankArgv(a, "off", 1, 1, dir, results), link);
          // CalibrationRun reads dir/serial: the non-overlapped run's trace.
          if (status == 0 && !fs::exists(d / "serial"))
            fs::rename(d / ModeName(false), d / "serial");
          return status;
        });
    LinkSample m;
    const double recorded = CommBytesPerRank(r);
    for (const auto& st : r.steps) {
      m.compute_s += st.b.compute_ns * 1e-9;
      m.comm_s += st.b.comm_ns * 1e-9;
    }
    if (m.compute_s <= 0 || recorded <= 0)
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: --link auto cannot calibrate: the run recorded {:.0f} bytes "
                              "per rank (one CP rank passes nothing: --cp 1); give a link "
                              "spec or none",
                              kCommand, recorded));
    // One block: K and V of this rank's positions and heads.
    const double block = 2.0 * (a.seq_len / a.cp) * a.batch * (a.heads / a.tp) * a.head_dim *
                         static_cast<double>(sizeof(float));
    const double per_block = 2.0 * (2.0 * a.cp) * block;  // 2N blocks, sent and received
    m.comm_s *= per_block / recorded;
    m.bytes = per_block;
    return m;
  };
  return tools::CalibrateLink(a.comm_ratio, 2, measure, kCommand);
}

struct RunSummary {
  bool overlap = false;
  double step_ms = 0, fwd_ms = 0, bwd_ms = 0, wait_ms = 0;
  trace::Breakdown b;
  std::string fingerprint, trace_json, svg;
};

// -n fixes the rank count, cp x tp: the CP size follows from it unless --cp
// is given too, when the two must agree.
void ResolveRanks(CpArgs& a) {
  if (a.nranks == 0) {
    if (a.cp == 0) a.cp = 2;
    return;
  }
  if (a.nranks % a.tp != 0)
    Usage(fmt::format("--tp {} must divide -n {} (the ranks are cp x tp)", a.tp, a.nranks));
  if (a.cp == 0) a.cp = a.nranks / a.tp;
  if (a.cp * a.tp != a.nranks)
    Usage(fmt::format("--cp {} x --tp {} must be -n {}", a.cp, a.tp, a.nranks));
}

void CheckArgs(const CpArgs& a) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) Usage(what);
  };
  need(a.heads % a.tp == 0,
       fmt::format("--tp {} must divide --heads {} (each TP rank holds its heads)", a.tp, a.heads));
  need(a.seq_len % (2 * a.cp) == 0,
       fmt::format("--seq-len {} must be divisible by 2 x --cp = {} (every CP rank holds two of "
                   "2 x cp equal chunks)",
                   a.seq_len, 2 * a.cp));
  need(a.overlap == "on" || a.overlap == "off" || a.overlap == "both",
       fmt::format("--overlap {}: expected on, off or both", a.overlap));
  CheckLinkOption(a.link);
  need(!(a.link == "auto" && a.cp < 2),
       "--link auto needs --cp >= 2 (a ring of one rank passes nothing to calibrate on)");
}

std::vector<std::string> OwnOutputs() {
  std::vector<std::string> names = {"results.json"};
  AddCalibrationOutputs(names, "serial");
  AddRunOutputs(names, {ModeName(false), ModeName(true)});
  return names;
}

// One variant's run from the job's results and its trace (exported to
// `out`).
RunSummary Summarise(const CpArgs& a, const json& run, const fs::path& out,
                     const std::string& link) {
  RunSummary s;
  s.overlap = run["overlap"].get<bool>();
  s.step_ms = Median(run["step_seconds"].get<std::vector<double>>()) * 1e3;
  s.fwd_ms = Median(run["forward_seconds"].get<std::vector<double>>()) * 1e3;
  s.bwd_ms = Median(run["backward_seconds"].get<std::vector<double>>()) * 1e3;
  s.wait_ms = Median(run["wait_seconds"].get<std::vector<double>>()) * 1e3;
  s.fingerprint = run["fingerprint"].get<std::string>();
  const char* name = ModeName(s.overlap);
  const RunTrace t = ExportRunTrace(run["trace_dir"].get<std::string>(), out, name,
                                    fmt::format("{}: ring attention, {}, cp {} x tp {}, {}",
                                                kCommand, name, a.cp, a.tp, LinkTitle(link)));
  for (const auto& st : t.report.steps) s.b += st.b;
  s.trace_json = t.trace_json;
  s.svg = t.svg;
  return s;
}

// The table, one column per variant.
void PrintTable(const CpArgs& a, const std::vector<RunSummary>& runs,
                const std::string& link_label) {
  const RunSummary& base = runs.front();
  const RunTable<RunSummary> table(runs, 34, 14);
  auto pct = [](const RunSummary& r, int64_t ns) { return fmt::format("{:.1f}", r.b.Pct(ns)); };
  fmt::print(
      "\n{}: ring attention forward + backward, sequence {} over cp {} (chunks of {}), {} heads "
      "over tp {}, head_dim {}, batch {}, {}\n{}; {} timed steps after {} warm-up, medians of "
      "the slowest rank\n\n",
      kCommand, a.seq_len, a.cp, a.seq_len / (2 * a.cp), a.heads, a.tp, a.head_dim, a.batch,
      a.no_causal ? "no mask" : "causal (load-balanced)", link_label, a.iters, a.warmup);
  table.Row("", [](const RunSummary& r) { return std::string(ModeName(r.overlap)); });
  table.Row("step time (ms)", [](const RunSummary& r) { return fmt::format("{:.2f}", r.step_ms); });
  table.Row("  forward (ms)", [](const RunSummary& r) { return fmt::format("{:.2f}", r.fwd_ms); });
  table.Row("  backward (ms)", [](const RunSummary& r) { return fmt::format("{:.2f}", r.bwd_ms); });
  table.Row("blocked on transfers (ms)",
            [](const RunSummary& r) { return fmt::format("{:.2f}", r.wait_ms); });
  table.Row("communication (%)", [&](const RunSummary& r) { return pct(r, r.b.comm_ns); });
  table.Row("uncovered comm (%)", [&](const RunSummary& r) {
    return fmt::format("{} {}", pct(r, r.b.uncovered_ns),
                       trace::VerdictName(r.b.UncoveredVerdict()));
  });
  table.Row("free time (%)", [&](const RunSummary& r) { return pct(r, r.b.free_ns); });
  table.Row("speedup vs no-overlap", [&](const RunSummary& r) {
    return fmt::format("{:.2f}x", r.step_ms > 0 ? base.step_ms / r.step_ms : 0.0);
  });
}

// Below the table: whether both variants gave the same bits, and where the
// traces are. Returns that.
bool PrintIdenticalAndFiles(const std::vector<RunSummary>& runs) {
  bool identical = true;
  for (const auto& r : runs) identical = identical && r.fingerprint == runs.front().fingerprint;
  fmt::print("\noutput and dQ, dK, dV identical (bitwise) across variants: {}\n",
             identical ? "yes" : "NO");
  fmt::print("\nShares: of the traced step, mean over ranks.\n");
  for (const auto& r : runs)
    fmt::print("{:>10}: trace {}\n            timeline {}\n", ModeName(r.overlap), r.trace_json,
               r.svg);
  return identical;
}

json ResultsJson(const CpArgs& a, const std::vector<RunSummary>& runs, const std::string& link,
                 bool identical) {
  const RunSummary& base = runs.front();
  json j = {{"mode", "cp"},
            {"ranks", a.cp * a.tp},
            {"cp", a.cp},
            {"tp", a.tp},
            {"seq", a.seq_len},
            {"heads", a.heads},
            {"head_dim", a.head_dim},
            {"batch", a.batch},
            {"causal", !a.no_causal},
            {"link", link},
            {"iters", a.iters},
            {"identical", identical}};
  for (const auto& r : runs) {
    j["runs"].push_back({{"overlap", r.overlap},
                         {"step_ms", r.step_ms},
                         {"forward_ms", r.fwd_ms},
                         {"backward_ms", r.bwd_ms},
                         {"wait_ms", r.wait_ms},
                         {"comm_pct", r.b.Pct(r.b.comm_ns)},
                         {"uncovered_pct", r.b.Pct(r.b.uncovered_ns)},
                         {"free_pct", r.b.Pct(r.b.free_ns)},
                         {"speedup", r.step_ms > 0 ? base.step_ms / r.step_ms : 0.0}});
  }
  return j;
}

void Conduct(const CpArgs& a) {
  const auto t_start = std::chrono::steady_clock::now();
  CheckArgs(a);
  const fs::path out = PrepareDemoOutput(a.out, a.json_path, OwnOutputs());
  const int nranks = a.cp * a.tp;
  const DemoLink dl = ResolveLink(
      a.link, [&] { return Calibrate(a, out); }, "one block's transfer", a.comm_ratio);
  fmt::print(stderr, "ring attention on {} ranks (cp {}, tp {}), {}\n", nranks, a.cp, a.tp,
             dl.label);
  const std::string results = (out / "results.json").string();
  json res = RunDemoJob(nranks, RankArgv(a, a.overlap, a.iters, a.warmup, out.string(), results),
                        dl.spec, results, kCommand, "ring attention");

  std::vector<RunSummary> runs;
  for (const auto& run : res["runs"]) runs.push_back(Summarise(a, run, out, dl.spec));
  PrintTable(a, runs, dl.label);
  const bool identical = PrintIdenticalAndFiles(runs);
  FinishDemo(t_start, a.json_path, ResultsJson(a, runs, dl.spec, identical), identical, kCommand);
}

}  // namespace

void RegisterDemoCp(CLI::App& demo) {
  auto a = std::make_shared<CpArgs>();
  CLI::App* cmd = demo.add_subcommand(
      "cp",
      "Context parallelism: ring attention forward and backward over cp ranks (x tp for the "
      "heads), the ring's transfers overlapped with its compute or not");
  cmd->add_option("-n,--nranks", a->nranks, "Ranks to launch, cp x tp (default: --cp x --tp)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--cp", a->cp, "Context-parallel ranks, the ring (default: -n / --tp, or 2)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--tp", a->tp, "Tensor-parallel ranks (heads split over them); cp x tp ranks")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--seq-len", a->seq_len, "Tokens per sequence (2 x cp must divide it)")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 22));
  cmd->add_option("--heads", a->heads, "Attention heads (tp must divide it)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 12));
  cmd->add_option("--head-dim", a->head_dim, "Head width")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 12));
  cmd->add_option("--batch", a->batch, "Sequences")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 12));
  cmd->add_flag("--no-causal", a->no_causal, "Full attention instead of causal");
  cmd->add_option("--overlap", a->overlap,
                  "on, off or both (the ring without overlap is the baseline)")
      ->capture_default_str();
  cmd->add_option("--link", a->link,
                  "Emulated link: auto (calibrated so that one block's transfer takes "
                  "--comm-ratio x one block's compute), none (raw shared memory), or a spec "
                  "such as bw=1GB/s,lat=5us")
      ->capture_default_str();
  cmd->add_option("--comm-ratio", a->comm_ratio,
                  "--link auto: one block's transfer over one block's compute")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 20.0));
  cmd->add_option("-i,--iters", a->iters, "Timed steps per variant")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  cmd->add_option("-w,--warmup", a->warmup, "Untimed steps first")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  cmd->add_option("--seed", a->seed, "Seed of the inputs")->capture_default_str();
  AddDemoEntry(cmd, kCommand,
               {&a->out, &a->json_path, &a->rank_job, &a->results, [a] { return RunRankJob(*a); },
                [a] {
                  ResolveRanks(*a);
                  Conduct(*a);
                }});
}

}  // namespace mc2::tools
