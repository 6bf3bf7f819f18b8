// `mc2 bench`: collective benchmarks in the manner of nccl-tests, and the
// tuning of the algorithm selector (--tune).
//
// Outside an mc2 job the command re-executes itself under the launcher with
// N ranks and a heap sized for the sweep, the ranks writing to its own
// output (only rank 0 prints); inside a job (as every rank of that
// launch, or under `mc2 run -n N mc2 bench ...`) it runs the sweep.
#include <fmt/format.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench.h"
#include "cli_validators.h"
#include "commands.h"
#include "core/env.h"
#include "launcher.h"
#include "mc2/mc2.h"
#include "output_paths.h"

namespace mc2::tools {

namespace {

constexpr int kDefaultRanks = 2;

struct BenchArgs {
  std::string coll;
  int nranks = 0;
  std::string min_bytes = "8", max_bytes = "256M";
  int factor = 2;
  std::string dtype = "f32", op = "sum", algo = "auto";
  int iters = 20, warmup = 5;
  bool no_check = false;
  std::string buffers = "symmetric";
  int root = 0;
  std::string json;
  bool tune = false;
  std::string output;
  std::string tune_result;  // internal: where a --tune job leaves its timings
};

[[noreturn]] void Usage(const std::string& message) {
  fmt::print(stderr, "mc2 bench: {}\n", message);
  throw CLI::RuntimeError(bench::kExitUsage);
}

// The arguments this executable was started with.
std::vector<std::string> SelfArgs() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string a; std::getline(in, a, '\0');) args.push_back(a);
  return args;
}

// Fails before any work when `path` cannot be written (output_paths.h).
void CheckOutput(const std::string& path, const char* flag) {
  try {
    CheckWritableFile(path, flag);
  } catch (const Error& e) {
    Usage(e.message());
  }
}

// What may follow `mc2 bench`: a collective, or the fused operators' "ops".
std::vector<std::string> CollAndOps() {
  std::vector<std::string> names = {"ops", "batch"};
  for (int c = 0; c <= static_cast<int>(bench::Coll::kSendRecv); ++c)
    names.push_back(bench::CollName(static_cast<bench::Coll>(c)));
  return names;
}

bench::Config Validate(const BenchArgs& a) {
  using namespace bench;
  Config cfg;
  if (a.coll.empty())
    Usage(fmt::format("missing the collective: expected one of {} (or --tune)", CollNames()));
  auto coll = ParseColl(a.coll);
  if (!coll)
    Usage(fmt::format("unknown collective '{}'{}: expected one of {} (or `mc2 bench ops`)", a.coll,
                      DidYouMean(a.coll, CollAndOps()), CollNames()));
  cfg.coll = *coll;
  cfg.nranks = a.nranks;
  // The option validators have checked the sizes' form (core::ParseBytes).
  cfg.min_bytes = core::ParseBytes(a.min_bytes, "-b");
  cfg.max_bytes = core::ParseBytes(a.max_bytes, "-e");
  if (cfg.min_bytes > cfg.max_bytes)
    Usage(fmt::format("-b {} is larger than -e {}", a.min_bytes, a.max_bytes));
  cfg.factor = a.factor;
  auto dtype = ParseDType(a.dtype);
  if (!dtype)
    Usage(fmt::format("unknown dtype '{}': expected f32, f64, f16, bf16, i8, u8, i32 or i64",
                      a.dtype));
  cfg.dtype = *dtype;
  auto op = ParseReduceOp(a.op);
  if (!op)
    Usage(fmt::format("unknown op '{}': expected sum, prod, min, max, avg, band, bor or bxor",
                      a.op));
  cfg.op = *op;
  if (IsReducing(cfg.coll) && !IsValidReduction(cfg.dtype, cfg.op))
    Usage(fmt::format("op {} is not defined for dtype {} (bitwise ops need an integer dtype)",
                      ReduceOpName(cfg.op), DTypeName(cfg.dtype)));
  auto algo = ParseAlgorithm(a.algo);
  if (!algo)
    Usage(fmt::format("unknown algorithm '{}': expected auto, ring, recursive_doubling, "
                      "rabenseifner, tree or direct",
                      a.algo));
  cfg.algo = *algo;
  if (cfg.coll == Coll::kSendRecv && cfg.algo != Algorithm::kAuto)
    Usage("--algo does not apply to send_recv");
  cfg.iters = a.iters;
  cfg.warmup = a.warmup;
  cfg.check = !a.no_check;
  cfg.symmetric = a.buffers == "symmetric";
  // Inside a job the job's size is checked by the ranks.
  // Inside a job started by `mc2 run` or by mpirun (across hosts).
  const bool in_job = Group::LaunchedByMc2() || Group::LaunchedByMpi();
  const int n = a.nranks ? a.nranks : (in_job ? 0 : kDefaultRanks);
  if (n > 0 && a.root >= n) Usage(fmt::format("--root {} is out of range for {} ranks", a.root, n));
  cfg.root = a.root;
  cfg.json_path = a.json;
  return cfg;
}

void RunCallback(const BenchArgs& a) {
  if (a.tune) {
    if (!a.coll.empty()) Usage("--tune measures every tunable collective: give no collective");
    if (Group::LaunchedByMc2()) {
      if (a.tune_result.empty()) Usage("--tune inside a job is internal to `mc2 bench --tune`");
      const int status = bench::RunTuneRank(a.tune_result);
      if (status != 0) throw CLI::RuntimeError(status);
      return;
    }
    if (Group::LaunchedByMpi()) {  // an mpirun job, across hosts: both levels
      if (a.nranks) Usage("-n goes with --tune outside a job (inside one: the job's ranks)");
      if (!a.output.empty()) CheckOutput(a.output, "--output");
      const int status = bench::RunTuneNet(a.output);
      if (status != 0) throw CLI::RuntimeError(status);
      return;
    }
    if (a.nranks == 1) Usage("-n 1 is invalid for --tune: expected 2 to 256 ranks");
    if (!a.output.empty()) CheckOutput(a.output, "--output");
    std::vector<int> counts = a.nranks ? std::vector<int>{a.nranks} : std::vector<int>{2, 4};
    const int status = bench::RunTune(SelfExe(), counts, a.output);
    if (status != 0) throw CLI::RuntimeError(status);
    return;
  }
  if (!a.output.empty())
    Usage(
        fmt::format("-o/--output {} goes with --tune (a sweep's rows: --json FILE; the "
                    "reduction: --op)",
                    a.output));
  bench::Config cfg = Validate(a);
  // Rank 0 writes the rows; inside a job the other ranks leave the check to it.
  const bool in_job = Group::LaunchedByMc2() || Group::LaunchedByMpi();
  const auto rank = Group::LaunchedByMc2() ? core::GetEnv("MC2_RANK")
                                           : core::GetEnv("OMPI_COMM_WORLD_RANK");
  if (!cfg.json_path.empty() && (!in_job || rank == "0"))
    CheckOutput(cfg.json_path, "--json");
  if (in_job) {
    const int status = bench::RunBenchRank(cfg);
    if (status != 0) throw CLI::RuntimeError(status);
    return;
  }
  LaunchOptions lo;
  lo.nranks = cfg.nranks ? cfg.nranks : kDefaultRanks;
  lo.argv = SelfArgs();
  if (lo.argv.empty()) {
    fmt::print(stderr, "mc2 bench: cannot read /proc/self/cmdline\n");
    throw CLI::RuntimeError(bench::kExitWrong);
  }
  lo.argv[0] = SelfExe();
  lo.prefix_output = false;
  lo.direct_output = true;
  lo.heap_bytes = bench::HeapBytesFor(cfg, lo.nranks);
  // Tell rank 0 whether a person is watching (its stderr may be a pipe).
  if (isatty(STDERR_FILENO)) setenv("MC2_BENCH_STDERR_TTY", "1", 1);
  const int status = RunLaunch(lo);
  if (status != 0) throw CLI::RuntimeError(status);
}

}  // namespace

void RegisterBench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Benchmark a collective over a range of sizes (nccl-tests layout), or --tune the "
      "algorithm selector");
  cmd->add_option("collective", a->coll,
                  "all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce or "
                  "send_recv");
  cmd->add_option("-n,--nranks", a->nranks,
                  "Ranks (default 2; inside a job: the job's size; --tune: 2 and 4)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("-b,--minbytes", a->min_bytes, "Smallest size in bytes, e.g. 8, 1K or 1.5K")
      ->capture_default_str()
      ->check(BytesValidator(1));
  cmd->add_option("-e,--maxbytes", a->max_bytes, "Largest size in bytes, e.g. 256M")
      ->capture_default_str()
      ->check(BytesValidator(1));
  cmd->add_option("-f,--stepfactor", a->factor, "Size multiplier between rows")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 20));
  cmd->add_option("-d,--dtype", a->dtype, "f32, f64, f16, bf16, i8, u8, i32 or i64")
      ->capture_default_str();
  cmd->add_option("--op", a->op, "sum, prod, min, max, avg, band, bor or bxor")
      ->capture_default_str();
  cmd->add_option("--algo", a->algo,
                  "auto, ring, recursive_doubling, rabenseifner, tree or direct; across hosts "
                  "hierarchical or direct (flat)")
      ->capture_default_str();
  cmd->add_option("-i,--iters", a->iters, "Timed iterations per size")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  cmd->add_option("-w,--warmup", a->warmup, "Untimed iterations per size")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_flag("--no-check", a->no_check,
                "Do not check the results (they are checked by default: exit 1 if any is wrong)");
  cmd->add_option("--buffers", a->buffers,
                  "symmetric (Group::AllocSymmetric) or private (heap memory)")
      ->capture_default_str()
      ->check(CLI::IsMember({"symmetric", "private"}));
  cmd->add_option("--root", a->root, "Root of broadcast and reduce")
      ->capture_default_str()
      ->check(CLI::Range(0, 255));
  cmd->add_option("--json", a->json, "Also write every row to this JSON file (- for standard output)");
  cmd->add_flag("--tune", a->tune,
                "Time every algorithm of all_reduce, all_gather, reduce_scatter, broadcast and "
                "reduce from 8 B to 64 MiB and write the selector's tuning table (in an mpirun "
                "job across hosts: also hierarchical vs flat across hosts, docs/multi-host.md)");
  cmd->add_option("-o,--output", a->output,
                  "--tune: the table to write (default ~/.cache/mc2/tuning.json)");
  cmd->add_option("--tune-result", a->tune_result)->group("");  // internal
  // `mc2 bench ops ...` (tools/bench_ops.cc) has its own options and callback.
  RegisterBenchOps(*cmd);
  // `mc2 bench batch ...` (tools/bench_batch.cc) likewise.
  RegisterBenchBatch(*cmd);
  cmd->callback([a, cmd] {
    if (cmd->got_subcommand("ops") || cmd->got_subcommand("batch")) return;
    RunCallback(*a);
  });
}

}  // namespace mc2::tools
