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
#include "mc2/tuning.h"

namespace mc2::collectives {

// The tuning table is public (<mc2/tuning.h>): `mc2 bench --tune` writes it.
using mc2::TuningFilePath;
using mc2::TuningTable;

// Parses MC2_ALGO's text: one algorithm name for every collective (key "")
// or "collective=name" pairs separated by commas. Throws kInvalidArgument
// naming MC2_ALGO, the text, what is wrong and the accepted form.
std::map<std::string, Algorithm> ParseAlgoEnv(const std::string& text);

// Whether `algo` implements `kind`.
bool Implements(Algorithm algo, OpKind kind);

// Chooses the algorithm for a call. `bytes` is the per-rank payload.
Algorithm SelectAlgorithm(OpKind kind, Algorithm requested, int ranks, size_t bytes);

// Groups that span hosts (collectives/net_dispatch.cc): kHierarchical or
// kDirect (flat) when the call's options, MC2_ALGO or (if `use_table`) the
// tuning table choose one, else kAuto (the caller's default). Any other
// requested algorithm counts as kAuto. The table's entries across hosts are
// keyed NetTableKind(kind, ranks per host), with the number of hosts as
// their rank count.
Algorithm SelectNetAlgorithm(OpKind kind, Algorithm requested, int hosts, int per_host,
                             size_t bytes, bool use_table);
std::string NetTableKind(OpKind kind, int per_host);

}  // namespace mc2::collectives

#endif  // MC2_COLLECTIVES_SELECTOR_H_
