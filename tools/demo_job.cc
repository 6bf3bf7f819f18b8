#include "demo_job.h"

#include <fmt/format.h>
#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "launcher.h"
#include "mc2/error.h"
#include "mc2/group.h"
#include "mc2/trace_file.h"
#include "output_paths.h"

namespace mc2::tools {

void DemoUsage(const char* command, const std::string& message) {
  fmt::print(stderr, "{}: {}\n", command, message);
  throw CLI::RuntimeError(kExitUsageDemo);
}

std::vector<Pipeline> ParsePipelines(const std::string& text, const char* command) {
  std::vector<Pipeline> out;
  std::stringstream in(text);
  for (std::string name; std::getline(in, name, ',');) {
    if (name.empty()) continue;
    auto p = ParsePipeline(name);
    if (!p)
      DemoUsage(command, fmt::format("--pipelines: unknown pipeline '{}': expected serial, "
                                     "chunked, fused or auto, comma-separated",
                                     name));
    if (std::find(out.begin(), out.end(), *p) != out.end())
      DemoUsage(command, fmt::format("--pipelines: '{}' is listed twice", name));
    out.push_back(*p);
  }
  if (out.empty()) DemoUsage(command, "--pipelines is empty");
  if (out.front() != Pipeline::kSerial) out.insert(out.begin(), Pipeline::kSerial);
  return out;
}

std::string PipelineList(const std::vector<Pipeline>& pipelines) {
  std::string names;
  for (Pipeline p : pipelines) names += fmt::format("{}{}", names.empty() ? "" : ",", PipelineName(p));
  return names;
}

DemoLink ResolveLink(const std::string& option, const std::function<std::string()>& calibrate,
                     const char* calibrated_what, double comm_ratio) {
  DemoLink l;
  if (option == "auto") {
    l.spec = calibrate();
    l.label = fmt::format("emulated link {} (calibrated: {} = {:.2f} x compute)", l.spec,
                          calibrated_what, comm_ratio);
  } else if (option == "none" || option == "off") {
    l.label = "raw shared memory (no link emulation)";
  } else {
    l.spec = option;
    l.label = "emulated link " + option;
  }
  return l;
}

nlohmann::json RunDemoJob(int nranks, std::vector<std::string> argv, const std::string& link,
                          const std::string& results, const char* command, const char* job) {
  int status = LaunchDemoJob(nranks, std::move(argv), link);
  if (status != 0) {
    fmt::print(stderr, "{}: the {} job failed (status {})\n", command, job, status);
    throw CLI::RuntimeError(status);
  }
  return ReadJobJson(results, command);
}

int LaunchDemoJob(int nranks, std::vector<std::string> argv, const std::string& link) {
  LaunchOptions lo;
  lo.nranks = nranks;
  lo.argv = std::move(argv);
  lo.prefix_output = false;
  lo.heap_bytes = size_t{512} << 20;
  if (link.empty())
    unsetenv("MC2_LINK");
  else
    setenv("MC2_LINK", link.c_str(), 1);
  setenv("MC2_DETERMINISTIC", "1", 1);
  unsetenv("MC2_TRACE");
  return RunLaunch(lo);
}

nlohmann::json ReadJobJson(const std::string& path, const char* command) {
  std::ifstream f(path);
  if (!f) throw Error(ErrorCode::kSystem, fmt::format("{}: the job left no {}", command, path));
  return nlohmann::json::parse(f);
}

trace::Report CalibrationRun(
    const std::filesystem::path& dir,
    const std::function<int(const std::string& dir, const std::string& results)>& launch) {
  std::filesystem::create_directories(dir);
  int status = launch(dir.string(), (dir / "results.json").string());
  if (status != 0) throw CLI::RuntimeError(status);
  return trace::Analyze(trace::LoadTrace((dir / "serial").string()));
}

double CommBytesPerRank(const trace::Report& r) {
  double bytes = 0;
  for (const auto& op : r.operators)
    if (op.cat == trace::Category::kComm) bytes += static_cast<double>(op.bytes);
  return bytes / static_cast<double>(std::max<size_t>(r.ranks.size(), 1));
}

std::string CalibrateLink(double comm_ratio, int n,
                          const std::function<LinkSample(const std::string&, const char*)>& measure,
                          const char* command) {
  // Whole MB/s, or KB/s below 10 MB/s (rounding must never make it 0).
  auto spec = [](double bw) {
    return bw >= 1e7 ? fmt::format("bw={:.0f}MB/s,lat=5us", bw / 1e6)
                     : fmt::format("bw={:.0f}KB/s,lat=5us", std::max(1.0, bw / 1e3));
  };
  fmt::print(stderr, "calibrating the emulated link (two short serial runs)...\n");
  const LinkSample raw = measure("", "raw");
  double bw = raw.bytes * (n - 1) / n / (comm_ratio * raw.compute_s);
  if (!(bw > 0) || !std::isfinite(bw))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: --link auto cannot calibrate: {:.0f} bytes per rank over "
                            "collectives of {} ranks give no bandwidth; give a link spec or none",
                            command, raw.bytes, n));
  const LinkSample paced = measure(spec(bw), "paced");
  if (paced.comm_s > 0) bw *= paced.comm_s / (comm_ratio * paced.compute_s);
  return spec(bw);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

JobArgv::JobArgv(const char* mode, const std::string& results, const std::string& out, int iters,
                 int warmup)
    : v_{SelfExe(), "demo"} {
  if (mode) v_.push_back(mode);
  v_.insert(v_.end(), {"--rank-job", "--results", results, "--output", out, "--iters",
                       std::to_string(iters), "--warmup", std::to_string(warmup)});
}

void JobArgv::Add(const char* flag, std::string value) {
  v_.push_back(flag);
  v_.push_back(std::move(value));
}

void JobArgv::Add(const char* flag) { v_.push_back(flag); }

int WriteJobResults(const std::string& path, const nlohmann::json& results, const char* command) {
  std::ofstream f(path);
  f << results.dump(1) << "\n";
  if (f) return 0;
  fmt::print(stderr, "{}: cannot write {}\n", command, path);
  return 1;
}

void WriteJsonOption(const std::string& path, const nlohmann::json& j, const char* command) {
  const std::string err = WriteOutputFile(path, j.dump(1) + "\n");
  if (err.empty()) return;
  fmt::print(stderr, "{}: cannot write --json {}: {}\n", command, path, err);
  throw CLI::RuntimeError(1);
}

void AddDemoEntry(CLI::App* cmd, const char* command, DemoEntry e) {
  cmd->add_option(
         "-o,--output", *e.out,
         fmt::format("Directory for traces, timelines and results: a new or empty one, or one an "
                     "earlier `{}` wrote (only the files it writes are replaced)",
                     command))
      ->capture_default_str();
  cmd->add_option("--json", *e.json_path,
                  "Also write the table to this JSON file (- for standard output)");
  cmd->add_flag("--rank-job", *e.rank_job)->group("");  // internal
  cmd->add_option("--results", *e.results)->group("");  // internal
  cmd->callback([cmd, command, e] {
    // A mode with modes of its own (`mc2 demo infer`, ...): the one that ran did the work.
    if (!cmd->get_subcommands().empty()) return;
    try {
      if (*e.rank_job) {
        if (!Group::LaunchedByMc2())
          DemoUsage(command, fmt::format("--rank-job is internal to `{}`", command));
        const int status = e.job();
        if (status != 0) throw CLI::RuntimeError(status);
        return;
      }
      ReserveStdoutForJson(*e.json_path);
      e.conduct();
    } catch (const Error& err) {
      const bool usage = err.code() == ErrorCode::kInvalidArgument;
      fmt::print(stderr, "{}: {}\n", command, usage ? err.message() : std::string(err.what()));
      throw CLI::RuntimeError(usage ? kExitUsageDemo : 1);
    }
  });
}

}  // namespace mc2::tools
