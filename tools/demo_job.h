// What the modes of `mc2 demo` (training, infer, pp, cp, fsdp) share:
// starting the demo's ranks as one local job (its argv), the results the
// job leaves and the --json file, the emulated link's calibration and the
// median of a series.
#ifndef MC2_TOOLS_DEMO_JOB_H_
#define MC2_TOOLS_DEMO_JOB_H_

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <CLI/CLI.hpp>

#include "trace_tools/analysis.h"

#include "mc2/fused_ops.h"

namespace mc2::tools {

// A demo's exit status for bad usage.
inline constexpr int kExitUsageDemo = 2;

// Prints "COMMAND: message" and ends the command with kExitUsageDemo.
[[noreturn]] void DemoUsage(const char* command, const std::string& message);

// --pipelines: a comma-separated list of serial, chunked, fused, auto,
// each at most once; serial is put first if missing (the baseline).
std::vector<Pipeline> ParsePipelines(const std::string& text, const char* command);
// "serial,fused,..." as the ranks' --pipelines.
std::string PipelineList(const std::vector<Pipeline>& pipelines);

// The link a demo runs over, from its --link option: "auto" is
// `calibrate()`, "none" / "off" is none (empty); anything else is a spec.
// `label` describes it for the user; `calibrated_what` says what the
// calibration equals to comm_ratio x compute (e.g. "communication per
// serial step").
struct DemoLink {
  std::string spec, label;
};
DemoLink ResolveLink(const std::string& option, const std::function<std::string()>& calibrate,
                     const char* calibrated_what, double comm_ratio);

// LaunchDemoJob, then the JSON it wrote to `results`; a failed job prints
// "COMMAND: the JOB job failed" and ends the command with its status.
nlohmann::json RunDemoJob(int nranks, std::vector<std::string> argv, const std::string& link,
                          const std::string& results, const char* command, const char* job);

// Runs `argv` as `nranks` local ranks (512 MiB of heap each, output not
// prefixed), over the emulated `link` (empty: none), in deterministic mode
// (the demos compare results bit for bit across pipelines), without
// MC2_TRACE (each run traces into a directory of its own). Returns the
// job's exit status.
int LaunchDemoJob(int nranks, std::vector<std::string> argv, const std::string& link);

// The JSON file the job wrote; kSystem naming `command` if it wrote none.
nlohmann::json ReadJobJson(const std::string& path, const char* command);

// What one traced serial calibration run measured, per rank: bytes sent
// by its collectives, and the compute and communication time of the phase
// the calibration is for.
struct LinkSample {
  double bytes = 0, compute_s = 0, comm_s = 0;
};

// One traced serial run for the calibration, into `dir` (created):
// `launch(dir, results)` starts it and returns the job's status (a failed
// job ends the command with that status, as CLI::RuntimeError). Returns the
// report of the trace it wrote under dir/serial.
trace::Report CalibrationRun(
    const std::filesystem::path& dir,
    const std::function<int(const std::string& dir, const std::string& results)>& launch);

// The bytes a rank's collectives moved in a traced run (the mean over
// ranks).
double CommBytesPerRank(const trace::Report& r);

// The emulated link (a MC2_LINK spec, 5 us latency) at which the measured
// phase's communication takes `comm_ratio` times its compute. Two runs of
// `measure(link, name)`: without emulation (the bytes a rank sends over a
// collective of `n` ranks, of which it sends (n-1)/n, and the compute give
// a first guess), then at the guessed bandwidth (the measured
// communication, latencies and skew included, corrects it). kInvalidArgument
// naming `command` when the first run gives no bandwidth.
std::string CalibrateLink(double comm_ratio, int n,
                          const std::function<LinkSample(const std::string&, const char*)>& measure,
                          const char* command);

// The argv of a demo's rank job: this executable, "demo", the mode
// (`mode` null: the training demo), "--rank-job", "--results RESULTS",
// "--output OUT", "--iters ITERS", "--warmup WARMUP", then what Add appends.
class JobArgv {
 public:
  JobArgv(const char* mode, const std::string& results, const std::string& out, int iters,
          int warmup);
  void Add(const char* flag, std::string value);
  void Add(const char* flag);
  std::vector<std::string> Take() { return std::move(v_); }

 private:
  std::vector<std::string> v_;
};

// Rank 0 of a rank job writes what it measured to `path` for the
// conductor; on failure prints "COMMAND: cannot write PATH" and returns the
// job's exit status 1 (0 on success).
int WriteJobResults(const std::string& path, const nlohmann::json& results, const char* command);

// --json FILE: writes `j` there; on failure prints "COMMAND: cannot write
// --json FILE: WHY" and ends the command with exit status 1.
void WriteJsonOption(const std::string& path, const nlohmann::json& j, const char* command);

// What every demo mode's command line ends with: -o/--output DIR and --json FILE
// (into `out` and `json_path`), the internal --rank-job and --results
// (into `rank_job` and `results`), and the callback. Inside the mode's
// rank job (only under `mc2 run`, else a usage error) the callback runs
// `job` and ends the command with its status when not 0; otherwise it runs
// `conduct`; neither runs when one of the command's own subcommands ran
// (that subcommand did the work). An mc2::Error from either is printed as "COMMAND: ..." and
// ends the command with kExitUsageDemo (invalid argument: the message
// only) or 1.
struct DemoEntry {
  std::string* out;
  std::string* json_path;
  bool* rank_job;
  std::string* results;
  std::function<int()> job;
  std::function<void()> conduct;
};
void AddDemoEntry(CLI::App* cmd, const char* command, DemoEntry entry);

// The median (0 for none).
double Median(std::vector<double> v);

}  // namespace mc2::tools

#endif  // MC2_TOOLS_DEMO_JOB_H_
