// `mc2 bench --tune` inside an mpirun job whose ranks span hosts: measures
// both levels of the collectives across hosts and writes them to the
// selector's tuning table (<mc2/tuning.h>).
//
// - the node level, as the tuning on one host does: every algorithm of the
//   tunable collectives on the ranks of each host (every host measures its
//   own at once; rank 0's host's timings are kept, under the rank count of
//   a host), when every host has the same number L > 1 of ranks;
// - the level across hosts: the hierarchical and the flat algorithm of
//   all_reduce, all_gather, reduce_scatter, broadcast and all_to_all on the
//   whole job, kept under "COLLECTIVE@L" with the number of hosts as rank
//   count (<mc2/tuning.h>), where the dispatch of groups across hosts looks
//   them up.
// Rank 0 writes the table (the other entries of an existing one are kept);
// every host must then read that file (a shared home, or MC2_TUNING_FILE).
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "bench.h"
#include "bench_tune.h"

namespace mc2::tools::bench {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr Coll kNetTuned[] = {Coll::kAllReduce, Coll::kAllGather, Coll::kReduceScatter,
                              Coll::kBroadcast, Coll::kAllToAll};
constexpr Algorithm kNetCandidates[] = {Algorithm::kHierarchical, Algorithm::kDirect};
// Host links are slow: the sizes across hosts stop here.
constexpr size_t kNetMaxBytes = size_t{16} << 20;
constexpr size_t kNameBytes = 256;

}  // namespace

int RunTuneNet(const std::string& output_arg) {
  Group g;
  try {
    g = Group::FromEnv();
  } catch (const Error& e) {
    fmt::print(stderr, "mc2 bench --tune: cannot join the job: {}\n", e.what());
    return kExitWrong;
  }
  const int n = g.size();
  const bool lead = g.rank() == 0;
  try {
    // The hosts, as the job's start-up maps them (MC2_HOSTNAME overrides).
    char name[kNameBytes] = {};
    if (const char* v = std::getenv("MC2_HOSTNAME"); v && *v)
      std::strncpy(name, v, kNameBytes - 1);
    else
      gethostname(name, kNameBytes - 1);
    std::vector<char> names(kNameBytes * n);
    AllGather(g, name, names.data(), kNameBytes, DType::kU8).Wait();
    std::vector<std::string> hosts;
    std::vector<int> host_of(n), per(0);
    for (int r = 0; r < n; ++r) {
      const std::string h(names.data() + r * kNameBytes);
      int idx = 0;
      while (idx < static_cast<int>(hosts.size()) && hosts[idx] != h) ++idx;
      if (idx == static_cast<int>(hosts.size())) hosts.push_back(h), per.push_back(0);
      host_of[r] = idx;
      ++per[idx];
    }
    const int nhosts = static_cast<int>(hosts.size());
    if (nhosts < 2) {
      if (lead)
        fmt::print(stderr,
                   "mc2 bench --tune: every rank of this job runs on host {}: to tune one host, "
                   "run `mc2 bench --tune` outside a job\n",
                   hosts[0]);
      return kExitWrong;
    }
    int per_host = 0;
    bool uniform = true;
    for (int c : per) per_host = std::max(per_host, c), uniform = uniform && c == per[0];
    const auto start = Clock::now();
    // The node level: each host on its own ranks.
    json node_results;
    const bool node_level = uniform && per_host > 1;
    if (node_level) {
      Group node = g.Split(host_of[g.rank()], g.rank());
      SymmetricBuffer send = node.AllocSymmetric(kMaxBytes);
      SymmetricBuffer recv = node.AllocSymmetric(kMaxBytes);
      std::memset(send.data(), 0, kMaxBytes);
      std::memset(recv.data(), 0, kMaxBytes);
      node_results = MeasureGroup(node, kTuned, kCandidates, TuneSizes(kMaxBytes),
                                  send.as<char>(), recv.as<char>(),
                                  fmt::format("node level, {} ranks", per_host));
      Barrier(node).Wait();
    }
    Barrier(g).Wait();
    // The level across hosts.
    SymmetricBuffer send = g.AllocSymmetric(kNetMaxBytes);
    SymmetricBuffer recv = g.AllocSymmetric(kNetMaxBytes);
    std::memset(send.data(), 0, kNetMaxBytes);
    std::memset(recv.data(), 0, kNetMaxBytes);
    json span_results =
        MeasureGroup(g, kNetTuned, kNetCandidates, TuneSizes(kNetMaxBytes), send.as<char>(),
                     recv.as<char>(), fmt::format("{} hosts", nhosts));
    Barrier(g).Wait();
    int status = 0;
    if (lead) {
      const std::string output = output_arg.empty() ? HomeCachePath() : output_arg;
      TuningTable table = LoadTable(output);
      std::string layout;
      for (int h = 0; h < nhosts; ++h) layout += fmt::format("{}{}:{}", h ? "," : "", hosts[h], per[h]);
      const double secs = std::chrono::duration<double>(Clock::now() - start).count();
      fmt::print("# mc2 bench --tune across hosts: {} ({} ranks), dtype {}, {:.1f} s\n", layout,
                 n, DTypeName(kDType), secs);
      if (node_level) {
        fmt::print("# node level ({} ranks per host, host {}):\n", per_host, hosts[0]);
        AddResults(table, node_results, kTuned, "", per_host);
      } else {
        fmt::print("# node level not measured: {}\n",
                   per_host == 1 ? "one rank per host" : "hosts have different rank counts");
      }
      fmt::print("# across hosts ({} hosts, at most {} ranks per host):\n", nhosts, per_host);
      AddResults(table, span_results, kNetTuned, fmt::format("@{}", per_host), nhosts);
      json meta = {{"generated_by", "mc2 bench --tune (across hosts)"},
                   {"dtype", DTypeName(kDType)},
                   {"hosts", layout},
                   {"seconds", secs}};
      char when[64];
      std::time_t now = std::time(nullptr);
      std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S%z", std::localtime(&now));
      meta["date"] = when;
      if (node_level) meta["raw"][std::to_string(per_host)] = node_results;
      meta["raw"][fmt::format("{}@{}", nhosts, per_host)] = span_results;
      status = WriteTable(table, meta, output);
      if (status == 0) fmt::print("# wrote {}\n", output);
      std::fflush(stdout);
    }
    // Every rank exits with rank 0's status.
    int32_t st = status;
    AllReduce(g, &st, &st, 1, DType::kI32, ReduceOp::kMax).Wait();
    return st;
  } catch (const std::exception& e) {
    fmt::print(stderr, "mc2 bench --tune: rank {}: {}\n", g.rank(), e.what());
    return kExitWrong;
  }
}

}  // namespace mc2::tools::bench
