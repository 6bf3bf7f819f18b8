// Traces of a world across hosts, for tests/integration/net_world_test.cc:
// run under mpirun with MC2_TRACE set, one rank per (emulated) host
// (MC2_HOSTNAME), each with its own MC2_TRACE_CLOCK_SKEW_NS. Makes the
// world (which measures each rank's clock offset to rank 0), runs
// `rounds` all-reduces separated by barriers, checks their results, writes
// the trace and prints "rank R: ok".
//
//   test_prog_net_trace ROUNDS
#include <mc2/mc2.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 10;
  mc2::Group world = mc2::Group::FromEnv();
  const int n = world.size(), me = world.rank();
  std::vector<float> v(1024);
  for (int k = 0; k < rounds; ++k) {
    mc2::Barrier(world).Wait();
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(me + k + i % 7);
    mc2::AllReduce(world, v.data(), v.data(), v.size(), mc2::DType::kF32, mc2::ReduceOp::kSum)
        .Wait();
    for (size_t i = 0; i < v.size(); ++i) {
      const float want = static_cast<float>(n * (n - 1) / 2 + n * (k + static_cast<int>(i % 7)));
      if (v[i] != want) {
        std::printf("rank %d: round %d element %zu is %g, not %g\n", me, k, i, v[i], want);
        return 1;
      }
    }
  }
  mc2::Barrier(world).Wait();
  mc2::trace::Flush();
  std::printf("rank %d: ok\n", me);
  return 0;
}
