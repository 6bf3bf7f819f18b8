// A quick latency/bandwidth probe of all_reduce under `mc2 run` (used while
// developing; the real benchmark is `mc2 bench`).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>

#include "mc2/mc2.h"

int main(int argc, char** argv) {
  using namespace mc2;
  Group g = Group::FromEnv();
  size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : 8;
  int iters = argc > 2 ? std::atoi(argv[2]) : 1000;
  bool sym = argc > 3 ? std::atoi(argv[3]) != 0 : true;
  size_t count = bytes / 4;
  SymmetricBuffer sb, rb;
  std::vector<float> sv, rv;
  float *s, *r;
  if (sym) {
    sb = g.AllocSymmetric(bytes);
    rb = g.AllocSymmetric(bytes);
    s = sb.as<float>();
    r = rb.as<float>();
  } else {
    sv.resize(count);
    rv.resize(count);
    s = sv.data();
    r = rv.data();
  }
  for (size_t i = 0; i < count; ++i) s[i] = 1.0f;
  for (int i = 0; i < 5; ++i) AllReduce(g, s, r, count, DType::kF32, ReduceOp::kSum).Wait();
  std::vector<double> t;
  for (int rep = 0; rep < 5; ++rep) {
    Barrier(g).Wait();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) AllReduce(g, s, r, count, DType::kF32, ReduceOp::kSum).Wait();
    auto t1 = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / iters);
  }
  std::sort(t.begin(), t.end());
  if (g.rank() == 0) {
    double us = t[t.size() / 2];
    double busbw = bytes / us / 1e3 * 2.0 * (g.size() - 1) / g.size();
    std::printf("bytes=%zu sym=%d time=%.2f us busbw=%.2f GB/s check=%g\n", bytes, sym, us, busbw,
                r[0]);
  }
  return 0;
}
