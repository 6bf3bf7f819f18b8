// The cost model behind Pipeline::kAuto (src/ops/cost_model.h): its
// predictions on inputs worked out by hand, the choices it makes in the
// three regimes (comm << compute, balanced, compute << comm), the tuning
// file's round trip and its errors.
#include "ops/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "mc2/error.h"

namespace mc2::ops {
namespace {

// Round numbers: 100 GF/s, no efficiency loss, comm 1 GB/s with no latency,
// no per-step cost, nothing of the cpu part overlaps.
CostParams Simple() {
  CostParams p = CostParams::Defaults();
  p.f32 = {100e9, 0};
  CostParams::PerRanks pr;
  pr.all_gather = pr.reduce_scatter = pr.all_reduce = {0, 1e9};
  p.comm = {{2, pr}};
  p.copy_bytes_per_s = 1e12;  // fused copies ~ free
  p.alpha_chunked_s = p.alpha_fused_s = 0;
  p.link_hop_s = 0;
  p.link_step_risk_s = 0;
  p.overlap_cpu_busy = p.overlap_cpu_idle = 0;
  p.min_gain = 0.03;
  return p;
}

Problem AllReduce2(size_t M, size_t k, size_t n) {
  Problem p;
  p.op = FusedOpKind::kMatmulAllReduce;
  p.ranks = 2;
  p.dtype = DType::kF32;
  p.M = M;
  p.k = k;
  p.n = n;
  p.rows = {M / 2, M - M / 2};
  return p;
}

TEST(CostModel, SerialIsComputePlusComm) {
  CostParams params = Simple();
  Environment env;
  env.cores = 2;
  // 1000 x 1000 x 1000: 2 GFLOP = 20 ms; the all-reduce of 4 MB at 1 GB/s:
  // 4 ms (cpu part, raw shm).
  Estimate e = Predict(params, env, AllReduce2(1000, 1000, 1000), Pipeline::kSerial, 1);
  EXPECT_NEAR(e.compute_s, 0.020, 1e-9);
  EXPECT_NEAR(e.comm_cpu_s, 0.004, 1e-9);
  EXPECT_EQ(e.comm_link_s, 0);
  EXPECT_NEAR(e.seconds, 0.024, 1e-9);
}

TEST(CostModel, EmulatedLinkAddsPortTime) {
  CostParams params = Simple();
  Environment env;
  env.cores = 2;
  env.link_bytes_per_second = 1e8;  // 100 MB/s
  env.link_latency_s = 0;
  // Deterministic ring all-reduce at n = 2 puts (n-1)/2 + (n-1)/n = 1 x the
  // 4 MB vector on a port: 40 ms.
  Estimate e = Predict(params, env, AllReduce2(1000, 1000, 1000), Pipeline::kSerial, 1);
  EXPECT_NEAR(e.comm_link_s, 0.040, 1e-9);
  EXPECT_NEAR(e.seconds, 0.020 + 0.004 + 0.040, 1e-9);
}

TEST(CostModel, OverlapFormulaOnKnownInputs) {
  // Fused all-reduce at n = 2, s = 2: Tc = 20 ms (no efficiency loss); the
  // port carries (M - m_r) n 4 + (n-1) m_r n 4 = 2 + 2 = 4 MB = 40 ms at
  // 100 MB/s; stages n s = 4: T = max(20, 40) + min(20, 40) / 4 = 45 ms
  // (+ the copies: 4 MB + 2 x 2 MB at 1 TB/s = 8 us, not overlapped).
  CostParams params = Simple();
  Environment env;
  env.cores = 2;
  env.link_bytes_per_second = 1e8;
  Estimate e = Predict(params, env, AllReduce2(1000, 1000, 1000), Pipeline::kFused, 2);
  EXPECT_EQ(e.stages, 4);
  EXPECT_NEAR(e.comm_link_s, 0.040, 1e-9);
  EXPECT_NEAR(e.comm_cpu_s, 8e6 / 1e12, 1e-12);
  EXPECT_NEAR(e.seconds, 0.040 + (0.020 + 8e-6) / 4, 1e-9);
  // Chunked, s = 4: one ring all-reduce of 1 MB per chunk; Tc = 20 ms,
  // link 40 ms, cpu 4 ms (hidden fraction 0): T = max(24, 40) + 24 / 4.
  Estimate c = Predict(params, env, AllReduce2(1000, 1000, 1000), Pipeline::kChunked, 4);
  EXPECT_EQ(c.stages, 4);
  EXPECT_NEAR(c.seconds, 0.040 + 0.024 / 4, 1e-7);
}

TEST(CostModel, SmallChunksLoseGemmEfficiency) {
  CostParams params = Simple();
  params.f32.half_rows = 100;  // a 100-row GEMM runs at half speed
  Environment env;
  env.cores = 2;
  Problem p = AllReduce2(800, 1000, 1000);
  // 8 chunks of 100 rows: each costs 2 x 1000 x 1000 x (100 + 100) / 1e11.
  Estimate e = Predict(params, env, p, Pipeline::kChunked, 8);
  EXPECT_NEAR(e.compute_s, 8 * 2e6 * 200 / 1e11, 1e-9);
  Estimate one = Predict(params, env, p, Pipeline::kSerial, 1);
  EXPECT_NEAR(one.compute_s, 2e6 * 900 / 1e11, 1e-9);
}

// The splits of a fused choice; -1 if the choice is serial.
int FusedSplits(const CostParams& params, const SplitProblem& p) {
  Choice c = ChooseSplitPipeline(params, p);
  return c.pipeline == Pipeline::kFused ? c.splits : -1;
}

// ChooseSplitPipeline (AllGatherBatchMatmul, MoE) on inputs worked out by
// hand: Tc = Tl = 50 ms, so T(s) = 50 ms + 50 ms / stages + stages * step.
// Under emulation a step costs between alpha_fused_s (here 0) and
// link_hop_s, and the s with the least worse ratio to the best of each wins.
TEST(CostModel, FusedSplitsBalanceFillAgainstPerStepCost) {
  CostParams params = Simple();
  SplitProblem p;
  p.ranks = 2;
  p.cores = 4;  // no core sharing, whatever this host has
  p.rows = 2500;
  p.n = p.k = 1000;  // 2e6 flop per row at 100 GF/s: 50 ms
  p.fixed_calls = 1;
  p.calls_per_stage = 1;
  p.port_bytes = 50e6;
  p.link_bytes_per_second = 1e9;  // 50 ms on the port
  // 2 ms a step: least at s = 5 (70 ms); free steps: least at s = 16
  // (53.1 ms). s = 9 is 1.051x / 1.046x those, s = 8 1.032x / 1.059x,
  // s = 10 1.071x / 1.035x: 9 is never far from either.
  params.link_hop_s = 2e-3;
  EXPECT_EQ(FusedSplits(params, p), 9);
  // Three blocks per pipeline: stages = 3 s. 1 ms a step: s = 4 is 1.029x
  // the best (s = 2, 64.3 ms) and 1.061x the free-step best (51.0 ms);
  // s = 3 1.004x / 1.088x, s = 5 1.062x / 1.045x.
  params.link_hop_s = 1e-3;
  p.blocks = 3;
  EXPECT_EQ(FusedSplits(params, p), 4);
  // One block, 1 ms a step: s = 11 (1.022x / 1.027x).
  p.blocks = 1;
  EXPECT_EQ(FusedSplits(params, p), 11);
  // Steps that cost the same either way: the plain minimum, s = 7.
  params.alpha_fused_s = 1e-3;
  EXPECT_EQ(FusedSplits(params, p), 7);
  params.alpha_fused_s = 0;
  // Small chunks that lose GEMM efficiency push s down: each call costs
  // half_rows rows more.
  params.f32.half_rows = 500;  // +10 ms of Tc per call
  EXPECT_LT(FusedSplits(params, p), 11);
  // Raw shared memory: the copy rate instead of the link, alpha_fused_s a
  // step; with neither costing anything the deepest pipeline wins.
  params.f32.half_rows = 0;
  p.link_bytes_per_second = 0;
  params.copy_bytes_per_s = 1e9;
  params.overlap_cpu_idle = 1;  // the copies hide whole
  EXPECT_EQ(FusedSplits(params, p), 16);
  params.alpha_fused_s = 2e-3;
  EXPECT_EQ(FusedSplits(params, p), 5);
  // A batch of 4 entries: s divides 4 or 4 divides s; 4 (T 70.5 ms) beats
  // 2 (79 ms) and 8 (72.3 ms).
  p.align = 4;
  EXPECT_EQ(FusedSplits(params, p), 4);
  p.align = 3;  // 6 (T 70.3 ms) beats 3 (72.7 ms)
  EXPECT_EQ(FusedSplits(params, p), 6);
}

// Serial when overlap cannot pay: one rank, a problem whose communication
// is negligible next to its compute (nothing to hide, the extra GEMM calls
// cost), or one whose per-step cost exceeds what a pipeline hides.
TEST(CostModel, SplitPipelineChoosesSerialWhenOverlapDoesNotPay) {
  CostParams params = Simple();
  SplitProblem p;
  p.ranks = 2;
  p.cores = 4;
  p.rows = 2500;
  p.n = p.k = 1000;  // 50 ms of GEMMs
  p.fixed_calls = 1;
  p.port_bytes = 50e6;
  p.link_bytes_per_second = 1e9;  // 50 ms on the port
  params.link_hop_s = 1e-3;
  EXPECT_EQ(ChooseSplitPipeline(params, p).pipeline, Pipeline::kFused);
  SplitProblem one = p;
  one.ranks = 1;
  EXPECT_EQ(ChooseSplitPipeline(params, one).pipeline, Pipeline::kSerial);
  EXPECT_EQ(ChooseSplitPipeline(params, one).splits, 1);
  // 50 us on the port: at most 50 us to hide, below min_gain of 50 ms.
  SplitProblem small_comm = p;
  small_comm.port_bytes = 50e3;
  EXPECT_EQ(ChooseSplitPipeline(params, small_comm).pipeline, Pipeline::kSerial);
  // Tiny GEMMs and transfers: each step costs more than it hides.
  SplitProblem tiny = p;
  tiny.rows = 1;
  tiny.port_bytes = 1e3;
  params.alpha_fused_s = 1e-3;
  EXPECT_EQ(ChooseSplitPipeline(params, tiny).pipeline, Pipeline::kSerial);
  // The prediction is reported: fused beats the serial estimate it names.
  params.alpha_fused_s = 0;
  Choice c = ChooseSplitPipeline(params, p);
  EXPECT_NEAR(c.serial.seconds, 0.1, 1e-3);  // 50 ms GEMMs + 50 ms port
  EXPECT_LT(c.estimate.seconds, c.serial.seconds);
}

TEST(CostModel, AutoChoosesByRegime) {
  CostParams params = Simple();
  params.f32.half_rows = 16;
  params.alpha_chunked_s = 100e-6;
  params.alpha_fused_s = 50e-6;
  Environment env;
  env.cores = 2;
  // Fused copies as fast as the collectives move data, so that on raw shm
  // it has no edge over serial.
  params.copy_bytes_per_s = 1e9;
  Problem p = AllReduce2(2048, 2048, 1024);  // 8.6 GFLOP: 86 ms
  // Balanced: the ring all-reduce puts the 8 MiB product on a port, at a
  // bandwidth that makes that take as long as the GEMM. Overlap pays: a
  // pipelined choice with several stages.
  env.link_bytes_per_second = 8388608 / 0.0859;
  Choice bal = ChoosePipeline(params, env, p);
  EXPECT_NE(bal.pipeline, Pipeline::kSerial);
  EXPECT_GT(bal.splits, 1);
  EXPECT_LT(bal.estimate.seconds, 0.75 * bal.serial.seconds);
  // comm << compute on raw shm, where nothing of the cpu part overlaps:
  // serial (overlap would only add per-step costs).
  env.link_bytes_per_second = 0;
  Choice raw = ChoosePipeline(params, env, p);
  EXPECT_EQ(raw.pipeline, Pipeline::kSerial);
  EXPECT_EQ(raw.splits, 1);
  // compute << comm: a tiny GEMM on a slow link: hiding 1% is below the
  // 3% threshold, so serial.
  env.link_bytes_per_second = 1e6;
  Problem tiny = AllReduce2(2048, 2, 1024);
  Choice cb = ChoosePipeline(params, env, tiny);
  EXPECT_EQ(cb.pipeline, Pipeline::kSerial);
  // compute << comm where chunking would hide the copies of the
  // collective: 16 ring all-reduces of 2 hops each under emulation cost
  // 16 x 2 x 0.5 ms of wake-ups, more than chunking hides, which keeps
  // auto off chunked.
  params.link_hop_s = 500e-6;
  params.copy_bytes_per_s = 1e12;
  params.comm[2].all_reduce = {0, 2e9};
  env.link_bytes_per_second = 50e6;
  Choice hop = ChoosePipeline(params, env, tiny);
  EXPECT_NE(hop.pipeline, Pipeline::kChunked);
  CostParams no_hop = params;
  no_hop.link_hop_s = 0;
  EXPECT_NEAR(Predict(params, env, tiny, Pipeline::kChunked, 16).seconds -
                  Predict(no_hop, env, tiny, Pipeline::kChunked, 16).seconds,
              16 * 2 * 500e-6, 1e-9);
  // Fused transfers are independent: no hop cost.
  EXPECT_EQ(Predict(params, env, tiny, Pipeline::kFused, 16).seconds,
            Predict(no_hop, env, tiny, Pipeline::kFused, 16).seconds);
  // One rank: always serial.
  Problem one = p;
  one.ranks = 1;
  one.rows = {p.M};
  EXPECT_EQ(ChoosePipeline(params, env, one).pipeline, Pipeline::kSerial);
}

// Decode-sized calls (a few rows, a small or moderate hidden size) are
// latency-bound: with the built-in parameters, on raw shared memory, every
// operator stays serial on 2 and 4 ranks, since a pipeline only adds steps
// to a collective that costs a few microseconds.
TEST(CostModel, DecodeSizedCallsStaySerialWithTheBuiltInParameters) {
  const CostParams params = CostParams::Defaults();
  Environment env;
  env.cores = 2;
  for (int ranks : {2, 4})
    for (size_t rows : {1, 4, 8})
      for (size_t hidden : {16, 64, 256, 1024})
        for (FusedOpKind op : {FusedOpKind::kMatmulAllReduce, FusedOpKind::kAllGatherMatmul,
                               FusedOpKind::kMatmulReduceScatter}) {
          Problem p;
          p.op = op;
          p.ranks = ranks;
          p.dtype = DType::kF32;
          p.M = rows * ranks;
          p.k = hidden;
          p.n = 4 * hidden;
          p.rows.assign(ranks, rows);
          const Choice c = ChoosePipeline(params, env, p);
          EXPECT_EQ(c.pipeline, Pipeline::kSerial)
              << FusedOpKindName(op) << " ranks " << ranks << " rows " << rows << " hidden "
              << hidden << ": chose s=" << c.splits;
        }
}

// Under emulation a step may cost more than the model says (wake-ups on a
// busy host): with a flat optimum, the per-step risk scenario makes auto
// take fewer steps, still pipelined, and never changes what Predict says.
TEST(CostModel, StepRiskPrefersFewerStepsOnAFlatOptimum) {
  CostParams params = Simple();
  params.f32.half_rows = 4;
  params.alpha_fused_s = 20e-6;
  params.alpha_chunked_s = 60e-6;
  Environment env;
  env.cores = 2;
  Problem p = AllReduce2(2048, 2048, 1024);
  env.link_bytes_per_second = 8388608 / 0.0859;
  Choice blind = ChoosePipeline(params, env, p);
  CostParams risky = params;
  risky.link_step_risk_s = 1e-3;
  Choice careful = ChoosePipeline(risky, env, p);
  ASSERT_NE(blind.pipeline, Pipeline::kSerial);
  ASSERT_NE(careful.pipeline, Pipeline::kSerial);
  EXPECT_LT(careful.estimate.stages, blind.estimate.stages);
  EXPECT_GT(careful.splits, 1);
  EXPECT_EQ(Predict(params, env, p, Pipeline::kFused, 8).seconds,
            Predict(risky, env, p, Pipeline::kFused, 8).seconds);
  // The risk is a quarter with a core per rank: the same ranks sharing one
  // core take fewer steps than with two cores. (The model's GEMM rate also
  // halves on one core, so compare against a twice-as-fast GEMM there.)
  Environment shared = env;
  shared.cores = 1;
  CostParams risky_fast = risky;
  risky_fast.f32.flops_per_s *= 2;
  risky_fast.copy_bytes_per_s *= 2;
  Choice crowded = ChoosePipeline(risky_fast, shared, p);
  ASSERT_NE(crowded.pipeline, Pipeline::kSerial);
  EXPECT_LT(crowded.estimate.stages, careful.estimate.stages);
  // Sharing the core with a quartered risk (charged whole there) chooses
  // what two cores choose.
  CostParams quarter_fast = risky_fast;
  quarter_fast.link_step_risk_s /= 4;
  Choice same = ChoosePipeline(quarter_fast, shared, p);
  EXPECT_EQ(same.pipeline, careful.pipeline);
  EXPECT_EQ(same.splits, careful.splits);
  // Raw shared memory: the risk does not apply.
  env.link_bytes_per_second = 0;
  Choice raw_blind = ChoosePipeline(params, env, p);
  Choice raw_careful = ChoosePipeline(risky, env, p);
  EXPECT_EQ(raw_blind.pipeline, raw_careful.pipeline);
  EXPECT_EQ(raw_blind.splits, raw_careful.splits);
}

TEST(CostModel, FusedNeedsItsWorkspace) {
  CostParams params = Simple();
  Environment env;
  env.cores = 2;
  env.link_bytes_per_second = 1e8;
  Problem p = AllReduce2(1000, 1000, 1000);
  EXPECT_EQ(FusedWorkspaceBytes(p), size_t{1000} * 1000 * 4);
  env.heap_bytes = 4 * FusedWorkspaceBytes(p);
  EXPECT_EQ(ChoosePipeline(params, env, p).pipeline, Pipeline::kFused);
  env.heap_bytes = 4 * FusedWorkspaceBytes(p) - 4;
  EXPECT_NE(ChoosePipeline(params, env, p).pipeline, Pipeline::kFused);
}

TEST(CostModel, TuningFileRoundTripAndErrors) {
  CostParams p = Simple();
  p.comm[4] = p.comm[2];
  p.comm[4].all_gather = {123e-6, 4.5e9};
  CostParams q = CostParams::Parse(p.ToJson(), "test");
  EXPECT_EQ(q.Hash(), p.Hash());
  EXPECT_NEAR(q.CommFor(4).all_gather.lat_s, 123e-6, 1e-12);
  // Rank counts between and beyond the table use the nearest below.
  EXPECT_NEAR(q.CommFor(5).all_gather.bytes_per_s, 4.5e9, 1);
  EXPECT_NEAR(q.CommFor(3).all_gather.bytes_per_s, 1e9, 1);
  // Missing keys keep their defaults.
  CostParams partial = CostParams::Parse(R"({"gemm": {"bf16": {"gflops": 150}}})", "t");
  EXPECT_NEAR(partial.bf16.flops_per_s, 150e9, 1);
  EXPECT_EQ(partial.f32.flops_per_s, CostParams::Defaults().f32.flops_per_s);
  for (const char* bad : {"[1]", "{", R"({"alpha_fused_us": -1})",
                          R"({"gemm": {"f32": {"gflops": 0}}})", R"({"comm": {"x": {}}})",
                          R"({"comm": {"2": {"all_gather": {"gbytes_per_s": "fast"}}}})"}) {
    try {
      CostParams::Parse(bad, "bad.json");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
    }
  }
  // Different parameters hash differently.
  CostParams r = p;
  r.alpha_fused_s += 1e-6;
  EXPECT_NE(r.Hash(), p.Hash());
}

}  // namespace
}  // namespace mc2::ops
