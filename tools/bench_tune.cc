// `mc2 bench --tune`: measures every algorithm of the collectives that have
// several, for each rank count, and writes the selector's tuning table
// (<mc2/tuning.h>) with the fastest algorithm per size range.
//
// The parent launches one job per rank count; in the job every rank runs
// RunTuneRank and rank 0 writes the raw timings to a temporary file that the
// parent turns into the table.
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench.h"
#include "bench_tune.h"
#include "launcher.h"
#include "mc2/mc2.h"
#include "mc2/tuning.h"

namespace mc2::tools::bench {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr size_t kMinBytes = 8;
// Time spent timing one (collective, algorithm, size), per trial.
constexpr double kTargetUs = 20000;
constexpr int kTrials = 3;
// A size where the previous size's winner is within kHysteresis of the best
// keeps it, and a lone winner between two sizes won by the same algorithm
// gives way to it if that one is within kIsolated: noise should not flip
// the choice back and forth.
constexpr double kHysteresis = 1.05;
constexpr double kIsolated = 1.15;

}  // namespace

std::vector<size_t> TuneSizes(size_t max_bytes) {
  std::vector<size_t> out;
  for (size_t s = kMinBytes; s <= max_bytes; s *= 4) out.push_back(s);
  if (out.back() != max_bytes) out.push_back(max_bytes);
  return out;
}

namespace {

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// Runs one call; throws what the collective throws.
void Once(const Group& g, Coll c, const Shape& s, const char* send, char* recv,
          const CollectiveOptions& o) {
  const size_t n = s.count;
  Work w;
  switch (c) {
    case Coll::kAllReduce: w = AllReduce(g, send, recv, n, kDType, ReduceOp::kSum, o); break;
    case Coll::kAllGather: w = AllGather(g, send, recv, n, kDType, o); break;
    case Coll::kReduceScatter: w = ReduceScatter(g, send, recv, n, kDType, ReduceOp::kSum, o); break;
    case Coll::kBroadcast: w = Broadcast(g, send, recv, n, kDType, 0, o); break;
    case Coll::kReduce: w = Reduce(g, send, recv, n, kDType, ReduceOp::kSum, 0, o); break;
    case Coll::kAllToAll: w = AllToAll(g, send, recv, n, kDType, o); break;
    default: break;
  }
  w.Wait();
}

double MaxOverRanks(const Group& g, double v) {
  AllReduce(g, &v, &v, 1, DType::kF64, ReduceOp::kMax).Wait();
  return v;
}

// Iterations of `algo` that take about kTargetUs, after a warm-up call;
// 0 if the algorithm does not implement the collective (identical on every
// rank: the selector refuses it in the call itself).
int Calibrate(const Group& g, Coll c, Algorithm algo, const Shape& s, const char* send,
              char* recv) {
  CollectiveOptions o;
  o.algorithm = algo;
  try {
    Once(g, c, s, send, recv, o);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kInvalidArgument) return 0;
    throw;
  }
  Barrier(g).Wait();
  const auto t0 = Clock::now();
  Once(g, c, s, send, recv, o);
  const double probe = MaxOverRanks(g, Micros(Clock::now() - t0));
  return static_cast<int>(std::clamp(kTargetUs / std::max(probe, 0.05), 1.0, 5000.0));
}

// Average microseconds per call over `iters` calls (the max over ranks).
double TimeAlgorithm(const Group& g, Coll c, Algorithm algo, const Shape& s, const char* send,
                     char* recv, int iters) {
  CollectiveOptions o;
  o.algorithm = algo;
  Barrier(g).Wait();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) Once(g, c, s, send, recv, o);
  return MaxOverRanks(g, Micros(Clock::now() - t0)) / iters;
}

}  // namespace

std::string HomeCachePath() {
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/mc2/tuning.json";
}

namespace {

struct Point {
  size_t bytes;  // the selector's size measure
  std::map<std::string, double> times;
};

// Winner per point, smoothed; then runs of equal winners as table entries.
std::vector<TuningTable::Entry> MakeEntries(const std::vector<Point>& pts,
                                            std::vector<std::string>* winners) {
  winners->clear();
  for (size_t i = 0; i < pts.size(); ++i) {
    std::string best;
    double bt = 1e300;
    for (auto& [a, t] : pts[i].times)
      if (t < bt) bt = t, best = a;
    if (i > 0 && !winners->back().empty()) {
      auto prev = pts[i].times.find(winners->back());
      if (prev != pts[i].times.end() && prev->second <= bt * kHysteresis) best = prev->first;
    }
    winners->push_back(best);
  }
  for (size_t i = 1; i + 1 < pts.size(); ++i) {
    const std::string& around = (*winners)[i - 1];
    if (around.empty() || around != (*winners)[i + 1] || around == (*winners)[i]) continue;
    auto it = pts[i].times.find(around), mine = pts[i].times.find((*winners)[i]);
    if (it != pts[i].times.end() && mine != pts[i].times.end() &&
        it->second <= mine->second * kIsolated)
      (*winners)[i] = around;
  }
  std::vector<TuningTable::Entry> entries;
  for (size_t i = 0; i < pts.size(); ++i) {
    if ((*winners)[i].empty()) continue;
    const bool last = i + 1 == pts.size();
    if (!last && (*winners)[i + 1] == (*winners)[i]) continue;
    size_t max_bytes = ~size_t{0};
    if (!last) {
      // About halfway (geometrically) to the next measured size, rounded
      // down to a power of two, and never below this size.
      const double mid =
          std::sqrt(static_cast<double>(pts[i].bytes) * static_cast<double>(pts[i + 1].bytes));
      size_t p2 = 1;
      while (static_cast<double>(p2) * 2 <= mid) p2 *= 2;
      max_bytes = std::max(pts[i].bytes, p2);
    }
    entries.push_back({max_bytes, *ParseAlgorithm((*winners)[i])});
  }
  return entries;
}

}  // namespace

json MeasureGroup(const Group& g, std::span<const Coll> colls,
                  std::span<const Algorithm> candidates, const std::vector<size_t>& sizes,
                  char* send, char* recv, const std::string& label) {
  const int n = g.size();
  const bool show = g.rank() == 0 && (isatty(STDERR_FILENO) || std::getenv("MC2_BENCH_STDERR_TTY"));
  json results = json::object();
  const auto start = Clock::now();
  size_t step = 0, steps = colls.size() * sizes.size();
  for (Coll c : colls) {
    std::vector<bool> skip(candidates.size(), false);
    json points = json::array();
    for (size_t bytes : sizes) {
      const Shape s = ShapeFor(c, bytes, DTypeSize(kDType), n);
      json times = json::object();
      std::vector<int> iters(candidates.size(), 0);
      std::vector<double> best(candidates.size(), 1e300);
      for (size_t k = 0; k < candidates.size(); ++k) {
        if (skip[k]) continue;
        iters[k] = Calibrate(g, c, candidates[k], s, send, recv);
        if (iters[k] == 0) skip[k] = true;  // not implemented: skip every size
      }
      // Trials interleave the algorithms, so that drift hits all alike;
      // each keeps its best trial.
      for (int t = 0; t < kTrials; ++t)
        for (size_t k = 0; k < candidates.size(); ++k)
          if (!skip[k])
            best[k] = std::min(best[k], TimeAlgorithm(g, c, candidates[k], s, send, recv, iters[k]));
      for (size_t k = 0; k < candidates.size(); ++k)
        if (!skip[k]) times[AlgorithmName(candidates[k])] = best[k];
      // The selector's size measure: per-rank bytes (all_gather: the
      // block each rank contributes; reduce_scatter: the whole input).
      points.push_back({{"bytes", s.send_bytes}, {"size", s.bytes}, {"times", times}});
      ++step;
      if (show) {
        fmt::print(stderr, "\r[tune] {}: {}/{} ({:.0f} s)", label, step, steps,
                   std::chrono::duration<double>(Clock::now() - start).count());
        std::fflush(stderr);
      }
    }
    results[CollName(c)] = std::move(points);
  }
  if (show) {
    fmt::print(stderr, "\r{:50}\r", "");
    std::fflush(stderr);
  }
  return results;
}

TuningTable LoadTable(const std::string& output) {
  TuningTable table;
  // Keep what an earlier run measured for other rank counts.
  if (std::ifstream in(output); in) {
    std::stringstream buf;
    buf << in.rdbuf();
    try {
      table = TuningTable::Parse(buf.str(), output);
    } catch (const Error& e) {
      fmt::print(stderr, "mc2 bench --tune: replacing {}: {}\n", output, e.message());
    }
  }
  return table;
}

void AddResults(TuningTable& table, const json& results, std::span<const Coll> colls,
                const std::string& suffix, int n) {
  // Winners by size: one column per collective.
  std::map<std::string, std::vector<std::string>> winners;
  std::vector<size_t> sizes;
  for (Coll c : colls) {
    const std::string kind = CollName(c);
    std::vector<Point> pts;
    for (auto& p : results[kind]) {
      Point pt{p["bytes"].get<size_t>(), {}};
      for (auto& [a, t] : p["times"].items()) pt.times[a] = t.get<double>();
      pts.push_back(std::move(pt));
      if (c == colls[0]) sizes.push_back(p["size"].get<size_t>());
    }
    auto entries = MakeEntries(pts, &winners[kind]);
    if (!entries.empty()) table.rules[kind + suffix][n] = std::move(entries);
  }
  fmt::print("# {:>9}", "size");
  for (Coll c : colls) fmt::print("  {:>18}", CollName(c));
  fmt::print("\n");
  for (size_t i = 0; i < sizes.size(); ++i) {
    fmt::print("  {:>9}", FormatSize(sizes[i]));
    for (Coll c : colls) {
      const auto& w = winners[CollName(c)];
      fmt::print("  {:>18}", i < w.size() && !w[i].empty() ? w[i] : "-");
    }
    fmt::print("\n");
  }
  for (Coll c : colls) {
    auto it = table.rules.find(CollName(c) + suffix);
    if (it == table.rules.end() || !it->second.count(n)) continue;
    std::string line;
    for (auto& e : it->second.at(n))
      line += e.max_bytes == ~size_t{0}
                  ? fmt::format(" {} beyond", AlgorithmName(e.algorithm))
                  : fmt::format(" {} up to {};", AlgorithmName(e.algorithm),
                                FormatSize(e.max_bytes));
    fmt::print("# {}{} ({} {}):{}\n", CollName(c), suffix, n, suffix.empty() ? "ranks" : "hosts",
               line);
  }
}

int WriteTable(const TuningTable& table, const json& meta,
               const std::string& output) {
  json out = json::parse(table.ToJson());
  out["_meta"] = meta;
  std::error_code ec;
  const std::filesystem::path path(output);
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  // Written beside the table under a name no other file has (mkstemp), then
  // renamed over it, so that a reader never sees half a table and no file of
  // the user's is overwritten on the way.
  std::string tmp = output + ".XXXXXX";
  const int fd = mkstemp(tmp.data());
  if (fd < 0) {
    fmt::print(stderr, "mc2 bench --tune: cannot write {}: {}\n", output, std::strerror(errno));
    return kExitWrong;
  }
  fchmod(fd, 0644);  // mkstemp's 0600 would make the table private
  close(fd);
  {
    std::ofstream f(tmp);
    f << out.dump(1) << "\n";
    f.close();
    if (!f) {
      fmt::print(stderr, "mc2 bench --tune: cannot write {}: {}\n", tmp, std::strerror(errno));
      std::remove(tmp.c_str());
      return kExitWrong;
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    fmt::print(stderr, "mc2 bench --tune: cannot write {}: {}\n", output, ec.message());
    std::remove(tmp.c_str());
    return kExitWrong;
  }
  return 0;
}

size_t TuneHeapBytes() {
  // send and recv of at most kMaxBytes each, plus the group's areas.
  return 2 * kMaxBytes + (size_t{64} << 20);
}

int RunTuneRank(const std::string& result_path) {
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
    SymmetricBuffer send = g.AllocSymmetric(kMaxBytes);
    SymmetricBuffer recv = g.AllocSymmetric(kMaxBytes);
    std::memset(send.data(), 0, kMaxBytes);
    std::memset(recv.data(), 0, kMaxBytes);
    const auto start = Clock::now();
    json results = MeasureGroup(g, kTuned, kCandidates, TuneSizes(kMaxBytes), send.as<char>(),
                                recv.as<char>(), fmt::format("{} ranks", n));
    Barrier(g).Wait();
    if (lead) {
      json j = {{"ranks", n},
                {"dtype", DTypeName(kDType)},
                {"seconds", std::chrono::duration<double>(Clock::now() - start).count()},
                {"results", results}};
      std::ofstream out(result_path);
      out << j.dump() << "\n";
      if (!out) {
        fmt::print(stderr, "mc2 bench --tune: cannot write {}\n", result_path);
        return kExitWrong;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "mc2 bench --tune: rank {}: {}\n", g.rank(), e.what());
    return kExitWrong;
  }
}

int RunTune(const std::string& self_exe, const std::vector<int>& nranks,
            const std::string& output_arg) {
  const std::string output = output_arg.empty() ? HomeCachePath() : output_arg;
  TuningTable table = LoadTable(output);
  json meta = {{"generated_by", "mc2 bench --tune"},
               {"dtype", DTypeName(kDType)},
               {"measured_ranks", nranks}};
  {
    char when[64];
    std::time_t now = std::time(nullptr);
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S%z", std::localtime(&now));
    meta["date"] = when;
  }
#ifndef NDEBUG
  fmt::print("# WARNING: debug build, figures are not representative\n");
#endif
  const auto start = Clock::now();
  for (int n : nranks) {
    char tmpl[] = "/tmp/mc2-tune-XXXXXX";
    const int fd = mkstemp(tmpl);
    if (fd < 0) {
      fmt::print(stderr, "mc2 bench --tune: cannot create a temporary file in /tmp\n");
      return kExitWrong;
    }
    close(fd);
    const std::string tmp = tmpl;
    LaunchOptions lo;
    lo.nranks = n;
    lo.argv = {self_exe, "bench", "--tune", "-n", std::to_string(n), "--tune-result", tmp};
    lo.prefix_output = false;
    lo.direct_output = true;
    lo.heap_bytes = TuneHeapBytes();
    const int status = RunLaunch(lo);
    json r;
    if (status == 0) {
      std::ifstream in(tmp);
      try {
        in >> r;
      } catch (const std::exception& e) {
        fmt::print(stderr, "mc2 bench --tune: bad measurements from the {}-rank job: {}\n", n,
                   e.what());
      }
    }
    std::remove(tmp.c_str());
    if (status != 0) return status;
    if (!r.is_object() || !r.contains("results")) return kExitWrong;

    fmt::print("# mc2 bench --tune: {} ranks, dtype {}, {:.1f} s\n", n, DTypeName(kDType),
               r.value("seconds", 0.0));
    AddResults(table, r["results"], kTuned, "", n);
    meta["raw"][std::to_string(n)] = r["results"];
    std::fflush(stdout);
  }

  meta["seconds"] = std::chrono::duration<double>(Clock::now() - start).count();
  if (const int status = WriteTable(table, meta, output); status != 0) return status;
  fmt::print("# wrote {}\n", output);
  const char* env = std::getenv("MC2_TUNING_FILE");
  if (env && *env && std::filesystem::path(env) != std::filesystem::path(output))
    fmt::print("# note: MC2_TUNING_FILE={} is set, so the selector reads that file instead\n", env);
  return 0;
}

}  // namespace mc2::tools::bench
