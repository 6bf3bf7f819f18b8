// A checker of the Chrome Trace Event format (the subset mc2 writes), used by
// the tests of the exported files: the document is an object with a
// "traceEvents" array (or the array itself); every event has a string "ph"
// among the phases below, a string "name", an integer "pid" and "tid",
// and per phase: X needs numeric "ts" and "dur" >= 0; i/I need numeric "ts"
// and a scope "s" in g/p/t (if present); M needs an object "args" and a
// known metadata name; "args", when present, is an object; "cat" a string.
// Events need not be sorted. Returns one message per violation.
#ifndef MC2_TESTS_TRACE_TRACE_EVENTS_CHECK_H_
#define MC2_TESTS_TRACE_TRACE_EVENTS_CHECK_H_

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace mc2::trace {

inline std::vector<std::string> CheckTraceEvents(const nlohmann::json& doc) {
  std::vector<std::string> bad;
  const nlohmann::json* events = &doc;
  if (doc.is_object()) {
    if (!doc.contains("traceEvents") || !doc["traceEvents"].is_array())
      return {"no traceEvents array"};
    events = &doc["traceEvents"];
    if (doc.contains("displayTimeUnit") && doc["displayTimeUnit"] != "ns" &&
        doc["displayTimeUnit"] != "ms")
      bad.push_back("displayTimeUnit must be ns or ms");
  } else if (!doc.is_array()) {
    return {"neither an object nor an array"};
  }
  static const std::set<std::string> kPhases = {"X", "B", "E", "i", "I", "M", "C",
                                                "b", "e", "n", "s", "t", "f"};
  static const std::set<std::string> kMeta = {
      "process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"};
  for (size_t i = 0; i < events->size(); ++i) {
    const auto& e = (*events)[i];
    auto fail = [&](const std::string& why) { bad.push_back(fmt::format("event {}: {}", i, why)); };
    if (!e.is_object()) {
      fail("not an object");
      continue;
    }
    if (!e.contains("ph") || !e["ph"].is_string() || !kPhases.count(e["ph"].get<std::string>())) {
      fail("missing or unknown ph");
      continue;
    }
    std::string ph = e["ph"];
    if (!e.contains("name") || !e["name"].is_string()) fail("name is not a string");
    if (!e.contains("pid") || !e["pid"].is_number_integer()) fail("pid is not an integer");
    if (ph != "M" && (!e.contains("tid") || !e["tid"].is_number_integer()))
      fail("tid is not an integer");
    if (e.contains("cat") && !e["cat"].is_string()) fail("cat is not a string");
    if (e.contains("args") && !e["args"].is_object()) fail("args is not an object");
    if (ph == "M") {
      if (!e.contains("args") || !e["args"].is_object()) fail("metadata without args");
      if (e.contains("name") && e["name"].is_string() && !kMeta.count(e["name"].get<std::string>()))
        fail("unknown metadata name");
      continue;
    }
    if (!e.contains("ts") || !e["ts"].is_number()) fail("ts is not a number");
    if (ph == "X" && (!e.contains("dur") || !e["dur"].is_number() || e["dur"].get<double>() < 0))
      fail("X without a non-negative numeric dur");
    if ((ph == "i" || ph == "I") && e.contains("s") &&
        (!e["s"].is_string() || (e["s"] != "g" && e["s"] != "p" && e["s"] != "t")))
      fail("instant scope s must be g, p or t");
  }
  return bad;
}

}  // namespace mc2::trace

#endif  // MC2_TESTS_TRACE_TRACE_EVENTS_CHECK_H_
