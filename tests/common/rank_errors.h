// What each rank of an in-process world got from a call that should fail
// on every rank alike (inconsistent arguments, bad shapes).
#ifndef MC2_TESTS_COMMON_RANK_ERRORS_H_
#define MC2_TESTS_COMMON_RANK_ERRORS_H_

#include <functional>
#include <vector>

#include "mc2/mc2.h"

namespace mc2::test {

// Runs `call` on every rank of a `size`-rank in-process world and returns
// the mc2::Error code each rank got (-1: none). Then checks (gtest) that
// the group still works: a failed call must not leave it unusable. Three
// ranks by default: enough for one rank to differ from two that agree.
std::vector<int> ErrorCodes(const std::function<void(Group&)>& call, int size = 3);

}  // namespace mc2::test

#endif  // MC2_TESTS_COMMON_RANK_ERRORS_H_
