// libFuzzer target: the configuration-string parsers of src/core/env.h
// (ParseBytes, ParseDuration, ParseBool, ParseInt) and ValidateEnvironment()
// over every MC2_* variable it checks.
//
// Input: byte 0 picks the parser (or the variable), the rest is the text.
// The contract under test (env.h): a parser returns a value or throws
// mc2::Error(kInvalidArgument) whose message names the source -- never
// another exception, a crash or undefined behaviour -- and a value it
// returns satisfies the documented form (a duration is positive, an integer
// lies in its range, a byte count below 2^63).
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/env.h"
#include "mc2/error.h"

namespace {

// Variables ValidateEnvironment reads. MC2_TRACE is left out on purpose: a
// valid value creates that directory, which a fuzzer must not do at random
// paths (its parser is CheckWritableDirectory over a path, not a grammar).
const char* const kVariables[] = {
    "MC2_TIMEOUT",    "MC2_DETERMINISTIC", "MC2_SPIN_US",      "MC2_HEAP_BYTES",
    "MC2_SCRATCH_BYTES", "MC2_LINK",       "MC2_GEMM_THREADS", "MC2_KERNELS",
    "MC2_LOG_LEVEL",  "MC2_BIND",
};
constexpr int kNumVariables = sizeof(kVariables) / sizeof(kVariables[0]);

[[noreturn]] void Fail(const char* what, std::string_view text) {
  std::fprintf(stderr, "contract broken: %s for '%.*s'\n", what, static_cast<int>(text.size()),
               text.data());
  std::abort();
}

void ExpectNamed(const mc2::Error& e, std::string_view name, std::string_view text) {
  if (e.code() != mc2::ErrorCode::kInvalidArgument) Fail("error code is not invalid_argument", text);
  if (e.message().find(name) == std::string::npos) Fail("the error does not name the source", text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const unsigned selector = data[0];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const unsigned parser = selector % 5;
  try {
    switch (parser) {
      case 0: {
        const size_t v = mc2::core::ParseBytes(text, "FUZZ_BYTES");
        if (v > (size_t{1} << 63)) Fail("byte count above 2^63", text);
        break;
      }
      case 1: {
        const auto v = mc2::core::ParseDuration(text, "FUZZ_DURATION");
        if (v.count() <= 0) Fail("a non-positive duration", text);
        break;
      }
      case 2:
        mc2::core::ParseBool(text, "FUZZ_BOOL");
        break;
      case 3: {
        // Ranges both small and at the limits of long.
        const long lo = (selector & 0x20) ? -1000 : 0;
        const long hi = (selector & 0x40) ? 1000000 : 0x7fffffffffffffffL;
        const long v = mc2::core::ParseInt(text, "FUZZ_INT", lo, hi);
        if (v < lo || v > hi) Fail("an integer out of its range", text);
        break;
      }
      case 4: {
        if (text.find('\0') != std::string::npos) return 0;  // not an environment string
        const char* name = kVariables[(selector / 5) % kNumVariables];
        setenv(name, text.c_str(), 1);
        try {
          mc2::core::ValidateEnvironment();
        } catch (const mc2::Error& e) {
          unsetenv(name);
          // MC2_LINK's and others' errors name the variable.
          ExpectNamed(e, name, text);
          return 0;
        }
        unsetenv(name);
        break;
      }
    }
  } catch (const mc2::Error& e) {
    static const char* const kNames[] = {"FUZZ_BYTES", "FUZZ_DURATION", "FUZZ_BOOL", "FUZZ_INT"};
    ExpectNamed(e, kNames[parser], text);
  }
  return 0;
}
