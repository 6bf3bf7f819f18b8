// CLI11 validators shared by the `mc2` subcommands, so that every option
// takes the same grammar as the MC2_* variables (core/env.h): sizes as
// core::ParseBytes reads them ("4096", "64K", "1.5G"; K/M/G/T binary), and
// durations as core::ParseDuration reads them (a bare number is seconds;
// "1.5s", "250ms", "10us", "5m").
#ifndef MC2_TOOLS_CLI_VALIDATORS_H_
#define MC2_TOOLS_CLI_VALIDATORS_H_

#include <CLI/CLI.hpp>
#include <cstddef>

namespace mc2::tools {

// Accepts a byte count of at least `min` bytes.
CLI::Validator BytesValidator(size_t min = 0);
// Accepts a positive duration.
CLI::Validator DurationValidator();

}  // namespace mc2::tools

#endif  // MC2_TOOLS_CLI_VALIDATORS_H_
