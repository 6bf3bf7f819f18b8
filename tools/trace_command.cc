// `mc2 trace merge|report|plot`: the tools over the traces a program writes
// with MC2_TRACE=DIR (<mc2/trace_file.h>, tools/lib/trace_tools/, docs/tracing.md).
#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "core/env.h"
#include "mc2/error.h"
#include "mc2/trace_file.h"
#include "output_paths.h"
#include "trace_tools/analysis.h"
#include "trace_tools/timeline_svg.h"

namespace mc2::tools {
namespace {

namespace fs = std::filesystem;

// Writes `text` to `path` ("-" = stdout); exits 1 with a message on failure.
void WriteOut(const std::string& what, const std::string& path, const std::string& text) {
  if (path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    fmt::print(stderr, "mc2 trace {}: cannot write {}: {}\n", what, path, std::strerror(errno));
    throw CLI::RuntimeError(1);
  }
}

// Runs `body`, turning an mc2::Error into a message and exit status 1.
template <typename F>
void Guard(const std::string& what, F&& body) {
  try {
    body();
  } catch (const Error& e) {
    fmt::print(stderr, "mc2 trace {}: {}\n", what, e.message());
    throw CLI::RuntimeError(1);
  }
}

// A window bound as core::ParseDuration reads it (a bare number is
// seconds, as in MC2_TIMEOUT; "12ms", "250us"), or 0 -> nanoseconds.
std::optional<int64_t> ParseTime(const std::string& s, const std::string& what) {
  if (s.empty()) return std::nullopt;
  double v = 0;
  std::string_view unit;
  const std::string_view t = core::TrimSpace(s);
  if (core::SplitNumber(t, &v, &unit) && v == 0) return 0;
  try {
    return core::ParseDuration(t, what).count();
  } catch (const Error& e) {
    fmt::print(stderr, "mc2 trace plot: {}\n", e.message());
    throw CLI::RuntimeError(2);
  }
}

// Fails before any work when the output file cannot be written.
void CheckOutput(const std::string& what, const std::string& path, const char* flag = "--output") {
  try {
    CheckWritableFile(path, flag);
  } catch (const Error& e) {
    fmt::print(stderr, "mc2 trace {}: {}\n", what, e.message());
    throw CLI::RuntimeError(1);
  }
}

// `mc2 trace plot` without -o: this file in the trace directory, or beside
// a trace file.
constexpr const char* kDefaultPlot = "timeline.svg";
// The comment that marks an SVG as written by `mc2 trace plot`: the default
// output replaces only a file that carries it.
constexpr std::string_view kPlotMark = "<!-- written by mc2 trace plot -->";

std::string DefaultPlotPath(const std::string& input) {
  std::error_code ec;
  const fs::path in(input);
  const fs::path dir = fs::is_directory(in, ec) ? in : in.parent_path();
  return (dir / kDefaultPlot).string();
}

// The SVG with kPlotMark after its XML declaration.
std::string MarkSvg(std::string svg) {
  const size_t eol = svg.rfind("<?xml", 0) == 0 ? svg.find('\n') : std::string::npos;
  const size_t at = eol == std::string::npos ? 0 : eol + 1;
  svg.insert(at, std::string(kPlotMark) + "\n");
  return svg;
}

// The default output may replace only a file that `mc2 trace plot` wrote
// (output_paths.h); any other file there is left alone, with a message.
void CheckDefaultPlot(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  std::ifstream in(path, std::ios::binary);
  std::string head(256, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  if (head.find(kPlotMark) != std::string::npos) return;
  fmt::print(stderr,
             "mc2 trace plot: {} exists and was not written by mc2 trace plot; it is left "
             "alone: name the output with -o FILE (-o {} replaces it)\n",
             path, path);
  throw CLI::RuntimeError(2);
}

}  // namespace

void RegisterTrace(CLI::App& app) {
  CLI::App* trace =
      app.add_subcommand("trace", "Merge, analyse and plot the traces written with MC2_TRACE=DIR");
  trace->require_subcommand(1);

  struct State {
    std::string input;
    std::string output;
    std::string json;  // report: --json FILE ("-": standard output)
    bool check = false;
    int width = 1400;
    int64_t step = -1;
    std::string from, to, title;
  };
  auto st = std::make_shared<State>();

  CLI::App* merge = trace->add_subcommand(
      "merge", "Merge DIR/rank-*.trace.json into one Chrome trace with aligned clocks");
  merge->add_option("dir", st->input, "Trace directory (MC2_TRACE)")->required();
  merge->add_option("-o,--output", st->output, "Merged trace file (Perfetto, chrome://tracing)")
      ->required();
  merge->callback([st] {
    CheckOutput("merge", st->output);
    Guard("merge", [&] {
      trace::TraceData t = trace::LoadTrace(st->input, /*align=*/true);
      if (st->output == "-") {
        WriteOut("merge", "-", trace::ToChromeJson(t));
        return;
      }
      trace::WriteChromeTrace(st->output, t);
      fmt::print("mc2 trace merge: {} rank(s), {} spans -> {}\n", t.ranks.size(), t.spans.size(),
                 st->output);
    });
  });

  CLI::App* report = trace->add_subcommand(
      "report", "Compute, communication, overlap, uncovered communication and free time");
  report->add_option("trace", st->input, "Trace directory or trace file")->required();
  report->add_option("--json", st->json,
                     "Also write the report as JSON to this file (- for standard output, the "
                     "text then going to standard error)");
  report->add_flag("--check", st->check,
                   "Exit with status 1 when a health criterion FAILs (mean of ranks)");
  report->callback([st] {
    if (!st->json.empty()) CheckOutput("report", st->json, "--json");
    trace::Report r;
    Guard("report", [&] {
      trace::TraceData t = trace::LoadTrace(st->input);
      r = trace::Analyze(t);
      ReserveStdoutForJson(st->json);
      WriteOut("report", "-", trace::FormatReport(r, st->input));
      if (!st->json.empty()) {
        const std::string err = WriteOutputFile(st->json, trace::ReportToJson(r).dump(2) + "\n");
        if (!err.empty())
          throw Error(ErrorCode::kInvalidArgument,
                      fmt::format("cannot write --json {}: {}", st->json, err));
      }
    });
    if (st->check && (r.overall.UncoveredVerdict() == trace::Verdict::kFail ||
                      r.overall.FreeVerdict() == trace::Verdict::kFail))
      throw CLI::RuntimeError(1);
  });

  CLI::App* plot =
      trace->add_subcommand("plot",
                            "Draw the timeline as SVG: a lane per rank and category, uncovered "
                            "communication hatched in red");
  plot->add_option("trace", st->input, "Trace directory or trace file")->required();
  plot->add_option("-o,--output", st->output,
                   fmt::format("SVG file to write ('-' = stdout; default: {} in the trace "
                               "directory, or beside the trace file)",
                               kDefaultPlot));
  plot->add_option("--width", st->width, "Width in pixels")
      ->capture_default_str()
      ->check(CLI::Range(200, 100000));
  plot->add_option("--step", st->step, "Plot only this marked step");
  plot->add_option(
      "--from", st->from,
      "Window start since the trace start: 12ms, 250us, 1.5s (a bare number is seconds)");
  plot->add_option("--to", st->to, "Window end since the trace start (as --from)");
  plot->add_option("--title", st->title, "Title (default: mc2 timeline)");
  plot->callback([st] {
    trace::PlotOptions o;
    o.width = st->width;
    if (st->step >= 0) o.step = st->step;
    o.from_ns = ParseTime(st->from, "--from");
    o.to_ns = ParseTime(st->to, "--to");
    o.title = st->title;
    const bool named = !st->output.empty();
    const std::string path = named ? st->output : DefaultPlotPath(st->input);
    if (!named) CheckDefaultPlot(path);
    CheckOutput("plot", path);
    Guard("plot", [&] {
      trace::TraceData t = trace::LoadTrace(st->input);
      WriteOut("plot", path, MarkSvg(trace::RenderTimelineSvg(t, o)));
    });
    if (!named) fmt::print("mc2 trace plot: {}\n", path);
  });
}

}  // namespace mc2::tools
