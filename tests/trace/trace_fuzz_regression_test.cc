// Regression tests for inputs the trace-file fuzz target (fuzz/
// trace_file_fuzz.cc) found to break trace::ParseChromeTrace, the reader
// behind `mc2 trace report|merge|plot`. Each must fail with
// mc2::Error(kInvalidArgument) naming the file and what is wrong, never
// with an uncaught JSON type_error (std::terminate) or signed overflow.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>

#include <string>

#include "mc2/error.h"
#include "mc2/trace_file.h"

namespace mc2::trace {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The error ParseChromeTrace raises for `text` (fails the test if none).
Error ParseError(const std::string& text) {
  try {
    ParseChromeTrace(text, "bad.trace.json");
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << text;
  return Error(ErrorCode::kInternal, "none");
}

TEST(TraceFuzzRegressionTest, RankMetadataOfTheWrongTypeIsInvalidNotATypeError) {
  // Was: nlohmann type_error 302 escaping ReadChromeTrace (crash of `mc2
  // trace report`).
  for (const char* field : {"world_size", "clock_offset_ns", "dropped"}) {
    const std::string text = std::string(R"({"otherData":{"mc2":{"ranks":[{"rank":0,")") + field +
                             R"(":"x"}]}},"traceEvents":[]})";
    const Error e = ParseError(text);
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_THAT(e.message(), AllOf(HasSubstr("bad.trace.json"), HasSubstr(field)));
  }
  // Out of range: a negative drop count, an absurd world size.
  EXPECT_THAT(ParseError(R"({"otherData":{"mc2":{"ranks":[{"rank":0,"dropped":-1}]}},"traceEvents":[]})")
                  .message(),
              HasSubstr("dropped"));
  EXPECT_THAT(ParseError(R"({"otherData":{"mc2":{"ranks":[{"rank":0,"world_size":1e12}]}},"traceEvents":[]})")
                  .message(),
              HasSubstr("world_size"));
}

TEST(TraceFuzzRegressionTest, HugeTimesAreInvalidNotAnOverflow) {
  // Was: ts + dur overflowing int64 (UBSan: signed integer overflow).
  Error e = ParseError(R"({"traceEvents":[{"ph":"X","name":"a","pid":0,"ts":9e15,"dur":9e15}]})");
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(e.message(), AllOf(HasSubstr("bad.trace.json"), HasSubstr("\"ts\" is out of range")));
  e = ParseError(R"({"traceEvents":[{"ph":"X","name":"a","pid":0,"ts":1,"dur":1e300}]})");
  EXPECT_THAT(e.message(), HasSubstr("\"dur\" is out of range"));
  e = ParseError(R"({"traceEvents":[{"ph":"i","name":"s","cat":"step","pid":0,"ts":-1e200}]})");
  EXPECT_THAT(e.message(), HasSubstr("\"ts\" is out of range"));
}

TEST(TraceFuzzRegressionTest, StepMarkerAtAnAbsurdTimeIsInvalid) {
  // Found by trace_file_fuzz (fuzz/corpus/trace_file_fuzz/regression-svg-
  // overflow, reduced): a step marker at ts = 1.1e66 us is out of range for
  // llround (it would give INT64_MIN, and the SVG timeline would overflow
  // subtracting it).
  const Error e = ParseError(
      R"({"traceEvents": [{"ph": "X", "name": "gemm", "cat": "compute", "pid": 0, "tid": 1,
          "ts": 1000.0, "dur": 50.5},
         {"ph": "i", "name": "step end", "cat": "step", "s": "p", "pid": 0, "tid": 1,
          "ts": 1109999999999999999999999999999999999999999999999999999999999999990.0}]})");
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(e.message(), AllOf(HasSubstr("event 1"), HasSubstr("\"ts\" is out of range")));
}

TEST(TraceFuzzRegressionTest, LargeButSaneValuesStillParse) {
  // Ten days of uptime in microseconds, a large clock offset: valid.
  const TraceData t = ParseChromeTrace(
      R"({"otherData":{"mc2":{"ranks":[{"rank":1,"world_size":2,"clock_offset_ns":-5000000000,"dropped":7}]}},
          "traceEvents":[{"ph":"X","name":"all_reduce","cat":"comm","pid":1,"tid":3,
                          "ts":864000000000.5,"dur":12.25,"args":{"bytes":64}}]})",
      "ok.trace.json");
  ASSERT_EQ(t.spans.size(), 1u);
  EXPECT_EQ(t.spans[0].start_ns, 864000000000500);
  EXPECT_EQ(t.spans[0].end_ns, 864000000012750);
  EXPECT_EQ(t.ranks.at(1).clock_offset_ns, -5000000000);
  EXPECT_EQ(t.ranks.at(1).dropped, 7u);
  EXPECT_EQ(t.ranks.at(1).world_size, 2);
}

TEST(TraceFuzzRegressionTest, HugeOrNegativeByteCountsSaturate) {
  // Found by trace_file_fuzz (make test-fuzz): converting "bytes": 4e96
  // from double to uint64 is undefined (UBSan: outside the range of
  // representable values). Byte and flop counts are informational: out of
  // range they saturate, negative or NaN-like ones read as 0.
  const TraceData t = ParseChromeTrace(
      R"({"traceEvents":[{"ph":"X","name":"a","cat":"comm","pid":0,"ts":1,"dur":1,
                          "args":{"bytes":4e96,"flops":-3.5}},
                         {"ph":"X","name":"b","cat":"comm","pid":0,"ts":2,"dur":1,
                          "args":{"bytes":1.5e3,"flops":1e19}}]})",
      "ok.trace.json");
  ASSERT_EQ(t.spans.size(), 2u);
  EXPECT_EQ(t.spans[0].bytes, UINT64_MAX);
  EXPECT_EQ(t.spans[0].flops, 0u);
  EXPECT_EQ(t.spans[1].bytes, 1500u);
  EXPECT_EQ(t.spans[1].flops, 10000000000000000000u);
}

}  // namespace
}  // namespace mc2::trace
