// libFuzzer target: trace files as `mc2 trace report|merge|plot` read them
// (trace::ParseChromeTrace, then what the commands do with the data:
// Align, Analyze, FormatReport, ReportToJson, ToChromeJson and the SVG
// timeline).
//
// Contract (trace_file.h): any text gives a TraceData or
// mc2::Error(kInvalidArgument) naming the source -- never another exception
// (a JSON library type error included), a crash or undefined behaviour
// (e.g. signed overflow on huge timestamps) -- and a TraceData that was
// read can be analysed, reported, plotted and written back; what is written
// back parses again.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "mc2/error.h"
#include "mc2/trace_file.h"
#include "trace_tools/analysis.h"
#include "trace_tools/timeline_svg.h"

namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "contract broken: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  mc2::trace::TraceData t;
  try {
    t = mc2::trace::ParseChromeTrace(text, "fuzz.trace.json");
  } catch (const mc2::Error& e) {
    if (e.code() != mc2::ErrorCode::kInvalidArgument) Fail("error code is not invalid_argument");
    if (e.message().find("fuzz.trace.json") == std::string::npos) Fail("the error does not name the file");
    return 0;
  }
  mc2::trace::Align(t);
  const mc2::trace::Report r = mc2::trace::Analyze(t);
  mc2::trace::FormatReport(r, "fuzz.trace.json");
  mc2::trace::ReportToJson(r).dump();
  // The SVG timeline draws every span: keep the input's size bounded.
  if (t.spans.size() + t.marks.size() < 2000) mc2::trace::RenderTimelineSvg(t);
  const std::string json = mc2::trace::ToChromeJson(t);
  try {
    mc2::trace::ParseChromeTrace(json, "written");
  } catch (const mc2::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    Fail("a trace written by ToChromeJson does not parse");
  }
  return 0;
}
