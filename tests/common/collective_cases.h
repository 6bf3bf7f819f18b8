// Test cases for the collectives, shared by the in-process sweep and the
// real-process runs under `mc2 run`: one case = collective x dtype x op x
// count x algorithm x in-place x buffer kind. Each rank's inputs are small
// integers (so every reduction is exact in any order) and the expected
// output is computed independently here, in int64/double, in rank order.
#ifndef MC2_TESTS_COMMON_COLLECTIVE_CASES_H_
#define MC2_TESTS_COMMON_COLLECTIVE_CASES_H_

#include <cstddef>
#include <string>
#include <vector>

#include "mc2/mc2.h"

namespace mc2::testing {

enum class Coll {
  kAllReduce,
  kReduce,
  kBroadcast,
  kAllGather,
  kAllGatherV,
  kGather,
  kScatter,
  kReduceScatter,
  kReduceScatterV,
  kAllToAll,
  kAllToAllV,
  kCount
};
const char* CollName(Coll c);
bool IsReducing(Coll c);

struct Case {
  Coll coll = Coll::kAllReduce;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;  // elements per rank (per block for block-wise collectives)
  Algorithm algo = Algorithm::kAuto;
  bool in_place = false;
  bool symmetric = false;
  int root = 0;
  // Pseudo-random float inputs, so that the result depends on the order of
  // reduction (for bitwise comparisons; RunCase's check is then meaningless).
  bool random_values = false;
};
std::string Describe(const Case& c);

// Runs `c` on every rank of `g` (collectively) and returns the number of
// wrong output elements on this rank (including writes past the output).
// Throws mc2::Error(kInvalidArgument) when c.algo does not implement c.coll;
// every rank throws alike, before any data moves.
size_t RunCase(const Group& g, const Case& c);

// Runs `c` with the same inputs and returns this rank's raw output bytes
// (for bitwise comparisons across algorithms).
std::vector<char> RunCaseOutput(const Group& g, const Case& c);

// The standard sweep for `n` ranks: every collective x dtype x op x size in
// `sizes` x algorithm x in-place x buffer kind, thinned by `stride` (keep
// every stride-th case, starting at `offset`) for quicker runs.
std::vector<Case> SweepCases(int n, const std::vector<size_t>& sizes, size_t stride = 1,
                             size_t offset = 0);

}  // namespace mc2::testing

#endif  // MC2_TESTS_COMMON_COLLECTIVE_CASES_H_
