// Fused operators (include/mc2/fused_ops.h): inconsistent or invalid
// arguments fail on every rank with the same code, a workspace too large for
// the heap fails everywhere and leaves the group usable, and the pipeline
// names round-trip.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/rank_errors.h"
#include "mc2/mc2.h"

namespace mc2 {
namespace {

using test::ErrorCodes;

TEST(FusedOps, InconsistentShapesFailEverywhere) {
  const int mis = static_cast<int>(ErrorCode::kMismatch);
  const int inv = static_cast<int>(ErrorCode::kInvalidArgument);
  std::vector<float> a(64 * 64, 1.0f), b(64 * 64, 1.0f), c(64 * 64);
  // k differs in AllGatherMatmul.
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              AllGatherMatmul(g, {.a = a.data(),
                                  .b = b.data(),
                                  .c = c.data(),
                                  .m = 2,
                                  .k = g.rank() == 1 ? 5u : 4u,
                                  .n = 3,
                                  .dtype = DType::kF32});
            }),
            std::vector<int>(3, mis));
  // M differs in MatmulAllReduce.
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              MatmulAllReduce(g, {.a = a.data(),
                                  .b = b.data(),
                                  .c = c.data(),
                                  .m = g.rank() == 2 ? 7u : 6u,
                                  .k = 4,
                                  .n = 3,
                                  .dtype = DType::kF32});
            }),
            std::vector<int>(3, mis));
  // m_local do not add up to M.
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              MatmulReduceScatter(g, {.a = a.data(),
                                      .b = b.data(),
                                      .c = c.data(),
                                      .m = 6,
                                      .k = 4,
                                      .n = 3,
                                      .dtype = DType::kF32,
                                      .m_local = 3});
            }),
            std::vector<int>(3, mis));
  // Different operators.
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              if (g.rank() == 0) {
                MatmulAllReduce(g, {.a = a.data(),
                                    .b = b.data(),
                                    .c = c.data(),
                                    .m = 6,
                                    .k = 4,
                                    .n = 3,
                                    .dtype = DType::kF32});
              } else {
                MatmulReduceScatter(g, {.a = a.data(),
                                        .b = b.data(),
                                        .c = c.data(),
                                        .m = 6,
                                        .k = 4,
                                        .n = 3,
                                        .dtype = DType::kF32,
                                        .m_local = 2});
              }
            }),
            std::vector<int>(3, mis));
  // Different splits / pipelines.
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              FusedOptions o;
              o.pipeline = Pipeline::kChunked;
              o.splits = 2 + g.rank();
              MatmulAllReduce(g,
                              {.a = a.data(),
                               .b = b.data(),
                               .c = c.data(),
                               .m = 6,
                               .k = 4,
                               .n = 3,
                               .dtype = DType::kF32},
                              o);
            }),
            std::vector<int>(3, mis));
  // Bad splits on every rank, and on one rank only.
  for (int bad : {0, 17}) {
    EXPECT_EQ(ErrorCodes([&](Group& g) {
                FusedOptions o;
                o.splits = bad;
                MatmulAllReduce(g,
                                {.a = a.data(),
                                 .b = b.data(),
                                 .c = c.data(),
                                 .m = 6,
                                 .k = 4,
                                 .n = 3,
                                 .dtype = DType::kF32},
                                o);
              }),
              std::vector<int>(3, inv));
  }
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              FusedOptions o;
              o.splits = g.rank() == 1 ? 99 : 4;
              AllGatherMatmul(g,
                              {.a = a.data(),
                               .b = b.data(),
                               .c = c.data(),
                               .m = 2,
                               .k = 4,
                               .n = 3,
                               .dtype = DType::kF32},
                              o);
            }),
            std::vector<int>(3, inv));
  // Unsupported dtype.
  EXPECT_EQ(ErrorCodes([&](Group& g) {
              MatmulAllReduce(g, {.a = a.data(),
                                  .b = b.data(),
                                  .c = c.data(),
                                  .m = 6,
                                  .k = 4,
                                  .n = 3,
                                  .dtype = DType::kF64});
            }),
            std::vector<int>(3, inv));
}

// A fused workspace larger than the heap fails on every rank with a clear
// kShmExhausted, and the group goes on working.
TEST(FusedOps, WorkspaceTooLargeForTheHeapFailsEverywhere) {
  WorldOptions wo;
  wo.heap_bytes = size_t{16} << 20;
  std::vector<int> codes(2, -1);
  std::vector<std::string> what(2);
  Group::RunInProcess(
      2,
      [&](Group& g) {
        const size_t M = 2048, k = 4, n = 2048;  // workspace: M n 4 = 16 MiB
        std::vector<float> a(M * k, 1.0f), b(k * n, 1.0f), c(M * n);
        FusedOptions fo;
        fo.pipeline = Pipeline::kFused;
        try {
          MatmulAllReduce(g,
                          {.a = a.data(),
                           .b = b.data(),
                           .c = c.data(),
                           .m = M,
                           .k = k,
                           .n = n,
                           .dtype = DType::kF32},
                          fo);
        } catch (const Error& e) {
          codes[g.rank()] = static_cast<int>(e.code());
          what[g.rank()] = e.what();
        }
        float x = 1, y = 0;
        AllReduce(g, &x, &y, 1, DType::kF32, ReduceOp::kSum).Wait();
        EXPECT_EQ(y, 2.0f);
      },
      wo);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(codes[r], static_cast<int>(ErrorCode::kShmExhausted)) << what[r];
    EXPECT_NE(what[r].find("MC2_HEAP_BYTES"), std::string::npos) << what[r];
  }
}

TEST(FusedOps, PipelineNames) {
  for (int i = 0; i < kNumPipelines; ++i) {
    auto p = static_cast<Pipeline>(i);
    EXPECT_EQ(ParsePipeline(PipelineName(p)), p);
  }
  EXPECT_FALSE(ParsePipeline("bogus").has_value());
}

}  // namespace
}  // namespace mc2
