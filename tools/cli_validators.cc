#include "cli_validators.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "core/env.h"
#include "mc2/error.h"

namespace mc2::tools {
namespace {

// Edit distance (insertions, deletions, substitutions) between a and b.
size_t Distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string DidYouMean(std::string_view word, const std::vector<std::string>& names) {
  // Within a third of the word's length (and at least 2 edits for short
  // words): "runn" -> run, "reprot" -> report, but "xyzzy" -> nothing.
  const size_t limit = std::max<size_t>(2, word.size() / 3);
  std::string best;
  size_t best_d = limit + 1;
  for (const auto& n : names) {
    const size_t d = Distance(word, n);
    if (d < best_d) best = n, best_d = d;
  }
  return best.empty() ? "" : fmt::format(" (did you mean '{}'?)", best);
}

CLI::Validator BytesValidator(size_t min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        try {
          const size_t bytes = core::ParseBytes(text, "size");
          if (bytes < min)
            return fmt::format("'{}' is {} bytes: expected at least {}", text, bytes, min);
          return "";
        } catch (const Error&) {
          return fmt::format(
              "'{}' is not a byte count: expected e.g. 4096, 64K, 1.5K, 256M or 2G (K/M/G/T "
              "= 2^10, 2^20, 2^30, 2^40)",
              text);
        }
      },
      "BYTES");
}

CLI::Validator DurationValidator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          core::ParseDuration(text, "duration");
          return "";
        } catch (const Error&) {
          return fmt::format(
              "'{}' is not a duration: expected e.g. 30 (seconds), 1.5s, 250ms, 10us or 5m", text);
        }
      },
      "DURATION");
}

}  // namespace mc2::tools
