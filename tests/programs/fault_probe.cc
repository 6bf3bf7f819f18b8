// Fault injection under `mc2 run`: `test_prog_fault_probe MODE [BYTES]`.
// Rank 1 misbehaves according to MODE; every other rank runs an all_reduce
// (a fused MatmulAllReduce loop for kill_fused) and prints exactly one line
// "rank R: <error code> after <ms> ms: <what>" (or "rank R: ok"), then exits
// 3 on error, 0 otherwise. <ms> counts from just before the operation that
// fails (from the start of main for the set-up modes).
//   kill_mid     rank 1 starts the all_reduce, then SIGKILLs itself mid-way
//   stop_mid     rank 1 starts the all_reduce, then SIGSTOPs itself mid-way
//                (it stays stopped: only the timeout can report it)
//   abort_mid    rank 1 starts the all_reduce, then calls abort()
//   never        rank 1 never calls (stays alive, sleeping)
//   exit         rank 1 exits 0 without calling
//   count        rank 1 calls with a different count
//   throw        rank 1 throws an uncaught exception before calling
//   kill_between rank 1 completes the all_reduce, computes for 200 ms and is
//                SIGKILLed there, while the others wait in the next call
//   kill_setup   rank 1 SIGKILLs itself before creating the world: the
//                others fail inside Group::FromEnv
//   stop_setup   rank 1 SIGSTOPs itself before creating the world
//   kill_fused   a thread of rank 1 SIGKILLs it 300 ms into a loop of fused
//                MatmulAllReduce calls (most of the time is inside one)
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mc2/mc2.h"

namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Rank 1 under `mc2 run` (read before the world exists, for the set-up modes).
bool EnvRankIs1() {
  const char* r = std::getenv("MC2_RANK");
  return r != nullptr && std::strcmp(r, "1") == 0;
}

// The fused-operator loop of kill_fused: MatmulAllReduce with the fused ring
// pipeline until an error (or 20 s, which is a failure of the test).
void FusedLoop(const mc2::Group& g) {
  const size_t m = 192, k = 192, n = 192;
  std::vector<float> a(m * k, 1.0f), b(k * n, 0.5f), c(m * n);
  mc2::FusedOptions opts;
  opts.pipeline = mc2::Pipeline::kFused;
  const auto start = Clock::now();
  while (MsSince(start) < 20000)
    mc2::MatmulAllReduce(g,
                         {.a = a.data(),
                          .b = b.data(),
                          .c = c.data(),
                          .m = m,
                          .k = k,
                          .n = n,
                          .dtype = mc2::DType::kF32},
                         opts);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mc2;
  std::string mode = argc > 1 ? argv[1] : "none";
  size_t bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (size_t{64} << 20);
  auto t0 = Clock::now();
  if (EnvRankIs1() && mode == "kill_setup") raise(SIGKILL);
  if (EnvRankIs1() && mode == "stop_setup") raise(SIGSTOP);
  Group g;
  try {
    g = Group::FromEnv();
  } catch (const Error& e) {
    std::printf("rank %s: %s after %.0f ms: %s\n", std::getenv("MC2_RANK"),
                ErrorCodeName(e.code()), MsSince(t0), e.what());
    std::fflush(stdout);
    return 3;
  }
  size_t count = bytes / 4;
  std::vector<float> in(count + 16, 1.0f), out(count + 16);
  // The set-up is not under test: under a sanitizer on a busy machine the
  // buffers above can take longer to fill than the short MC2_TIMEOUT the
  // tests give the operation that fails.
  CollectiveOptions setup;
  setup.timeout = std::chrono::seconds(60);
  Barrier(g, setup).Wait();
  bool bad = g.rank() == 1;
  if (bad && mode == "never") {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (bad && mode == "exit") return 0;
  if (bad && mode == "throw") throw std::runtime_error("injected failure on rank 1");
  if (bad && mode == "count") count += 3;
  if (bad && mode == "kill_fused") {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      kill(getpid(), SIGKILL);
    }).detach();
  }
  t0 = Clock::now();
  try {
    if (mode == "kill_fused") {
      FusedLoop(g);
      throw std::runtime_error("kill_fused: the fused loop ended without an error");
    }
    Work w = AllReduce(g, in.data(), out.data(), count, DType::kF32, ReduceOp::kSum);
    if (bad && (mode == "kill_mid" || mode == "stop_mid" || mode == "abort_mid")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (mode == "kill_mid") raise(SIGKILL);
      if (mode == "stop_mid") raise(SIGSTOP);
      std::abort();
    }
    w.Wait();
    if (bad && mode == "kill_between") {
      // "Computing" between two calls; the others are already waiting in
      // the next one.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      raise(SIGKILL);
    }
    t0 = Clock::now();
    // A second, small operation: a peer that died after the first one must
    // still be noticed.
    for (int i = 0; i < 3; ++i) AllReduce(g, in.data(), out.data(), 1, DType::kF32, ReduceOp::kSum).Wait();
    std::printf("rank %d: ok\n", g.rank());
    return 0;
  } catch (const Error& e) {
    std::printf("rank %d: %s after %.0f ms: %s\n", g.rank(), ErrorCodeName(e.code()), MsSince(t0),
                e.what());
    std::fflush(stdout);
    return 3;
  }
}
