// The collectives' tuning table: which algorithm the selector uses for a
// collective, a rank count and a message size when the call, MC2_ALGO and
// the built-in defaults leave the choice open (MC2_TUNING_FILE in docs/running.md).
//
// The library reads the table once per process, from MC2_TUNING_FILE, else
// ~/.cache/mc2/tuning.json. `mc2 bench --tune` measures the algorithms and
// writes it; programs may build, read and write one with TuningTable.
//
// JSON form: {"all_reduce": {"2": [[65536, "direct"], [1e18, "rabenseifner"]]},
// ...}: per collective name and rank count, size thresholds in bytes per
// rank with the algorithm to use up to each; a threshold of 1.8e19 or more
// means "any size". Entries across hosts use the key
// "<collective>@<ranks per host>" with the number of hosts as the rank
// count. A top-level "_meta" member is ignored.
//
// TuningTable is a plain value: no shared state, any thread may use its own
// copy.
#ifndef MC2_TUNING_H_
#define MC2_TUNING_H_

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "mc2/collectives.h"

namespace mc2 {

struct TuningTable {
  struct Entry {
    size_t max_bytes;     // per-rank bytes up to which `algorithm` applies
    Algorithm algorithm;  // never kAuto in a parsed table
  };
  // collective name -> rank count -> entries, ascending in max_bytes.
  std::map<std::string, std::map<int, std::vector<Entry>>> rules;

  // Parses the JSON form, sorting each list by max_bytes. Throws
  // mc2::Error(kInvalidArgument) naming `source` and what is wrong.
  static TuningTable Parse(const std::string& json_text, const std::string& source);
  // The JSON form of `rules` (which Parse reads back to an equal table).
  std::string ToJson() const;
  // The algorithm for (collective, ranks, per-rank bytes): the rule of the
  // nearest rank count at or below `ranks`, its first entry that covers
  // `bytes`; kAuto when no rule applies.
  Algorithm Lookup(const std::string& kind, int ranks, size_t bytes) const;
};

// Path of the tuning table the library reads: MC2_TUNING_FILE if set, else
// ~/.cache/mc2/tuning.json ("" when HOME is not set either). The file need
// not exist.
std::string TuningFilePath();

}  // namespace mc2

#endif  // MC2_TUNING_H_
