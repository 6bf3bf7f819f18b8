// Runs a sample of the collective test cases on real processes, under
// `mc2 run -n N test_prog_run_cases [STRIDE] [SIZES...]`. Prints one line per
// failure and a final "cases: N passed, M failed" from rank 0; exits 1 on
// any failure.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/collective_cases.h"

int main(int argc, char** argv) {
  using namespace mc2;
  using namespace mc2::testing;
  Group g = Group::FromEnv();
  size_t stride = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 13;
  std::vector<size_t> sizes;
  for (int i = 2; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  if (sizes.empty()) sizes = {0, 1, 7, 4099, (size_t{1} << 20) / 4 + 5};
  auto cases = SweepCases(g.size(), sizes, stride, 0);
  size_t passed = 0, failed = 0, skipped = 0;
  for (const Case& c : cases) {
    size_t wrong;
    try {
      wrong = RunCase(g, c);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kInvalidArgument) {
        ++skipped;
        continue;
      }
      throw;
    }
    // Every rank must agree that the case passed.
    uint64_t w = wrong;
    AllReduce(g, &w, &w, 1, DType::kI64, ReduceOp::kSum).Wait();
    if (w) {
      ++failed;
      if (g.rank() == 0) std::printf("FAILED (%llu wrong): %s\n", (unsigned long long)w, Describe(c).c_str());
    } else {
      ++passed;
    }
  }
  if (g.rank() == 0)
    std::printf("cases: %zu passed, %zu failed, %zu skipped\n", passed, failed, skipped);
  return failed ? 1 : 0;
}
