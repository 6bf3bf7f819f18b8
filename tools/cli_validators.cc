#include "cli_validators.h"

#include <fmt/format.h>

#include <string>

#include "core/env.h"
#include "mc2/error.h"

namespace mc2::tools {

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
