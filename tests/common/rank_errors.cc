#include "common/rank_errors.h"

#include <gtest/gtest.h>

namespace mc2::test {

std::vector<int> ErrorCodes(const std::function<void(Group&)>& call, int size) {
  std::vector<int> codes(size, -1);
  Group::RunInProcess(size, [&](Group& g) {
    try {
      call(g);
    } catch (const Error& e) {
      codes[g.rank()] = static_cast<int>(e.code());
    }
    float x = 1, y = 0;
    AllReduce(g, &x, &y, 1, DType::kF32, ReduceOp::kSum).Wait();
    EXPECT_EQ(y, static_cast<float>(g.size()));
  });
  return codes;
}

}  // namespace mc2::test
