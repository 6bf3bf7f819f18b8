// The SVG timeline: well-formed XML, one lane per rank and category, spans
// coloured by operator with a legend, uncovered communication hatched, a
// time axis with units, step windows, and clear errors for bad windows.
// (tests/trace/render_check.sh renders one in headless Chromium.)
#include "trace_tools/timeline_svg.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

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

TEST(TimelineSvg, LongNamesInTheLegendDoNotOverlap) {
  TraceData t;
  t.ranks[0].world_size = 1;
  std::vector<std::string> names;
  for (int i = 0; i < 7; ++i) {
    names.push_back("fused_all_gather_batch_matmul_pipeline_stage_" + std::to_string(i));
    SpanRecord s;
    s.rank = 0;
    s.tid = 1;
    s.cat = i % 2 ? Category::kComm : Category::kCompute;
    s.name = names.back();
    s.start_ns = i * 1000;
    s.end_ns = i * 1000 + 900 - i;  // distinct totals: a fixed colour order
    t.spans.push_back(s);
  }
  // A name longer than a whole legend line is shortened, not drawn past it.
  SpanRecord huge = t.spans[0];
  huge.name = std::string(400, 'x');
  huge.start_ns = 9000;
  huge.end_ns = 9100;
  t.spans.push_back(huge);
  PlotOptions o;
  o.width = 800;
  const std::string svg = RenderTimelineSvg(t, o);
  EXPECT_EQ(CheckXml(svg), "");
  // Each legend entry: its swatch, then its label 24 px to the right.
  const std::string legend = svg.substr(svg.find(">legend</text>"));
  std::regex entry(
      "<rect x=\"([0-9.]+)\" y=\"([0-9.]+)\" width=\"18\" height=\"12\"[^>]*/>\n"
      "<text x=\"[0-9.]+\" y=\"[0-9.]+\">([^<]*)</text>");
  struct Item {
    double x, y;
    std::string label;
  };
  std::vector<Item> items;
  for (auto it = std::sregex_iterator(legend.begin(), legend.end(), entry);
       it != std::sregex_iterator(); ++it)
    items.push_back({std::stod((*it)[1]), std::stod((*it)[2]), (*it)[3]});
  ASSERT_EQ(items.size(), names.size() + 2) << legend;  // + the long one + uncovered
  // At 12 px a glyph of these fonts is at most ~7 px wide on average.
  constexpr double kGlyph = 7.0;
  auto right_edge = [&](const Item& i) { return i.x + 24 + kGlyph * i.label.size(); };
  for (const Item& i : items) EXPECT_LE(right_edge(i), o.width) << i.label;
  for (size_t k = 1; k < items.size(); ++k) {
    if (items[k].y != items[k - 1].y) {
      EXPECT_GT(items[k].y, items[k - 1].y);
      continue;
    }
    EXPECT_GE(items[k].x, right_edge(items[k - 1]))
        << "'" << items[k - 1].label << "' runs into '" << items[k].label << "'";
  }
  for (const auto& n : names) EXPECT_THAT(svg, HasSubstr(">" + n + "</text>"));
  EXPECT_THAT(svg, HasSubstr("xxx...</text>"));
  // The picture is tall enough for every legend line.
  std::smatch h;
  ASSERT_TRUE(std::regex_search(svg, h, std::regex("height=\"([0-9.]+)\" viewBox")));
  EXPECT_GE(std::stod(h[1]), items.back().y + 12);
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
