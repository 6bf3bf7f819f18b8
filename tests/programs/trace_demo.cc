// A traced program with collectives interleaved with compute, for the
// tracing tests and the example timeline in docs/ (docs/tracing.md):
//
//   MC2_TRACE=/tmp/t mc2 run -n 2 build/tests/test_prog_trace_demo
//   mc2 trace report /tmp/t && mc2 trace plot /tmp/t -o timeline.svg
//
// Each step computes TILES matmul tiles; the all_reduce of tile t runs on
// the progress thread while tile t+1 is computed (overlapped), the last
// one has nothing to hide behind (uncovered), and a small all_gather and a
// host-side "pack" follow serially.
//
// Usage: trace_demo [STEPS=4] [TILES=4] [N=96] [TILE_BYTES=262144]
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "mc2/mc2.h"

namespace {

// C = A * B for n x n matrices, naive: a predictable amount of compute.
void Matmul(const float* a, const float* b, float* c, int n) {
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) c[i * n + j] = 0;
    for (int k = 0; k < n; ++k) {
      float x = a[i * n + k];
      for (int j = 0; j < n; ++j) c[i * n + j] += x * b[k * n + j];
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mc2;
  const int steps = argc > 1 ? std::atoi(argv[1]) : 4;
  const int tiles = argc > 2 ? std::atoi(argv[2]) : 4;
  const int n = argc > 3 ? std::atoi(argv[3]) : 96;
  const size_t tile_elems = (argc > 4 ? std::strtoull(argv[4], nullptr, 0) : 262144) / 4;

  Group g = Group::FromEnv();
  const int rank = g.rank(), size = g.size();
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  std::vector<std::vector<float>> in(tiles, std::vector<float>(tile_elems));
  std::vector<std::vector<float>> out(tiles, std::vector<float>(tile_elems));
  std::vector<float> mine(4096, static_cast<float>(rank)), all(4096 * size);
  const uint64_t flops = 2ull * n * n * n;
  int bad = 0;

  for (int step = 0; step < steps; ++step) {
    trace::MarkStep(step);
    std::vector<Work> pending;
    for (int t = 0; t < tiles; ++t) {
      {
        trace::Scope s("matmul", trace::Category::kCompute, flops);
        Matmul(a.data(), b.data(), c.data(), n);
        for (size_t i = 0; i < tile_elems; ++i) in[t][i] = c[i % c.size()] + rank;
      }
      // Runs on the progress thread while the next tile is computed.
      pending.push_back(
          AllReduce(g, in[t].data(), out[t].data(), tile_elems, DType::kF32, ReduceOp::kSum));
    }
    {
      trace::Scope s("wait", trace::Category::kWait);
      for (Work& w : pending) w.Wait();
    }
    // Serial: nothing to overlap with.
    AllGather(g, mine.data(), all.data(), mine.size(), DType::kF32).Wait();
    {
      trace::Scope s("pack", trace::Category::kHost);
      for (int t = 0; t < tiles; ++t) {
        float want = c[0] * size + size * (size - 1) / 2.0f;
        if (out[t][0] != want) ++bad;
      }
      for (int r = 0; r < size; ++r)
        if (all[r * 4096] != static_cast<float>(r)) ++bad;
    }
  }
  trace::EndStep();
  if (rank == 0) std::printf("trace_demo: %d steps, %s\n", steps, bad ? "WRONG" : "ok");
  return bad ? 1 : 0;
}
