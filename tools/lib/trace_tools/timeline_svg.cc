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

}  // namespace

std::string RenderTimelineSvg(const TraceData& t, const PlotOptions& opt) {
  // The window.
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
  Report rep = Analyze(t);
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

  // Geometry.
  const int width = std::max(400, opt.width);
  const int left = 150, right = 24, top = 64, lane_h = 22, lane_gap = 4, rank_gap = 14;
  const double plot_w = width - left - right;
  const double scale = plot_w / static_cast<double>(hi - lo);  // px per ns
  auto X = [&](int64_t ns) { return left + (ns - lo) * scale; };

  // Colours: operator names by total time, most expensive first.
  std::map<std::string, int64_t> time_by_name;
  for (const auto& s : t.spans) time_by_name[s.name] += s.end_ns - s.start_ns;
  std::vector<std::pair<int64_t, std::string>> order;
  for (const auto& [name, ns] : time_by_name) order.push_back({-ns, name});
  std::sort(order.begin(), order.end());
  std::map<std::string, const char*> colour;
  for (size_t i = 0; i < order.size(); ++i)
    colour[order[i].second] = i < static_cast<size_t>(kPaletteSize) ? kPalette[i] : kOther;

  // Lanes.
  struct Lane {
    int rank;
    Category cat;
    double y;
  };
  std::vector<Lane> lanes;
  std::map<int, std::set<Category>> cats;
  std::set<int> ranks;
  for (const auto& [rank, info] : t.ranks) ranks.insert(rank);
  for (const auto& s : t.spans) {
    ranks.insert(s.rank);
    cats[s.rank].insert(s.cat);
  }
  double y = top;
  std::map<int, std::pair<double, double>> rank_band;  // rank -> [y0, y1]
  for (int rank : ranks) {
    double y0 = y;
    for (Category c : {Category::kCompute, Category::kComm, Category::kWait, Category::kHost}) {
      bool always = c == Category::kCompute || c == Category::kComm;
      if (!always && !cats[rank].count(c)) continue;
      lanes.push_back({rank, c, y});
      y += lane_h + lane_gap;
    }
    rank_band[rank] = {y0, y - lane_gap};
    y += rank_gap;
  }
  const double axis_y = y + 4;

  // Legend layout (after the axis).
  std::vector<std::pair<std::string, const char*>> legend;
  for (size_t i = 0; i < order.size() && i < static_cast<size_t>(kPaletteSize); ++i)
    legend.push_back({order[i].second, kPalette[i]});
  if (order.size() > static_cast<size_t>(kPaletteSize)) legend.push_back({"other", kOther});
  legend.push_back({"uncovered communication", "url(#uncovered)"});
  const double legend_y = axis_y + 48;
  // Items flow left to right and wrap, each as wide as its label (at a
  // generous estimate of the font's glyph width, so that labels never run
  // into each other); a label wider than the whole line is shortened.
  constexpr double kGlyphW = 7.5, kSwatchW = 24, kItemGap = 18;
  const double line_w = width - 40;
  const size_t max_chars = std::max<size_t>(8, static_cast<size_t>((line_w - kSwatchW) / kGlyphW));
  struct LegendItem {
    std::string label;
    const char* fill;
    double x, y;
  };
  std::vector<LegendItem> items;
  double lx = 20, ly = legend_y;
  for (const auto& [name, fill] : legend) {
    std::string label = name.size() <= max_chars ? name : name.substr(0, max_chars - 3) + "...";
    const double w = kSwatchW + kGlyphW * static_cast<double>(label.size());
    if (lx > 20 && lx + w > 20 + line_w) {
      lx = 20;
      ly += 20;
    }
    items.push_back({std::move(label), fill, lx, ly});
    lx += w + kItemGap;
  }
  const double height = ly + 20 + 16;

  std::string o;
  auto put = [&]<typename... T>(fmt::format_string<T...> f, T&&... args) {
    fmt::format_to(std::back_inserter(o), f, std::forward<T>(args)...);
  };
  put("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  put("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
      width, Num(height), width, Num(height));
  put("<defs>\n<pattern id=\"uncovered\" patternUnits=\"userSpaceOnUse\" width=\"6\" "
      "height=\"6\" patternTransform=\"rotate(45)\">\n"
      "<rect width=\"6\" height=\"6\" fill=\"#ffffff\" fill-opacity=\"0.25\"/>\n"
      "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#d62728\" stroke-width=\"3\"/>\n"
      "</pattern>\n<clipPath id=\"plot\"><rect x=\"{}\" y=\"0\" width=\"{}\" height=\"{}\"/>"
      "</clipPath>\n</defs>\n",
      left, Num(plot_w), Num(height));
  put("<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");

  // Title and summary.
  const Breakdown& b = rep.overall;
  put("<text x=\"{}\" y=\"22\" font-size=\"16\" font-weight=\"bold\">{}</text>\n", left,
      Esc(opt.title.empty() ? "mc2 timeline" : opt.title));
  put("<text x=\"{}\" y=\"42\" fill=\"#333333\">{} rank(s), window {}{}; mean per rank: "
      "compute {:.1f}%, comm {:.1f}%, overlapped {:.1f}%, uncovered comm {:.1f}% ({}), "
      "free {:.1f}% ({})</text>\n",
      left, ranks.size(), Dur(hi - lo),
      opt.step ? fmt::format(" (step {})", *opt.step) : std::string(), b.Pct(b.compute_ns),
      b.Pct(b.comm_ns), b.Pct(b.overlapped_ns), b.Pct(b.uncovered_ns),
      VerdictName(b.UncoveredVerdict()), b.Pct(b.free_ns), VerdictName(b.FreeVerdict()));

  // Grid and axis.
  Unit unit = PickUnit(hi - lo);
  int64_t step = TickStep(hi - lo, std::max(4, static_cast<int>(plot_w / 110)));
  int64_t first_tick = ((lo - origin) + step - 1) / step * step;  // relative to the origin
  if (lo - origin < 0) first_tick = (lo - origin) / step * step;
  put("<g stroke=\"#e6e6e6\" stroke-width=\"1\">\n");
  for (int64_t tk = first_tick; origin + tk <= hi; tk += step)
    put("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\n", Num(X(origin + tk)), top - 4,
        Num(axis_y));
  put("</g>\n");
  put("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333333\"/>\n", left, Num(axis_y),
      Num(left + plot_w), Num(axis_y));
  for (int64_t tk = first_tick; origin + tk <= hi; tk += step) {
    double x = X(origin + tk);
    put("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#333333\"/>\n", Num(x),
        Num(axis_y), Num(axis_y + 5));
    put("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", Num(x), Num(axis_y + 18),
        Num(tk / unit.ns));
  }
  put("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#333333\">time since trace start "
      "({})</text>\n",
      Num(left + plot_w / 2), Num(axis_y + 36), unit.name);

  // Lane backgrounds and labels.
  for (const Lane& l : lanes) {
    put("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#f7f7f7\"/>\n", left, Num(l.y),
        Num(plot_w), lane_h);
    put("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">rank {} {}</text>\n", left - 8,
        Num(l.y + lane_h / 2.0 + 4), l.rank,
        l.cat == Category::kComm ? "communication" : CategoryName(l.cat));
  }

  // Spans, per lane: coalesce same-name neighbours closer than a pixel,
  // then draw long ones first so that short ones stay visible on top.
  std::map<std::pair<int, Category>, std::vector<const SpanRecord*>> by_lane;
  for (const auto& s : t.spans)
    if (s.end_ns >= lo && s.start_ns <= hi) by_lane[{s.rank, s.cat}].push_back(&s);
  const int64_t px_ns = std::max<int64_t>(1, static_cast<int64_t>(1.0 / scale));
  put("<g clip-path=\"url(#plot)\">\n");
  for (const Lane& l : lanes) {
    auto& v = by_lane[{l.rank, l.cat}];
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
    for (const Box& bx : boxes) {
      const SpanRecord* s = bx.first;
      double x0 = X(std::max(bx.lo, lo)), x1 = X(std::min(bx.hi, hi));
      std::string tip = bx.count > 1
                            ? fmt::format("{} x{} ({} spans merged at this zoom), {}", s->name,
                                          bx.count, bx.count, Dur(bx.hi - bx.lo))
                            : fmt::format("{}{}, {}{}{}", s->name,
                                          s->algorithm.empty() ? "" : " [" + s->algorithm + "]",
                                          Dur(s->end_ns - s->start_ns),
                                          s->bytes ? fmt::format(", {} bytes", s->bytes) : "",
                                          s->step >= 0 ? fmt::format(", step {}", s->step) : "");
      put("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"#ffffff\" "
          "stroke-width=\"0.3\"><title>{}</title></rect>\n",
          Num(x0), Num(l.y + 2), Num(std::max(0.6, x1 - x0)), lane_h - 4, colour[s->name],
          Esc(tip));
    }
  }

  // Uncovered communication: comm that no compute of the same rank hides.
  std::map<int, Intervals> comp, comm;
  for (const auto& s : t.spans) {
    if (s.cat == Category::kCompute) comp[s.rank].push_back({s.start_ns, s.end_ns});
    if (s.cat == Category::kComm) comm[s.rank].push_back({s.start_ns, s.end_ns});
  }
  for (const Lane& l : lanes) {
    if (l.cat != Category::kComm) continue;
    Intervals unc = Clip(Subtract(Union(comm[l.rank]), Union(comp[l.rank])), lo, hi);
    // Merge pieces closer than a pixel so the outline stays readable.
    Intervals merged;
    for (const Interval& x : unc) {
      if (!merged.empty() && x.lo <= merged.back().hi + px_ns)
        merged.back().hi = x.hi;
      else
        merged.push_back(x);
    }
    for (const Interval& x : merged) {
      double x0 = X(x.lo), x1 = X(x.hi);
      put("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"url(#uncovered)\" "
          "stroke=\"#d62728\" stroke-width=\"1.2\"><title>uncovered communication, {}</title>"
          "</rect>\n",
          Num(x0), Num(l.y + 1), Num(std::max(1.0, x1 - x0)), lane_h - 2, Dur(x.hi - x.lo));
    }
  }

  // Step markers.
  for (const StepMark& m : t.marks) {
    if (m.t_ns < lo || m.t_ns > hi || !rank_band.count(m.rank)) continue;
    auto [y0, y1] = rank_band[m.rank];
    double x = X(m.t_ns);
    put("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#222222\" "
        "stroke-dasharray=\"3,2\" stroke-width=\"1\"><title>{3}</title></line>\n",
        Num(x), Num(y0 - 3), Num(y1 + 3),
        m.end ? std::string("step end") : fmt::format("step {}", m.step));
  }
  put("</g>\n");
  // Step labels, above the lanes, from the first rank that marked steps.
  for (const auto& [rank, band] : rank_band) {
    bool labelled = false;
    for (const StepMark& m : t.marks) {
      if (m.rank != rank || m.end || m.t_ns < lo || m.t_ns > hi) continue;
      put("<text x=\"{}\" y=\"{}\" font-size=\"10\" fill=\"#222222\">step {}</text>\n",
          Num(X(m.t_ns) + 3), top - 6, m.step);
      labelled = true;
    }
    if (labelled) break;
  }
  // Rank separators.
  for (const auto& [rank, band] : rank_band)
    put("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#bbbbbb\"/>\n", 8,
        Num(band.second + rank_gap / 2.0), width - right, Num(band.second + rank_gap / 2.0));

  // Legend.
  put("<text x=\"20\" y=\"{}\" font-weight=\"bold\">legend</text>\n", Num(legend_y - 6));
  for (size_t i = 0; i < items.size(); ++i) {
    const LegendItem& it = items[i];
    const bool hatch = i + 1 == items.size();  // the uncovered-communication swatch
    put("<rect x=\"{}\" y=\"{}\" width=\"18\" height=\"12\" fill=\"{}\" stroke=\"{}\"/>\n",
        Num(it.x), Num(it.y), it.fill, hatch ? "#d62728" : "none");
    put("<text x=\"{}\" y=\"{}\">{}</text>\n", Num(it.x + kSwatchW), Num(it.y + 10), Esc(it.label));
  }
  put("</svg>\n");
  return o;
}

}  // namespace mc2::trace
