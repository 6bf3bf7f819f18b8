// The SVG timeline: well-formed XML, one lane per rank and category, spans
// coloured by operator with a legend, uncovered communication hatched, a
// time axis with units, step windows, and clear errors for bad windows.
// (tests/trace/render_check.sh renders one in headless Chromium.)
#include "trace/timeline_svg.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>

#include "mc2/error.h"

namespace mc2::trace {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A minimal XML well-formedness check: balanced, properly nested tags,
// quoted attributes, one root. Returns "" or what is wrong.
std::string CheckXml(const std::string& s) {
  std::vector<std::string> stack;
  size_t i = 0;
  int roots = 0;
  while ((i = s.find('<', i)) != std::string::npos) {
    size_t j = s.find('>', i);
    if (j == std::string::npos) return "unterminated tag";
    std::string tag = s.substr(i + 1, j - i - 1);
    i = j + 1;
    if (tag.empty()) return "empty tag";
    if (tag[0] == '?' || tag[0] == '!') continue;
    if (tag[0] == '/') {
      std::string name = tag.substr(1);
      if (stack.empty() || stack.back() != name) return "mismatched </" + name + ">";
      stack.pop_back();
      continue;
    }
    bool self = tag.back() == '/';
    std::string name = tag.substr(0, tag.find_first_of(" \n/"));
    if (std::count(tag.begin(), tag.end(), '"') % 2) return "odd quotes in <" + name + ">";
    if (stack.empty()) ++roots;
    if (!self) stack.push_back(name);
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  return roots == 1 ? "" : "not exactly one root element";
}

TraceData Demo() {
  TraceData t;
  auto span = [&](int rank, Category c, const std::string& name, int64_t lo, int64_t hi,
                  const std::string& algo = "") {
    SpanRecord s;
    s.rank = rank;
    s.tid = rank * 10 + static_cast<int>(c);
    s.cat = c;
    s.name = name;
    s.algorithm = algo;
    s.start_ns = lo;
    s.end_ns = hi;
    t.spans.push_back(s);
    t.ranks[rank].world_size = 2;
  };
  for (int r = 0; r < 2; ++r) {
    for (int step = 0; step < 2; ++step) {
      int64_t base = step * 1'000'000;
      t.marks.push_back({r, 1, base, step, false});
      span(r, Category::kCompute, "matmul", base, base + 600'000);
      span(r, Category::kComm, "all_reduce", base + 100'000, base + 500'000, "ring");
      span(r, Category::kComm, "all_gather <&>", base + 650'000, base + 900'000, "direct");
      span(r, Category::kWait, "wait", base + 650'000, base + 900'000);
    }
  }
  return t;
}

TEST(TimelineSvg, DrawsLanesLegendAxisAndUncoveredCommunication) {
  std::string svg = RenderTimelineSvg(Demo());
  EXPECT_EQ(CheckXml(svg), "");
  EXPECT_THAT(svg, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  for (const char* lane : {"rank 0 compute", "rank 0 communication", "rank 0 wait",
                           "rank 1 compute", "rank 1 communication", "rank 1 wait"})
    EXPECT_THAT(svg, HasSubstr(lane));
  EXPECT_THAT(svg, Not(HasSubstr("rank 0 host")));  // no host spans: no lane
  // Names are escaped, and each has a legend entry with its own colour.
  EXPECT_THAT(svg, HasSubstr("all_gather &lt;&amp;&gt;"));
  EXPECT_THAT(svg, Not(HasSubstr("all_gather <&>")));
  EXPECT_THAT(svg, HasSubstr(">matmul</text>"));
  EXPECT_THAT(svg, HasSubstr(">all_reduce</text>"));
  EXPECT_THAT(svg, HasSubstr(">uncovered communication</text>"));
  // The uncovered all_gathers (no compute under them) are hatched: 2 ranks
  // x 2 steps, and nothing else is.
  std::regex hatched("fill=\"url\\(#uncovered\\)\" stroke=\"#d62728\"");
  auto n =
      std::distance(std::sregex_iterator(svg.begin(), svg.end(), hatched), std::sregex_iterator());
  EXPECT_EQ(n, 2 * 2 + 1);  // + the legend swatch
  EXPECT_THAT(svg, HasSubstr("uncovered communication, 250.00 us"));
  // Axis: 1.9 ms of trace is labelled in microseconds.
  EXPECT_THAT(svg, HasSubstr("time since trace start (us)"));
  EXPECT_THAT(svg, HasSubstr(">1000</text>"));
  // Steps are drawn and labelled.
  EXPECT_THAT(svg, HasSubstr(">step 1</text>"));
  // The summary line carries the verdicts.
  EXPECT_THAT(svg, HasSubstr("uncovered comm"));
}

TEST(TimelineSvg, StepAndTimeWindows) {
  PlotOptions o;
  o.step = 1;
  o.title = "only step 1";
  std::string svg = RenderTimelineSvg(Demo(), o);
  EXPECT_EQ(CheckXml(svg), "");
  EXPECT_THAT(svg, HasSubstr("only step 1"));
  EXPECT_THAT(svg, HasSubstr("(step 1)"));
  EXPECT_THAT(svg, Not(HasSubstr(">step 0</text>")));

  o = {};
  o.step = 9;
  EXPECT_THROW(RenderTimelineSvg(Demo(), o), Error);
  o = {};
  o.from_ns = 5'000'000;
  EXPECT_THROW(RenderTimelineSvg(Demo(), o), Error);
  o = {};
  o.from_ns = 100'000;
  o.to_ns = 200'000;
  svg = RenderTimelineSvg(Demo(), o);
  EXPECT_EQ(CheckXml(svg), "");
  EXPECT_THAT(svg, HasSubstr("window 100.00 us"));
}

TEST(TimelineSvg, EmptyTraceStillRenders) {
  std::string svg = RenderTimelineSvg(TraceData{});
  EXPECT_EQ(CheckXml(svg), "");
  EXPECT_THAT(svg, HasSubstr("0 rank(s)"));
}

TEST(TimelineSvg, ManyTinySpansAreMergedIntoFewRectangles) {
  TraceData t;
  t.ranks[0];
  for (int i = 0; i < 100000; ++i) {
    SpanRecord s;
    s.cat = Category::kComm;
    s.name = "all_reduce";
    s.start_ns = i * 100;
    s.end_ns = i * 100 + 50;
    t.spans.push_back(s);
  }
  std::string svg = RenderTimelineSvg(t);
  EXPECT_EQ(CheckXml(svg), "");
  EXPECT_LT(svg.size(), 200'000u) << "tiny spans were not merged";
  EXPECT_THAT(svg, HasSubstr("spans merged at this zoom"));
}

}  // namespace
}  // namespace mc2::trace
