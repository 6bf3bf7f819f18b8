// GEMM throughput of mc2::Gemm per backend and type, in GF/s (2 m n k flops
// per call), with one thread unless --threads says otherwise: the figure is
// per core, the budget one rank has for compute. Two columns: GF/s over
// wall-clock time, and GF/s/cpu over the CPU time the process used (all its
// threads), which is the per-core figure even when other programs share the
// cores and the wall clock runs ahead.
//
//   build/bench/gemm_bench [--threads=N] [google-benchmark flags]
//
// Rows: f32 (OpenBLAS), f32_onednn, bf16 (f32 out), bf16_bf16 (bf16 out),
// at 1024^3 and m=4096, n=k=1024, plain and with B transposed.
#include <benchmark/benchmark.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mc2/ops.h"

namespace {

int g_threads = 1;

enum Kind { kF32 = 0, kF32OneDNN, kBF16, kBF16Out };
const char* const kKindNames[] = {"f32", "f32_onednn", "bf16", "bf16_bf16"};

void BM_Gemm(benchmark::State& state) {
  const Kind kind = static_cast<Kind>(state.range(0));
  const size_t m = state.range(1), n = state.range(2), k = state.range(3);
  const bool tb = state.range(4) != 0;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> a(m * k), b(k * n), c(m * n);
  for (auto& x : a) x = dist(rng);
  for (auto& x : b) x = dist(rng);
  std::vector<mc2::bf16> a16(a.size()), b16(b.size()), c16(c.size());
  mc2::ConvertF32ToBF16(a.data(), a16.data(), a.size());
  mc2::ConvertF32ToBF16(b.data(), b16.data(), b.size());
  mc2::GemmOptions o;
  o.threads = g_threads;
  o.trans_b = tb;
  if (kind == kF32OneDNN) o.backend = mc2::GemmBackend::kOneDNN;
  auto run = [&] {
    switch (kind) {
      case kF32:
      case kF32OneDNN:
        mc2::Gemm(m, n, k, a.data(), b.data(), c.data(), o);
        break;
      case kBF16:
        mc2::Gemm(m, n, k, a16.data(), b16.data(), c.data(), o);
        break;
      case kBF16Out:
        mc2::Gemm(m, n, k, a16.data(), b16.data(), c16.data(), o);
        break;
    }
  };
  run();  // primitive creation and page faults are not what we measure
  auto cpu_seconds = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  };
  const double cpu0 = cpu_seconds();
  for (auto _ : state) {
    run();
    benchmark::ClobberMemory();
  }
  const double cpu = cpu_seconds() - cpu0;
  const double gflop = mc2::GemmFlops(m, n, k) * static_cast<double>(state.iterations()) / 1e9;
  state.counters["GF/s"] = benchmark::Counter(gflop, benchmark::Counter::kIsRate);
  state.counters["GF/s/cpu"] = cpu > 0 ? gflop / cpu : 0.0;
  state.SetLabel(std::string(kKindNames[kind]) + (tb ? " B^T" : ""));
}

void Shapes(benchmark::internal::Benchmark* b) {
  for (int kind = kF32; kind <= kBF16Out; ++kind)
    for (auto shape : {std::vector<int64_t>{1024, 1024, 1024}, {4096, 1024, 1024}})
      for (int tb : {0, 1}) b->Args({kind, shape[0], shape[1], shape[2], tb});
  b->ArgNames({"kind", "m", "n", "k", "tb"});
  b->Unit(benchmark::kMillisecond);
  b->UseRealTime();
  b->MinTime(0.5);
}
BENCHMARK(BM_Gemm)->Apply(Shapes);

}  // namespace

int main(int argc, char** argv) {
  // Our own flag first; the rest goes to Google Benchmark.
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      g_threads = std::atoi(argv[i] + 10);
      if (g_threads < 1 || g_threads > 1024) {
        std::fprintf(stderr, "gemm_bench: --threads must be in [1, 1024]\n");
        return 2;
      }
    } else {
      rest.push_back(argv[i]);
    }
  }
#ifndef NDEBUG
  std::fprintf(stderr,
               "WARNING: gemm_bench was built without NDEBUG (a debug build): figures are "
               "not representative\n");
#endif
  std::printf(
      "# mc2::Gemm, %d thread(s) per call; kind: 0 f32 (OpenBLAS), 1 f32 (oneDNN), "
      "2 bf16 -> f32, 3 bf16 -> bf16 (oneDNN)\n",
      g_threads);
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_argc, rest.data())) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
