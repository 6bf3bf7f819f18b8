// What the conductors of the `mc2 demo` modes share around their runs:
// the --output directory made ready before any work, each run's trace
// exported (a Chrome trace and an SVG timeline), the side-by-side table,
// and the end (the elapsed time, the --json file, the exit status).
#ifndef MC2_TOOLS_DEMO_RESULTS_H_
#define MC2_TOOLS_DEMO_RESULTS_H_

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trace_tools/analysis.h"
#include "mc2/trace_file.h"

namespace mc2::tools {

// --link: accepts auto, none and off, and checks anything else as a link
// spec (kInvalidArgument naming --link).
void CheckLinkOption(const std::string& link);

// What a demo's timeline titles say of the link `spec` (empty: none).
std::string LinkTitle(const std::string& spec);

// Names for RemoveOwnOutputs (output_paths.h): trace-RUN.json,
// timeline-RUN.svg and the trace directory RUN/ of each run name.
void AddRunOutputs(std::vector<std::string>& names, std::initializer_list<const char*> runs);
// The two calibration runs' outputs (CalibrationRun, CalibrateLink), each
// under calibrate/raw/ and calibrate/paced/: its trace directory
// `trace_dir`/, its results.json, then the directories themselves.
void AddCalibrationOutputs(std::vector<std::string>& names, const char* trace_dir);

// Makes the demo's outputs ready before any work: the --json file must be
// writable (when given), the --output directory is prepared and the `own`
// outputs of an earlier run are removed from it. Returns its absolute path.
std::filesystem::path PrepareDemoOutput(const std::string& out, const std::string& json_path,
                                        const std::vector<std::string>& own);

// One run's trace, loaded from the directory its job traced into and
// analysed, and where it was exported.
struct RunTrace {
  trace::TraceData data;
  trace::Report report;
  std::string trace_json;  // out/trace-NAME.json
  std::string svg;         // out/timeline-NAME.svg
};

// Loads and analyses the trace in `trace_dir`, writes it to `out` as the
// Chrome trace trace-NAME.json and the SVG timeline timeline-NAME.svg
// titled `title` (last_step_only: the window of the last marked step).
RunTrace ExportRunTrace(const std::string& trace_dir, const std::filesystem::path& out,
                        const std::string& name, const std::string& title,
                        bool last_step_only = false);

// The runs side by side: a row is a label, then one cell per run.
template <class Run>
class RunTable {
 public:
  RunTable(const std::vector<Run>& runs, int label_width, int cell_width)
      : runs_(runs), label_width_(label_width), cell_width_(cell_width) {}

  // Prints the row; `cell(run)` gives a run's text.
  template <class Cell>
  void Row(const std::string& label, Cell cell) const {
    std::string line = fmt::format("{:<{}}", label, label_width_);
    for (const Run& r : runs_) line += fmt::format("{:>{}}", cell(r), cell_width_);
    fmt::print("{}\n", line);
  }

 private:
  const std::vector<Run>& runs_;
  int label_width_, cell_width_;
};

// The end of a demo's conductor: prints "finished in N s" (since `start`),
// writes `j` to --json `json_path` when given (WriteJsonOption), and ends
// the command with exit status 1 when the runs' results were not
// `identical`.
void FinishDemo(std::chrono::steady_clock::time_point start, const std::string& json_path,
                const nlohmann::json& j, bool identical, const char* command);

// The rank side's progress line on rank 0: "  round I/N" (warm-up marked).
void PrintRound(bool root, int round, int rounds, int warmup);

// Ends the trace of a traced step: flushes it and stops tracing.
void StopTrace();

}  // namespace mc2::tools

#endif  // MC2_TOOLS_DEMO_RESULTS_H_
