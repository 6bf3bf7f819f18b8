// What every fused operator shares (src/ops/fused_common.h and the engine
// channel): a group of one rank runs each operator without any collective
// and gets the product of its inputs; sizes whose byte counts overflow are
// rejected with kInvalidArgument naming the operand, on every rank; the
// operators' internal messages never take a user's message.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/operands.h"
#include "common/rank_errors.h"
#include "engine/group_impl.h"
#include "mc2/mc2.h"

namespace mc2 {
namespace {

using test::Mat;
using test::Random;
using test::SameBits;

constexpr size_t kHuge = std::numeric_limits<size_t>::max() / 2;
const int kInvalid = static_cast<int>(ErrorCode::kInvalidArgument);

// The plain product A [m x k] B [k x n] in f32, the reference.
std::vector<float> Product(const float* a, const float* b, size_t m, size_t k, size_t n) {
  std::vector<float> c(m * n, 0.0f);
  GemmOptions o;
  o.backend = GemmBackend::kOneDNN;
  o.threads = 1;
  Gemm(m, n, k, DType::kF32, a, b, DType::kF32, c.data(), o);
  return c;
}

// ------------------------------------------------------------ one rank

TEST(FusedFramework, OneRankRunsEveryOperatorWithoutCollectives) {
  Group::RunInProcess(1, [](Group& g) {
    const size_t m = 37, k = 19, n = 23;
    Mat a = Random(m * k, DType::kF32, 1), b = Random(k * n, DType::kF32, 2);
    const float* af = reinterpret_cast<const float*>(a.bytes.data());
    const float* bf = reinterpret_cast<const float*>(b.bytes.data());
    const std::vector<float> want = Product(af, bf, m, k, n);
    for (Pipeline pl : {Pipeline::kSerial, Pipeline::kChunked, Pipeline::kFused, Pipeline::kAuto}) {
      SCOPED_TRACE(PipelineName(pl));
      FusedOptions o;
      o.pipeline = pl;
      o.gemm_threads = 1;
      const uint64_t seq = internal::Access::Impl(g)->last_seq();
      std::vector<float> c(m * n, -1.0f), rs(m * n, -1.0f), ar(m * n, -1.0f);
      std::vector<float> gathered(m * k, -1.0f);
      AllGatherMatmul(g,
                      {.a = af,
                       .b = bf,
                       .c = c.data(),
                       .m = m,
                       .k = k,
                       .n = n,
                       .dtype = DType::kF32,
                       .gathered_a = gathered.data()},
                      o);
      MatmulReduceScatter(g,
                          {.a = af,
                           .b = bf,
                           .c = rs.data(),
                           .m = m,
                           .k = k,
                           .n = n,
                           .dtype = DType::kF32,
                           .m_local = m},
                          o);
      MatmulAllReduce(
          g, {.a = af, .b = bf, .c = ar.data(), .m = m, .k = k, .n = n, .dtype = DType::kF32}, o);
      std::vector<float> batched(2 * m * n, -1.0f);
      Mat a2 = Random(2 * m * k, DType::kF32, 3);
      AllGatherBatchMatmul(g,
                           {.a = a2.bytes.data(),
                            .b = bf,
                            .c = batched.data(),
                            .m = m,
                            .k = k,
                            .n = n,
                            .dtype = DType::kF32,
                            .batch = 2,
                            .b_layout = BatchB::kShared},
                           o);
      // No operation took a sequence number: no agreement exchange, no
      // collective.
      EXPECT_EQ(internal::Access::Impl(g)->last_seq(), seq);
      EXPECT_TRUE(SameBits(c, want));
      EXPECT_TRUE(SameBits(rs, want));
      EXPECT_TRUE(SameBits(ar, want));
      EXPECT_EQ(std::memcmp(gathered.data(), af, m * k * 4), 0);
      const float* a2f = reinterpret_cast<const float*>(a2.bytes.data());
      EXPECT_TRUE(SameBits(batched, Product(a2f, bf, 2 * m, k, n)));
    }
  });
}

TEST(FusedFramework, OneRankRunsTheMoeOperatorsWithoutCollectives) {
  Group::RunInProcess(1, [](Group& g) {
    const size_t T = 9, d = 8, h = 6;
    const int E = 2, topk = 1;
    std::vector<int32_t> ids = {0, 1, 1, 0, -1, 1, 0, 0, 1};
    const uint64_t seq = internal::Access::Impl(g)->last_seq();
    MoeRouting r = MoeRoute(g, ids.data(), T, topk, E);
    Mat x = Random(T * d, DType::kF32, 4), w = Random(E * d * h, DType::kF32, 5);
    const float* xf = reinterpret_cast<const float*>(x.bytes.data());
    const float* wf = reinterpret_cast<const float*>(w.bytes.data());
    const size_t R = r.num_received();
    ASSERT_EQ(R, 8u);
    // The reference: the routed rows of each expert, in slot order, times
    // its weights.
    std::vector<float> want;
    for (int e = 0; e < E; ++e) {
      std::vector<float> rows;
      for (size_t t = 0; t < T; ++t)
        if (ids[t] == e) rows.insert(rows.end(), xf + t * d, xf + (t + 1) * d);
      std::vector<float> y = Product(rows.data(), wf + e * d * h, rows.size() / d, d, h);
      want.insert(want.end(), y.begin(), y.end());
    }
    for (Pipeline pl : {Pipeline::kSerial, Pipeline::kChunked, Pipeline::kFused, Pipeline::kAuto}) {
      SCOPED_TRACE(PipelineName(pl));
      FusedOptions o;
      o.pipeline = pl;
      o.gemm_threads = 1;
      std::vector<float> y(R * h, -1.0f);
      AllToAllMatmul(g, r, {.a = xf, .b = wf, .c = y.data(), .k = d, .n = h, .dtype = DType::kF32},
                     o);
      EXPECT_TRUE(SameBits(y, want));
      std::vector<float> out(T * d, -1.0f);
      Mat w2 = Random(E * h * d, DType::kF32, 6);
      MatmulAllToAll(g, r,
                     {.a = y.data(),
                      .b = w2.bytes.data(),
                      .c = out.data(),
                      .k = h,
                      .n = d,
                      .dtype = DType::kF32},
                     o);
      std::vector<float> mlp(T * d, -1.0f);
      MoeMlp(g, r,
             {.a = xf,
              .w1 = wf,
              .w2 = w2.bytes.data(),
              .c = mlp.data(),
              .d = d,
              .h1 = h,
              .h2 = h,
              .dtype = DType::kF32},
             o);
      // The MLP is the dispatch then the combine.
      EXPECT_TRUE(SameBits(mlp, out));
    }
    EXPECT_EQ(internal::Access::Impl(g)->last_seq(), seq);
  });
}

// ------------------------------------------------------------ sizes

// Runs `call` on 1 and on 2 ranks: every rank gets kInvalidArgument, and
// (on one rank) the message names `operand`.
void ExpectSizeError(const std::function<void(Group&)>& call, const std::string& operand) {
  for (int size : {1, 2}) {
    SCOPED_TRACE("ranks: " + std::to_string(size));
    EXPECT_EQ(test::ErrorCodes(call, size), std::vector<int>(size, kInvalid));
  }
  Group::RunInProcess(1, [&](Group& g) {
    try {
      call(g);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(operand), std::string::npos) << e.what();
    }
  });
}

TEST(FusedFramework, OverflowingSizesAreInvalidArguments) {
  float buf[64] = {};
  ExpectSizeError(
      [&](Group&) { Gemm(kHuge, 4, 4, DType::kF32, buf, buf, DType::kF32, buf, GemmOptions{}); },
      "m=");
  ExpectSizeError(
      [&](Group& g) {
        AllGatherMatmul(
            g, {.a = buf, .b = buf, .c = buf, .m = kHuge, .k = 4, .n = 4, .dtype = DType::kF32});
      },
      "A (args.m x args.k)");
  ExpectSizeError(
      [&](Group& g) {
        AllGatherMatmul(
            g, {.a = buf, .b = buf, .c = buf, .m = 4, .k = 4, .n = kHuge, .dtype = DType::kF32});
      },
      "B (args.k x args.n)");
  ExpectSizeError(
      [&](Group& g) {
        MatmulReduceScatter(g, {.a = buf,
                                .b = buf,
                                .c = buf,
                                .m = kHuge,
                                .k = 4,
                                .n = 4,
                                .dtype = DType::kF32,
                                .m_local = 0});
      },
      "A (args.m x args.k)");
  ExpectSizeError(
      [&](Group& g) {
        MatmulReduceScatter(g, {.a = buf,
                                .b = buf,
                                .c = buf,
                                .m = 4,
                                .k = 0,
                                .n = kHuge,
                                .dtype = DType::kF32,
                                .m_local = 0});
      },
      "the product (args.m x args.n)");
  ExpectSizeError(
      [&](Group& g) {
        MatmulAllReduce(
            g, {.a = buf, .b = buf, .c = buf, .m = kHuge, .k = 0, .n = 4, .dtype = DType::kBF16});
      },
      "C (args.m x args.n)");
  ExpectSizeError(
      [&](Group& g) {
        AllGatherBatchMatmul(g, {.a = buf,
                                 .b = buf,
                                 .c = buf,
                                 .m = 4,
                                 .k = 4,
                                 .n = 4,
                                 .dtype = DType::kF32,
                                 .batch = kHuge,
                                 .b_layout = BatchB::kPerBatch});
      },
      "A (args.batch x args.m x args.k)");
  ExpectSizeError(
      [&](Group& g) {
        AllGatherBatchMatmul(g, {.a = buf,
                                 .b = buf,
                                 .c = buf,
                                 .m = 0,
                                 .k = 4,
                                 .n = kHuge,
                                 .dtype = DType::kF32,
                                 .batch = 2,
                                 .b_layout = BatchB::kPerBatch});
      },
      "B (args.batch x args.k x args.n)");
  int32_t ids[4] = {};
  ExpectSizeError([&](Group& g) { MoeRoute(g, ids, kHuge, 4, 2); },
                  "expert_ids (num_tokens x topk)");
}

TEST(FusedFramework, OverflowingMoeSizesAreInvalidArguments) {
  float buf[64] = {};
  int32_t ids[2] = {0, 1};
  auto route = [&](Group& g) { return MoeRoute(g, ids, 2, 1, 2 * g.size()); };
  ExpectSizeError(
      [&](Group& g) {
        MoeRouting r = route(g);
        AllToAllMatmul(g, r,
                       {.a = buf, .b = buf, .c = buf, .k = kHuge, .n = 4, .dtype = DType::kF32});
      },
      "x (num_tokens x args.k)");
  ExpectSizeError(
      [&](Group& g) {
        MoeRouting r = route(g);
        MatmulAllToAll(g, r,
                       {.a = buf, .b = buf, .c = buf, .k = kHuge, .n = 4, .dtype = DType::kF32});
      },
      "hidden (received rows x args.k)");
  ExpectSizeError(
      [&](Group& g) {
        MoeRouting r = route(g);
        MoeMlp(g, r,
               {.a = buf,
                .w1 = buf,
                .w2 = buf,
                .c = buf,
                .d = 4,
                .h1 = kHuge,
                .h2 = kHuge,
                .dtype = DType::kF32});
      },
      "w1 (experts_per_rank x args.d x args.h1)");
}

// Shards whose sum overflows: each rank's own sizes are fine, M is not.
TEST(FusedFramework, RowCountsThatOverflowTogetherAreInvalidArguments) {
  float buf[4] = {};
  auto call = [&](Group& g) {
    AllGatherMatmul(
        g, {.a = buf, .b = buf, .c = buf, .m = kHuge + 1, .k = 0, .n = 0, .dtype = DType::kF32});
  };
  EXPECT_EQ(test::ErrorCodes(call, 2), std::vector<int>(2, kInvalid));
  auto batch = [&](Group& g) {
    AllGatherBatchMatmul(g, {.a = buf,
                             .b = buf,
                             .c = buf,
                             .m = kHuge + 1,
                             .k = 0,
                             .n = 0,
                             .dtype = DType::kF32,
                             .batch = 1,
                             .b_layout = BatchB::kShared});
  };
  EXPECT_EQ(test::ErrorCodes(batch, 2), std::vector<int>(2, kInvalid));
}

// ------------------------------------------------------------ tags

// A user message is in flight while the MoE and batch operators run, with
// tags that spell "MC2" and a letter as an operator's own might: the
// operators do not take it, and the user's Recv gets it intact afterwards.
TEST(FusedFramework, OperatorMessagesNeverTakeAUsersMessage) {
  constexpr int kMc2LikeTags[] = {0x4d43324d, 0x4d43324e, 0x4d433242};
  Group::RunInProcess(2, [&](Group& g) {
    const int me = g.rank(), peer = 1 - me;
    std::vector<Work> sends;
    std::vector<std::vector<int>> payload;
    for (int tag : kMc2LikeTags) payload.push_back({tag, me, 7, 11, 13});
    for (size_t i = 0; i < payload.size(); ++i) {
      sends.push_back(g.Send(payload[i].data(), payload[i].size() * 4, peer, kMc2LikeTags[i]));
    }
    // MoE: every token of each rank goes to an expert of the other rank.
    const size_t T = 6, d = 5, h = 3;
    std::vector<int32_t> ids(T, peer == 0 ? 0 : 1);
    MoeRouting r = MoeRoute(g, ids.data(), T, 1, 2);
    Mat x = Random(T * d, DType::kF32, 10 + me), w = Random(d * h, DType::kF32, 20 + me);
    std::vector<float> want(r.num_received() * h), got(want.size());
    FusedOptions serial, fused;
    serial.pipeline = Pipeline::kSerial;
    fused.pipeline = Pipeline::kFused;
    fused.splits = 2;
    AllToAllMatmul(g, r,
                   {.a = x.bytes.data(),
                    .b = w.bytes.data(),
                    .c = want.data(),
                    .k = d,
                    .n = h,
                    .dtype = DType::kF32},
                   serial);
    AllToAllMatmul(g, r,
                   {.a = x.bytes.data(),
                    .b = w.bytes.data(),
                    .c = got.data(),
                    .k = d,
                    .n = h,
                    .dtype = DType::kF32},
                   fused);
    EXPECT_TRUE(SameBits(got, want));
    std::vector<float> back(T * d), back_serial(T * d);
    MatmulAllToAll(g, r,
                   {.a = got.data(),
                    .b = w.bytes.data(),
                    .c = back.data(),
                    .k = h,
                    .n = d,
                    .dtype = DType::kF32},
                   fused);
    MatmulAllToAll(g, r,
                   {.a = got.data(),
                    .b = w.bytes.data(),
                    .c = back_serial.data(),
                    .k = h,
                    .n = d,
                    .dtype = DType::kF32},
                   serial);
    EXPECT_TRUE(SameBits(back, back_serial));
    // Batch: the fused ring's point-to-point messages.
    Mat a = Random(2 * 4 * d, DType::kF32, 30 + me), b = Random(d * h, DType::kF32, 40);
    std::vector<float> cb(2 * 8 * h), cb_serial(2 * 8 * h);
    AllGatherBatchMatmul(g,
                         {.a = a.bytes.data(),
                          .b = b.bytes.data(),
                          .c = cb.data(),
                          .m = 4,
                          .k = d,
                          .n = h,
                          .dtype = DType::kF32,
                          .batch = 2,
                          .b_layout = BatchB::kShared},
                         fused);
    AllGatherBatchMatmul(g,
                         {.a = a.bytes.data(),
                          .b = b.bytes.data(),
                          .c = cb_serial.data(),
                          .m = 4,
                          .k = d,
                          .n = h,
                          .dtype = DType::kF32,
                          .batch = 2,
                          .b_layout = BatchB::kShared},
                         serial);
    EXPECT_TRUE(SameBits(cb, cb_serial));
    // The user's messages arrive intact, each at its own Recv.
    for (size_t i = 0; i < payload.size(); ++i) {
      std::vector<int> in(payload[i].size(), -1);
      g.Recv(in.data(), in.size() * 4, peer, kMc2LikeTags[i]).Wait();
      EXPECT_EQ(in, (std::vector<int>{kMc2LikeTags[i], peer, 7, 11, 13}));
    }
    for (Work& s : sends) s.Wait();
  });
}

TEST(FusedFramework, NegativeUserTagsAreInvalidArguments) {
  Group::RunInProcess(2, [](Group& g) {
    int x = 0;
    try {
      g.Send(&x, 4, 1 - g.rank(), -1);
      ADD_FAILURE() << "Send with a negative tag";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
    EXPECT_THROW(g.Recv(&x, 4, 1 - g.rank(), -5), Error);
  });
}

}  // namespace
}  // namespace mc2
