// Measures the CPU time an idle rank uses: after a few collectives, every
// rank sleeps for SECONDS and prints the CPU time its process consumed
// meanwhile (progress and point-to-point threads included).
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "mc2/mc2.h"

static double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

int main(int argc, char** argv) {
  using namespace mc2;
  double seconds = argc > 1 ? std::atof(argv[1]) : 5.0;
  Group g = Group::FromEnv();
  std::vector<float> v(1 << 20, 1.0f);
  for (int i = 0; i < 10; ++i) AllReduce(g, v.data(), v.data(), v.size(), DType::kF32, ReduceOp::kSum).Wait();
  int32_t x = g.rank();
  if (g.size() > 1) {  // start the point-to-point thread too
    int peer = g.rank() ^ 1;
    if (peer < g.size()) {
      Work s = g.Send(&x, 4, peer), r = g.Recv(&x, 4, peer);
      s.Wait();
      r.Wait();
    }
  }
  Barrier(g).Wait();
  double c0 = CpuSeconds();
  auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double cpu = CpuSeconds() - c0;
  std::printf("rank %d: idle cpu %.4f s over %.2f s = %.3f%% of a core\n", g.rank(), cpu, wall,
              100.0 * cpu / wall);
  return 0;
}
