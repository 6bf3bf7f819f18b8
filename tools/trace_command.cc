// `mc2 trace merge|report|plot`: the tools over the traces a program writes
// with MC2_TRACE=DIR (src/trace/, docs/tracing.md).
#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "core/env.h"
#include "mc2/error.h"
#include "output_paths.h"
#include "trace/analysis.h"
#include "trace/timeline_svg.h"
#include "trace/trace_file.h"

namespace mc2::tools {
namespace {

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
void CheckOutput(const std::string& what, const std::string& path) {
  try {
    CheckWritableFile(path, "--output");
  } catch (const Error& e) {
    fmt::print(stderr, "mc2 trace {}: {}\n", what, e.message());
    throw CLI::RuntimeError(1);
  }
}

}  // namespace

void RegisterTrace(CLI::App& app) {
  CLI::App* trace =
      app.add_subcommand("trace", "Merge, analyse and plot the traces written with MC2_TRACE=DIR");
  trace->require_subcommand(1);

  struct State {
    std::string input;
    std::string output;
    bool json = false;
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
  report->add_flag("--json", st->json, "Print the report as JSON");
  report->add_flag("--check", st->check,
                   "Exit with status 1 when a health criterion FAILs (mean of ranks)");
  report->callback([st] {
    trace::Report r;
    Guard("report", [&] {
      trace::TraceData t = trace::LoadTrace(st->input);
      r = trace::Analyze(t);
      if (st->json)
        WriteOut("report", "-", trace::ReportToJson(r).dump(2) + "\n");
      else
        WriteOut("report", "-", trace::FormatReport(r, st->input));
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
  plot->add_option("-o,--output", st->output, "SVG file to write ('-' = stdout)")->required();
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
    CheckOutput("plot", st->output);
    Guard("plot", [&] {
      trace::TraceData t = trace::LoadTrace(st->input);
      WriteOut("plot", st->output, trace::RenderTimelineSvg(t, o));
    });
  });
}

}  // namespace mc2::tools
