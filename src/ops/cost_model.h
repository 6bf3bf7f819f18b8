// The cost model behind Pipeline::kAuto of the fused operators.
//
// Works as follows. For a call (operator, rank count, dtype, M, k, n, the
// per-rank row blocks) and a candidate (pipeline, s) the model predicts
//
//   T = max(Tc', H) + min(Tc', H) / stages + calls * alpha
//
// the T(s) ~ max(Tc, Tm) + min(Tc, Tm)/s + s alpha, generalised to
// what this host can hide:
//   Tc     the GEMM time of the pipeline's GEMM calls: 2 n k (rows + h) / G
//          per call, where G is the GEMM rate (flop/s) of the dtype and h
//          the "half-efficiency rows" (a call of h rows runs at G/2): small
//          chunks lose efficiency, which is what stops s from growing.
//   Tm     the communication, split in two parts:
//          - cpu: copies the cores make (shared-memory collectives, the
//            fused pipeline's own copies), fitted per collective as
//            lat + bytes / bw on raw shared memory;
//          - link: under link emulation, latency plus the bytes the
//            pipeline puts on a rank's egress port over the link bandwidth
//            (the port serializes them; no CPU).
//          Only a fraction `overlap_cpu` of the cpu part can hide behind the
//          GEMMs (the cores that copy are the cores that multiply; with one
//          rank per core little hides), all of the link part can:
//          Tc' = Tc + (1 - overlap_cpu) cpu,   H = link + overlap_cpu cpu.
//   stages the pipeline depth: s for chunked, n s for fused (n blocks of s
//          chunks); serial has one stage and no overlap: T = Tc + Tm.
//   alpha  the fixed cost of one pipeline step (a collective's launch for
//          chunked, a signal and wait for fused), per call of the pipeline.
//
// ChoosePipeline evaluates serial, chunked and fused for s in 1..16. The
// model's largest error on a shared host is the GEMM rate of the moment
// (which moves the compute/link balance), so each candidate is also
// evaluated at 0.6x and 1.6x the tuned rate, and the candidate with the
// lowest worst-case ratio to each scenario's best wins (the choice that is
// never far from the best, rather than the best for one guess). It keeps
// serial unless the winner is predicted at least `min_gain` (3%) faster at
// the tuned rate and not slower in the other scenarios, since a smaller
// gain is within the model's error and could as well be a loss. Fused is a
// candidate only when its workspace fits in a quarter of the heap.
//
// Parameters come from the operator tuning file that `mc2 bench ops --tune`
// measures and writes (JSON, below), found as MC2_OPS_TUNING_FILE, else
// ~/.cache/mc2/ops_tuning.json; without one, built-in defaults measured on
// the development host. Every input is the same on every rank (the
// operators check a hash of them), so every rank chooses alike.
//
// Thread safety: the functions are pure; LoadedCostParams() loads once
// (thread-safe static) and returns an immutable object.
#ifndef MC2_OPS_COST_MODEL_H_
#define MC2_OPS_COST_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mc2/ops.h"
#include "mc2/tensor.h"

namespace mc2::ops {

// The operators the model knows (values are the operators' wire ids).
enum class FusedOpKind : uint64_t { kAllGatherMatmul = 1, kMatmulReduceScatter, kMatmulAllReduce };
const char* FusedOpKindName(FusedOpKind op);

struct CostParams {
  // GEMM: rate (flop/s) of one rank on a core of its own, and
  // half-efficiency rows, per dtype. With more ranks than cores the model
  // scales the rate (and the copy rate) by cores / ranks.
  struct GemmRate {
    double flops_per_s = 100e9;
    double half_rows = 8;
  };
  // One collective on raw shared memory: lat + bytes / bytes_per_s, where
  // bytes is the collective's per-rank size as the operators pass it
  // (all_gather: the gathered output, reduce_scatter and all_reduce: the
  // input).
  struct Comm {
    double lat_s = 50e-6;
    double bytes_per_s = 5e9;
  };
  struct PerRanks {
    Comm all_gather, reduce_scatter, all_reduce;
  };
  GemmRate f32{100e9, 8}, bf16{200e9, 8};
  // Rank count -> collectives (the nearest count at or below is used, else
  // the smallest above).
  std::map<int, PerRanks> comm;
  // Memory copy rate of one core (the fused pipeline's copies).
  double copy_bytes_per_s = 6e9;
  // Per pipeline step: chunked (one collective) and fused (signal + wait).
  double alpha_chunked_s = 60e-6;
  double alpha_fused_s = 20e-6;
  // Under link emulation, each dependent flag hop of a collective (a ring
  // step waiting for the previous one) also pays the delivery thread's and
  // the waiter's wake-ups (docs/link-emulation.md: a delayed flag appears
  // late, later when the cores are busy). Charged
  // per hop to the chunked pipeline's s collectives; the fused pipeline's
  // transfers do not depend on each other, so it pays this once.
  double link_hop_s = 500e-6;
  // Under link emulation, how much more a pipeline step may cost than the
  // model says (wake-ups of delayed flags on a busy host): ChoosePipeline
  // prefers candidates that stay near the best with this added per step,
  // a quarter of it when every rank has a core of its own; a larger risk
  // keeps s below the flat optimum of larger s.
  double link_step_risk_s = 0.5e-3;
  // Fraction of the cpu part of communication that hides behind GEMMs,
  // when there are at least as many ranks as cores, and when there are
  // fewer.
  double overlap_cpu_busy = 0.1;
  double overlap_cpu_idle = 0.7;
  // Keep serial unless the best candidate is predicted this much faster.
  double min_gain = 0.03;
  std::string source = "built-in defaults";

  static CostParams Defaults();
  // Parses the JSON form (ToJson's); missing keys keep their defaults.
  // Throws mc2::Error(kInvalidArgument) naming `source` and the bad entry.
  static CostParams Parse(const std::string& json_text, const std::string& source);
  std::string ToJson() const;
  // A hash of every value (not `source`).
  uint64_t Hash() const;
  const GemmRate& Gemm(DType t) const { return t == DType::kBF16 ? bf16 : f32; }
  const PerRanks& CommFor(int ranks) const;
};

// What the model knows of the machine a call runs on.
struct Environment {
  double link_bytes_per_second = 0;  // 0: no link emulation
  double link_latency_s = 0;
  size_t heap_bytes = 0;  // symmetric heap per rank (0: unknown, no limit)
  int cores = 0;          // 0: core::HostCpus()
  uint64_t Hash() const;
};

// One call, from the globally agreed plan.
struct Problem {
  FusedOpKind op = FusedOpKind::kAllGatherMatmul;
  int ranks = 1;
  DType dtype = DType::kF32;
  size_t M = 0;  // total rows
  size_t k = 0;  // AG: k; RS/AR: the largest k_local
  size_t n = 0;  // AG: the largest n; RS/AR: n
  std::vector<size_t> rows;  // per-rank row blocks (size ranks)
  bool gathered_a = false;   // AG: the gathered A is wanted (fused copies it)
};

struct Estimate {
  double seconds = 0;
  double compute_s = 0;   // Tc (incl. the chunks' efficiency loss)
  double comm_cpu_s = 0;  // Tm, cpu part
  double comm_link_s = 0; // Tm, link part
  int stages = 1;
  int calls = 1;
};

struct Choice {
  Pipeline pipeline = Pipeline::kSerial;
  int splits = 1;
  Estimate estimate;
  Estimate serial;
};

// Workspace bytes per rank the fused pipeline needs for `p`.
size_t FusedWorkspaceBytes(const Problem& p);
// The model's prediction for one candidate (pipeline not kAuto).
Estimate Predict(const CostParams& params, const Environment& env, const Problem& p,
                 Pipeline pipeline, int splits);
// The fastest candidate (see the top of the file).
Choice ChoosePipeline(const CostParams& params, const Environment& env, const Problem& p);

// For the operators outside FusedOpKind (AllGatherBatchMatmul, the MoE
// pair), which run serial or their fused pipeline of `blocks` blocks of s
// chunks (stages = blocks s). The busiest rank's time is modeled as
//   serial    Tc(fixed_calls) + Tl + alpha_fused_s
//   fused(s)  max(Tc', H) + exposed min(Tc', H) / stages + stages * step
// where Tc(calls) = 2 n k (rows + calls half_rows) / rate (each call loses
// the half-efficiency rows; the rate scaled by cores / ranks when ranks
// outnumber cores), calls = fixed_calls + calls_per_stage stages, and Tl is
// port_bytes over the link (over the copy rate on raw shm). Under emulation
// the link hides whole (Tc' = Tc, H = Tl); on raw shared memory only the
// fraction overlap_cpu of the copies does, as in Predict. A step costs
// alpha_fused_s on raw shm; under emulation anywhere from alpha_fused_s
// (idle cores) to link_hop_s (cores busy with GEMMs delay the delayed
// flags' wake-ups).
//
// ChooseSplitPipeline picks s in 1..16 whose worse ratio to the best s
// under either step cost is least, then fused at that s if it is predicted
// min_gain faster than serial with the cheap step and not slower with the
// dear one; else serial (always with fewer than 2 ranks).
struct SplitProblem {
  DType dtype = DType::kF32;
  int ranks = 1;
  int cores = 0;  // 0: core::HostCpus()
  double rows = 0, n = 0, k = 0;
  double fixed_calls = 0, calls_per_stage = 1;
  int blocks = 1;
  double port_bytes = 0;
  double link_bytes_per_second = 0;  // 0: raw shared memory
  // Stage-sized pieces of the shorter side that nothing hides: 1 when data
  // moves one way (the first chunk's transfer, or the last's); 2 when it
  // also comes back (MoeMlp: the first chunk's arrival and the last one's
  // GEMMs and return).
  double exposed_stages = 1;
  // Only s that divide `align` or that it divides (a batch of `align`
  // entries: other counts cut entries into two smaller GEMMs).
  int align = 1;
};
Choice ChooseSplitPipeline(const CostParams& params, const SplitProblem& p);

// The parameters in effect: MC2_OPS_TUNING_FILE (an error if unreadable or
// invalid), else ~/.cache/mc2/ops_tuning.json if present (an error if
// invalid), else Defaults(). Loaded once per process.
const CostParams& LoadedCostParams();
// Path of the tuning file in effect ("" if none applies).
std::string CostParamsPath();

}  // namespace mc2::ops

#endif  // MC2_OPS_COST_MODEL_H_
