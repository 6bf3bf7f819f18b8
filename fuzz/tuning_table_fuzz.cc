// libFuzzer target: the collectives tuning table (MC2_TUNING_FILE, written
// by `mc2 bench --tune`), TuningTable::Parse (<mc2/tuning.h>).
//
// Contract (<mc2/tuning.h>): a table or mc2::Error(kInvalidArgument) naming the
// source, never another exception; within a parsed table each rule list is
// sorted by size; ToJson() of a table parses back, and one more round trip
// changes nothing; Lookup answers any query.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "collectives/selector.h"
#include "mc2/error.h"

namespace {

using mc2::TuningTable;

[[noreturn]] void Fail(const char* what, const std::string& text) {
  std::fprintf(stderr, "contract broken: %s for '%s'\n", what, text.c_str());
  std::abort();
}

bool SameRules(const TuningTable& a, const TuningTable& b) {
  if (a.rules.size() != b.rules.size()) return false;
  for (const auto& [kind, per] : a.rules) {
    auto it = b.rules.find(kind);
    if (it == b.rules.end() || it->second.size() != per.size()) return false;
    for (const auto& [ranks, list] : per) {
      auto jt = it->second.find(ranks);
      if (jt == it->second.end() || jt->second.size() != list.size()) return false;
      for (size_t i = 0; i < list.size(); ++i)
        if (list[i].max_bytes != jt->second[i].max_bytes ||
            list[i].algorithm != jt->second[i].algorithm)
          return false;
    }
  }
  return true;
}

TuningTable ParseOrFail(const std::string& json, const std::string& input, bool may_fail,
                        bool* failed) {
  try {
    return TuningTable::Parse(json, "fuzz.json");
  } catch (const mc2::Error& e) {
    if (e.code() != mc2::ErrorCode::kInvalidArgument) Fail("error code is not invalid_argument", input);
    if (e.message().find("fuzz.json") == std::string::npos) Fail("the error does not name the file", input);
    if (!may_fail) Fail("ToJson() of a parsed table does not parse", input);
    *failed = true;
    return {};
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  bool failed = false;
  const TuningTable t = ParseOrFail(text, text, true, &failed);
  if (failed) return 0;
  for (const auto& [kind, per] : t.rules)
    for (const auto& [ranks, list] : per)
      for (size_t i = 1; i < list.size(); ++i)
        if (list[i - 1].max_bytes > list[i].max_bytes) Fail("rules not sorted by size", text);
  const TuningTable t2 = ParseOrFail(t.ToJson(), text, false, &failed);
  const TuningTable t3 = ParseOrFail(t2.ToJson(), text, false, &failed);
  if (!SameRules(t2, t3)) Fail("ToJson/Parse is not stable", text);
  for (const auto& [kind, per] : t.rules)
    for (int ranks : {1, 2, 3, 8, 1 << 20})
      for (size_t bytes : {size_t{0}, size_t{1} << 16, ~size_t{0}}) t.Lookup(kind, ranks, bytes);
  return 0;
}
