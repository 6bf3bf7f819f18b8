// libFuzzer target: MC2_ALGO (collectives::ParseAlgoEnv) and the algorithm
// names (ParseAlgorithm).
//
// Contract (selector.h): a map of collective -> algorithm, or
// mc2::Error(kInvalidArgument) naming MC2_ALGO; every key of the map is ""
// (every collective) or a collective name, and every value an algorithm
// whose name parses back to itself.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "collectives/selector.h"
#include "mc2/collectives.h"
#include "mc2/error.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& text) {
  std::fprintf(stderr, "contract broken: %s for '%s'\n", what, text.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (auto a = mc2::ParseAlgorithm(text)) {
    if (mc2::ParseAlgorithm(mc2::AlgorithmName(*a)) != a) Fail("a name that does not round-trip", text);
  }
  std::map<std::string, mc2::Algorithm> parsed;
  try {
    parsed = mc2::collectives::ParseAlgoEnv(text);
  } catch (const mc2::Error& e) {
    if (e.code() != mc2::ErrorCode::kInvalidArgument) Fail("error code is not invalid_argument", text);
    if (e.message().find("MC2_ALGO") == std::string::npos) Fail("the error does not name MC2_ALGO", text);
    return 0;
  }
  static const std::set<std::string> kKeys = {"",        "all_reduce",      "reduce",
                                              "broadcast", "all_gather",    "all_gatherv",
                                              "gather",  "scatter",         "reduce_scatter",
                                              "reduce_scatterv", "all_to_allv", "barrier"};
  for (const auto& [key, algo] : parsed) {
    if (!kKeys.count(key)) Fail("an unknown collective accepted", text);
    if (mc2::ParseAlgorithm(mc2::AlgorithmName(algo)) != algo) Fail("an invalid algorithm accepted", text);
  }
  return 0;
}
