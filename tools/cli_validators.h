// Command-line helpers shared by the `mc2` subcommands: CLI11 validators,
// so that every option
// takes the same grammar as the MC2_* variables (core/env.h): sizes as
// core::ParseBytes reads them ("4096", "64K", "1.5G"; K/M/G/T binary), and
// durations as core::ParseDuration reads them (a bare number is seconds;
// "1.5s", "250ms", "10us", "5m").
#ifndef MC2_TOOLS_CLI_VALIDATORS_H_
#define MC2_TOOLS_CLI_VALIDATORS_H_

#include <CLI/CLI.hpp>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace mc2::tools {

// Accepts a byte count of at least `min` bytes.
CLI::Validator BytesValidator(size_t min = 0);
// Accepts a positive duration.
CLI::Validator DurationValidator();

// " (did you mean 'NAME'?)" for the entry of `names` nearest to `word` in
// edit distance, when it is near enough to be a likely typo; "" otherwise.
std::string DidYouMean(std::string_view word, const std::vector<std::string>& names);

}  // namespace mc2::tools

#endif  // MC2_TOOLS_CLI_VALIDATORS_H_
