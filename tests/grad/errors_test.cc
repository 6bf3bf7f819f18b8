// GradSync's bad input: a clear mc2::Error naming the cause, never a hang.
// Local misuse (an unregistered parameter, a second mark, bad options or
// dtypes) throws kInvalidArgument on the rank that made it and leaves the
// GradSync usable; registrations or options that differ between ranks
// throw kMismatch from Finalize on every rank.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <string>

#include "mc2/mc2.h"

namespace mc2 {
namespace {

template <typename F>
void ExpectError(ErrorCode code, const std::string& needle, F&& f) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(GradSyncErrors, InvalidOptionsAndRegistrations) {
  Group::RunInProcess(1, [&](Group& g) {
    ExpectError(ErrorCode::kInvalidArgument, "caps",
                [&] { GradSync s(g, {.bucket_cap_bytes = 0}); });
    ExpectError(ErrorCode::kInvalidArgument, "topk_ratio", [&] {
      GradSync s(g, {.compression = {.scheme = Compression::kTopK, .topk_ratio = 0}});
    });
    ExpectError(ErrorCode::kInvalidArgument, "threshold", [&] {
      GradSync s(g, {.compression = {.scheme = Compression::kThreshold,
                                     .threshold = std::numeric_limits<float>::quiet_NaN()}});
    });
    ExpectError(ErrorCode::kInvalidArgument, "not a float", [&] {
      GradSync s(g);
      s.Register("ids", 4, DType::kI32);
    });
    ExpectError(ErrorCode::kInvalidArgument, "takes f32", [&] {
      GradSync s(g, {.compression = {.scheme = Compression::kBF16}});
      s.Register("w", 4, DType::kF64);
    });
    ExpectError(ErrorCode::kInvalidArgument, "registered twice", [&] {
      GradSync s(g);
      s.Register("w", 4, DType::kF32);
      s.Register("w", 4, DType::kF32);
    });
    ExpectError(ErrorCode::kInvalidArgument, "no group 3", [&] {
      GradSync s(g);
      s.Register("w", 4, DType::kF32, 3);
    });
    ExpectError(ErrorCode::kInvalidArgument, "before Finalize", [&] {
      GradSync s(g);
      s.Register("w", 4, DType::kF32);
      s.MarkReady(0);
    });
    ExpectError(ErrorCode::kInvalidArgument, "after Finalize", [&] {
      GradSync s(g);
      s.Finalize();
      s.Register("w", 4, DType::kF32);
    });
  });
}

// The rank that errs gets kInvalidArgument; the step then completes on
// every rank with the right result.
TEST(GradSyncErrors, UnregisteredAndTwiceMarkedParametersLeaveTheStepUsable) {
  Group::RunInProcess(3, [&](Group& g) {
    GradSync sync(g, {.bucket_cap_bytes = 16, .first_bucket_cap_bytes = 16});
    sync.Register("a", 4, DType::kF32);
    sync.Register("b", 4, DType::kF32);
    sync.Finalize();
    sync.ZeroGrad();
    for (int p : {0, 1}) std::fill_n(sync.GradAs<float>(p), 4, float(g.rank() + 1));
    sync.MarkReady(1);
    if (g.rank() == 1) {
      ExpectError(ErrorCode::kInvalidArgument, "marked ready twice", [&] { sync.MarkReady(1); });
      ExpectError(ErrorCode::kInvalidArgument, "parameter id 2 is not registered",
                  [&] { sync.MarkReady(2); });
      ExpectError(ErrorCode::kInvalidArgument, "parameter id -1", [&] { sync.Grad(-1); });
    }
    sync.MarkReady(0);
    sync.Finish();
    for (int p : {0, 1}) {
      for (int i = 0; i < 4; ++i) ASSERT_EQ(sync.GradAs<float>(p)[i], 2.0f);
    }
    Barrier(g).Wait();
  });
}

TEST(GradSyncErrors, MismatchedRegistrationsFailOnEveryRank) {
  struct Case {
    const char* what;
    const char* needle;
  };
  for (const Case& c :
       {Case{"count", "parameter 1 differs"}, Case{"extra", "rank 2: 3"},
        Case{"dtype", "parameter 0 differs"}, Case{"options", "different options"}}) {
    SCOPED_TRACE(c.what);
    std::atomic<int> caught{0};
    Group::RunInProcess(3, [&](Group& g) {
      const std::string what = c.what;
      GradSyncOptions o;
      if (what == "options" && g.rank() == 2) o.bucket_cap_bytes = 1024;
      GradSync sync(g, o);
      sync.Register("a", 8, what == "dtype" && g.rank() == 0 ? DType::kF64 : DType::kF32);
      sync.Register("b", what == "count" && g.rank() == 1 ? 9 : 8, DType::kF32);
      if (what == "extra" && g.rank() == 2) sync.Register("c", 8, DType::kF32);
      ExpectError(ErrorCode::kMismatch, c.needle, [&] { sync.Finalize(); });
      ++caught;
    });
    EXPECT_EQ(caught.load(), 3);
  }
}

}  // namespace
}  // namespace mc2
