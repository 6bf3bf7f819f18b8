// Sizes whose byte arithmetic overflows: every public collective and group
// call rejects them with kInvalidArgument naming the cause, before anything
// is allocated or any rank waits, so the group stays usable afterwards.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "core/checked.h"
#include "mc2/mc2.h"

namespace mc2 {
namespace {

constexpr size_t kMax = std::numeric_limits<size_t>::max();
constexpr size_t kPtrdiffMax = static_cast<size_t>(std::numeric_limits<ptrdiff_t>::max());

// Runs `call` and expects mc2::Error(kInvalidArgument) whose message holds
// every one of `needles`.
void ExpectInvalid(const std::function<void()>& call,
                   std::initializer_list<std::string_view> needles) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one containing '" << *needles.begin() << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    for (std::string_view n : needles)
      EXPECT_NE(e.message().find(n), std::string::npos)
          << "message '" << e.message() << "' lacks '" << n << "'";
  }
}

// After the rejected calls the group must still run collectives: no rank
// was left waiting inside one of them.
void ExpectUsable(const Group& g) {
  int64_t one = 1, sum = 0;
  AllReduce(g, &one, &sum, 1, DType::kI64, ReduceOp::kSum).Wait();
  EXPECT_EQ(sum, g.size());
}

class SizeOverflow : public ::testing::TestWithParam<int> {};

TEST_P(SizeOverflow, RootedAndAllReduceCountTimesElementSize) {
  Group::RunInProcess(GetParam(), [](Group& g) {
    float buf[4] = {};
    // The reported crash: SIZE_MAX / 2 f32 elements.
    ExpectInvalid([&] { AllReduce(g, buf, buf, kMax / 2, DType::kF32, ReduceOp::kSum); },
                  {"all_reduce: count 9223372036854775807 x 4 bytes (f32) overflows size_t"});
    ExpectInvalid([&] { AllReduce(g, buf, buf + 2, kMax / 8 + 1, DType::kF64, ReduceOp::kMax); },
                  {"all_reduce: count", "x 8 bytes (f64) overflows size_t"});
    // No overflow, but more than any buffer can hold.
    ExpectInvalid([&] { AllReduce(g, buf, buf, kMax / 4, DType::kF32, ReduceOp::kSum); },
                  {"all_reduce: count 4611686018427387903 x 4 bytes (f32)",
                   "exceeds the largest possible buffer"});
    ExpectInvalid([&] { Reduce(g, buf, buf, kMax / 2 + 1, DType::kBF16, ReduceOp::kSum, 0); },
                  {"reduce: count 9223372036854775808 x 2 bytes (bf16) overflows size_t"});
    ExpectInvalid([&] { Broadcast(g, buf, buf, kMax, DType::kI32, g.size() - 1); },
                  {"broadcast: count 18446744073709551615 x 4 bytes (i32) overflows size_t"});
    // Null buffers: the size is what is wrong, and it is reported first.
    ExpectInvalid([&] { AllReduce(g, nullptr, nullptr, kMax / 2, DType::kF32, ReduceOp::kSum); },
                  {"overflows size_t"});
    ExpectUsable(g);
  });
}

TEST_P(SizeOverflow, GathersAndScattersCountTimesRanks) {
  Group::RunInProcess(GetParam(), [](Group& g) {
    const size_t n = g.size();
    float buf[16] = {};
    // count x ranks elements overflows with 2 or more ranks, count x element
    // size with one.
    const size_t count = n > 1 ? kMax / n + 1 : kMax / 2;
    const std::string_view cause = n > 1 ? "ranks overflows size_t" : "overflows size_t";
    ExpectInvalid([&] { AllGather(g, buf, buf, count, DType::kF32); }, {"all_gather: ", cause});
    ExpectInvalid([&] { Gather(g, buf, buf, count, DType::kF32, 0); }, {"gather: ", cause});
    ExpectInvalid([&] { AllToAll(g, buf, buf + 8, count, DType::kF32); }, {"all_to_all: ", cause});
    // Elements fit, bytes do not.
    ExpectInvalid([&] { AllGather(g, buf, buf, kMax / n / 2, DType::kF32); },
                  {"all_gather: count x ranks", "x 4 bytes (f32)"});
    ExpectInvalid([&] { Scatter(g, buf, buf, kMax / 2 + 1, DType::kI8, 0); },
                  {"scatter: count 9223372036854775808 x 1 bytes (i8)",
                   "exceeds the largest possible buffer"});
    if (n > 1) {
      // The root's input (count x ranks) is too large, whether or not the
      // product wraps.
      ExpectInvalid([&] { Scatter(g, buf, buf, kPtrdiffMax / n + 1, DType::kU8, 0); },
                    {"scatter: ", "ranks"});
      ExpectInvalid(
          [&] { ReduceScatter(g, buf, buf, kPtrdiffMax / n + 1, DType::kU8, ReduceOp::kBor); },
          {"reduce_scatter: ", "ranks"});
    }
    ExpectInvalid([&] { ReduceScatter(g, buf, buf, kMax / 2, DType::kF32, ReduceOp::kSum); },
                  {"reduce_scatter: count 9223372036854775807 x 4 bytes (f32) overflows size_t"});
    ExpectUsable(g);
  });
}

TEST_P(SizeOverflow, VariantsSumsAndDisplacements) {
  Group::RunInProcess(GetParam(), [](Group& g) {
    const size_t n = g.size();
    float buf[64] = {};
    std::vector<size_t> small(n, 1), packed(n);
    for (size_t r = 0; r < n; ++r) packed[r] = r;
    // A displacement plus its count wraps.
    std::vector<size_t> displs = packed;
    displs.back() = kMax - 1;
    std::vector<size_t> counts = small;
    counts.back() = 2;
    ExpectInvalid([&] { AllGatherV(g, buf + g.rank(), buf, counts, displs, DType::kF32); },
                  {"all_gatherv: displs[", "] 18446744073709551614 + counts[", "overflows size_t"});
    // The packed sum of the counts wraps.
    std::vector<size_t> huge(n, kMax / n + 1);
    if (n == 1) huge[0] = kMax / 2;
    ExpectInvalid([&] { AllGatherV(g, buf, buf, huge, {}, DType::kF32); }, {"all_gatherv: "});
    ExpectInvalid([&] { ReduceScatterV(g, buf, buf, huge, DType::kF32, ReduceOp::kSum); },
                  {"reduce_scatterv: "});
    if (n > 1) {
      ExpectInvalid([&] { AllGatherV(g, buf, buf, huge, {}, DType::kF32); },
                    {"all_gatherv: the sum of counts up to [", "overflows size_t"});
      ExpectInvalid([&] { ReduceScatterV(g, buf, buf, huge, DType::kF32, ReduceOp::kSum); },
                    {"reduce_scatterv: the sum of counts up to [", "overflows size_t"});
    }
    // Extents that fit in elements but not in bytes.
    std::vector<size_t> wide = small;
    wide[0] = kMax / 4;
    ExpectInvalid([&] { ReduceScatterV(g, buf, buf, wide, DType::kF64, ReduceOp::kSum); },
                  {"reduce_scatterv: the sum of counts", "x 8 bytes (f64)"});
    std::vector<size_t> far = packed;
    far[0] = kMax / 8;
    ExpectInvalid([&] { AllGatherV(g, buf + g.rank(), buf, small, far, DType::kF32); },
                  {"all_gatherv: the output extent (elements)", "x 4 bytes (f32)"});
    // All-to-all-v: this rank's own displacements and counts. Every rank
    // passes the same wrong values, so all raise together.
    std::vector<size_t> a2a_displs = packed;
    a2a_displs.back() = kMax;
    ExpectInvalid(
        [&] { AllToAllV(g, buf, small, a2a_displs, buf + 32, small, {}, DType::kF32); },
        {"all_to_allv: send_displs[", "] 18446744073709551615 + send_counts[", "overflows size_t"});
    ExpectInvalid([&] { AllToAllV(g, buf, small, {}, buf + 32, small, a2a_displs, DType::kF32); },
                  {"all_to_allv: recv_displs[", "overflows size_t"});
    std::vector<size_t> a2a_far = packed;
    a2a_far[0] = kPtrdiffMax;
    ExpectInvalid([&] { AllToAllV(g, buf, small, a2a_far, buf + 32, small, {}, DType::kF16); },
                  {"all_to_allv: the send extent (elements)"});
    ExpectUsable(g);
  });
}

TEST_P(SizeOverflow, BufferRangesThatWrapTheAddressSpace) {
  Group::RunInProcess(GetParam(), [](Group& g) {
    // A size that fits, at an address whose end wraps around.
    auto* top = reinterpret_cast<float*>(uintptr_t{0} - 64);
    ExpectInvalid([&] { AllReduce(g, top, top, 1024, DType::kF32, ReduceOp::kSum); },
                  {"all_reduce: send at", "wraps around the address space"});
    ExpectUsable(g);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, SizeOverflow, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(SizeOverflowGroup, AllocSymmetricPutGetSendRecv) {
  Group::RunInProcess(2, [](Group& g) {
    ExpectInvalid([&] { g.AllocSymmetric(kMax); },
                  {"AllocSymmetric: a request of 18446744073709551615 bytes exceeds the largest "
                   "possible buffer"});
    ExpectInvalid([&] { g.AllocSymmetric(kMax - 100); }, {"AllocSymmetric: "});
    auto buf = g.AllocSymmetric(64);
    char x[16] = {};
    const int peer = 1 - g.rank();
    // offset + bytes wraps: it must not pass the bounds check.
    ExpectInvalid([&] { g.Put(buf, peer, 8, x, kMax - 4); },
                  {"Put: src of 18446744073709551611 bytes exceeds the largest possible buffer"});
    ExpectInvalid([&] { g.Put(buf, peer, kMax, x, 8); },
                  {"Put: 8 bytes at offset 18446744073709551615 exceed the buffer's 64 bytes"});
    ExpectInvalid([&] { g.Get(buf, peer, 60, x, 8); },
                  {"Get: 8 bytes at offset 60 exceed the buffer's 64 bytes"});
    ExpectInvalid([&] { g.Get(buf, peer, kPtrdiffMax, x, kPtrdiffMax); },
                  {"Get: ", "exceed the buffer's 64 bytes"});
    ExpectInvalid([&] { g.Put(buf, peer, 0, nullptr, 8); }, {"Put: src is null"});
    ExpectInvalid([&] { g.Send(x, kMax, peer); },
                  {"Send: data of 18446744073709551615 bytes exceeds the largest possible buffer"});
    ExpectInvalid([&] { g.Recv(x, kPtrdiffMax + 1, peer, 5); },
                  {"Recv: data of 9223372036854775808 bytes exceeds"});
    auto* top = reinterpret_cast<char*>(uintptr_t{0} - 16);
    ExpectInvalid([&] { g.Send(top, 32, peer); }, {"Send: data at", "wraps around"});
    // Nothing was sent or posted: a message round trip still pairs up.
    int64_t mine = g.rank() + 10, theirs = 0;
    Work s = g.Send(&mine, sizeof(mine), peer, 5);
    g.Recv(&theirs, sizeof(theirs), peer, 5).Wait();
    s.Wait();
    EXPECT_EQ(theirs, peer + 10);
    ExpectUsable(g);
    Barrier(g).Wait();
  });
}

TEST(CheckedArithmetic, HelpersReturnExactResultsOrThrow) {
  EXPECT_EQ(core::CheckedMul(size_t{1} << 31, size_t{1} << 32, "x"), size_t{1} << 63);
  EXPECT_EQ(core::CheckedAdd(kMax - 1, 1, "x"), kMax);
  EXPECT_EQ(core::SaturatingMul(kMax / 2, 3), kMax);
  EXPECT_EQ(core::SaturatingMul(6, 7), 42u);
  ExpectInvalid([] { core::CheckedMul(size_t{1} << 32, size_t{1} << 32, "m {} x {}", 1, 2); },
                {"m 1 x 2 overflows size_t"});
  ExpectInvalid([] { core::CheckedAdd(kMax, 1, "a"); }, {"a overflows size_t"});
  EXPECT_EQ(core::CheckedBytes("op", "count", kPtrdiffMax / 8, DType::kF64), kPtrdiffMax / 8 * 8);
  ExpectInvalid([] { core::CheckedBytes("op", "count", kPtrdiffMax / 8 + 1, DType::kF64); },
                {"op: count 1152921504606846976 x 8 bytes (f64) = 9223372036854775808 bytes "
                 "exceeds the largest possible buffer"});
  size_t total = 0;
  const std::vector<size_t> c = {3, 0, 5};
  EXPECT_EQ(core::CheckedPackedDispls("op", "counts", c, &total), (std::vector<size_t>{0, 3, 3}));
  EXPECT_EQ(total, 8u);
  const std::vector<size_t> big = {kMax, 1};
  ExpectInvalid([&] { core::CheckedPackedDispls("op", "counts", big); },
                {"op: the sum of counts up to [1] (18446744073709551615 + 1) overflows size_t"});
}

}  // namespace
}  // namespace mc2
