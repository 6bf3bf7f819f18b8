// Minimal leveled logging to stderr. The level comes from MC2_LOG_LEVEL
// (error, warn, info, debug, trace; default warn). Each line is prefixed with
// "[mc2 <level> r<rank>]" once the process knows its rank.
#ifndef MC2_CORE_LOG_H_
#define MC2_CORE_LOG_H_

#include <fmt/format.h>

#include <string>

namespace mc2::core {

enum class LogLevel : int { kError = 0, kWarn, kInfo, kDebug, kTrace };

LogLevel CurrentLogLevel();
void SetLogRank(int rank);
void LogLine(LogLevel level, const std::string& line);

}  // namespace mc2::core

#define MC2_LOG(level, ...)                                                    \
  do {                                                                         \
    if (static_cast<int>(::mc2::core::LogLevel::level) <=                      \
        static_cast<int>(::mc2::core::CurrentLogLevel()))                      \
      ::mc2::core::LogLine(::mc2::core::LogLevel::level,                       \
                           ::fmt::format(__VA_ARGS__));                        \
  } while (0)

#endif  // MC2_CORE_LOG_H_
