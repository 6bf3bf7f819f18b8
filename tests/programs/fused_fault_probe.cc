// Runs fused MatmulAllReduce calls in a loop under `mc2 run`; with argument
// "kill", rank 1 SIGKILLs itself after 300 ms, in the middle of a call. Each
// rank prints one line: "rank R: failed after T ms: CODE: message" or
// "rank R: finished", used by tests/integration/bench_ops_test.cc to check
// that the fused pipeline fails on every surviving rank within the timeout
// (and does not hang) when a peer dies.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mc2/mc2.h"
#include "mc2/ops.h"

int main(int argc, char** argv) {
  const bool kill_one = argc > 1 && std::strcmp(argv[1], "kill") == 0;
  mc2::Group g = mc2::Group::FromEnv();
  const size_t M = 512, K = 1024, N = 512;
  std::vector<float> a(M * K, 0.5f), b(K * N, 0.25f), c(M * N);
  mc2::FusedOptions o;
  o.pipeline = mc2::Pipeline::kFused;
  o.splits = 4;
  if (kill_one && g.rank() == 1) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      raise(SIGKILL);
    }).detach();
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto ms = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
        .count();
  };
  try {
    // ~20 ms per call: a kill at 300 ms lands in a call (while its GEMMs run
    // or the ranks wait for chunks).
    for (int i = 0; i < (kill_one ? 100000 : 5); ++i) {
      mc2::MatmulAllReduce(g,
                           {.a = a.data(),
                            .b = b.data(),
                            .c = c.data(),
                            .m = M,
                            .k = K,
                            .n = N,
                            .dtype = mc2::DType::kF32},
                           o);
      if (c[0] != 0.5f * 0.25f * K * g.size()) {
        std::printf("rank %d: wrong result %g\n", g.rank(), c[0]);
        return 4;
      }
    }
  } catch (const mc2::Error& e) {
    std::printf("rank %d: failed after %.0f ms: %s: %s\n", g.rank(), ms(),
                mc2::ErrorCodeName(e.code()), e.what());
    std::fflush(stdout);
    return 3;
  }
  std::printf("rank %d: finished\n", g.rank());
  return 0;
}
