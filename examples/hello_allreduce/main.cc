// hello_allreduce: every rank contributes a vector, all of them receive the
// elementwise sum, and rank 0 prints it.
//
//   mc2 run -n 4 ./hello_allreduce
//
// Rank r contributes x[i] = r + i, so the sum over N ranks is
// N*i + N*(N-1)/2: each rank checks its result against that and the program
// exits non-zero on a mismatch.
#include <mc2/mc2.h>

#include <cstdio>
#include <vector>

int main() {
  try {
    mc2::Group world = mc2::Group::FromEnv();
    const int n = world.size();
    const int rank = world.rank();

    constexpr size_t kCount = 1000;
    std::vector<float> x(kCount), sum(kCount);
    for (size_t i = 0; i < kCount; ++i) x[i] = static_cast<float>(rank + i);

    // Asynchronous: the Work completes once the sum is in `sum`.
    mc2::Work work = mc2::AllReduce(world, x.data(), sum.data(), kCount, mc2::DType::kF32,
                                    mc2::ReduceOp::kSum);
    work.Wait();

    size_t wrong = 0;
    for (size_t i = 0; i < kCount; ++i) {
      const float want = static_cast<float>(n * i + n * (n - 1) / 2);
      if (sum[i] != want) ++wrong;
    }
    if (rank == 0) {
      std::printf("hello_allreduce: %d ranks, %s, sum[0]=%g sum[1]=%g sum[%zu]=%g: %s\n", n,
                  work.algorithm().c_str(), sum[0], sum[1], kCount - 1, sum[kCount - 1],
                  wrong == 0 ? "OK" : "WRONG");
    }
    return wrong == 0 ? 0 : 1;
  } catch (const mc2::Error& e) {
    std::fprintf(stderr, "hello_allreduce: %s\n", e.what());
    return 1;
  }
}
