#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace mc2::core {
namespace {

LogLevel ReadLevel() {
  const char* v = std::getenv("MC2_LOG_LEVEL");
  if (v == nullptr || *v == '\0') return LogLevel::kWarn;
  static const char* const kNames[] = {"error", "warn", "info", "debug", "trace"};
  for (int i = 0; i < 5; ++i)
    if (std::strcmp(v, kNames[i]) == 0) return static_cast<LogLevel>(i);
  // Logging cannot throw from every call site; say it once and keep going.
  std::fprintf(stderr,
               "[mc2] MC2_LOG_LEVEL='%s' is invalid: expected error, warn, info, "
               "debug or trace; using warn\n", v);
  return LogLevel::kWarn;
}

std::atomic<int> g_rank{-1};

}  // namespace

LogLevel CurrentLogLevel() {
  static const LogLevel level = ReadLevel();
  return level;
}

void SetLogRank(int rank) { g_rank.store(rank, std::memory_order_relaxed); }

void LogLine(LogLevel level, const std::string& line) {
  static const char* const kNames[] = {"E", "W", "I", "D", "T"};
  int rank = g_rank.load(std::memory_order_relaxed);
  std::string out = rank >= 0
      ? fmt::format("[mc2 {} r{}] {}\n", kNames[static_cast<int>(level)], rank, line)
      : fmt::format("[mc2 {}] {}\n", kNames[static_cast<int>(level)], line);
  std::fwrite(out.data(), 1, out.size(), stderr);
}

}  // namespace mc2::core
