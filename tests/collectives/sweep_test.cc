// The broad sweep of every collective x algorithm x dtype x op x size x
// in-place x buffer kind, with ranks as threads (tests/common has the cases
// and the independent reference). A tiny scratch forces the multi-window
// staging paths; real processes run a sample of the same cases
// (integration/processes_test.cc).
#include <gtest/gtest.h>

#include "common/collective_cases.h"

namespace mc2::testing {
namespace {

// A 16 KiB scratch: messages above it stage in several windows.
WorldOptions SmallScratch(size_t heap_bytes = 0) {
  WorldOptions o;
  o.heap_bytes = heap_bytes;
  o.scratch_bytes = 16384;
  return o;
}

class Sweep : public ::testing::TestWithParam<int> {};

TEST_P(Sweep, EveryCaseMatchesReference) {
  const int n = GetParam();
  // 4099 elements spans several 16 KiB windows for every dtype; 1 MiB + 5
  // elements is exercised on a thinner sample below.
  const std::vector<size_t> sizes = {0, 1, 7, 4099};
  const size_t stride = n >= 5 ? 7 : 1;
  auto cases = SweepCases(n, sizes, stride, n);
  size_t ran = 0, skipped = 0;
  Group::RunInProcess(n, [&](Group& g) {
    for (const Case& c : cases) {
      size_t wrong;
      try {
        wrong = RunCase(g, c);
      } catch (const Error& e) {
        if (e.code() == ErrorCode::kInvalidArgument) {  // algorithm lacks this collective
          if (g.rank() == 0) ++skipped;
          continue;
        }
        throw;
      }
      EXPECT_EQ(wrong, 0u) << "n=" << n << " rank " << g.rank() << ": " << Describe(c);
      if (g.rank() == 0) ++ran;
    }
  }, SmallScratch());
  EXPECT_GT(ran, cases.size() / 4);
  RecordProperty("ran", static_cast<int>(ran));
}

TEST_P(Sweep, LargeMessagesMatchReference) {
  const int n = GetParam();
  auto cases = SweepCases(n, {(size_t{1} << 20) + 5}, n >= 5 ? 401 : 157, n);
  Group::RunInProcess(n, [&](Group& g) {
    for (const Case& c : cases) {
      try {
        EXPECT_EQ(RunCase(g, c), 0u) << "n=" << n << ": " << Describe(c);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kInvalidArgument) throw;
      }
    }
  }, SmallScratch(size_t{192} << 20));
}

// Deterministic mode: every algorithm gives the bitwise-identical result on
// inputs where the order of reduction matters.
TEST_P(Sweep, DeterministicAcrossAlgorithms) {
  const int n = GetParam();
  for (Coll coll : {Coll::kAllReduce, Coll::kReduce, Coll::kReduceScatter}) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProd}) {
        Group::RunInProcess(n, [&](Group& g) {
          Case base{coll, t, op, 5003, Algorithm::kDirect, false, false, n - 1, true};
          auto ref = RunCaseOutput(g, base);
          for (int a = 1; a < kNumAlgorithms; ++a)
            for (int sym = 0; sym < 2; ++sym) {
              Case c = base;
              c.algo = static_cast<Algorithm>(a);
              c.symmetric = sym;
              std::vector<char> out;
              try {
                out = RunCaseOutput(g, c);
              } catch (const Error& e) {
                if (e.code() == ErrorCode::kInvalidArgument) continue;
                throw;
              }
              EXPECT_TRUE(out == ref) << "n=" << n << ": " << Describe(c);
            }
        }, SmallScratch());
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Sweep, ::testing::Values(1, 2, 3, 4, 5, 8));

}  // namespace
}  // namespace mc2::testing
