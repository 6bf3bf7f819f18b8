#include "core/env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "mc2/error.h"

namespace mc2::core {
namespace {

using ::testing::HasSubstr;

// The message of the kInvalidArgument error `f` throws ("" if none).
template <typename F>
std::string ErrorOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(Env, ParseBytes) {
  EXPECT_EQ(ParseBytes("1048576", "x"), 1048576u);
  EXPECT_EQ(ParseBytes("64K", "x"), 65536u);
  EXPECT_EQ(ParseBytes("256M", "x"), 256u << 20);
  EXPECT_EQ(ParseBytes("1.5G", "x"), 3u << 29);
  EXPECT_EQ(ParseBytes(" 2 GiB ", "x"), 2ull << 30);
  EXPECT_EQ(ParseBytes("0", "x"), 0u);
  for (const char* bad : {"", "-1", "12Q", "1.3", "M", "1e3", "99999999999T"})
    EXPECT_THAT(ErrorOf([&] { ParseBytes(bad, "MC2_HEAP_BYTES"); }),
                AllOf(HasSubstr("MC2_HEAP_BYTES"), HasSubstr("byte count")))
        << bad;
}

TEST(Env, ParseDuration) {
  using namespace std::chrono;
  EXPECT_EQ(ParseDuration("300", "x"), seconds(300));
  EXPECT_EQ(ParseDuration("1.5s", "x"), milliseconds(1500));
  EXPECT_EQ(ParseDuration("250ms", "x"), milliseconds(250));
  EXPECT_EQ(ParseDuration("10us", "x"), microseconds(10));
  EXPECT_EQ(ParseDuration("5m", "x"), minutes(5));
  for (const char* bad : {"", "0", "-3", "abc", "3 weeks", "1e99"})
    EXPECT_THAT(ErrorOf([&] { ParseDuration(bad, "MC2_TIMEOUT"); }), HasSubstr("MC2_TIMEOUT"))
        << bad;
}

TEST(Env, ParseBoolAndInt) {
  EXPECT_TRUE(ParseBool("yes", "x"));
  EXPECT_FALSE(ParseBool("OFF", "x"));
  EXPECT_THAT(ErrorOf([] { ParseBool("maybe", "MC2_DETERMINISTIC"); }),
              HasSubstr("MC2_DETERMINISTIC"));
  EXPECT_EQ(ParseInt("42", "x", 0, 100), 42);
  EXPECT_THAT(ErrorOf([] { ParseInt("101", "N", 0, 100); }), HasSubstr("[0, 100]"));
  EXPECT_THAT(ErrorOf([] { ParseInt("4x", "N", 0, 100); }), HasSubstr("N='4x'"));
}

// Every variable ValidateEnvironment checks fails with its own name.
TEST(Env, ValidateEnvironmentNamesTheBadVariable) {
  const char* cases[][2] = {{"MC2_TIMEOUT", "soon"},   {"MC2_DETERMINISTIC", "2"},
                            {"MC2_SPIN_US", "-5"},     {"MC2_HEAP_BYTES", "lots"},
                            {"MC2_SCRATCH_BYTES", "x"}, {"MC2_KERNELS", "sse9"},
                            {"MC2_LOG_LEVEL", "loud"}};
  for (auto& [name, value] : cases) {
    setenv(name, value, 1);
    EXPECT_THAT(ErrorOf([] { ValidateEnvironment(); }), HasSubstr(name)) << name;
    unsetenv(name);
  }
  EXPECT_EQ(ErrorOf([] { ValidateEnvironment(); }), "");
}

// An unknown MC2_ variable is named in a warning; the ones mc2's own tools
// set for their ranks are known.
TEST(Env, ValidateEnvironmentWarnsOfUnknownVariablesOnly) {
  setenv("MC2_TIMEOUTT", "5s", 1);
  testing::internal::CaptureStderr();
  ValidateEnvironment();
  EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("MC2_TIMEOUTT"));
  unsetenv("MC2_TIMEOUTT");

  setenv("MC2_BENCH_STDERR_TTY", "1", 1);
  testing::internal::CaptureStderr();
  ValidateEnvironment();
  EXPECT_THAT(testing::internal::GetCapturedStderr(),
              ::testing::Not(HasSubstr("MC2_BENCH_STDERR_TTY")));
  unsetenv("MC2_BENCH_STDERR_TTY");
}

// Inside a job the launcher has already warned once for the whole job, so a
// rank (MC2_JOB_ID and MC2_RANK set) does not repeat it.
TEST(Env, RanksOfAJobLeaveUnknownVariablesToTheLauncher) {
  setenv("MC2_TIMEOUTT", "5s", 1);
  setenv("MC2_JOB_ID", "test", 1);
  setenv("MC2_RANK", "1", 1);
  testing::internal::CaptureStderr();
  ValidateEnvironment();
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  unsetenv("MC2_JOB_ID");
  unsetenv("MC2_RANK");
  unsetenv("MC2_TIMEOUTT");
}

// A trace directory that cannot be used is named with the system's reason.
TEST(Env, CheckWritableDirectoryGivesTheReason) {
  EXPECT_THAT(ErrorOf([] { CheckWritableDirectory("/proc/mc2-no-such-dir/x", "MC2_TRACE"); }),
              AllOf(HasSubstr("MC2_TRACE='/proc/mc2-no-such-dir/x'"),
                    HasSubstr("No such file or directory")));
  EXPECT_THAT(ErrorOf([] { CheckWritableDirectory("/dev/null", "MC2_TRACE"); }),
              HasSubstr("not a directory"));
  char dir[] = "/tmp/mc2-env-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string nested = std::string(dir) + "/a/b";
  EXPECT_EQ(ErrorOf([&] { CheckWritableDirectory(nested, "MC2_TRACE"); }), "");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mc2::core
