// `mc2 bench ops --tune`: measures the operators' cost model parameters
// (ops/cost_model.h) on this job's ranks, on raw shared memory, and has
// rank 0 merge them into the tuning file: the GEMM rate and its loss on few
// rows, the collectives' latency and bandwidth as the operators call them,
// one core's copy rate, the pipelines' per-step costs and how much of the
// communication hides behind GEMMs.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "bench.h"
#include "bench_ops.h"
#include "core/env.h"

namespace mc2::tools::bench_ops {

namespace {

using Clock = std::chrono::steady_clock;

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

// What every measurement shares.
struct TuneContext {
  const Group& g;
  const OpsConfig& cfg;
  Timer timer;
  bool lead;
  // Ranks per core: the rates are stored per core, and ranks beyond the
  // cores share them (cost_model.h).
  double share;
};

// GEMM rate and efficiency loss: t(rows) = 2 N K (rows + h) / G, every
// rank multiplying at once (as in the operators).
void MeasureGemm(const TuneContext& t, DType dt, ops::CostParams& params) {
  const size_t gk = t.cfg.k, gn = t.cfg.n;
  std::vector<char> a, b;
  Fill(a, 2048 * gk, dt, 1);
  Fill(b, gk * gn, dt, 2);
  std::vector<float> c(2048 * gn);
  // As the operators multiply: B packed once (outside the timing: one
  // pass over B per call, noise next to the GEMM).
  auto gemms = OpCase::OpGemms(t.g, dt);
  // One call of R rows against c calls of R/c rows, alternated (so that
  // load changes hit both alike): t1 = a (R + h), tc = a (R + c h).
  constexpr size_t R = 1024;
  constexpr int kCalls = 16;
  std::vector<double> t1s, tcs;
  gemms.Gemm(R, gn, gk, a.data(), b.data(), DType::kF32, c.data());
  for (int i = 0; i < 7; ++i) {
    t1s.push_back(
        t.timer.Median([&] { gemms.Gemm(R, gn, gk, a.data(), b.data(), DType::kF32, c.data()); }));
    tcs.push_back(t.timer.Median([&] {
      for (int j = 0; j < kCalls; ++j)
        gemms.Gemm(R / kCalls, gn, gk, a.data() + j * (R / kCalls) * gk * DTypeSize(dt), b.data(),
                   DType::kF32, c.data() + j * (R / kCalls) * gn);
    }));
  }
  const double t1 = bench::Median(t1s), tc = bench::Median(tcs);
  const double h = std::clamp((tc - t1) * R / std::max(1e-12, kCalls * t1 - tc), 0.0, 4.0 * R);
  const double slope = t1 / (R + h);
  auto& rate = dt == DType::kF32 ? params.f32 : params.bf16;
  rate.flops_per_s = 2.0 * double(gn) * double(gk) / slope * t.share;
  rate.half_rows = h;
  if (t.lead)
    fmt::print(
        "# gemm {}: {:.1f} GF/s per core (all ranks at once), half-efficiency rows "
        "{:.1f}\n",
        DTypeName(dt), rate.flops_per_s / 1e9, rate.half_rows);
}

// One collective (0: all_gather, 1: reduce_scatter, 2: all_reduce) as the
// operators call it (private buffers, background): lat + bytes / bw from
// two sizes.
void MeasureCollective(const TuneContext& t, int which, ops::CostParams::PerRanks& pr) {
  const Group& g = t.g;
  const int n = g.size();
  const CollectiveOptions co = OpCollectiveOptions(false);
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
    ts.push_back(t.timer.Median([&] {
      if (which == 0)
        AllGatherV(g, in.data() + displs[g.rank()], out.data(), counts, displs, DType::kF32, co)
            .Wait();
      else if (which == 1)
        ReduceScatterV(g, in.data(), out.data(), counts, DType::kF32, ReduceOp::kSum, co).Wait();
      else
        AllReduce(g, in.data(), out.data(), elems, DType::kF32, ReduceOp::kSum, co).Wait();
    }));
  }
  const double bw = (xs[1] - xs[0]) / std::max(1e-9, ts[1] - ts[0]);
  const double lat = std::max(0.0, ts[0] - xs[0] / bw);
  auto& c = which == 0 ? pr.all_gather : which == 1 ? pr.reduce_scatter : pr.all_reduce;
  c.bytes_per_s = bw;
  c.lat_s = lat;
  if (t.lead)
    fmt::print("# {}: lat {:.1f} us, {:.2f} GB/s\n",
               which == 0   ? "all_gather"
               : which == 1 ? "reduce_scatter"
                            : "all_reduce",
               lat * 1e6, bw / 1e9);
}

// Copy rate of one core, every rank copying at once.
void MeasureCopy(const TuneContext& t, ops::CostParams& params) {
  std::vector<char> src(size_t{64} << 20, 1), dst(src.size());
  const double s = t.timer.Median([&] { std::memcpy(dst.data(), src.data(), src.size()); });
  params.copy_bytes_per_s = double(src.size()) / s * t.share;
  if (t.lead) fmt::print("# copy: {:.2f} GB/s per core\n", params.copy_bytes_per_s / 1e9);
}

// Per-step costs: a small MatmulAllReduce with 8 chunks against 1.
void MeasureStepCosts(const TuneContext& t, ops::CostParams& params) {
  OpsConfig small = t.cfg;
  small.m = 256;
  small.k = 64;
  small.n = 64;
  small.dtype = DType::kF32;
  std::unique_ptr<OpCase> mc = MakeMatmulReduceCase(t.g, small, true);
  for (Pipeline p : {Pipeline::kChunked, Pipeline::kFused}) {
    FusedOptions o1, o8;
    o1.pipeline = o8.pipeline = p;
    o1.splits = 1;
    o8.splits = 8;
    const double t1 = t.timer.Median([&] { mc->Run(o1); });
    const double t8 = t.timer.Median([&] { mc->Run(o8); });
    const double steps = p == Pipeline::kFused ? 7.0 * t.g.size() : 7.0;
    const double alpha = std::max(0.0, (t8 - t1) / steps);
    (p == Pipeline::kFused ? params.alpha_fused_s : params.alpha_chunked_s) = alpha;
    if (t.lead) fmt::print("# alpha {}: {:.1f} us per step\n", PipelineName(p), alpha * 1e6);
  }
}

// How much of the raw-shm communication hides behind GEMMs: chunked with 4
// chunks against serial, on a shape whose comm ~ compute. K is cut so that
// the GEMM takes about as long as the all-reduce: the fraction is only
// measurable when both are sizeable.
void MeasureOverlap(const TuneContext& t, int cores, ops::CostParams& params) {
  OpsConfig mid = t.cfg;
  mid.dtype = DType::kF32;
  mid.k = 128;
  std::unique_ptr<OpCase> ar = MakeMatmulReduceCase(t.g, mid, true);
  const double tc = t.timer.Median([&] { ar->ComputeOnly(); });
  const double tm = t.timer.Median([&] { ar->CommOnly(OpCollectiveOptions(false)); });
  FusedOptions ser, ch;
  ser.pipeline = Pipeline::kSerial;
  ch.pipeline = Pipeline::kChunked;
  ch.splits = 4;
  const double ts = t.timer.Median([&] { ar->Run(ser); });
  const double tch = t.timer.Median([&] { ar->Run(ch); });
  const double ov = std::clamp((ts - tch) / (std::min(tc, tm) * (1 - 1.0 / 4)), 0.0, 1.0);
  const int n = t.g.size();
  (n >= cores ? params.overlap_cpu_busy : params.overlap_cpu_idle) = ov;
  if (t.lead)
    fmt::print(
        "# raw-shm overlap ({} ranks, {} cores): {:.2f} (serial {:.2f} ms, chunked "
        "{:.2f} ms, Tc {:.2f} ms, Tm {:.2f} ms)\n",
        n, cores, ov, ts * 1e3, tch * 1e3, tc * 1e3, tm * 1e3);
}

// Rank 0 writes the merged parameters; false (with the OS's reason) if the
// file cannot be written.
bool WriteParams(const ops::CostParams& params, const std::string& path) {
  std::ofstream out(path);
  out << params.ToJson();
  out.close();
  if (!out) {
    fmt::print(stderr, "mc2 bench ops --tune: cannot write --output {}: {}\n", path,
               std::strerror(errno));
    return false;
  }
  fmt::print("# wrote {}\n", path);
  return true;
}

int TuneOnRank(const OpsConfig& cfg, const std::string& path) {
  // The measurements run the operators with explicit pipelines; they must
  // not depend on (or fail for want of) the file being written.
  unsetenv("MC2_OPS_TUNING_FILE");
  WorldOptions wo;
  wo.link = "none";
  Group g = Group::FromEnv(wo);
  const int cores = core::HostCpus();
  const TuneContext t{g, cfg, Timer(g, 3, 1), g.rank() == 0,
                      std::max(1.0, double(g.size()) / cores)};
  ops::CostParams params = ops::CostParams::Defaults();
  if (std::ifstream in(path); in) {
    std::stringstream buf;
    buf << in.rdbuf();
    params = ops::CostParams::Parse(buf.str(), path);
  }
  if (t.lead) fmt::print("# mc2 bench ops --tune: {} ranks, raw shm\n", g.size());
  for (DType dt : {DType::kF32, DType::kBF16}) MeasureGemm(t, dt, params);
  if (g.size() > 1) {
    ops::CostParams::PerRanks pr = params.CommFor(g.size());
    for (int which = 0; which < 3; ++which) MeasureCollective(t, which, pr);
    params.comm[g.size()] = pr;
  }
  MeasureCopy(t, params);
  if (g.size() > 1) {
    MeasureStepCosts(t, params);
    MeasureOverlap(t, cores, params);
  }
  int status = 0;
  if (t.lead && !WriteParams(params, path)) status = bench::kExitWrong;
  Barrier(g).Wait();
  return status;
}

}  // namespace

int RunTuneRank(const OpsConfig& cfg, const std::string& path) {
  try {
    return TuneOnRank(cfg, path);
  } catch (const std::exception& e) {
    fmt::print(stderr, "mc2 bench ops --tune: {}\n", e.what());
    return bench::kExitWrong;
  }
}

}  // namespace mc2::tools::bench_ops
