// The selector: which algorithm runs a collective call.
//
// Order of precedence: the call's CollectiveOptions::algorithm, then MC2_ALGO
// (one name for every collective, or "all_reduce=ring,all_gather=direct"),
// then the tuning table (MC2_TUNING_FILE, else ~/.cache/mc2/tuning.json,
// written by `mc2 bench --tune`), then built-in defaults. An explicit choice
// of an algorithm that does not implement the collective is an error; the
// table and defaults only name implemented ones.
#ifndef MC2_COLLECTIVES_SELECTOR_H_
#define MC2_COLLECTIVES_SELECTOR_H_

#include <map>
#include <string>
#include <vector>

#include "collectives/algorithm.h"

namespace mc2::collectives {

// A tuning table: per collective and rank count, size thresholds in bytes
// (ascending) with the algorithm to use up to each.
struct TuningTable {
  struct Entry {
    size_t max_bytes;
    Algorithm algorithm;
  };
  std::map<std::string, std::map<int, std::vector<Entry>>> rules;

  // Parses the JSON form; throws kInvalidArgument naming `source`.
  static TuningTable Parse(const std::string& json_text, const std::string& source);
  std::string ToJson() const;
  // The algorithm for (kind, ranks, bytes), or kAuto when the table has no
  // rule (the nearest rank count at or below `ranks` is used).
  Algorithm Lookup(const std::string& kind, int ranks, size_t bytes) const;
};

// Parses MC2_ALGO's text: one algorithm name for every collective (key "")
// or "collective=name" pairs separated by commas. Throws kInvalidArgument
// naming MC2_ALGO, the text, what is wrong and the accepted form.
std::map<std::string, Algorithm> ParseAlgoEnv(const std::string& text);

// Whether `algo` implements `kind`.
bool Implements(Algorithm algo, OpKind kind);

// Chooses the algorithm for a call. `bytes` is the per-rank payload.
Algorithm SelectAlgorithm(OpKind kind, Algorithm requested, int ranks, size_t bytes);

// Groups that span hosts (collectives/span_dispatch.cc): kHierarchical or
// kDirect (flat) when the call's options, MC2_ALGO or (if `use_table`) the
// tuning table choose one, else kAuto (the caller's default). Any other
// requested algorithm counts as kAuto. The table's entries across hosts are
// keyed SpanTableKind(kind, ranks per host), with the number of hosts as
// their rank count.
Algorithm SelectSpanAlgorithm(OpKind kind, Algorithm requested, int hosts, int per_host,
                              size_t bytes, bool use_table);
std::string SpanTableKind(OpKind kind, int per_host);

// Path of the tuning table in effect ("" if none).
std::string TuningFilePath();

}  // namespace mc2::collectives

#endif  // MC2_COLLECTIVES_SELECTOR_H_
