// The pieces of `mc2 bench --tune` (bench_tune.cc) that the tuning across
// hosts (bench_tune_net.cc) shares: measuring a group's algorithms,
// turning the timings into table entries, reading and writing the table.
#ifndef MC2_TOOLS_BENCH_TUNE_H_
#define MC2_TOOLS_BENCH_TUNE_H_

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "bench.h"
#include "mc2/mc2.h"
#include "mc2/tuning.h"

namespace mc2::tools::bench {

inline constexpr DType kDType = DType::kF32;
// The collectives and algorithms of one host's tuning.
inline constexpr Coll kTuned[] = {Coll::kAllReduce, Coll::kAllGather, Coll::kReduceScatter,
                                  Coll::kBroadcast, Coll::kReduce};
inline constexpr Algorithm kCandidates[] = {Algorithm::kRing, Algorithm::kRecursiveDoubling,
                                            Algorithm::kRabenseifner, Algorithm::kBinomialTree,
                                            Algorithm::kDirect};
inline constexpr size_t kMaxBytes = size_t{64} << 20;

// 8 B, x4 ..., up to max_bytes.
std::vector<size_t> TuneSizes(size_t max_bytes);
std::string HomeCachePath();
// Every candidate (not implementing a collective: left out) on every size
// of every collective, on group `g` (collective over it; send and recv of
// the largest size). Rank 0 shows progress, tagged `label`. Returns
// {collective: [{"bytes", "size", "times": {algorithm: us}}]}.
nlohmann::json MeasureGroup(const Group& g, std::span<const Coll> colls,
                            std::span<const Algorithm> candidates,
                            const std::vector<size_t>& sizes, char* send, char* recv,
                            const std::string& label);
// The table at `output`, or an empty one (a bad one is reported, replaced).
TuningTable LoadTable(const std::string& output);
// The winners of MeasureGroup's `results` as the table's entries for
// collective name + `suffix` and rank count `n`; prints them.
void AddResults(TuningTable& table, const nlohmann::json& results,
                std::span<const Coll> colls, const std::string& suffix, int n);
// Writes the table (with "_meta") to `output` atomically; 0 or kExitWrong.
int WriteTable(const TuningTable& table, const nlohmann::json& meta,
               const std::string& output);

}  // namespace mc2::tools::bench

#endif  // MC2_TOOLS_BENCH_TUNE_H_
