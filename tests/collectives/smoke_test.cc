#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "mc2/mc2.h"

namespace mc2 {
namespace {

TEST(Smoke, AllReduceF32Sum) {
  for (int n : {1, 2, 3, 4}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}, size_t{1 << 20}}) {
      for (auto algo : {Algorithm::kDirect, Algorithm::kRabenseifner}) {
        Group::RunInProcess(n, [&](Group& g) {
          std::vector<float> in(count), out(count, -1);
          for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((i * 7 + g.rank() * 3) % 17);
          AllReduce(g, in.data(), out.data(), count, DType::kF32, ReduceOp::kSum,
                    {.algorithm = algo}).Wait();
          for (size_t i = 0; i < count; ++i) {
            float ref = 0;
            for (int r = 0; r < n; ++r) ref += static_cast<float>((i * 7 + r * 3) % 17);
            ASSERT_EQ(out[i], ref) << "n=" << n << " i=" << i << " count=" << count;
          }
        });
      }
    }
  }
}

TEST(Smoke, SymmetricInPlace) {
  Group::RunInProcess(3, [&](Group& g) {
    size_t count = 300000;
    auto buf = g.AllocSymmetric(count * sizeof(int32_t));
    auto* p = buf.as<int32_t>();
    for (size_t i = 0; i < count; ++i) p[i] = static_cast<int32_t>(i + g.rank());
    AllReduce(g, p, p, count, DType::kI32, ReduceOp::kSum).Wait();
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(p[i], static_cast<int32_t>(3 * i + 3));
    Barrier(g).Wait();
  });
}

TEST(Smoke, MismatchedCountsRaiseEverywhere) {
  EXPECT_THROW(Group::RunInProcess(2, [&](Group& g) {
    std::vector<float> a(10 + g.rank());
    try {
      AllReduce(g, a.data(), a.data(), a.size(), DType::kF32, ReduceOp::kSum).Wait();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kMismatch) << e.what();
      throw;
    }
  }), Error);
}

}  // namespace
}  // namespace mc2
