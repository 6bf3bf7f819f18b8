// Fault injection under `mc2 run`: `test_prog_fault_probe MODE [BYTES]`.
// Rank 1 misbehaves according to MODE; every other rank runs an all_reduce
// and prints exactly one line "rank R: <error code> after <ms> ms: <what>"
// (or "rank R: ok"), then exits 3 on error, 0 otherwise.
//   kill_mid   rank 1 starts the all_reduce, then SIGKILLs itself mid-way
//   never      rank 1 never calls (stays alive, sleeping)
//   exit       rank 1 exits 0 without calling
//   count      rank 1 calls with a different count
//   throw      rank 1 throws an uncaught exception before calling
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mc2/mc2.h"

int main(int argc, char** argv) {
  using namespace mc2;
  std::string mode = argc > 1 ? argv[1] : "none";
  size_t bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (size_t{64} << 20);
  Group g = Group::FromEnv();
  size_t count = bytes / 4;
  std::vector<float> in(count + 16, 1.0f), out(count + 16);
  Barrier(g).Wait();
  bool bad = g.rank() == 1;
  if (bad && mode == "never") {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (bad && mode == "exit") return 0;
  if (bad && mode == "throw") throw std::runtime_error("injected failure on rank 1");
  if (bad && mode == "count") count += 3;
  auto t0 = std::chrono::steady_clock::now();
  try {
    Work w = AllReduce(g, in.data(), out.data(), count, DType::kF32, ReduceOp::kSum);
    if (bad && mode == "kill_mid") {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      raise(SIGKILL);
    }
    w.Wait();
    // A second, small operation: a peer that died after the first one must
    // still be noticed.
    for (int i = 0; i < 3; ++i) AllReduce(g, in.data(), out.data(), 1, DType::kF32, ReduceOp::kSum).Wait();
    std::printf("rank %d: ok\n", g.rank());
    return 0;
  } catch (const Error& e) {
    auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rank %d: %s after %.0f ms: %s\n", g.rank(), ErrorCodeName(e.code()), ms, e.what());
    std::fflush(stdout);
    return 3;
  }
}
