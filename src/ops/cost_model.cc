#include "ops/cost_model.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/env.h"
#include "core/log.h"
#include "mc2/error.h"

namespace mc2::ops {

const char* FusedOpKindName(FusedOpKind op) {
  switch (op) {
    case FusedOpKind::kAllGatherMatmul: return "all_gather_matmul";
    case FusedOpKind::kMatmulReduceScatter: return "matmul_reduce_scatter";
    case FusedOpKind::kMatmulAllReduce: return "matmul_all_reduce";
  }
  return "?";
}

namespace {

// FNV-1a over the bytes of doubles and integers, in a fixed order.
class Hasher {
 public:
  void Add(double v) { Bytes(&v, sizeof v); }
  void Add(uint64_t v) { Bytes(&v, sizeof v); }
  uint64_t value() const { return h_; }

 private:
  void Bytes(const void* p, size_t n) {
    auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ c[i]) * 0x100000001b3ull;
  }
  uint64_t h_ = 0xcbf29ce484222325ull;
};

double Pos(const nlohmann::json& j, const char* key, double def, const std::string& where,
           const std::string& source) {
  if (!j.contains(key)) return def;
  const auto& v = j.at(key);
  if (!v.is_number() || !(v.get<double>() >= 0) || !std::isfinite(v.get<double>()))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("operator tuning file {} is invalid: {}.{} = {} (expected a "
                            "non-negative number)",
                            source, where, key, v.dump()));
  return v.get<double>();
}

nlohmann::json CommJson(const CostParams::Comm& c) {
  return {{"lat_us", c.lat_s * 1e6}, {"gbytes_per_s", c.bytes_per_s / 1e9}};
}

CostParams::Comm CommFrom(const nlohmann::json& j, const CostParams::Comm& def,
                          const std::string& where, const std::string& source) {
  CostParams::Comm c = def;
  c.lat_s = Pos(j, "lat_us", def.lat_s * 1e6, where, source) * 1e-6;
  c.bytes_per_s = Pos(j, "gbytes_per_s", def.bytes_per_s / 1e9, where, source) * 1e9;
  if (c.bytes_per_s <= 0)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("operator tuning file {} is invalid: {}.gbytes_per_s must be > 0",
                            source, where));
  return c;
}

// GEMM seconds of one call of `rows` rows (efficiency loss included).
double GemmSeconds(const CostParams::GemmRate& g, size_t rows, size_t n, size_t k) {
  if (rows == 0 || n == 0 || k == 0) return 0;
  return 2.0 * double(n) * double(k) * (double(rows) + g.half_rows) / g.flops_per_s;
}

double CommSeconds(const CostParams::Comm& c, double bytes) {
  return bytes > 0 ? c.lat_s + bytes / c.bytes_per_s : 0;
}

int CoresOf(const Environment& env) { return env.cores > 0 ? env.cores : core::HostCpus(); }

}  // namespace

CostParams CostParams::Defaults() {
  CostParams p;
  // Measured on the development host (2 vCPUs, one GEMM thread per rank,
  // private buffers, raw shm): bench/gemm_bench and `mc2 bench ops --tune`.
  p.f32 = {100e9, 8};
  p.bf16 = {200e9, 8};
  // The latencies are those of an operator's collective, which runs on the
  // progress thread (never inline): a few microseconds with 2 ranks, more
  // with 4 ranks sharing 2 cores.
  PerRanks two;
  two.all_gather = {3e-6, 8e9};
  two.reduce_scatter = {3e-6, 6e9};
  two.all_reduce = {4e-6, 4e9};
  PerRanks four;
  four.all_gather = {10e-6, 5e9};
  four.reduce_scatter = {10e-6, 3e9};
  four.all_reduce = {12e-6, 2e9};
  p.comm = {{2, two}, {4, four}};
  return p;
}

const CostParams::PerRanks& CostParams::CommFor(int ranks) const {
  static const PerRanks fallback;
  if (comm.empty()) return fallback;
  auto it = comm.upper_bound(ranks);
  if (it == comm.begin()) return it->second;
  return std::prev(it)->second;
}

CostParams CostParams::Parse(const std::string& json_text, const std::string& source) {
  CostParams p = Defaults();
  p.source = source;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("operator tuning file {} is not valid JSON: {}", source, e.what()));
  }
  if (!j.is_object())
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("operator tuning file {} is invalid: the top level is not an object "
                            "(expected the form `mc2 bench ops --tune` writes)",
                            source));
  if (j.contains("gemm")) {
    const auto& g = j.at("gemm");
    for (auto [name, rate] : {std::pair{"f32", &p.f32}, std::pair{"bf16", &p.bf16}}) {
      if (!g.contains(name)) continue;
      const std::string where = std::string("gemm.") + name;
      rate->flops_per_s = Pos(g.at(name), "gflops", rate->flops_per_s / 1e9, where, source) * 1e9;
      rate->half_rows = Pos(g.at(name), "half_rows", rate->half_rows, where, source);
      if (rate->flops_per_s <= 0)
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("operator tuning file {} is invalid: {}.gflops must be > 0",
                                source, where));
    }
  }
  if (j.contains("comm")) {
    const auto& c = j.at("comm");
    if (!c.is_object())
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("operator tuning file {} is invalid: comm is not an object", source));
    for (auto& [ranks_text, per] : c.items()) {
      int ranks = 0;
      try {
        ranks = std::stoi(ranks_text);
      } catch (...) {
      }
      if (ranks < 1)
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("operator tuning file {} is invalid: comm key '{}' is not a rank "
                                "count",
                                source, ranks_text));
      PerRanks pr = p.CommFor(ranks);
      const std::string w = "comm." + ranks_text;
      if (per.contains("all_gather"))
        pr.all_gather = CommFrom(per.at("all_gather"), pr.all_gather, w + ".all_gather", source);
      if (per.contains("reduce_scatter"))
        pr.reduce_scatter =
            CommFrom(per.at("reduce_scatter"), pr.reduce_scatter, w + ".reduce_scatter", source);
      if (per.contains("all_reduce"))
        pr.all_reduce = CommFrom(per.at("all_reduce"), pr.all_reduce, w + ".all_reduce", source);
      p.comm[ranks] = pr;
    }
  }
  p.copy_bytes_per_s = Pos(j, "copy_gbytes_per_s", p.copy_bytes_per_s / 1e9, "", source) * 1e9;
  p.alpha_chunked_s = Pos(j, "alpha_chunked_us", p.alpha_chunked_s * 1e6, "", source) * 1e-6;
  p.alpha_fused_s = Pos(j, "alpha_fused_us", p.alpha_fused_s * 1e6, "", source) * 1e-6;
  p.link_hop_s = Pos(j, "link_hop_us", p.link_hop_s * 1e6, "", source) * 1e-6;
  p.link_step_risk_s =
      Pos(j, "link_step_risk_us", p.link_step_risk_s * 1e6, "", source) * 1e-6;
  p.overlap_cpu_busy = std::min(1.0, Pos(j, "overlap_cpu_busy", p.overlap_cpu_busy, "", source));
  p.overlap_cpu_idle = std::min(1.0, Pos(j, "overlap_cpu_idle", p.overlap_cpu_idle, "", source));
  p.min_gain = std::min(0.5, Pos(j, "min_gain", p.min_gain, "", source));
  if (p.copy_bytes_per_s <= 0)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("operator tuning file {} is invalid: copy_gbytes_per_s must be > 0",
                            source));
  return p;
}

std::string CostParams::ToJson() const {
  nlohmann::json j;
  j["_meta"] = {{"written_by", "mc2 bench ops --tune"},
                {"model", "see src/ops/cost_model.h"}};
  j["gemm"]["f32"] = {{"gflops", f32.flops_per_s / 1e9}, {"half_rows", f32.half_rows}};
  j["gemm"]["bf16"] = {{"gflops", bf16.flops_per_s / 1e9}, {"half_rows", bf16.half_rows}};
  for (const auto& [ranks, pr] : comm) {
    j["comm"][std::to_string(ranks)] = {{"all_gather", CommJson(pr.all_gather)},
                                        {"reduce_scatter", CommJson(pr.reduce_scatter)},
                                        {"all_reduce", CommJson(pr.all_reduce)}};
  }
  j["copy_gbytes_per_s"] = copy_bytes_per_s / 1e9;
  j["alpha_chunked_us"] = alpha_chunked_s * 1e6;
  j["alpha_fused_us"] = alpha_fused_s * 1e6;
  j["link_hop_us"] = link_hop_s * 1e6;
  j["link_step_risk_us"] = link_step_risk_s * 1e6;
  j["overlap_cpu_busy"] = overlap_cpu_busy;
  j["overlap_cpu_idle"] = overlap_cpu_idle;
  j["min_gain"] = min_gain;
  return j.dump(2) + "\n";
}

uint64_t CostParams::Hash() const {
  Hasher h;
  for (const GemmRate* g : {&f32, &bf16}) {
    h.Add(g->flops_per_s);
    h.Add(g->half_rows);
  }
  for (const auto& [ranks, pr] : comm) {
    h.Add(uint64_t(ranks));
    for (const Comm* c : {&pr.all_gather, &pr.reduce_scatter, &pr.all_reduce}) {
      h.Add(c->lat_s);
      h.Add(c->bytes_per_s);
    }
  }
  for (double v : {copy_bytes_per_s, alpha_chunked_s, alpha_fused_s, link_hop_s, link_step_risk_s,
                   overlap_cpu_busy, overlap_cpu_idle, min_gain})
    h.Add(v);
  return h.value();
}

uint64_t Environment::Hash() const {
  Hasher h;
  h.Add(link_bytes_per_second);
  h.Add(link_latency_s);
  h.Add(uint64_t(heap_bytes));
  h.Add(uint64_t(cores));
  return h.value();
}

size_t FusedWorkspaceBytes(const Problem& p) {
  size_t most = 0;
  for (size_t r : p.rows) {
    size_t b = 0;
    switch (p.op) {
      case FusedOpKind::kAllGatherMatmul: b = r * p.k * DTypeSize(p.dtype); break;
      case FusedOpKind::kMatmulReduceScatter: b = (p.M - r) * p.n * sizeof(float); break;
      case FusedOpKind::kMatmulAllReduce: b = p.M * p.n * sizeof(float); break;
    }
    most = std::max(most, b);
  }
  return most;
}

Estimate Predict(const CostParams& params, const Environment& env, const Problem& p,
                 Pipeline pipeline, int splits) {
  Estimate e;
  const int n = std::max(1, p.ranks);
  const int s = std::max(1, splits);
  const int cores = CoresOf(env);
  // More ranks than cores share them: each rank's GEMMs and copies run at
  // cores / ranks of a core's rate (the link, which is not CPU, does not).
  const double share = std::max(1.0, double(n) / cores);
  CostParams::GemmRate g = params.Gemm(p.dtype);
  g.flops_per_s /= share;
  const double copy_rate = params.copy_bytes_per_s / share;
  const auto& comm = params.CommFor(n);
  const double esize = static_cast<double>(DTypeSize(p.dtype));
  size_t max_rows = 0, min_rows = p.M;
  for (size_t r : p.rows) {
    max_rows = std::max(max_rows, r);
    min_rows = std::min(min_rows, r);
  }
  if (p.rows.empty()) min_rows = 0;
  // GEMM time over the pipeline's calls: each block of `rows` cut in `c`.
  auto gemm_blocks = [&](int c) {
    double t = 0;
    for (size_t r : p.rows)
      for (int j = 0; j < c; ++j)
        t += GemmSeconds(g, r * (j + 1) / c - r * j / c, p.n, p.k);
    return t;
  };
  const double link_bw = env.link_bytes_per_second;
  auto link = [&](double port_bytes, int hops) {
    return link_bw > 0 && port_bytes > 0
               ? hops * env.link_latency_s + port_bytes / link_bw
               : 0.0;
  };
  const double c_bytes = double(p.M) * double(p.n) * 4;  // the f32 product
  const double a_bytes = double(p.M) * double(p.k) * esize;
  // Collective the serial/chunked pipelines run, and what the ring puts on
  // a port under emulation (deterministic reduce-scatter moves raw chunks:
  // (n-1)/2 of the vector, see collectives/ring.cc).
  double coll_bytes = 0, port_bytes = 0;
  const CostParams::Comm* coll = nullptr;
  switch (p.op) {
    case FusedOpKind::kAllGatherMatmul:
      coll = &comm.all_gather;
      coll_bytes = a_bytes;
      port_bytes = double(n - 1) * double(max_rows) * double(p.k) * esize;
      break;
    case FusedOpKind::kMatmulReduceScatter:
      coll = &comm.reduce_scatter;
      coll_bytes = c_bytes;
      port_bytes = c_bytes * (n - 1) / 2.0;
      break;
    case FusedOpKind::kMatmulAllReduce:
      coll = &comm.all_reduce;
      coll_bytes = c_bytes;
      port_bytes = c_bytes * (n - 1) / 2.0 + c_bytes * (n - 1) / n;
      break;
  }
  const double ov = n >= cores ? params.overlap_cpu_busy : params.overlap_cpu_idle;
  const int hops = std::max(1, n - 1) * (p.op == FusedOpKind::kMatmulAllReduce ? 2 : 1);
  double alpha = 0, extra = 0;
  if (pipeline == Pipeline::kSerial || n == 1) {
    // One GEMM of all M rows.
    e.compute_s = GemmSeconds(g, p.M, p.n, p.k);
    if (n > 1) {
      e.comm_cpu_s = CommSeconds(*coll, coll_bytes);
      e.comm_link_s = link(port_bytes, hops);
    }
    e.seconds = e.compute_s + e.comm_cpu_s + e.comm_link_s;
    e.stages = 1;
    e.calls = 1;
    return e;
  }
  if (pipeline == Pipeline::kChunked) {
    e.compute_s = p.op == FusedOpKind::kMatmulAllReduce
                      ? [&] {
                          double t = 0;
                          for (int j = 0; j < s; ++j)
                            t += GemmSeconds(g, p.M * (j + 1) / s - p.M * j / s, p.n, p.k);
                          return t;
                        }()
                      : gemm_blocks(s);
    // s collectives of 1/s of the bytes: s latencies.
    e.comm_cpu_s = s * CommSeconds(*coll, coll_bytes / s);
    e.comm_link_s = link(port_bytes, hops) + (link_bw > 0 ? (s - 1) * env.link_latency_s : 0);
    // s collectives of `hops` dependent steps each, serialized on the
    // progress thread: their wake-ups add up (not hidden behind GEMMs).
    if (link_bw > 0) extra = s * hops * params.link_hop_s;
    e.stages = s;
    e.calls = s;
    alpha = params.alpha_chunked_s;
  } else {  // kFused
    e.compute_s = gemm_blocks(s);
    // What the fused pipeline copies on the cores, and puts on a port.
    double copy = 0, port = 0;
    switch (p.op) {
      case FusedOpKind::kAllGatherMatmul:
        copy = double(max_rows) * p.k * esize + (p.gathered_a ? a_bytes : 0);
        port = double(n - 1) * double(max_rows) * double(p.k) * esize;
        break;
      case FusedOpKind::kMatmulReduceScatter:
        // The owner's ReduceTree reads n partials of its block.
        copy = double(n) * double(max_rows) * p.n * 4;
        port = double(p.M - min_rows) * p.n * 4;
        break;
      case FusedOpKind::kMatmulAllReduce:
        copy = double(n) * double(max_rows) * p.n * 4 + c_bytes;
        port = double(p.M - min_rows) * p.n * 4 + double(n - 1) * double(max_rows) * p.n * 4;
        break;
    }
    e.comm_cpu_s = copy / copy_rate;
    e.comm_link_s = link(port, 1);
    e.stages = n * s;
    e.calls = n * s;
    alpha = params.alpha_fused_s;
  }
  const double tc = e.compute_s + (1 - ov) * e.comm_cpu_s;
  const double h = e.comm_link_s + ov * e.comm_cpu_s;
  e.seconds = std::max(tc, h) + std::min(tc, h) / e.stages + e.calls * alpha + extra;
  return e;
}

namespace {

// The chunks per block of a split pipeline (see ChooseSplitPipeline).
int BestSplits(const CostParams& params, const SplitProblem& p) {
  const double cores = p.cores > 0 ? p.cores : core::HostCpus();
  const CostParams::GemmRate& gemm = params.Gemm(p.dtype);
  const double rate = gemm.flops_per_s * std::min(1.0, cores / std::max(1, p.ranks));
  const double tl = p.port_bytes / (p.link_bytes_per_second > 0 ? p.link_bytes_per_second
                                                                : params.copy_bytes_per_s);
  // A step costs alpha_fused_s when its waiter wakes at once, and up to
  // link_hop_s under emulation when the cores are busy with GEMMs and the
  // delayed flag's wake-ups queue behind them. Which one holds depends on
  // the load of the moment, so the s whose worse ratio to the best under
  // either cost is least wins: the choice that is never far from the best.
  const double step_lo = params.alpha_fused_s;
  const double step_hi = p.link_bytes_per_second > 0 ? params.link_hop_s : step_lo;
  const int align = std::max(1, p.align);
  struct Cand {
    int s;
    double hi, lo;
  };
  std::vector<Cand> cands;
  for (int s = 1; s <= 16; ++s) {
    if (s % align != 0 && align % s != 0) continue;
    const double stages = double(std::max(1, p.blocks)) * s;
    const double calls = p.fixed_calls + p.calls_per_stage * stages;
    const double tc = 2.0 * p.n * p.k * (p.rows + calls * gemm.half_rows) / rate;
    const double t = std::max(tc, tl) + p.exposed_stages * std::min(tc, tl) / stages;
    cands.push_back({s, t + stages * step_hi, t + stages * step_lo});
  }
  double best_hi = cands[0].hi, best_lo = cands[0].lo;
  for (const Cand& c : cands) best_hi = std::min(best_hi, c.hi), best_lo = std::min(best_lo, c.lo);
  auto regret = [&](const Cand& c) {
    return std::max(c.hi / std::max(best_hi, 1e-30), c.lo / std::max(best_lo, 1e-30));
  };
  const Cand* best = &cands[0];
  for (const Cand& c : cands) {
    const double r = regret(c), rb = regret(*best);
    if (r < rb || (r == rb && c.hi < best->hi)) best = &c;
  }
  return best->s;
}

}  // namespace

Choice ChooseSplitPipeline(const CostParams& params, const SplitProblem& p) {
  Choice c;
  if (p.ranks <= 1) return c;  // nothing to overlap
  const int cores = p.cores > 0 ? p.cores : core::HostCpus();
  const CostParams::GemmRate& gemm = params.Gemm(p.dtype);
  const double rate = gemm.flops_per_s * std::min(1.0, double(cores) / p.ranks);
  const bool link = p.link_bytes_per_second > 0;
  const double comm = p.port_bytes / (link ? p.link_bytes_per_second : params.copy_bytes_per_s);
  // Serial: the GEMMs (one per fixed call) after the communication, one
  // step for the whole exchange.
  auto tc_of = [&](double calls) {
    return 2.0 * p.n * p.k * (p.rows + calls * gemm.half_rows) / rate;
  };
  const double serial = tc_of(p.fixed_calls) + comm + params.alpha_fused_s;
  // Fused at the chosen s: the same form as BestSplits, where on raw shared
  // memory only the fraction overlap_cpu of the copies can hide (the cores
  // that copy are the cores that multiply), as in Predict.
  const int s = BestSplits(params, p);
  const double stages = double(std::max(1, p.blocks)) * s;
  const double ov =
      link ? 1.0 : (p.ranks >= cores ? params.overlap_cpu_busy : params.overlap_cpu_idle);
  const double tc = tc_of(p.fixed_calls + p.calls_per_stage * stages) + (1 - ov) * comm;
  const double h = ov * comm;
  const double t = std::max(tc, h) + p.exposed_stages * std::min(tc, h) / stages;
  const double lo = t + stages * params.alpha_fused_s;
  const double hi = t + stages * (link ? params.link_hop_s : params.alpha_fused_s);
  c.serial.seconds = serial;
  c.serial.compute_s = tc_of(p.fixed_calls);
  c.estimate = c.serial;
  // Fused only when it is predicted at least min_gain faster with steps at
  // their cheapest, and not slower with steps at their dearest: a smaller
  // gain is within the model's error.
  if (lo <= (1 - params.min_gain) * serial && hi <= serial) {
    c.pipeline = Pipeline::kFused;
    c.splits = s;
    c.estimate.seconds = lo;
    c.estimate.compute_s = tc;
    c.estimate.stages = static_cast<int>(stages);
  }
  return c;
}

Choice ChoosePipeline(const CostParams& params, const Environment& env, const Problem& p) {
  Choice best;
  best.serial = Predict(params, env, p, Pipeline::kSerial, 1);
  best.estimate = best.serial;
  if (p.ranks <= 1) return best;
  const bool fused_fits = env.heap_bytes == 0 || FusedWorkspaceBytes(p) <= env.heap_bytes / 4;
  // Robustness against the model's main error: the GEMM rate of the moment
  // (other jobs on the cores, turbo) differs from the tuned one, which moves
  // the balance between compute and the link. Every candidate is evaluated
  // with the tuned rate and with 0.6x and 1.6x of it, and the one whose
  // worst ratio to the best candidate of each scenario is lowest wins (ties:
  // the faster one at the tuned rate). Overlap must pay in every scenario:
  // >= min_gain faster than serial at the tuned rate and not slower than
  // serial at the others.
  //
  // The second error is the cost of a pipeline step, which the tuning
  // measures on raw shared memory: under link emulation every step whose
  // GEMM waits for a delayed flag also pays the delivery's and the
  // waiter's wake-ups, which grow with the load of the host and can exceed
  // the tuned step cost many times over. A fourth scenario
  // charges every step `link_step_risk_s` more, so that of a flat optimum
  // (s = 4 and s = 16 predicted alike) the fewer steps win.
  constexpr double kScale[] = {1.0, 0.6, 1.6};
  std::vector<CostParams> scenario;
  for (double f : kScale) {
    CostParams q = params;
    q.f32.flops_per_s *= f;
    q.bf16.flops_per_s *= f;
    scenario.push_back(q);
  }
  // The wake-ups that make a step late queue behind GEMMs mostly when ranks
  // outnumber the cores (a woken waiter waits for another rank's slice on
  // its core). With a core per rank a quarter of the risk applies: the full
  // one keeps s below the flat optimum of larger s.
  const int cores = CoresOf(env);
  const double step_risk = env.link_bytes_per_second <= 0 ? 0.0
                           : p.ranks > cores              ? params.link_step_risk_s
                                                          : params.link_step_risk_s / 4;
  struct Cand {
    Pipeline pl;
    int s;
    std::array<double, 4> t;
  };
  std::vector<Cand> cands;
  auto add = [&](Pipeline pl, int s) {
    Cand c{pl, s, {}};
    for (size_t i = 0; i < scenario.size(); ++i)
      c.t[i] = Predict(scenario[i], env, p, pl, s).seconds;
    const Estimate e = Predict(params, env, p, pl, s);
    c.t[3] = e.seconds + (pl == Pipeline::kSerial ? 0 : e.stages * step_risk);
    cands.push_back(c);
  };
  add(Pipeline::kSerial, 1);
  for (int s = 1; s <= 16; ++s) {
    if (s > 1) add(Pipeline::kChunked, s);
    if (fused_fits) add(Pipeline::kFused, s);
  }
  std::array<double, 4> floor;
  floor.fill(1e300);
  for (const Cand& c : cands)
    for (size_t i = 0; i < floor.size(); ++i) floor[i] = std::min(floor[i], c.t[i]);
  const Cand& serial = cands[0];
  const Cand* pick = nullptr;
  double pick_regret = 1e300;
  for (const Cand& c : cands) {
    if (c.pl == Pipeline::kSerial) continue;
    bool pays = c.t[0] <= serial.t[0] * (1 - params.min_gain);
    for (size_t i = 1; i < c.t.size(); ++i) pays = pays && c.t[i] <= serial.t[i];
    if (!pays) continue;
    double regret = 0;
    for (size_t i = 0; i < c.t.size(); ++i) regret = std::max(regret, c.t[i] / floor[i]);
    if (regret < pick_regret - 1e-9 || (regret < pick_regret + 1e-9 && pick && c.t[0] < pick->t[0])) {
      pick = &c;
      pick_regret = regret;
    }
  }
  if (!pick) return best;
  best.pipeline = pick->pl;
  best.splits = pick->s;
  best.estimate = Predict(params, env, p, pick->pl, pick->s);
  return best;
}

std::string CostParamsPath() {
  if (auto v = core::GetEnv("MC2_OPS_TUNING_FILE")) return *v;
  if (auto home = core::GetEnv("HOME")) return *home + "/.cache/mc2/ops_tuning.json";
  return "";
}

const CostParams& LoadedCostParams() {
  static const CostParams params = [] {
    const std::string path = CostParamsPath();
    if (path.empty()) return CostParams::Defaults();
    std::ifstream in(path);
    if (!in) {
      if (core::GetEnv("MC2_OPS_TUNING_FILE"))
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("MC2_OPS_TUNING_FILE='{}' cannot be read", path));
      return CostParams::Defaults();
    }
    std::stringstream buf;
    buf << in.rdbuf();
    MC2_LOG(kInfo, "fused operators: using tuning file {}", path);
    return CostParams::Parse(buf.str(), path);
  }();
  return params;
}

}  // namespace mc2::ops
