// `mc2 bench ops`: benchmarks of the fused compute+communication operators
// (include/mc2/ops.h), and the tuning of their cost model (--tune).
//
//   mc2 bench ops -n N --op all_gather_matmul|matmul_reduce_scatter|
//       matmul_all_reduce|all_gather_batch_matmul|moe|moe_mlp -m M -k K -N N [--dtype f32|bf16]
//       [--pipeline serial|chunked|fused|auto|all] [--splits s|sweep]
//       [--link SPEC|auto|none] [--iters I] [--warmup W] [--confirm C]
//       [--json FILE]
//   mc2 bench ops -n N --tune [--output FILE] [-m M -k K -N N]
//
// Every rank runs a GEMM of M x K x N (2 M N K flops): AllGatherMatmul
// gathers M rows of A [M x K] (each rank holds M/n) and multiplies by its
// B [K x N]; MatmulReduceScatter and MatmulAllReduce multiply A [M x K] by
// B [K x N] and reduce the [M x N] products over the ranks.
//
// Per configuration (rank 0 prints, one row per pipeline and split count):
// compute-only (the operator's GEMMs alone, all ranks at once), comm-only
// (its collective alone), serial, each pipeline's time (medians over
// --iters, of the slowest rank), the ideal bound max(Tc, Tm) + min(Tc,
// Tm) / stages (stages = s for chunked, n s for fused), overlap efficiency
// (T_serial - T) / min(Tc, Tm), speedup vs serial and #wrong: elements that
// differ (bitwise) from the serial pipeline's result, summed over ranks
// (deterministic mode makes every pipeline bitwise equal to serial).
// Then the best fixed configuration, and its ratios re-measured by
// --confirm: C fresh round-robin iterations of compute-only, comm-only,
// serial, the best and auto (odd iterations in reverse order), with auto's
// ratios to the best and to serial also as medians of the iterations'
// ratios (paired: a slow spell of the host slows both sides alike). The
// sweep's best is the minimum of many noisy medians, which its own noise
// helped make the minimum, so ratios against it are biased; the confirmed
// ones are not.
//
// Like `mc2 bench`, outside an mc2 job the command re-executes itself under
// the launcher with N ranks and a heap sized for the shapes; inside a job
// (`mc2 run -n N mc2 bench ops ...`) it runs on the job's ranks.
// `--link auto` first launches short calibration jobs (compute-only and
// comm-only times) and picks the emulated bandwidth that makes the comm-only
// time equal the compute-only time, then launches the benchmark with it; so
// it needs the benchmark to start its own ranks.
//
// Adding an operator. The operators are a table of runners (kRunners): a
// name, a one-line description of how -m/-k/-N map to its shapes, a factory
// that allocates one rank's inputs and returns an OpCase, and the symmetric
// heap the fused pipeline needs. An OpCase runs the operator with given
// FusedOptions (Run), its GEMMs alone (ComputeOnly), its collective alone
// (CommOnly), and exposes this rank's result (Output). To add e.g.
// `all_gather_batch_matmul` or `moe`, write one class deriving from OpCase
// (see AllGatherMatmulCase for the pattern: inputs filled by Fill(), the
// operator call, the same GEMM and collective calls that its serial
// pipeline makes) and append one line to kRunners; everything else
// (timing, columns, JSON, --link auto, --tune-free operation) is shared.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench.h"
#include "commands.h"
#include "core/env.h"
#include "core/link_config.h"
#include "core/reduce.h"
#include "launcher.h"
#include "mc2/mc2.h"
#include "mc2/ops.h"
#include "ops/cost_model.h"
#include "ops/gemm.h"

namespace mc2::tools {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr int kDefaultRanks = 2;
constexpr int kSweepSplits[] = {1, 2, 3, 4, 6, 8, 12, 16};

struct OpsArgs {
  std::string op;
  int nranks = 0;
  std::string dtype = "f32";
  size_t m = 2048, k = 2048, n = 1024;
  std::string pipeline = "all";
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

struct OpsConfig {
  std::string op;
  int nranks = 0;
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

[[noreturn]] void Usage(const std::string& message) {
  fmt::print(stderr, "mc2 bench ops: {}\n", message);
  throw CLI::RuntimeError(bench::kExitUsage);
}


// Deterministic inputs: values in [-1, 1) from a hash of (seed, index).
void Fill(std::vector<char>& bytes, size_t count, DType dtype, uint64_t seed) {
  std::vector<float> f(count);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& v : f) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<float>(static_cast<int64_t>(x % 2001) - 1000) / 1000.0f;
  }
  bytes.resize(count * DTypeSize(dtype));
  if (count == 0) return;
  if (dtype == DType::kF32) std::memcpy(bytes.data(), f.data(), count * 4);
  else ConvertF32ToBF16(f.data(), reinterpret_cast<bf16*>(bytes.data()), count);
}

size_t RowsOf(size_t m, int rank, int n) { return m * (rank + 1) / n - m * rank / n; }

// ---------------------------------------------------------------- op cases
// One operator on one rank: its inputs and the three things that are timed.
class OpCase {
 public:
  virtual ~OpCase() = default;
  // Runs the operator with `o` (this rank's result goes to Output()).
  virtual FusedReport Run(const FusedOptions& o) = 0;
  // The GEMM(s) the serial pipeline makes, alone.
  virtual void ComputeOnly() = 0;
  // The collective the serial pipeline makes, alone.
  virtual void CommOnly(const CollectiveOptions& co) = 0;
  virtual std::span<const float> Output() const = 0;

  // The GEMMs as the operators run them: deterministic f32 on oneDNN, each
  // B packed once per call (ops::PackedGemmBSet), the packing included.
  static ops::PackedGemmBSet OpGemms(const Group& g, DType dtype) {
    GemmOptions o;
    if (g.deterministic() && dtype == DType::kF32) o.backend = GemmBackend::kOneDNN;
    return ops::PackedGemmBSet(dtype, o);
  }
};

class AllGatherMatmulCase : public OpCase {
 public:
  AllGatherMatmulCase(const Group& g, const OpsConfig& c)
      : g_(g), c_(c), rows_(RowsOf(c.m, g.rank(), g.size())) {
    Fill(a_, rows_ * c.k, c.dtype, 11 + g.rank());
    Fill(b_, c.k * c.n, c.dtype, 1000 + g.rank());
    ag_.resize(c.m * c.k * DTypeSize(c.dtype));
    out_.resize(c.m * c.n);
    for (int r = 0; r < g.size(); ++r) {
      counts_.push_back(RowsOf(c.m, r, g.size()) * c.k * DTypeSize(c.dtype));
      displs_.push_back(r == 0 ? 0 : displs_.back() + counts_[r - 1]);
    }
  }
  FusedReport Run(const FusedOptions& o) override {
    FusedReport rep;
    AllGatherMatmulSync(g_, a_.data(), rows_, c_.k, b_.data(), c_.n, c_.dtype, out_.data(),
                        nullptr, o, &rep);
    return rep;
  }
  void ComputeOnly() override {
    auto gemms = OpGemms(g_, c_.dtype);
    gemms.Gemm(c_.m, c_.n, c_.k, ag_.data(), b_.data(), DType::kF32, out_.data());
  }
  void CommOnly(const CollectiveOptions& co) override {
    AllGatherV(g_, a_.data(), ag_.data(), counts_, displs_, DType::kU8, co).Wait();
  }
  std::span<const float> Output() const override { return out_; }

 private:
  const Group& g_;
  const OpsConfig& c_;
  size_t rows_;
  std::vector<char> a_, b_, ag_;
  std::vector<float> out_;
  std::vector<size_t> counts_, displs_;
};

// MatmulReduceScatter (all_reduce = false) and MatmulAllReduce.
class MatmulReduceCase : public OpCase {
 public:
  MatmulReduceCase(const Group& g, const OpsConfig& c, bool all_reduce)
      : g_(g), c_(c), all_reduce_(all_reduce), rows_(RowsOf(c.m, g.rank(), g.size())) {
    Fill(a_, c.m * c.k, c.dtype, 21 + g.rank());
    Fill(b_, c.k * c.n, c.dtype, 2000 + g.rank());
    full_.resize(c.m * c.n);
    out_.resize((all_reduce ? c.m : rows_) * c.n);
    for (int r = 0; r < g.size(); ++r) counts_.push_back(RowsOf(c.m, r, g.size()) * c.n);
  }
  FusedReport Run(const FusedOptions& o) override {
    FusedReport rep;
    if (all_reduce_) {
      MatmulAllReduceSync(g_, a_.data(), c_.m, c_.k, b_.data(), c_.n, c_.dtype, out_.data(), o,
                          &rep);
    } else {
      MatmulReduceScatterSync(g_, a_.data(), c_.m, c_.k, b_.data(), c_.n, c_.dtype, out_.data(),
                              rows_, o, &rep);
    }
    return rep;
  }
  void ComputeOnly() override {
    auto gemms = OpGemms(g_, c_.dtype);
    gemms.Gemm(c_.m, c_.n, c_.k, a_.data(), b_.data(), DType::kF32, full_.data());
  }
  void CommOnly(const CollectiveOptions& co) override {
    if (all_reduce_) {
      AllReduce(g_, full_.data(), full_.data(), full_.size(), DType::kF32, ReduceOp::kSum, co)
          .Wait();
    } else {
      ReduceScatterV(g_, full_.data(), out_.data(), counts_, DType::kF32, ReduceOp::kSum, co)
          .Wait();
    }
  }
  std::span<const float> Output() const override { return out_; }

 private:
  const Group& g_;
  const OpsConfig& c_;
  bool all_reduce_;
  size_t rows_;
  std::vector<char> a_, b_;
  std::vector<float> full_, out_;
  std::vector<size_t> counts_;
};

// AllGatherBatchMatmul: a batch of kBatchEntries products, each gathering
// M / kBatchEntries rows (split unevenly over the ranks) of K, times its own
// B [K x N]: the same 2 M N K flops and port bytes as all_gather_matmul.
constexpr size_t kBatchEntries = 4;

class AllGatherBatchMatmulCase : public OpCase {
 public:
  AllGatherBatchMatmulCase(const Group& g, const OpsConfig& c)
      : g_(g), c_(c), m_(c.m / kBatchEntries), rows_(RowsOf(m_, g.rank(), g.size())) {
    const size_t es = DTypeSize(c.dtype);
    Fill(a_, kBatchEntries * rows_ * c.k, c.dtype, 31 + g.rank());
    Fill(b_, kBatchEntries * c.k * c.n, c.dtype, 3000 + g.rank());
    ag_.resize(kBatchEntries * m_ * c.k * es);
    out_.resize(kBatchEntries * m_ * c.n);
    for (int r = 0; r < g.size(); ++r) {
      counts_.push_back(kBatchEntries * RowsOf(m_, r, g.size()) * c.k * es);
      displs_.push_back(r == 0 ? 0 : displs_.back() + counts_[r - 1]);
    }
  }
  FusedReport Run(const FusedOptions& o) override {
    FusedReport rep;
    AllGatherBatchMatmulSync(g_, a_.data(), kBatchEntries, rows_, c_.k, b_.data(),
                             BatchB::kPerBatch, c_.n, c_.dtype, out_.data(), nullptr, o, &rep);
    return rep;
  }
  void ComputeOnly() override {
    auto gemms = OpGemms(g_, c_.dtype);
    const size_t es = DTypeSize(c_.dtype);
    for (size_t e = 0; e < kBatchEntries; ++e) {
      gemms.Gemm(m_, c_.n, c_.k, ag_.data() + e * m_ * c_.k * es, b_.data() + e * c_.k * c_.n * es,
                 DType::kF32, out_.data() + e * m_ * c_.n);
    }
  }
  void CommOnly(const CollectiveOptions& co) override {
    AllGatherV(g_, a_.data(), ag_.data(), counts_, displs_, DType::kU8, co).Wait();
  }
  std::span<const float> Output() const override { return out_; }

 private:
  const Group& g_;
  const OpsConfig& c_;
  size_t m_, rows_;
  std::vector<char> a_, b_, ag_;
  std::vector<float> out_;
  std::vector<size_t> counts_, displs_;
};

// MoE dispatch + experts + combine (AllToAllMatmul, then MatmulAllToAll):
// rank r has about M tokens (M (2 + r % 3) / 3: uneven), each routed to
// kMoeTopk of kMoeExpertsPerRank * n experts with a skewed (Zipf-like,
// weight 1 / (e+1)^0.7) assignment, so ranks and experts receive uneven
// counts; tokens are [M x K], each expert's weights [K x N] then [N x K].
constexpr int kMoeTopk = 2;
constexpr int kMoeExpertsPerRank = 2;
constexpr int kMoeTag = 0x4d43424d;

size_t MoeTokens(const OpsConfig& c, int rank) { return c.m * (2 + rank % 3) / 3; }

std::vector<int32_t> MoeIds(const OpsConfig& c, int rank, int n) {
  const int E = kMoeExpertsPerRank * n;
  std::vector<double> cum(E);
  double total = 0;
  for (int e = 0; e < E; ++e) cum[e] = total += 1.0 / std::pow(e + 1.0, 0.7);
  const size_t T = MoeTokens(c, rank);
  std::vector<int32_t> ids(T * kMoeTopk);
  uint64_t x = 0x9e3779b97f4a7c15ull * (rank + 7);
  for (size_t t = 0; t < T; ++t) {
    for (int j = 0; j < kMoeTopk; ++j) {
      int e = 0;
      bool dup = true;
      while (dup) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        double u = double(x >> 11) / double(1ull << 53) * total;
        e = static_cast<int>(std::lower_bound(cum.begin(), cum.end(), u) - cum.begin());
        e = std::min(e, E - 1);
        dup = false;
        for (int q = 0; q < j; ++q) dup = dup || ids[t * kMoeTopk + q] == e;
      }
      ids[t * kMoeTopk + j] = e;
    }
  }
  return ids;
}

// The bytes the busiest port carries in the serial pipeline (the dispatch
// and the combine both in dtype), for --link auto.
double MoePortBytes(const OpsConfig& c, int n) {
  std::vector<std::vector<size_t>> sent(n, std::vector<size_t>(n, 0));
  for (int r = 0; r < n; ++r)
    for (int32_t e : MoeIds(c, r, n)) sent[r][e / kMoeExpertsPerRank]++;
  double worst = 0;
  for (int r = 0; r < n; ++r) {
    double bytes = 0;
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      bytes += double(sent[r][q] + sent[q][r]) * c.k * DTypeSize(c.dtype);
    }
    worst = std::max(worst, bytes);
  }
  return worst;
}

class MoeCase : public OpCase {
 public:
  MoeCase(const Group& g, const OpsConfig& c) : g_(g), c_(c) {
    const int n = g.size(), me = g.rank();
    const size_t T = MoeTokens(c, me), es = DTypeSize(c.dtype);
    ids_ = MoeIds(c, me, n);
    routing_ = MoeRoute(g, ids_.data(), T, kMoeTopk, kMoeExpertsPerRank * n);
    const size_t R = routing_.num_received();
    Fill(x_, T * c.k, c.dtype, 41 + me);
    Fill(w1_, kMoeExpertsPerRank * c.k * c.n, c.dtype, 4000 + me);
    Fill(w2_, kMoeExpertsPerRank * c.n * c.k, c.dtype, 5000 + me);
    Fill(hidden_, R * c.n, c.dtype, 6000 + me);
    probs_.resize(T * kMoeTopk);
    for (size_t i = 0; i < probs_.size(); ++i) probs_[i] = 0.25f + 0.5f * float(i % 2);
    // y and out in one buffer, so that Output() checks both.
    all_.resize(R * c.n + T * c.k);
    xe_.resize(R * c.k * es);
    ye_.resize(R * c.k);
    // The serial pipeline's exchanges: blocks to / from every rank.
    const int E = kMoeExpertsPerRank * n;
    send_.assign(n, 0);
    recv_.assign(n, 0);
    for (int q = 0; q < n; ++q) {
      for (int le = 0; le < kMoeExpertsPerRank; ++le) {
        send_[q] += routing_.counts[me * E + q * kMoeExpertsPerRank + le];
        recv_[q] += routing_.counts[q * E + me * kMoeExpertsPerRank + le];
      }
    }
    xs_.resize(routing_.num_sent() * c.k * es);
    yr_.resize(routing_.num_sent() * c.k);
  }
  FusedReport Run(const FusedOptions& o) override {
    FusedReport rep;
    const size_t R = routing_.num_received();
    AllToAllMatmulSync(g_, routing_, x_.data(), c_.k, w1_.data(), c_.n, c_.dtype, all_.data(),
                       nullptr, o);
    MatmulAllToAllSync(g_, routing_, hidden_.data(), c_.n, w2_.data(), c_.k, c_.dtype,
                       all_.data() + R * c_.n, probs_.data(), o, &rep);
    return rep;
  }
  void ComputeOnly() override {
    auto gemms = OpGemms(g_, c_.dtype);
    const size_t es = DTypeSize(c_.dtype);
    size_t at = 0;
    for (int le = 0; le < kMoeExpertsPerRank; ++le) {
      const size_t rows = routing_.expert_rows(le);
      if (rows == 0) continue;
      gemms.Gemm(rows, c_.n, c_.k, xe_.data() + at * c_.k * es, w1_.data() + le * c_.k * c_.n * es,
                 DType::kF32, all_.data() + at * c_.n);
      gemms.Gemm(rows, c_.k, c_.n, hidden_.data() + at * c_.n * es,
                 w2_.data() + le * c_.n * c_.k * es, c_.dtype, ye_.data() + at * c_.k);
      at += rows;
    }
  }
  // The operators move rows point-to-point (ops.h), so the comm-only time
  // is that of the same messages: the dispatch, then the combine.
  void CommOnly(const CollectiveOptions&) override {
    Exchange(xs_.data(), send_, xe_.data(), recv_, c_.k * DTypeSize(c_.dtype));
    Exchange(reinterpret_cast<char*>(ye_.data()), recv_, reinterpret_cast<char*>(yr_.data()),
             send_, c_.k * DTypeSize(c_.dtype));
  }
  std::span<const float> Output() const override { return all_; }

 protected:
  void Exchange(char* sbuf, const std::vector<size_t>& srows, char* rbuf,
                const std::vector<size_t>& rrows, size_t row_bytes) {
    const int n = g_.size(), me = g_.rank();
    std::vector<Work> works;
    size_t so = 0, ro = 0;
    std::vector<size_t> soff(n), roff(n);
    for (int q = 0; q < n; ++q) {
      soff[q] = so;
      roff[q] = ro;
      so += srows[q];
      ro += rrows[q];
    }
    for (int i = 1; i < n; ++i) {
      const int src = (me - i + n) % n, dst = (me + i) % n;
      if (rrows[src])
        works.push_back(g_.Recv(rbuf + roff[src] * row_bytes, rrows[src] * row_bytes, src, kMoeTag));
      if (srows[dst])
        works.push_back(g_.Send(sbuf + soff[dst] * row_bytes, srows[dst] * row_bytes, dst, kMoeTag));
    }
    for (Work& w : works) w.Wait();
  }

  const Group& g_;
  const OpsConfig& c_;
  std::vector<int32_t> ids_;
  MoeRouting routing_;
  std::vector<char> x_, w1_, w2_, hidden_, xe_, xs_;
  std::vector<float> probs_, all_, ye_, yr_;
  std::vector<size_t> send_, recv_;
};

// The same MoE layer in one call (MoeMlp): dispatch, each expert's SwiGLU
// MLP (K x 2N gate|up, silu(gate) * up, N x K) and combine, so a chunk's
// result goes back while later chunks are multiplied. Tokens, routing and
// bytes moved as MoeCase's; the GEMMs are 1.5x its (the gate).
class MoeMlpCase : public MoeCase {
 public:
  MoeMlpCase(const Group& g, const OpsConfig& c) : MoeCase(g, c) {
    const size_t R = routing_.num_received(), T = routing_.num_tokens;
    Fill(w13_, kMoeExpertsPerRank * c.k * 2 * c.n, c.dtype, 7000 + g.rank());
    // y1 (what backward keeps) and out in one buffer, so that Output()
    // checks both.
    all_.resize(R * 2 * c.n + T * c.k);
    act_.resize(R * c.n);
    hidden_.resize(R * c.n * DTypeSize(c.dtype));
  }
  FusedReport Run(const FusedOptions& o) override {
    FusedReport rep;
    const size_t R = routing_.num_received();
    MoeMlpSaved saved;
    saved.y1 = all_.data();
    MoeMlpSync(g_, routing_, x_.data(), c_.k, w13_.data(), 2 * c_.n, SwiGlu(c_.n), c_.n,
               w2_.data(), c_.dtype, all_.data() + R * 2 * c_.n, probs_.data(), saved, o, &rep);
    return rep;
  }
  // The serial pipeline's expert work: both GEMMs, SwiGLU and its rounding.
  void ComputeOnly() override {
    auto gemms = OpGemms(g_, c_.dtype);
    const size_t es = DTypeSize(c_.dtype);
    size_t at = 0;
    for (int le = 0; le < kMoeExpertsPerRank; ++le) {
      const size_t rows = routing_.expert_rows(le);
      if (rows == 0) continue;
      float* y1 = all_.data() + at * 2 * c_.n;
      gemms.Gemm(rows, 2 * c_.n, c_.k, xe_.data() + at * c_.k * es,
                 w13_.data() + le * c_.k * 2 * c_.n * es, DType::kF32, y1);
      SwiGlu(c_.n)(y1, rows, act_.data() + at * c_.n);
      if (c_.dtype == DType::kBF16) {
        auto* b = reinterpret_cast<uint16_t*>(hidden_.data()) + at * c_.n;
        for (size_t i = 0; i < rows * c_.n; ++i) b[i] = core::F32ToBF16(act_[at * c_.n + i]);
      }
      const char* h = c_.dtype == DType::kBF16 ? hidden_.data() + at * c_.n * es
                                               : reinterpret_cast<const char*>(act_.data() + at * c_.n);
      gemms.Gemm(rows, c_.k, c_.n, h, w2_.data() + le * c_.n * c_.k * es, c_.dtype,
                 ye_.data() + at * c_.k);
      at += rows;
    }
  }

 private:
  // in = [gate | up] (rows x 2n): out = silu(gate) * up (rows x n).
  static MoeActivation SwiGlu(size_t n) {
    return [n](const float* in, size_t rows, float* out) {
      for (size_t r = 0; r < rows; ++r) {
        const float* gate = in + r * 2 * n;
        const float* up = gate + n;
        for (size_t i = 0; i < n; ++i) out[r * n + i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
      }
    };
  }
  std::vector<char> w13_;
  std::vector<float> act_;
};

// The runner table (see "Adding an operator" at the top).
struct OpRunner {
  const char* name;
  ops::FusedOpKind kind;  // for the cost model (--link auto's port bytes)
  const char* shapes;     // how -m/-k/-N map to the operator
  std::unique_ptr<OpCase> (*make)(const Group& g, const OpsConfig& c);
  // Bytes the busiest port carries in the serial pipeline, for --link auto,
  // when the cost model does not know the operator (null: ask the model).
  double (*port_bytes)(const OpsConfig& c, int n) = nullptr;
};

const OpRunner kRunners[] = {
    {"all_gather_matmul", ops::FusedOpKind::kAllGatherMatmul,
     "A [M x K] gathered from M/n rows per rank, times B [K x N]",
     [](const Group& g, const OpsConfig& c) -> std::unique_ptr<OpCase> {
       return std::make_unique<AllGatherMatmulCase>(g, c);
     }},
    {"matmul_reduce_scatter", ops::FusedOpKind::kMatmulReduceScatter,
     "A [M x K] times B [K x N] per rank, reduce-scattered by rows",
     [](const Group& g, const OpsConfig& c) -> std::unique_ptr<OpCase> {
       return std::make_unique<MatmulReduceCase>(g, c, false);
     }},
    {"matmul_all_reduce", ops::FusedOpKind::kMatmulAllReduce,
     "A [M x K] times B [K x N] per rank, all-reduced",
     [](const Group& g, const OpsConfig& c) -> std::unique_ptr<OpCase> {
       return std::make_unique<MatmulReduceCase>(g, c, true);
     }},
    {"all_gather_batch_matmul", ops::FusedOpKind::kAllGatherMatmul,
     "a batch of 4: A [4 x M/4 x K] gathered from M/4n rows per rank and entry, times B [4 x K "
     "x N]",
     [](const Group& g, const OpsConfig& c) -> std::unique_ptr<OpCase> {
       return std::make_unique<AllGatherBatchMatmulCase>(g, c);
     }},
    {"moe", ops::FusedOpKind::kAllGatherMatmul,
     "~M tokens [x K] per rank (uneven), top-2 of 2n experts (skewed), experts K x N then N x "
     "K: dispatch + experts + combine",
     [](const Group& g, const OpsConfig& c) -> std::unique_ptr<OpCase> {
       return std::make_unique<MoeCase>(g, c);
     },
     MoePortBytes},
    {"moe_mlp", ops::FusedOpKind::kAllGatherMatmul,
     "as moe, in one call (MoeMlp): experts K x 2N (gate|up), SwiGLU, N x K",
     [](const Group& g, const OpsConfig& c) -> std::unique_ptr<OpCase> {
       return std::make_unique<MoeMlpCase>(g, c);
     },
     MoePortBytes},
};

const OpRunner* FindRunner(const std::string& name) {
  for (const OpRunner& r : kRunners)
    if (name == r.name) return &r;
  return nullptr;
}

std::string RunnerNames() {
  std::string s;
  for (const OpRunner& r : kRunners) s += (s.empty() ? "" : ", ") + std::string(r.name);
  return s;
}

// The cost model's view of a configuration (port bytes, workspace).
ops::Problem ProblemOf(const OpRunner& r, const OpsConfig& c, int n) {
  ops::Problem p;
  p.op = r.kind;
  p.ranks = n;
  p.dtype = c.dtype;
  p.M = c.m;
  p.k = c.k;
  p.n = c.n;
  for (int q = 0; q < n; ++q) p.rows.push_back(RowsOf(c.m, q, n));
  return p;
}

// Heap per rank: the fused workspace (grown geometrically, so twice) plus
// the groups' areas and the collectives' scratch.
size_t HeapBytesFor(const OpRunner& r, const OpsConfig& c, int n) {
  size_t ws = ops::FusedWorkspaceBytes(ProblemOf(r, c, n));
  return std::max<size_t>(tools::kDefaultHeapBytes, 2 * ws + (size_t{64} << 20));
}

// ---------------------------------------------------------------- timing
class Timer {
 public:
  Timer(const Group& g, int iters, int warmup) : g_(g), iters_(iters), warmup_(warmup) {}
  // Median over iterations of the slowest rank's time of `fn`, seconds.
  double Median(const std::function<void()>& fn) const {
    for (int i = 0; i < warmup_; ++i) fn();
    std::vector<double> t;
    for (int i = 0; i < iters_; ++i) {
      Barrier(g_).Wait();
      auto t0 = Clock::now();
      fn();
      double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      double worst = 0;
      AllReduce(g_, &dt, &worst, 1, DType::kF64, ReduceOp::kMax).Wait();
      t.push_back(worst);
    }
    return bench::Median(t);
  }

 private:
  const Group& g_;
  int iters_, warmup_;
};

// Elements of `a` that differ bitwise from `b`, summed over ranks.
int64_t CountWrongAll(const Group& g, std::span<const float> a, const std::vector<float>& b) {
  int64_t wrong = static_cast<int64_t>(
      a.size() == b.size() ? bench::CountWrong(a.data(), b.data(), a.size(), 4)
                           : std::max(a.size(), b.size()));
  int64_t sum = 0;
  AllReduce(g, &wrong, &sum, 1, DType::kI64, ReduceOp::kSum).Wait();
  return sum;
}

// The collectives' options the operators use (fused_ops.cc MakePlan): in
// the background, and under link emulation the ring (which declares its
// bytes to the link).
CollectiveOptions OpCollectiveOptions(bool emulated) {
  CollectiveOptions co;
  co.may_run_inline = false;
  if (emulated) co.algorithm = Algorithm::kRing;
  return co;
}

struct Row {
  std::string pipeline;
  int splits = 1;
  int stages = 1;
  double time_s = 0;
  double traced_s = 0;  // --trace-ab: the median with tracing on
  double ideal_s = 0;
  int64_t wrong = 0;
  std::string chosen;  // auto: what it ran
};

// The ideal time of a pipeline of `stages` overlapped stages: max(Tc, Tm) +
// min(Tc, Tm) / stages; 0 stages is serial, Tc + Tm.
double IdealBound(double tc, double tm, int stages) {
  if (stages == 0) return tc + tm;
  return std::max(tc, tm) + std::min(tc, tm) / stages;
}

int RunOpsRank(const OpsConfig& cfg) {
  const OpRunner* runner = FindRunner(cfg.op);
  WorldOptions wo;
  wo.link = cfg.link;
  Group g;
  try {
    g = Group::FromEnv(wo);
  } catch (const Error& e) {
    fmt::print(stderr, "mc2 bench ops: cannot join the job: {}\n", e.what());
    return bench::kExitWrong;
  }
  const bool lead = g.rank() == 0;
  const int n = g.size();
  if (cfg.nranks != 0 && cfg.nranks != n) {
    if (lead)
      fmt::print(stderr, "mc2 bench ops: -n {} does not match the job's {} ranks\n", cfg.nranks,
                 n);
    return bench::kExitUsage;
  }
  const core::LinkConfig link = core::ParseLinkConfig(cfg.link, "--link");
  try {
    std::unique_ptr<OpCase> op = runner->make(g, cfg);
    const CollectiveOptions co = OpCollectiveOptions(link.enabled);
    // What is timed: compute-only, comm-only, serial, then every pipeline
    // and split count asked for. They are timed round-robin (iteration i of
    // every candidate, then i+1, ...), so that a change in the machine's
    // load (other jobs on these 2 noisy cores) hits all of them alike.
    struct Candidate {
      std::function<void()> fn;
      FusedOptions options;
      bool is_op = false;
      FusedReport report;
      int64_t wrong = 0;
      std::vector<double> times;
      std::vector<double> traced_times;  // --trace-ab
    };
    std::vector<Candidate> cands;
    cands.emplace_back().fn = [&] { op->ComputeOnly(); };
    if (n > 1) cands.emplace_back().fn = [&] { op->CommOnly(co); };
    auto add_op = [&](Pipeline p, int s) {
      Candidate c;
      c.options.pipeline = p;
      if (s > 0) c.options.splits = s;
      c.is_op = true;
      cands.push_back(std::move(c));
      Candidate& last = cands.back();
      last.fn = [&op, &last] { last.report = op->Run(last.options); };
    };
    cands.reserve(3 + cfg.pipelines.size() * cfg.splits.size() + 1);
    add_op(Pipeline::kSerial, 0);
    const size_t serial_idx = cands.size() - 1;
    for (Pipeline p : cfg.pipelines) {
      if (p == Pipeline::kSerial) continue;
      if (p == Pipeline::kAuto) add_op(p, 0);
      else
        for (int s : cfg.splits) add_op(p, s);
    }
    // Serial's result is the reference; every pipeline's first run is
    // checked against it (and serves as a warm-up).
    cands[serial_idx].fn();
    std::vector<float> reference(op->Output().begin(), op->Output().end());
    for (auto& c : cands) {
      if (!c.is_op) continue;
      c.fn();
      c.wrong = CountWrongAll(g, op->Output(), reference);
    }
    for (int w = 0; w < cfg.warmup; ++w)
      for (auto& c : cands) c.fn();
    const bool ab = !cfg.trace_ab.empty();
    auto time_once = [&](Candidate& c, bool traced) {
      // Every rank toggles at the same point of the same iteration, so a
      // traced run is traced on every rank.
      if (ab) {
        if (traced) trace::Enable(cfg.trace_ab);
        else trace::Disable();
      }
      Barrier(g).Wait();
      auto t0 = Clock::now();
      c.fn();
      double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      double worst = 0;
      AllReduce(g, &dt, &worst, 1, DType::kF64, ReduceOp::kMax).Wait();
      (traced ? c.traced_times : c.times).push_back(worst);
    };
    for (int i = 0; i < cfg.iters; ++i) {
      for (auto& c : cands) {
        if (!ab) {
          time_once(c, false);
        } else {
          // Alternate which half goes first, so drift and caches favour
          // neither.
          time_once(c, i % 2 == 1);
          time_once(c, i % 2 == 0);
        }
      }
    }
    if (ab) trace::Disable();
    const double tc = bench::Median(cands[0].times);
    const double tm = n > 1 ? bench::Median(cands[1].times) : 0.0;
    if (!cfg.calibrate_out.empty()) {
      if (lead) {
        json j = {{"compute_s", tc}, {"comm_s", tm}};
        std::ofstream(cfg.calibrate_out) << j.dump() << "\n";
      }
      return 0;
    }
    const double flops = GemmFlops(cfg.m, cfg.n, cfg.k);
    const double t_serial = bench::Median(cands[serial_idx].times);
    if (lead) {
#ifndef NDEBUG
      fmt::print("# WARNING: debug build, figures are not representative\n");
#endif
      fmt::print("# mc2 bench ops {}: {} ranks, dtype {}, M={} K={} N={} ({}), {:.2f} GFLOP per "
                 "rank, iters {}, warmup {}, deterministic {}\n",
                 cfg.op, n, DTypeName(cfg.dtype), cfg.m, cfg.k, cfg.n, runner->shapes,
                 flops / 1e9, cfg.iters, cfg.warmup, g.deterministic() ? 1 : 0);
      if (link.enabled)
        fmt::print("# emulated link: {}{}\n", link.Describe(),
                   cfg.link_auto ? " (--link auto: comm-only calibrated to compute-only)" : "");
      else
        fmt::print("# raw shm (no emulation)\n");
      fmt::print("# compute-only {:.2f} ms, comm-only {:.2f} ms (medians of {} round-robin "
                 "iterations, slowest rank)\n",
                 tc * 1e3, tm * 1e3, cfg.iters);
      fmt::print("#\n# {:>8}  {:>6}  {:>6}  {:>10}  {:>10}  {:>8}  {:>8}  {:>7}  {:>7}  {}\n",
                 "pipeline", "splits", "stages", "time_ms", "ideal_ms", "vs_ideal", "overlap",
                 "speedup", "#wrong", "ran");
    }
    std::vector<Row> rows;
    for (size_t i = serial_idx; i < cands.size(); ++i) {
      const Candidate& c = cands[i];
      const FusedReport& rep = c.report;
      Row r;
      r.pipeline = PipelineName(c.options.pipeline);
      r.time_s = bench::Median(c.times);
      if (ab) r.traced_s = bench::Median(c.traced_times);
      r.wrong = c.wrong;
      r.splits = rep.splits;
      r.stages = rep.pipeline == Pipeline::kFused     ? n * rep.splits
                 : rep.pipeline == Pipeline::kChunked ? rep.splits
                                                      : 1;
      r.ideal_s = IdealBound(tc, tm, rep.pipeline == Pipeline::kSerial ? 0 : r.stages);
      r.chosen = fmt::format("{} s={}", PipelineName(rep.pipeline), rep.splits);
      rows.push_back(r);
      if (!lead) continue;
      const double hide = std::min(tc, tm);
      const std::string eff =
          hide > 0 ? fmt::format("{:.0f}%", 100 * (t_serial - r.time_s) / hide) : "-";
      fmt::print("  {:>8}  {:>6}  {:>6}  {:>10.2f}  {:>10.2f}  {:>8.2f}  {:>8}  {:>7.2f}  {:>7}  "
                 "{}\n",
                 r.pipeline, r.splits, r.stages, r.time_s * 1e3, r.ideal_s * 1e3,
                 r.time_s / r.ideal_s, eff, t_serial / r.time_s, r.wrong, r.chosen);
    }
    int64_t wrong = 0;
    for (const Row& r : rows) wrong += r.wrong;
    // The best fixed configuration (auto is what is judged against it).
    // Every rank holds the same (max-reduced) times, so all pick the same.
    size_t best_row = 0;  // serial's
    std::optional<size_t> auto_row;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (cands[serial_idx + i].options.pipeline == Pipeline::kAuto) auto_row = i;
      else if (rows[i].time_s < rows[best_row].time_s) best_row = i;
    }
    const Row* best = &rows[best_row];
    // Confirmation: fresh round-robin iterations of the figures the
    // verdicts rest on (see OpsConfig::confirm).
    struct Confirmed {
      double tc = 0, tm = 0, serial = 0, best = 0, automatic = 0;
      double best_ideal = 0;     // IdealBound of the best, from the confirmed tc and tm
      double hide = 0;           // min(tc, tm): what overlap can hide
      double best_overlap = 0;   // (serial - best) / hide, 0 if nothing to hide
      // Medians of the per-iteration ratios: auto and the best (and serial)
      // of one iteration ran back to back, so a slow spell of the host
      // slows both and cancels out of their ratio; the ratio of the two
      // medians keeps it whenever the spell hits one more often.
      double auto_over_best_paired = 0, auto_over_serial_paired = 0;
    };
    std::optional<Confirmed> confirmed;
    if (cfg.confirm > 0 && !ab) {
      std::vector<size_t> set = {0};
      if (n > 1) set.push_back(1);
      set.push_back(serial_idx);
      if (best_row != 0) set.push_back(serial_idx + best_row);
      if (auto_row) set.push_back(serial_idx + *auto_row);
      for (size_t idx : set) cands[idx].times.clear();
      // Odd iterations run the set backwards, so neither the best nor auto
      // always runs right after the other (or after serial).
      for (int i = 0; i < cfg.confirm; ++i) {
        if (i % 2 == 0)
          for (size_t idx : set) time_once(cands[idx], false);
        else
          for (auto it = set.rbegin(); it != set.rend(); ++it) time_once(cands[*it], false);
      }
      Confirmed c;
      c.tc = bench::Median(cands[0].times);
      c.tm = n > 1 ? bench::Median(cands[1].times) : 0.0;
      c.serial = bench::Median(cands[serial_idx].times);
      c.best = bench::Median(cands[serial_idx + best_row].times);
      if (auto_row) c.automatic = bench::Median(cands[serial_idx + *auto_row].times);
      c.hide = std::min(c.tc, c.tm);
      c.best_ideal = IdealBound(c.tc, c.tm, best_row == 0 ? 0 : best->stages);
      c.best_overlap = c.hide > 0 ? (c.serial - c.best) / c.hide : 0.0;
      if (auto_row) {
        const std::vector<double>& ta = cands[serial_idx + *auto_row].times;
        const std::vector<double>& tb = cands[serial_idx + best_row].times;
        const std::vector<double>& ts = cands[serial_idx].times;
        std::vector<double> over_best, over_serial;
        for (size_t i = 0; i < ta.size(); ++i) {
          over_best.push_back(ta[i] / tb[i]);
          over_serial.push_back(ta[i] / ts[i]);
        }
        c.auto_over_best_paired = bench::Median(over_best);
        c.auto_over_serial_paired = bench::Median(over_serial);
      }
      confirmed = c;
    }
    if (lead) {
      fmt::print("#\n# best: {} ({}), {:.2f}x serial, {:.2f}x the ideal bound\n", best->pipeline,
                 best->chosen, t_serial / best->time_s, best->time_s / best->ideal_s);
      if (confirmed) {
        const Confirmed& c = *confirmed;
        fmt::print("# confirmed ({} fresh round-robin iterations; the sweep's minimum is biased "
                   "low): compute-only {:.2f} ms, comm-only {:.2f} ms, serial {:.2f} ms, best "
                   "{:.2f} ms = {:.2f}x serial, {:.2f}x the ideal bound, overlap {}",
                   cfg.confirm, c.tc * 1e3, c.tm * 1e3, c.serial * 1e3, c.best * 1e3,
                   c.serial / c.best, c.best / c.best_ideal,
                   c.hide > 0 ? fmt::format("{:.0f}%", 100 * c.best_overlap) : "-");
        if (auto_row)
          fmt::print("; auto ({}) {:.2f} ms = {:.2f}x the best, {:.2f}x serial (median of "
                     "the iterations' ratios: {:.3f}x the best, {:.3f}x serial)",
                     rows[*auto_row].chosen, c.automatic * 1e3, c.automatic / c.best,
                     c.automatic / c.serial, c.auto_over_best_paired,
                     c.auto_over_serial_paired);
        fmt::print("\n");
      }
      fmt::print("# Out of bounds values : {} {}\n", wrong, wrong == 0 ? "OK" : "FAILED");
      if (ab) {
        // Each row's traced and untraced medians come from the same
        // iterations, interleaved: the ratio is side by side.
        fmt::print("#\n# tracing overhead (--trace-ab {}: each iteration timed traced and "
                   "untraced, alternating order)\n",
                   cfg.trace_ab);
        fmt::print("# {:>8}  {:>6}  {:>10}  {:>10}  {:>7}\n", "pipeline", "splits", "off_ms",
                   "on_ms", "on/off");
        std::vector<double> ratios;
        for (const Row& r : rows) {
          ratios.push_back(r.traced_s / r.time_s);
          fmt::print("  {:>8}  {:>6}  {:>10.2f}  {:>10.2f}  {:>7.3f}\n", r.pipeline, r.splits,
                     r.time_s * 1e3, r.traced_s * 1e3, ratios.back());
        }
        fmt::print("# tracing on/off, median over rows: {:.3f}\n", bench::Median(ratios));
      }
      std::fflush(stdout);
      if (!cfg.json_path.empty()) {
        json j;
        j["op"] = cfg.op;
        j["ranks"] = n;
        j["dtype"] = DTypeName(cfg.dtype);
        j["M"] = cfg.m;
        j["K"] = cfg.k;
        j["N"] = cfg.n;
        j["link"] = link.enabled ? link.Describe() : "none";
        j["link_auto"] = cfg.link_auto;
        j["compute_ms"] = tc * 1e3;
        j["comm_ms"] = tm * 1e3;
        j["serial_ms"] = t_serial * 1e3;
        for (const Row& r : rows) {
          const double hide = std::min(tc, tm);
          j["rows"].push_back({{"pipeline", r.pipeline},
                               {"splits", r.splits},
                               {"stages", r.stages},
                               {"time_ms", r.time_s * 1e3},
                               {"ideal_ms", r.ideal_s * 1e3},
                               {"overlap_efficiency",
                                hide > 0 ? (t_serial - r.time_s) / hide : 0.0},
                               {"speedup", t_serial / r.time_s},
                               {"wrong", r.wrong},
                               {"ran", r.chosen}});
          if (ab) j["rows"].back()["traced_ms"] = r.traced_s * 1e3;
        }
        if (confirmed) {
          const Confirmed& c = *confirmed;
          json cj = {{"iters", cfg.confirm},
                     {"compute_ms", c.tc * 1e3},
                     {"comm_ms", c.tm * 1e3},
                     {"serial_ms", c.serial * 1e3},
                     {"best_pipeline", best->pipeline},
                     {"best_splits", best->splits},
                     {"best_stages", best->stages},
                     {"best_ms", c.best * 1e3},
                     {"best_ideal_ms", c.best_ideal * 1e3},
                     {"best_overlap_efficiency", c.best_overlap}};
          if (auto_row) {
            cj["auto_ran"] = rows[*auto_row].chosen;
            cj["auto_ms"] = c.automatic * 1e3;
            cj["auto_over_best_paired"] = c.auto_over_best_paired;
            cj["auto_over_serial_paired"] = c.auto_over_serial_paired;
          }
          j["confirm"] = cj;
        }
        std::ofstream(cfg.json_path) << j.dump(2) << "\n";
      }
    }
    return wrong == 0 ? 0 : bench::kExitWrong;
  } catch (const Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "\nmc2 bench ops: rank {}: {}\n", g.rank(), e.what());
    return e.code() == ErrorCode::kInvalidArgument ? bench::kExitUsage : bench::kExitWrong;
  }
}

// ---------------------------------------------------------------- --tune
// Measures the cost model's parameters on this job's ranks (raw shm) and
// has rank 0 merge them into `path`.
int RunTuneRankImpl(const OpsConfig& cfg, const std::string& path) {
  // The measurements run the operators with explicit pipelines; they must
  // not depend on (or fail for want of) the file being written.
  unsetenv("MC2_OPS_TUNING_FILE");
  WorldOptions wo;
  wo.link = "none";
  Group g = Group::FromEnv(wo);
  const bool lead = g.rank() == 0;
  const int n = g.size();
  Timer timer(g, 3, 1);
  ops::CostParams params = ops::CostParams::Defaults();
  if (std::ifstream in(path); in) {
    std::stringstream buf;
    buf << in.rdbuf();
    params = ops::CostParams::Parse(buf.str(), path);
  }
  if (lead) fmt::print("# mc2 bench ops --tune: {} ranks, raw shm\n", n);
  // GEMM rate and efficiency loss: t(rows) = 2 N K (rows + h) / G, every
  // rank multiplying at once (as in the operators).
  const int cores = core::HostCpus();
  const double share = std::max(1.0, double(n) / cores);
  const size_t gk = cfg.k, gn = cfg.n;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    std::vector<char> a, b;
    Fill(a, 2048 * gk, dt, 1);
    Fill(b, gk * gn, dt, 2);
    std::vector<float> c(2048 * gn);
    // As the operators multiply: B packed once (outside the timing: one
    // pass over B per call, noise next to the GEMM).
    auto gemms = OpCase::OpGemms(g, dt);
    // One call of R rows against c calls of R/c rows, alternated (so that
    // load changes hit both alike): t1 = a (R + h), tc = a (R + c h).
    constexpr size_t R = 1024;
    constexpr int kCalls = 16;
    std::vector<double> t1s, tcs;
    gemms.Gemm(R, gn, gk, a.data(), b.data(), DType::kF32, c.data());
    for (int i = 0; i < 7; ++i) {
      t1s.push_back(timer.Median([&] {
        gemms.Gemm(R, gn, gk, a.data(), b.data(), DType::kF32, c.data());
      }));
      tcs.push_back(timer.Median([&] {
        for (int j = 0; j < kCalls; ++j)
          gemms.Gemm(R / kCalls, gn, gk, a.data() + j * (R / kCalls) * gk * DTypeSize(dt),
                     b.data(), DType::kF32, c.data() + j * (R / kCalls) * gn);
      }));
    }
    const double t1 = bench::Median(t1s), tc = bench::Median(tcs);
    const double h = std::clamp((tc - t1) * R / std::max(1e-12, kCalls * t1 - tc), 0.0, 4.0 * R);
    const double slope = t1 / (R + h);
    auto& rate = dt == DType::kF32 ? params.f32 : params.bf16;
    // Stored per core: ranks beyond the cores share them (cost_model.h).
    rate.flops_per_s = 2.0 * double(gn) * double(gk) / slope * share;
    rate.half_rows = h;
    if (lead)
      fmt::print("# gemm {}: {:.1f} GF/s per core (all ranks at once), half-efficiency rows "
                 "{:.1f}\n",
                 DTypeName(dt), rate.flops_per_s / 1e9, rate.half_rows);
  }
  // Collectives as the operators call them (private buffers, background):
  // lat + bytes / bw from two sizes.
  if (n > 1) {
    const CollectiveOptions co = OpCollectiveOptions(false);
    ops::CostParams::PerRanks pr = params.CommFor(n);
    for (int which = 0; which < 3; ++which) {
      std::vector<double> xs, ts;
      for (size_t bytes : {size_t{1} << 20, size_t{16} << 20}) {
        const size_t elems = bytes / 4;
        std::vector<float> in(elems, 1.0f), out(elems);
        std::vector<size_t> counts(n), displs(n);
        for (int r = 0; r < n; ++r) {
          counts[r] = RowsOf(elems, r, n);
          displs[r] = r == 0 ? 0 : displs[r - 1] + counts[r - 1];
        }
        xs.push_back(double(bytes));
        ts.push_back(timer.Median([&] {
          if (which == 0)
            AllGatherV(g, in.data() + displs[g.rank()], out.data(), counts, displs, DType::kF32,
                       co)
                .Wait();
          else if (which == 1)
            ReduceScatterV(g, in.data(), out.data(), counts, DType::kF32, ReduceOp::kSum, co)
                .Wait();
          else
            AllReduce(g, in.data(), out.data(), elems, DType::kF32, ReduceOp::kSum, co).Wait();
        }));
      }
      const double bw = (xs[1] - xs[0]) / std::max(1e-9, ts[1] - ts[0]);
      const double lat = std::max(0.0, ts[0] - xs[0] / bw);
      auto& c = which == 0 ? pr.all_gather : which == 1 ? pr.reduce_scatter : pr.all_reduce;
      c.bytes_per_s = bw;
      c.lat_s = lat;
      if (lead)
        fmt::print("# {}: lat {:.1f} us, {:.2f} GB/s\n",
                   which == 0 ? "all_gather" : which == 1 ? "reduce_scatter" : "all_reduce",
                   lat * 1e6, bw / 1e9);
    }
    params.comm[n] = pr;
  }
  // Copy rate of one core, every rank copying at once.
  {
    std::vector<char> src(size_t{64} << 20, 1), dst(src.size());
    const double t = timer.Median([&] { std::memcpy(dst.data(), src.data(), src.size()); });
    params.copy_bytes_per_s = double(src.size()) / t * share;
    if (lead) fmt::print("# copy: {:.2f} GB/s per core\n", params.copy_bytes_per_s / 1e9);
  }
  // Per-step costs: a small MatmulAllReduce with 8 chunks against 1.
  if (n > 1) {
    OpsConfig small = cfg;
    small.m = 256;
    small.k = 64;
    small.n = 64;
    small.dtype = DType::kF32;
    MatmulReduceCase mc(g, small, true);
    for (Pipeline p : {Pipeline::kChunked, Pipeline::kFused}) {
      FusedOptions o1, o8;
      o1.pipeline = o8.pipeline = p;
      o1.splits = 1;
      o8.splits = 8;
      const double t1 = timer.Median([&] { mc.Run(o1); });
      const double t8 = timer.Median([&] { mc.Run(o8); });
      const double steps = p == Pipeline::kFused ? 7.0 * n : 7.0;
      const double alpha = std::max(0.0, (t8 - t1) / steps);
      (p == Pipeline::kFused ? params.alpha_fused_s : params.alpha_chunked_s) = alpha;
      if (lead) fmt::print("# alpha {}: {:.1f} us per step\n", PipelineName(p), alpha * 1e6);
    }
    // How much of the raw-shm communication hides behind GEMMs: chunked
    // with 4 chunks against serial, on a shape whose comm ~ compute.
    // K is cut so that the GEMM takes about as long as the all-reduce:
    // the fraction is only measurable when both are sizeable.
    OpsConfig mid = cfg;
    mid.dtype = DType::kF32;
    mid.k = 128;
    MatmulReduceCase ar(g, mid, true);
    const double tc = timer.Median([&] { ar.ComputeOnly(); });
    const double tm = timer.Median([&] { ar.CommOnly(OpCollectiveOptions(false)); });
    FusedOptions ser, ch;
    ser.pipeline = Pipeline::kSerial;
    ch.pipeline = Pipeline::kChunked;
    ch.splits = 4;
    const double ts = timer.Median([&] { ar.Run(ser); });
    const double tch = timer.Median([&] { ar.Run(ch); });
    const double ov =
        std::clamp((ts - tch) / (std::min(tc, tm) * (1 - 1.0 / 4)), 0.0, 1.0);
    (n >= cores ? params.overlap_cpu_busy : params.overlap_cpu_idle) = ov;
    if (lead)
      fmt::print("# raw-shm overlap ({} ranks, {} cores): {:.2f} (serial {:.2f} ms, chunked "
                 "{:.2f} ms, Tc {:.2f} ms, Tm {:.2f} ms)\n",
                 n, cores, ov, ts * 1e3, tch * 1e3, tc * 1e3, tm * 1e3);
  }
  if (lead) {
    std::filesystem::path p(path);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    std::ofstream(path) << params.ToJson();
    fmt::print("# wrote {}\n", path);
  }
  Barrier(g).Wait();
  return 0;
}

int RunTuneRank(const OpsConfig& cfg, const std::string& path) {
  try {
    return RunTuneRankImpl(cfg, path);
  } catch (const std::exception& e) {
    fmt::print(stderr, "mc2 bench ops --tune: {}\n", e.what());
    return bench::kExitWrong;
  }
}

// ---------------------------------------------------------------- outside
OpsConfig Validate(const OpsArgs& a) {
  OpsConfig c;
  if (!a.tune) {
    if (a.op.empty()) Usage(fmt::format("missing --op: expected one of {}", RunnerNames()));
    if (!FindRunner(a.op))
      Usage(fmt::format("unknown --op '{}': expected one of {}", a.op, RunnerNames()));
  }
  c.op = a.op;
  if (a.nranks < 0 || a.nranks > 256)
    Usage(fmt::format("-n {} is invalid: expected 1 to 256 ranks", a.nranks));
  c.nranks = a.nranks;
  auto dt = ParseDType(a.dtype);
  if (!dt || (*dt != DType::kF32 && *dt != DType::kBF16))
    Usage(fmt::format("--dtype '{}' is invalid: expected f32 or bf16", a.dtype));
  c.dtype = *dt;
  if (a.m == 0 || a.k == 0 || a.n == 0) Usage("-m, -k and -N must be positive");
  c.m = a.m;
  c.k = a.k;
  c.n = a.n;
  if (a.pipeline == "all") {
    c.pipelines = {Pipeline::kChunked, Pipeline::kFused, Pipeline::kAuto};
  } else {
    auto p = ParsePipeline(a.pipeline);
    if (!p)
      Usage(fmt::format("--pipeline '{}' is invalid: expected serial, chunked, fused, auto or all",
                        a.pipeline));
    c.pipelines = {*p};
  }
  if (a.splits == "sweep") {
    c.splits.assign(std::begin(kSweepSplits), std::end(kSweepSplits));
  } else {
    // One count or a comma-separated list.
    std::stringstream in(a.splits);
    for (std::string item; std::getline(in, item, ',');) {
      int s = 0;
      try {
        size_t used = 0;
        s = std::stoi(item, &used);
        if (used != item.size()) s = 0;
      } catch (...) {
      }
      if (s < 1 || s > 16)
        Usage(fmt::format("--splits '{}' is invalid: expected 1 to 16, a list such as 2,4,8, or "
                          "sweep",
                          a.splits));
      c.splits.push_back(s);
    }
    if (c.splits.empty()) Usage("--splits is empty");
  }
  if (a.link != "auto" && a.link != "none") {
    try {
      (void)core::ParseLinkConfig(a.link, "--link");
    } catch (const Error& e) {
      Usage(e.message());
    }
  }
  c.link = a.link;
  if (a.iters < 1) Usage(fmt::format("--iters {} is invalid: expected at least 1", a.iters));
  if (a.warmup < 0) Usage(fmt::format("--warmup {} is invalid: expected 0 or more", a.warmup));
  c.iters = a.iters;
  c.warmup = a.warmup;
  if (a.confirm < -1)
    Usage(fmt::format("--confirm {} is invalid: expected 0 or more", a.confirm));
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
  std::vector<std::string> v = {SelfExe(), "bench", "ops", "--op", c.op, "-m",
                                std::to_string(c.m), "-k", std::to_string(c.k), "-N",
                                std::to_string(c.n), "--dtype", DTypeName(c.dtype), "--link",
                                link, "--iters", std::to_string(c.iters), "--warmup",
                                std::to_string(c.warmup), "--confirm",
                                std::to_string(c.confirm)};
  std::string pipes;
  if (c.pipelines.size() > 1) pipes = "all";
  else pipes = PipelineName(c.pipelines[0]);
  v.insert(v.end(), {"--pipeline", pipes});
  std::string splits;
  for (int s : c.splits) splits += (splits.empty() ? "" : ",") + std::to_string(s);
  v.insert(v.end(), {"--splits", splits});
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
  const OpRunner& runner = *FindRunner(c.op);
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
  const double port = runner.port_bytes
                          ? runner.port_bytes(c, nranks)
                          : ops::Predict(ops::CostParams::Defaults(), unit,
                                         ProblemOf(runner, c, nranks), Pipeline::kSerial, 1)
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
  // with Tc the mean of every launch's compute-only: one launch's Tc is 3
  // iterations, and a host phase moved it by 10-15% (once it set a link
  // that left comm-only at 84 ms against compute-only at 96 ms). Three
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

void RunOpsCallback(const OpsArgs& a, bool link_was_auto) {
  OpsConfig cfg = Validate(a);
  if (a.tune) {
    const std::string path = !a.output.empty() ? a.output : ops::CostParamsPath();
    if (path.empty()) Usage("--tune: no output path (set --output or HOME)");
    if (Group::LaunchedByMc2()) {
      const int status = RunTuneRank(cfg, path);
      if (status != 0) throw CLI::RuntimeError(status);
      return;
    }
    const int nr = cfg.nranks ? cfg.nranks : kDefaultRanks;
    std::vector<std::string> argv = {SelfExe(), "bench", "ops", "--tune", "--output", path,
                                     "-m", std::to_string(cfg.m), "-k", std::to_string(cfg.k),
                                     "-N", std::to_string(cfg.n)};
    const int status = Launch(nr, argv, tools::kDefaultHeapBytes);
    if (status != 0) throw CLI::RuntimeError(status);
    return;
  }
  if (Group::LaunchedByMc2()) {
    if (cfg.link == "auto")
      Usage("--link auto needs to start its own ranks (run `mc2 bench ops` outside `mc2 run`)");
    cfg.link_auto = link_was_auto;
    const int status = RunOpsRank(cfg);
    if (status != 0) throw CLI::RuntimeError(status);
    return;
  }
  const int nr = cfg.nranks ? cfg.nranks : kDefaultRanks;
  const size_t heap = HeapBytesFor(*FindRunner(cfg.op), cfg, nr);
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

}  // namespace

void RegisterBenchOps(CLI::App& bench) {
  auto a = std::make_shared<OpsArgs>();
  auto link_was_auto = std::make_shared<bool>(false);
  CLI::App* cmd = bench.add_subcommand(
      "ops",
      "Benchmark a fused operator's pipelines against compute-only, comm-only and the ideal "
      "overlap bound, or --tune the `auto` pipeline's cost model");
  cmd->add_option("--op", a->op,
                  "all_gather_matmul, matmul_reduce_scatter, matmul_all_reduce, "
                  "all_gather_batch_matmul, moe or moe_mlp");
  cmd->add_option("-n,--nranks", a->nranks, "Ranks (default 2; inside a job: the job's size)");
  cmd->add_option("--dtype", a->dtype, "f32 or bf16")->capture_default_str();
  cmd->add_option("-m", a->m, "Rows M of the per-rank GEMM")->capture_default_str();
  cmd->add_option("-k", a->k, "Inner dimension K of the per-rank GEMM")->capture_default_str();
  cmd->add_option("-N", a->n, "Columns N of the per-rank GEMM")->capture_default_str();
  cmd->add_option("--pipeline", a->pipeline, "serial, chunked, fused, auto or all")
      ->capture_default_str();
  cmd->add_option("--splits", a->splits, "Chunks per block, 1-16, a list (2,4,8), or sweep")
      ->capture_default_str();
  cmd->add_option("--link", a->link,
                  "Emulated link (e.g. bw=10GB/s,lat=5us), auto (comm-only = compute-only) or "
                  "none")
      ->capture_default_str();
  cmd->add_option("--iters", a->iters, "Timed iterations")->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "Untimed iterations")->capture_default_str();
  cmd->add_option("--confirm", a->confirm,
                  "After the sweep, re-time compute-only, comm-only, serial, the best and auto "
                  "side by side for this many iterations (default: --iters; 0: off), since the "
                  "best of many noisy medians is biased low");
  cmd->add_option("--json", a->json, "Also write the rows to this JSON file");
  cmd->add_option("--trace-ab", a->trace_ab,
                  "Measure tracing's cost: time every configuration traced (into this "
                  "directory) and untraced in each iteration, alternating, and print both");
  cmd->add_flag("--tune", a->tune,
                "Measure the cost model's parameters (GEMM rate, collectives, per-step costs, "
                "raw-shm overlap) and write the operator tuning file");
  cmd->add_option("--output", a->output,
                  "--tune: the file to write (default MC2_OPS_TUNING_FILE, else "
                  "~/.cache/mc2/ops_tuning.json)");
  cmd->add_option("--calibrate-out", a->calibrate_out)->group("");  // internal
  cmd->add_flag("--link-was-auto", *link_was_auto)->group("");     // internal
  cmd->callback([a, link_was_auto] { RunOpsCallback(*a, *link_was_auto); });
}

}  // namespace mc2::tools
