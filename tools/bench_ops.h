// `mc2 bench ops`: shared pieces of the fused-operator benchmark.
//
// bench_ops.cc parses the command line and, outside an mc2 job, launches
// the ranks (after --link auto's calibration jobs); bench_ops_cases.cc and
// bench_ops_moe.cc say what each operator case runs (the fused call, its
// compute-only and comm-only baselines); bench_ops_sweep.cc times them
// round-robin on every rank; bench_ops_report.cc prints the table and
// writes the JSON on rank 0; bench_ops_tune.cc measures the cost model's
// parameters (--tune).
//
// The figures (bench_ops_report.cc prints the same legend):
//   floor    max(compute-only, comm-only): no pipeline can beat it, since
//            it must run all of the compute and move all of the bytes;
//            both are timed in the same round-robin iterations as the
//            pipelines, so the host's load changes hit them alike.
//   overlap  (compute-only + comm-only - time) / min(compute-only,
//            comm-only): the share of the shorter side hidden behind the
//            longer one. It is at most 100% whenever the time respects the
//            floor; a time below the floor (the medians' noise) is marked
//            `noise` and gets no overlap figure.
//   model    the pipeline-fill prediction max + min / stages (stages = s
//            for chunked, n s for fused; serial: the sum): a prediction,
//            not a bound.
#ifndef MC2_TOOLS_BENCH_OPS_H_
#define MC2_TOOLS_BENCH_OPS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mc2/mc2.h"
#include "mc2/ops.h"
#include "ops/cost_model.h"
#include "ops/gemm.h"

namespace mc2::tools::bench_ops {

// One run's configuration, validated (bench_ops.cc).
struct OpsConfig {
  std::string op;  // --operator: a runner's name
  int nranks = 0;  // 0: the job's size
  DType dtype = DType::kF32;
  size_t m = 0, k = 0, n = 0;
  std::vector<Pipeline> pipelines;
  std::vector<int> splits;
  std::string link = "none";  // a link spec or "none" (auto resolved outside)
  bool link_auto = false;     // the link was calibrated by --link auto
  int iters = 5, warmup = 2;
  // Fresh round-robin iterations of compute-only, comm-only, serial, the
  // sweep's best and auto, after the sweep (0: none). The best of many
  // noisy medians is biased low (its own noise is what made it the
  // minimum), so ratios against it are re-measured on new iterations.
  int confirm = 0;
  std::string json_path;
  std::string calibrate_out;
  // --trace-ab DIR: time every configuration twice per iteration, traced
  // into DIR and untraced, in alternating order, to measure what tracing
  // costs side by side in one run.
  std::string trace_ab;
};

// Deterministic inputs: `count` values in [-1, 1) of `dtype` from a hash of
// (seed, index).
void Fill(std::vector<char>& bytes, size_t count, DType dtype, uint64_t seed);

// Rows of `m` that rank `rank` of `n` holds: an even split, the remainder
// spread over the ranks.
inline size_t RowsOf(size_t m, int rank, int n) { return m * (rank + 1) / n - m * rank / n; }

// One operator on one rank: its inputs and the three things that are timed.
class OpCase {
 public:
  virtual ~OpCase() = default;
  // Runs the operator with `o` (this rank's result goes to Output()).
  virtual FusedReport Run(const FusedOptions& o) = 0;
  // The compute the serial pipeline runs, without communication.
  virtual void ComputeOnly() = 0;
  // The communication the serial pipeline runs, without compute.
  virtual void CommOnly(const CollectiveOptions& co) = 0;
  virtual std::span<const float> Output() const = 0;

  // The GEMMs as the operators run them: deterministic f32 on oneDNN, each
  // B packed once per call (ops::PackedGemmBSet), the packing included.
  static ops::PackedGemmBSet OpGemms(const Group& g, DType dtype);
};

// The runner table (bench_ops_cases.cc). Adding an operator: write one
// class deriving from OpCase (AllGatherMatmulCase shows the pattern: inputs
// made by Fill(), the operator call, the serial pipeline's compute and
// collective alone) and append one line to the table; timing, columns,
// JSON and --link auto are shared.
struct OpRunner {
  const char* name;
  ops::FusedOpKind kind;  // for the cost model (--link auto's port bytes)
  const char* shapes;     // how -m/-k/-N map to the operator
  std::unique_ptr<OpCase> (*make)(const Group& g, const OpsConfig& c);
  // Bytes the busiest port carries in the serial pipeline, for --link auto,
  // when the cost model does not know the operator (null: ask the model).
  double (*port_bytes)(const OpsConfig& c, int n) = nullptr;
};

std::span<const OpRunner> Runners();
// Null if no runner has this name.
const OpRunner* FindRunner(const std::string& name);
std::vector<std::string> RunnerNames();

// MatmulAllReduce (all_reduce) or MatmulReduceScatter on `c`'s shape; --tune
// times it. `c` must outlive the case.
std::unique_ptr<OpCase> MakeMatmulReduceCase(const Group& g, const OpsConfig& c, bool all_reduce);
// The MoE cases (bench_ops_moe.cc).
std::unique_ptr<OpCase> MakeMoeCase(const Group& g, const OpsConfig& c);
std::unique_ptr<OpCase> MakeMoeMlpCase(const Group& g, const OpsConfig& c);
double MoePortBytes(const OpsConfig& c, int n);

// The cost model's view of a configuration (port bytes, workspace).
ops::Problem ProblemOf(const OpRunner& r, const OpsConfig& c, int n);
// Symmetric heap per rank that a run of `c` on `n` ranks needs.
size_t HeapBytesFor(const OpRunner& r, const OpsConfig& c, int n);

// The collectives' options the operators use: in the background, and under
// link emulation the ring (which declares its bytes to the link).
CollectiveOptions OpCollectiveOptions(bool emulated);

// The floor, overlap and model of one set of medians (see the top).
struct Bounds {
  double tc = 0, tm = 0;  // compute-only, comm-only (seconds)
  double Floor() const;
  // Whether `t` beats the floor (then it has no overlap figure).
  bool BelowFloor(double t) const { return t < Floor(); }
  // The overlap of a pipeline that took `t`; nullopt when nothing can be
  // hidden (one rank) or `t` is below the floor.
  std::optional<double> Overlap(double t) const;
  // The pipeline-fill model for `stages` overlapped stages (0: serial).
  double Model(int stages) const;
};

// One row of the table: a pipeline and split count, or auto.
struct Row {
  std::string pipeline;
  int splits = 1;
  int stages = 1;
  bool serial = false;  // what ran was the serial pipeline
  double time_s = 0;
  double traced_s = 0;  // --trace-ab: the median with tracing on
  int64_t wrong = 0;
  std::string chosen;  // what ran: "pipeline s=splits"
};

// Fresh round-robin iterations of the figures the verdicts rest on (see
// OpsConfig::confirm).
struct Confirmed {
  Bounds bounds;
  double serial = 0, best = 0, automatic = 0;
  // Medians of the per-iteration ratios: auto and the best (and serial)
  // of one iteration ran back to back, so a slow spell of the host slows
  // both and cancels out of their ratio; the ratio of the two medians
  // keeps it whenever the spell hits one more often.
  double auto_over_best_paired = 0, auto_over_serial_paired = 0;
  // The same for the best: serial / best and best / that iteration's
  // floor (max of its compute-only and comm-only).
  double serial_over_best_paired = 0, best_over_floor_paired = 0;
  // Every iteration's times (seconds), in order; comm empty on one rank,
  // automatic empty without auto.
  std::vector<double> compute_times, comm_times, serial_times, best_times, auto_times;
};

// Everything rank 0 reports about one run.
struct Results {
  int ranks = 0;
  bool deterministic = true;
  std::string link;  // described, or "none"
  Bounds bounds;
  double serial_s = 0;
  std::vector<Row> rows;  // serial first
  size_t best_row = 0;    // the best fixed configuration (auto excluded)
  std::optional<size_t> auto_row;
  std::optional<Confirmed> confirmed;
  int64_t wrong = 0;
};

// Prints the header lines (before the rows), one row, and the summary.
void PrintHeader(const OpsConfig& cfg, const Results& res);
void PrintRow(const Results& res, const Row& r);
void PrintSummary(const OpsConfig& cfg, const Results& res);
// Writes the run as JSON to cfg.json_path; false (with a message naming
// the OS's reason) when it cannot be written.
bool WriteJson(const OpsConfig& cfg, const Results& res);

// Runs the sweep on this rank of an mc2 job; the exit status.
int RunOpsRank(const OpsConfig& cfg);
// --tune on this rank of an mc2 job: rank 0 merges the measured cost model
// parameters into `path`; the exit status.
int RunTuneRank(const OpsConfig& cfg, const std::string& path);

}  // namespace mc2::tools::bench_ops

#endif  // MC2_TOOLS_BENCH_OPS_H_
