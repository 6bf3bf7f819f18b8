// Parsing of configuration strings (environment variables and options).
//
// Every parser either returns a value or throws mc2::Error(kInvalidArgument)
// whose message names the variable or option, the offending text and the
// accepted form -- a bad MC2_* variable never crashes and is never ignored.
//
// These are the one grammar of sizes and durations for every MC2_* variable
// and every `mc2` option (tools/cli_validators.h): a size is a byte count
// with an optional binary unit, a duration is a number with an optional
// unit, and a bare number is always seconds.
#ifndef MC2_CORE_ENV_H_
#define MC2_CORE_ENV_H_

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace mc2::core {

// "1048576", "64K", "256M", "1G", "1.5G", "512MiB", "2GB" (K/M/G/T are
// binary: 1K = 1024). `what` names the source for error messages.
size_t ParseBytes(std::string_view text, std::string_view what);
// "300" (seconds), "1.5s", "250ms", "10us", "5m". Must be > 0.
std::chrono::nanoseconds ParseDuration(std::string_view text, std::string_view what);
// "1/0", "true/false", "yes/no", "on/off".
bool ParseBool(std::string_view text, std::string_view what);
// A non-negative integer in [lo, hi].
long ParseInt(std::string_view text, std::string_view what, long lo, long hi);

// Helpers of the parsers above, for other parsers of configuration strings:
// `text` without leading and trailing white space, and "1.5G" split into
// 1.5 and "G" (false when `text` does not start with a number).
std::string_view TrimSpace(std::string_view text);
bool SplitNumber(std::string_view text, double* value, std::string_view* unit);

// The raw value of an environment variable, or nullopt when unset or empty.
std::optional<std::string> GetEnv(const char* name);
// Typed getters: the default when unset; throws naming `name` when invalid.
size_t EnvBytes(const char* name, size_t dflt);
std::chrono::nanoseconds EnvDuration(const char* name, std::chrono::nanoseconds dflt);
bool EnvBool(const char* name, bool dflt);
long EnvInt(const char* name, long dflt, long lo, long hi);

// The host's online CPUs (std::thread::hardware_concurrency(), at least 1),
// read once: glibc reads /sys for every call, and the operators' cost model
// asks for every candidate it evaluates.
int HostCpus();

// Creates `dir` (and its parents) if missing and checks that it is a
// writable directory; throws mc2::Error(kInvalidArgument) naming `what`
// otherwise.
void CheckWritableDirectory(const std::string& dir, std::string_view what);

// Checks every MC2_* variable this layer and the transport read, once, up
// front (called when a world is created), so that a bad value fails at
// set-up with a message naming it rather than deep inside an operation.
// Unknown MC2_* names are reported as a warning (likely typos).
void ValidateEnvironment();

}  // namespace mc2::core

#endif  // MC2_CORE_ENV_H_
