#include "trace_tools/timeline_svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "mc2/error.h"
#include "trace_tools/analysis.h"

namespace mc2::trace {
namespace {

// Distinct, print-safe colours (Tableau 20 order: dark shades first).
constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948",
                                    "#76b7b2", "#9c755f", "#ff9da7", "#bab0ac", "#1f77b4",
                                    "#8c564b", "#17becf", "#bcbd22", "#7f7f7f", "#aec7e8",
                                    "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#dbdb8d"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
constexpr const char* kOther = "#d0d0d0";

std::string Esc(std::string_view s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      case '\'':
        o += "&apos;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

std::string Dur(int64_t ns) {
  double a = std::abs(static_cast<double>(ns));
  if (a < 1e3) return fmt::format("{} ns", ns);
  if (a < 1e6) return fmt::format("{:.2f} us", ns / 1e3);
  if (a < 1e9) return fmt::format("{:.3f} ms", ns / 1e6);
  return fmt::format("{:.3f} s", ns / 1e9);
}

// A "nice" tick step (1, 2 or 5 x 10^k ns) giving about `want` ticks.
int64_t TickStep(int64_t span_ns, int want) {
  double raw = std::max(1.0, static_cast<double>(span_ns) / want);
  double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return std::max<int64_t>(1, static_cast<int64_t>(m * p));
  return static_cast<int64_t>(10 * p);
}

struct Unit {
  const char* name;
  double ns;
};
Unit PickUnit(int64_t span_ns) {
  if (span_ns >= 10'000'000'000) return {"s", 1e9};
  if (span_ns >= 10'000'000) return {"ms", 1e6};
  if (span_ns >= 10'000) return {"us", 1e3};
  return {"ns", 1};
}

std::string Num(double v) {
  std::string s = fmt::format("{:.6f}", v);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

struct Box {
  int64_t lo, hi;
  const SpanRecord* first;
  int count;
};

// Appends formatted text to `o`.
template <typename... T>
void Put(std::string& o, fmt::format_string<T...> f, T&&... args) {
  fmt::format_to(std::back_inserter(o), f, std::forward<T>(args)...);
}

// One lane: a rank's spans of one category.
struct Lane {
  int rank;
  Category cat;
  double y;
};

struct LegendItem {
  std::string label;
  const char* fill;
  double x, y;
};

// Fixed geometry, in pixels.
constexpr int kLeft = 150, kRight = 24, kTop = 64, kLaneH = 22, kLaneGap = 4, kRankGap = 14;
// Legend items: a generous estimate of the font's glyph width, so that
// labels never run into each other.
constexpr double kGlyphW = 7.5, kSwatchW = 24, kItemGap = 18;

// Where everything goes: the time window, the scale, the colours, the lanes
// and the legend. Computed once, before anything is drawn.
struct Layout {
  int64_t origin = 0;      // the trace's first event
  int64_t lo = 0, hi = 0;  // the window drawn
  int width = 0;
  double plot_w = 0;
  double scale = 0;                                    // px per ns
  std::vector<std::pair<int64_t, std::string>> order;  // (-total ns, name), most expensive first
  std::map<std::string, const char*> colour;
  std::set<int> ranks;
  std::vector<Lane> lanes;
  std::map<int, std::pair<double, double>> rank_band;  // rank -> [y0, y1]
  double axis_y = 0;
  double legend_y = 0;
  std::vector<LegendItem> items;
  double height = 0;

  double X(int64_t ns) const { return kLeft + (ns - lo) * scale; }
};

// The window: the whole trace, one step, or a part cut by from/to.
void PlaceWindow(const TraceData& t, const PlotOptions& opt, const Report& rep, Layout& L) {
  int64_t origin = 0, end = 0;
  bool any = false;
  auto see = [&](int64_t lo, int64_t hi) {
    origin = any ? std::min(origin, lo) : lo;
    end = any ? std::max(end, hi) : hi;
    any = true;
  };
  for (const auto& s : t.spans) see(s.start_ns, std::max(s.start_ns, s.end_ns));
  for (const auto& m : t.marks) see(m.t_ns, m.t_ns);
  int64_t lo = origin, hi = end;
  if (opt.step) {
    auto it = std::find_if(rep.steps.begin(), rep.steps.end(),
                           [&](const StepBreakdown& s) { return s.step == *opt.step; });
    if (it == rep.steps.end())
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("step {} is not marked in the trace", *opt.step));
    lo = it->start_ns;
    hi = it->end_ns;
  }
  if (opt.from_ns) lo = std::max(lo, origin + *opt.from_ns);
  if (opt.to_ns) hi = std::min(hi, origin + *opt.to_ns);
  if (any && hi <= lo && (opt.step || opt.from_ns || opt.to_ns))
    throw Error(ErrorCode::kInvalidArgument, "the requested window of the trace is empty");
  if (hi <= lo) hi = lo + 1000;  // an empty trace still gets an axis
  L.origin = origin;
  L.lo = lo;
  L.hi = hi;
  L.width = std::max(400, opt.width);
  L.plot_w = L.width - kLeft - kRight;
  L.scale = L.plot_w / static_cast<double>(hi - lo);
}

// Colours: operator names by total time, most expensive first.
void PickColours(const TraceData& t, Layout& L) {
  std::map<std::string, int64_t> time_by_name;
  for (const auto& s : t.spans) time_by_name[s.name] += s.end_ns - s.start_ns;
  for (const auto& [name, ns] : time_by_name) L.order.push_back({-ns, name});
  std::sort(L.order.begin(), L.order.end());
  for (size_t i = 0; i < L.order.size(); ++i)
    L.colour[L.order[i].second] = i < static_cast<size_t>(kPaletteSize) ? kPalette[i] : kOther;
}

// Lanes: compute and communication for every rank, wait and host for the
// ranks that have such spans.
void PlaceLanes(const TraceData& t, Layout& L) {
  std::map<int, std::set<Category>> cats;
  for (const auto& [rank, info] : t.ranks) L.ranks.insert(rank);
  for (const auto& s : t.spans) {
    L.ranks.insert(s.rank);
    cats[s.rank].insert(s.cat);
  }
  double y = kTop;
  for (int rank : L.ranks) {
    double y0 = y;
    for (Category c : {Category::kCompute, Category::kComm, Category::kWait, Category::kHost}) {
      bool always = c == Category::kCompute || c == Category::kComm;
      if (!always && !cats[rank].count(c)) continue;
      L.lanes.push_back({rank, c, y});
      y += kLaneH + kLaneGap;
    }
    L.rank_band[rank] = {y0, y - kLaneGap};
    y += kRankGap;
  }
  L.axis_y = y + 4;
}

// The legend, below the axis: items flow left to right and wrap, each as
// wide as its label; a label wider than the whole line is shortened.
void PlaceLegend(Layout& L) {
  std::vector<std::pair<std::string, const char*>> legend;
  for (size_t i = 0; i < L.order.size() && i < static_cast<size_t>(kPaletteSize); ++i)
    legend.push_back({L.order[i].second, kPalette[i]});
  if (L.order.size() > static_cast<size_t>(kPaletteSize)) legend.push_back({"other", kOther});
  legend.push_back({"uncovered communication", "url(#uncovered)"});
  L.legend_y = L.axis_y + 48;
  const double line_w = L.width - 40;
  const size_t max_chars = std::max<size_t>(8, static_cast<size_t>((line_w - kSwatchW) / kGlyphW));
  double lx = 20, ly = L.legend_y;
  for (const auto& [name, fill] : legend) {
    std::string label = name.size() <= max_chars ? name : name.substr(0, max_chars - 3) + "...";
    const double w = kSwatchW + kGlyphW * static_cast<double>(label.size());
    if (lx > 20 && lx + w > 20 + line_w) {
      lx = 20;
      ly += 20;
    }
    L.items.push_back({std::move(label), fill, lx, ly});
    lx += w + kItemGap;
  }
  L.height = ly + 20 + 16;
}

// The document's head: size, the hatch pattern, the plot's clip path, the
// background.
void DrawHead(const Layout& L, std::string& o) {
  Put(o, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  Put(o,
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
      L.width, Num(L.height), L.width, Num(L.height));
  Put(o,
      "<defs>\n<pattern id=\"uncovered\" patternUnits=\"userSpaceOnUse\" width=\"6\" "
      "height=\"6\" patternTransform=\"rotate(45)\">\n"
      "<rect width=\"6\" height=\"6\" fill=\"#ffffff\" fill-opacity=\"0.25\"/>\n"
      "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#d62728\" stroke-width=\"3\"/>\n"
      "</pattern>\n<clipPath id=\"plot\"><rect x=\"{}\" y=\"0\" width=\"{}\" height=\"{}\"/>"
      "</clipPath>\n</defs>\n",
      kLeft, Num(L.plot_w), Num(L.height));
  Put(o, "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
}

// Title and summary line.
void DrawTitle(const PlotOptions& opt, const Report& rep, const Layout& L, std::string& o) {
  const Breakdown& b = rep.overall;
  Put(o, "<text x=\"{}\" y=\"22\" font-size=\"16\" font-weight=\"bold\">{}</text>\n", kLeft,
      Esc(opt.title.empty() ? "mc2 timeline" : opt.title));
  Put(o,
      "<text x=\"{}\" y=\"42\" fill=\"#333333\">{} rank(s), window {}{}; mean per rank: "
      "compute {:.1f}%, comm {:.1f}%, overlapped {:.1f}%, uncovered comm {:.1f}% ({}), "
      "free {:.1f}% ({})</text>\n",
      kLeft, L.ranks.size(), Dur(L.hi - L.lo),
      opt.step ? fmt::format(" (step {})", *opt.step) : std::string(), b.Pct(b.compute_ns),
      b.Pct(b.comm_ns), b.Pct(b.overlapped_ns), b.Pct(b.uncovered_ns),
      VerdictName(b.UncoveredVerdict()), b.Pct(b.free_ns), VerdictName(b.FreeVerdict()));
}

// Grid lines, the time axis with its ticks and unit.
void DrawAxis(const Layout& L, std::string& o) {
  const int64_t lo = L.lo, hi = L.hi, origin = L.origin;
  Unit unit = PickUnit(hi - lo);
  int64_t step = TickStep(hi - lo, std::max(4, static_cast<int>(L.plot_w / 110)));
  int64_t first_tick = ((lo - origin) + step - 1) / step * step;  // relative to the origin
  if (lo - origin < 0) first_tick = (lo - origin) / step * step;
  Put(o, "<g stroke=\"#e6e6e6\" stroke-width=\"1\">\n");
  for (int64_t tk = first_tick; origin + tk <= hi; tk += step)
    Put(o, "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\n", Num(L.X(origin + tk)), kTop - 4,
        Num(L.axis_y));
  Put(o, "</g>\n");
  Put(o, "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333333\"/>\n", kLeft,
      Num(L.axis_y), Num(kLeft + L.plot_w), Num(L.axis_y));
  for (int64_t tk = first_tick; origin + tk <= hi; tk += step) {
    double x = L.X(origin + tk);
    Put(o, "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#333333\"/>\n", Num(x),
        Num(L.axis_y), Num(L.axis_y + 5));
    Put(o, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", Num(x), Num(L.axis_y + 18),
        Num(tk / unit.ns));
  }
  Put(o,
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#333333\">time since trace start "
      "({})</text>\n",
      Num(kLeft + L.plot_w / 2), Num(L.axis_y + 36), unit.name);
}

// Lane backgrounds and labels.
void DrawLanes(const Layout& L, std::string& o) {
  for (const Lane& l : L.lanes) {
    Put(o, "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#f7f7f7\"/>\n", kLeft,
        Num(l.y), Num(L.plot_w), kLaneH);
    Put(o, "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">rank {} {}</text>\n", kLeft - 8,
        Num(l.y + kLaneH / 2.0 + 4), l.rank,
        l.cat == Category::kComm ? "communication" : CategoryName(l.cat));
  }
}

// The spans of one lane (sorted by start) as boxes: same-name neighbours
// closer than a pixel coalesced, long boxes first so that short ones stay
// visible on top.
std::vector<Box> Coalesce(std::vector<const SpanRecord*>& v, int64_t px_ns) {
  std::sort(v.begin(), v.end(),
            [](const SpanRecord* a, const SpanRecord* b) { return a->start_ns < b->start_ns; });
  std::map<std::string, Box> open;  // per name: the box being extended
  std::vector<Box> boxes;
  for (const SpanRecord* s : v) {
    auto it = open.find(s->name);
    // Only slivers are merged: spans wide enough to see keep their edges.
    bool sliver = it != open.end() && (it->second.hi - it->second.lo < 2 * px_ns ||
                                       s->end_ns - s->start_ns < 2 * px_ns);
    if (sliver && s->start_ns <= it->second.hi + px_ns) {
      it->second.hi = std::max(it->second.hi, s->end_ns);
      it->second.count += 1;
      continue;
    }
    if (it != open.end()) boxes.push_back(it->second);
    open[s->name] = Box{s->start_ns, s->end_ns, s, 1};
  }
  for (auto& [name, box] : open) boxes.push_back(box);
  std::stable_sort(boxes.begin(), boxes.end(),
                   [](const Box& a, const Box& b) { return a.hi - a.lo > b.hi - b.lo; });
  return boxes;
}

// The spans, as coloured boxes with a tooltip each.
void DrawSpans(const TraceData& t, const Layout& L, int64_t px_ns, std::string& o) {
  std::map<std::pair<int, Category>, std::vector<const SpanRecord*>> by_lane;
  for (const auto& s : t.spans)
    if (s.end_ns >= L.lo && s.start_ns <= L.hi) by_lane[{s.rank, s.cat}].push_back(&s);
  for (const Lane& l : L.lanes) {
    for (const Box& bx : Coalesce(by_lane[{l.rank, l.cat}], px_ns)) {
      const SpanRecord* s = bx.first;
      double x0 = L.X(std::max(bx.lo, L.lo)), x1 = L.X(std::min(bx.hi, L.hi));
      std::string tip = bx.count > 1
                            ? fmt::format("{} x{} ({} spans merged at this zoom), {}", s->name,
                                          bx.count, bx.count, Dur(bx.hi - bx.lo))
                            : fmt::format("{}{}, {}{}{}", s->name,
                                          s->algorithm.empty() ? "" : " [" + s->algorithm + "]",
                                          Dur(s->end_ns - s->start_ns),
                                          s->bytes ? fmt::format(", {} bytes", s->bytes) : "",
                                          s->step >= 0 ? fmt::format(", step {}", s->step) : "");
      Put(o,
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"#ffffff\" "
          "stroke-width=\"0.3\"><title>{}</title></rect>\n",
          Num(x0), Num(l.y + 2), Num(std::max(0.6, x1 - x0)), kLaneH - 4, L.colour.at(s->name),
          Esc(tip));
    }
  }
}

// Uncovered communication: comm that no compute of the same rank hides,
// hatched and outlined over the communication lanes.
void DrawUncovered(const TraceData& t, const Layout& L, int64_t px_ns, std::string& o) {
  std::map<int, Intervals> comp, comm;
  for (const auto& s : t.spans) {
    if (s.cat == Category::kCompute) comp[s.rank].push_back({s.start_ns, s.end_ns});
    if (s.cat == Category::kComm) comm[s.rank].push_back({s.start_ns, s.end_ns});
  }
  for (const Lane& l : L.lanes) {
    if (l.cat != Category::kComm) continue;
    Intervals unc = Clip(Subtract(Union(comm[l.rank]), Union(comp[l.rank])), L.lo, L.hi);
    // Merge pieces closer than a pixel so the outline stays readable.
    Intervals merged;
    for (const Interval& x : unc) {
      if (!merged.empty() && x.lo <= merged.back().hi + px_ns)
        merged.back().hi = x.hi;
      else
        merged.push_back(x);
    }
    for (const Interval& x : merged) {
      double x0 = L.X(x.lo), x1 = L.X(x.hi);
      Put(o,
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"url(#uncovered)\" "
          "stroke=\"#d62728\" stroke-width=\"1.2\"><title>uncovered communication, {}</title>"
          "</rect>\n",
          Num(x0), Num(l.y + 1), Num(std::max(1.0, x1 - x0)), kLaneH - 2, Dur(x.hi - x.lo));
    }
  }
}

// Step markers as dashed lines across each rank's band.
void DrawStepMarkers(const TraceData& t, const Layout& L, std::string& o) {
  for (const StepMark& m : t.marks) {
    auto band = L.rank_band.find(m.rank);
    if (m.t_ns < L.lo || m.t_ns > L.hi || band == L.rank_band.end()) continue;
    auto [y0, y1] = band->second;
    double x = L.X(m.t_ns);
    Put(o,
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#222222\" "
        "stroke-dasharray=\"3,2\" stroke-width=\"1\"><title>{3}</title></line>\n",
        Num(x), Num(y0 - 3), Num(y1 + 3),
        m.end ? std::string("step end") : fmt::format("step {}", m.step));
  }
}

// Step labels above the lanes, from the first rank that marked steps, and
// the lines that separate the ranks.
void DrawStepLabelsAndSeparators(const TraceData& t, const Layout& L, std::string& o) {
  for (const auto& [rank, band] : L.rank_band) {
    bool labelled = false;
    for (const StepMark& m : t.marks) {
      if (m.rank != rank || m.end || m.t_ns < L.lo || m.t_ns > L.hi) continue;
      Put(o, "<text x=\"{}\" y=\"{}\" font-size=\"10\" fill=\"#222222\">step {}</text>\n",
          Num(L.X(m.t_ns) + 3), kTop - 6, m.step);
      labelled = true;
    }
    if (labelled) break;
  }
  for (const auto& [rank, band] : L.rank_band)
    Put(o, "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#bbbbbb\"/>\n", 8,
        Num(band.second + kRankGap / 2.0), L.width - kRight, Num(band.second + kRankGap / 2.0));
}

void DrawLegend(const Layout& L, std::string& o) {
  Put(o, "<text x=\"20\" y=\"{}\" font-weight=\"bold\">legend</text>\n", Num(L.legend_y - 6));
  for (size_t i = 0; i < L.items.size(); ++i) {
    const LegendItem& it = L.items[i];
    const bool hatch = i + 1 == L.items.size();  // the uncovered-communication swatch
    Put(o, "<rect x=\"{}\" y=\"{}\" width=\"18\" height=\"12\" fill=\"{}\" stroke=\"{}\"/>\n",
        Num(it.x), Num(it.y), it.fill, hatch ? "#d62728" : "none");
    Put(o, "<text x=\"{}\" y=\"{}\">{}</text>\n", Num(it.x + kSwatchW), Num(it.y + 10),
        Esc(it.label));
  }
}

}  // namespace

std::string RenderTimelineSvg(const TraceData& t, const PlotOptions& opt) {
  const Report rep = Analyze(t);
  Layout L;
  PlaceWindow(t, opt, rep, L);
  PickColours(t, L);
  PlaceLanes(t, L);
  PlaceLegend(L);
  const int64_t px_ns = std::max<int64_t>(1, static_cast<int64_t>(1.0 / L.scale));

  std::string o;
  DrawHead(L, o);
  DrawTitle(opt, rep, L, o);
  DrawAxis(L, o);
  DrawLanes(L, o);
  Put(o, "<g clip-path=\"url(#plot)\">\n");
  DrawSpans(t, L, px_ns, o);
  DrawUncovered(t, L, px_ns, o);
  DrawStepMarkers(t, L, o);
  Put(o, "</g>\n");
  DrawStepLabelsAndSeparators(t, L, o);
  DrawLegend(L, o);
  Put(o, "</svg>\n");
  return o;
}

}  // namespace mc2::trace
