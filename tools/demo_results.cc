#include "demo_results.h"

#include <CLI/CLI.hpp>
#include <fstream>

#include "core/link_config.h"
#include "demo_job.h"
#include "mc2/trace.h"
#include "output_paths.h"
#include "trace_tools/timeline_svg.h"

namespace mc2::tools {

namespace fs = std::filesystem;

void CheckLinkOption(const std::string& link) {
  if (link != "auto" && link != "none" && link != "off") core::ParseLinkConfig(link, "--link");
}

std::string LinkTitle(const std::string& spec) {
  return spec.empty() ? "raw shm" : "emulated link " + spec;
}

void AddRunOutputs(std::vector<std::string>& names, std::initializer_list<const char*> runs) {
  for (const char* run : runs) {
    names.push_back(fmt::format("trace-{}.json", run));
    names.push_back(fmt::format("timeline-{}.svg", run));
    names.push_back(fmt::format("{}/", run));
  }
}

void AddCalibrationOutputs(std::vector<std::string>& names, const char* trace_dir) {
  for (const char* run : {"raw", "paced"}) {
    names.push_back(fmt::format("calibrate/{}/{}/", run, trace_dir));
    names.push_back(fmt::format("calibrate/{}/results.json", run));
    names.push_back(fmt::format("calibrate/{}/", run));
  }
  names.push_back("calibrate/");
}

fs::path PrepareDemoOutput(const std::string& out, const std::string& json_path,
                           const std::vector<std::string>& own) {
  if (!json_path.empty()) CheckWritableFile(json_path, "--json");
  PrepareOutputDir(out, "--output");
  const fs::path dir = fs::absolute(out);
  RemoveOwnOutputs(dir.string(), own);
  return dir;
}

RunTrace ExportRunTrace(const std::string& trace_dir, const fs::path& out,
                        const std::string& name, const std::string& title, bool last_step_only) {
  RunTrace t;
  t.data = trace::LoadTrace(trace_dir);
  t.report = trace::Analyze(t.data);
  t.trace_json = (out / fmt::format("trace-{}.json", name)).string();
  trace::WriteChromeTrace(t.trace_json, t.data);
  trace::PlotOptions po;
  if (last_step_only && !t.report.steps.empty()) po.step = t.report.steps.back().step;
  po.title = title;
  t.svg = (out / fmt::format("timeline-{}.svg", name)).string();
  std::ofstream(t.svg) << trace::RenderTimelineSvg(t.data, po);
  return t;
}

void FinishDemo(std::chrono::steady_clock::time_point start, const std::string& json_path,
                const nlohmann::json& j, bool identical, const char* command) {
  fmt::print("finished in {:.0f} s\n",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  if (!json_path.empty()) WriteJsonOption(json_path, j, command);
  if (!identical) throw CLI::RuntimeError(1);
}

void PrintRound(bool root, int round, int rounds, int warmup) {
  if (root)
    fmt::print(stderr, "  round {}/{}{}\n", round + 1, rounds, round < warmup ? " (warm-up)" : "");
}

void StopTrace() {
  trace::Flush();
  trace::Disable();
}

}  // namespace mc2::tools
