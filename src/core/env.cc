#include "core/env.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <thread>

#include "core/link_config.h"
#include "core/log.h"
#include "core/placement.h"
#include "mc2/error.h"

extern char** environ;

namespace mc2::core {
namespace {

[[noreturn]] void Bad(std::string_view what, std::string_view text, std::string_view form) {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("{}='{}' is invalid: expected {}", what, text, form));
}

std::string Lower(std::string_view s) {
  std::string r(s);
  for (auto& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

}  // namespace

std::string_view TrimSpace(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool SplitNumber(std::string_view s, double* value, std::string_view* unit) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return false;
  std::string num(s.substr(0, i));
  char* end = nullptr;
  *value = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(*value)) return false;
  *unit = TrimSpace(s.substr(i));
  return true;
}

size_t ParseBytes(std::string_view text, std::string_view what) {
  constexpr std::string_view kForm = "a byte count such as 1048576, 64K, 256M or 2G";
  double v;
  std::string_view unit;
  if (!SplitNumber(TrimSpace(text), &v, &unit)) Bad(what, text, kForm);
  std::string u = Lower(unit);
  double mult;
  if (u.empty() || u == "b") mult = 1;
  else if (u == "k" || u == "kb" || u == "kib") mult = 1024.0;
  else if (u == "m" || u == "mb" || u == "mib") mult = 1024.0 * 1024;
  else if (u == "g" || u == "gb" || u == "gib") mult = 1024.0 * 1024 * 1024;
  else if (u == "t" || u == "tb" || u == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else Bad(what, text, kForm);
  double bytes = v * mult;
  if (bytes > 9.0e18 || bytes != std::floor(bytes)) Bad(what, text, kForm);
  return static_cast<size_t>(bytes);
}

std::chrono::nanoseconds ParseDuration(std::string_view text, std::string_view what) {
  constexpr std::string_view kForm =
      "a positive duration such as 300 (seconds), 1.5s, 250ms, 10us or 5m";
  double v;
  std::string_view unit;
  if (!SplitNumber(TrimSpace(text), &v, &unit)) Bad(what, text, kForm);
  std::string u = Lower(unit);
  double ns;
  if (u.empty() || u == "s") ns = v * 1e9;
  else if (u == "ms") ns = v * 1e6;
  else if (u == "us") ns = v * 1e3;
  else if (u == "ns") ns = v;
  else if (u == "m" || u == "min") ns = v * 60e9;
  else if (u == "h") ns = v * 3600e9;
  else Bad(what, text, kForm);
  if (!(ns >= 1) || ns > 9.0e18) Bad(what, text, kForm);
  return std::chrono::nanoseconds(static_cast<int64_t>(ns));
}

bool ParseBool(std::string_view text, std::string_view what) {
  std::string t = Lower(TrimSpace(text));
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  Bad(what, text, "one of 1, 0, true, false, yes, no, on, off");
}

long ParseInt(std::string_view text, std::string_view what, long lo, long hi) {
  std::string_view t = TrimSpace(text);
  long v = 0;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || p != t.data() + t.size() || v < lo || v > hi)
    Bad(what, text, fmt::format("an integer in [{}, {}]", lo, hi));
  return v;
}

std::optional<std::string> GetEnv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

size_t EnvBytes(const char* name, size_t dflt) {
  auto v = GetEnv(name);
  return v ? ParseBytes(*v, name) : dflt;
}

std::chrono::nanoseconds EnvDuration(const char* name, std::chrono::nanoseconds dflt) {
  auto v = GetEnv(name);
  return v ? ParseDuration(*v, name) : dflt;
}

bool EnvBool(const char* name, bool dflt) {
  auto v = GetEnv(name);
  return v ? ParseBool(*v, name) : dflt;
}

long EnvInt(const char* name, long dflt, long lo, long hi) {
  auto v = GetEnv(name);
  return v ? ParseInt(*v, name, lo, hi) : dflt;
}

int HostCpus() {
  static const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return cpus;
}

void CheckWritableDirectory(const std::string& dir, std::string_view what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // A concurrent creator (another rank) is fine: only the end state counts.
  std::error_code ec2;
  std::string reason;
  if (std::filesystem::exists(dir, ec2) && !std::filesystem::is_directory(dir, ec2))
    reason = "it exists and is not a directory";
  else if (!std::filesystem::is_directory(dir, ec2))
    reason = "cannot create the directory: " + (ec ? ec.message() : std::string("unknown"));
  else if (::access(dir.c_str(), W_OK | X_OK) != 0)
    reason = fmt::format("cannot write into the directory: {}", std::strerror(errno));
  if (!reason.empty())
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}='{}' is invalid: {}; expected a writable directory (it is "
                            "created if missing)",
                            what, dir, reason));
}

void ValidateEnvironment() {
  EnvDuration("MC2_TIMEOUT", std::chrono::seconds(300));
  EnvBool("MC2_DETERMINISTIC", true);
  EnvBool("MC2_CHECK", false);
  EnvInt("MC2_SPIN_US", 20, 0, 1000000);
  if (GetEnv("MC2_HEAP_BYTES")) EnvBytes("MC2_HEAP_BYTES", 0);
  if (GetEnv("MC2_SCRATCH_BYTES")) EnvBytes("MC2_SCRATCH_BYTES", 0);
  LinkConfigFromEnv();
  EnvInt("MC2_GEMM_THREADS", 1, 1, 1024);
  EnvBool("MC2_GEMM_TILED", false);
  BindPolicyFromEnv();
  if (auto v = GetEnv("MC2_KERNELS"); v && *v != "portable" && *v != "auto")
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("MC2_KERNELS='{}' is invalid: expected auto or portable", *v));
  if (auto v = GetEnv("MC2_LOG_LEVEL")) {
    static const char* const kLevels[] = {"error", "warn", "info", "debug", "trace"};
    if (std::find(std::begin(kLevels), std::end(kLevels), *v) == std::end(kLevels))
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("MC2_LOG_LEVEL='{}' is invalid: expected error, warn, info, "
                              "debug or trace", *v));
  }
  if (auto v = GetEnv("MC2_TRACE")) CheckWritableDirectory(*v, "MC2_TRACE");
  static const char* const kKnown[] = {
      "MC2_RANK", "MC2_WORLD_SIZE", "MC2_LOCAL_RANK", "MC2_LOCAL_SIZE", "MC2_JOB_ID", "MC2_SHM_FDS",
      "MC2_HEAP_BYTES", "MC2_SHM_DIR", "MC2_TIMEOUT", "MC2_ALGO", "MC2_DETERMINISTIC", "MC2_CHECK",
      "MC2_SCRATCH_BYTES", "MC2_SPIN_US", "MC2_LOG_LEVEL", "MC2_TUNING_FILE", "MC2_OPS_TUNING_FILE",
      "MC2_KERNELS", "MC2_TRACE", "MC2_TRACE_CLOCK_SKEW_NS", "MC2_LINK", "MC2_GEMM_THREADS",
      "MC2_GEMM_TILED", "MC2_BIND",
      // Jobs across hosts (docs/multi-host.md).
      "MC2_HOSTNAME", "MC2_MPI_PIECE_BYTES",
      // Set by `mc2 bench` for its ranks (a person watches its stderr).
      "MC2_BENCH_STDERR_TTY"};
  // Under `mc2 run` the launcher has already warned, once for the job.
  if (GetEnv("MC2_JOB_ID") && GetEnv("MC2_RANK")) return;
  for (char** e = ::environ; *e; ++e) {
    std::string_view entry(*e);
    if (entry.rfind("MC2_", 0) != 0) continue;
    std::string_view name = entry.substr(0, entry.find('='));
    if (std::find(std::begin(kKnown), std::end(kKnown), name) == std::end(kKnown))
      MC2_LOG(kWarn, "ignoring unknown environment variable {} (a typo?)", name);
  }
}

}  // namespace mc2::core
