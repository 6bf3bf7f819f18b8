// `mc2 bench batch`: a batch of collectives (include/mc2/batch.h) against
// the same collectives issued as separate calls, side by side.
//
//   mc2 bench batch [-n N] [--entries E] [--bytes B] [-i ITERS] [-w WARMUP]
//                   [--reps R] [--json FILE]
//
// Two cases: E all-reduces of B bytes (f32 sum) each, and a mixed batch of
// E entries cycling through all_reduce (f32 sum), all_gather (bf16),
// reduce_scatter (f32 max) and broadcast (i32, rotating root) of about B
// bytes per rank each. Each repetition times ITERS iterations of both ways,
// the order alternating between repetitions; a way's time is the slowest
// rank's mean per iteration, and the row shows the medians over the
// repetitions. Before timing, every entry's batch output is compared with
// the separate call's output bit for bit (#wrong). Private buffers, as a
// framework's gradients usually are. Inside a job (mc2 run, mpirun or
// `mc2 run --hosts`: then across hosts, where the batch is fused into few
// net collectives) it runs on the job's ranks; outside one the command
// launches itself on N local ranks (default 2). Rank 0 prints and writes
// the JSON.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli_validators.h"
#include "commands.h"
#include "core/env.h"
#include "launcher.h"
#include "mc2/mc2.h"
#include "output_paths.h"

namespace mc2::tools {
namespace {

struct BatchArgs {
  int nranks = 2;
  int entries = 200;
  std::string bytes_text = "16K";
  size_t bytes = 0;  // bytes_text, parsed
  int iters = 20;
  int warmup = 5;
  int reps = 7;
  std::string json;
};

using Clock = std::chrono::steady_clock;

// The entries of one case on this rank, with their buffers.
struct Case {
  std::string name;
  std::vector<BatchEntry> entries;
  std::vector<std::vector<char>> send, recv;
  size_t bytes_per_rank = 0;  // what each rank contributes, summed over entries
};

Case MakeCase(const Group& g, bool mixed, int entries, size_t bytes) {
  const int n = g.size(), me = g.rank();
  Case c;
  c.name = mixed ? "mixed" : "all_reduce";
  c.send.resize(entries);
  c.recv.resize(entries);
  for (int e = 0; e < entries; ++e) {
    const int kind = mixed ? e % 4 : 0;
    std::vector<char>& s = c.send[e];
    std::vector<char>& r = c.recv[e];
    auto fill = [&](size_t nbytes) {
      s.resize(nbytes);
      for (size_t i = 0; i < nbytes; i += 4) {
        const float v = static_cast<float>((i / 4 + e + 3 * me) % 13) - 6.f;
        std::memcpy(s.data() + i, &v, std::min<size_t>(4, nbytes - i));
      }
    };
    switch (kind) {
      case 0: {
        const size_t count = bytes / 4;
        fill(count * 4);
        r.assign(count * 4, 0);
        c.entries.push_back(
            BatchEntry::AllReduce(s.data(), r.data(), count, DType::kF32, ReduceOp::kSum));
        c.bytes_per_rank += count * 4;
        break;
      }
      case 1: {
        const size_t count = std::max<size_t>(1, bytes / 2 / n);
        fill(count * 2);
        r.assign(count * 2 * n, 0);
        c.entries.push_back(BatchEntry::AllGather(s.data(), r.data(), count, DType::kBF16));
        c.bytes_per_rank += count * 2;
        break;
      }
      case 2: {
        const size_t count = std::max<size_t>(1, bytes / 4 / n);
        fill(count * 4 * n);
        r.assign(count * 4, 0);
        c.entries.push_back(
            BatchEntry::ReduceScatter(s.data(), r.data(), count, DType::kF32, ReduceOp::kMax));
        c.bytes_per_rank += count * 4 * n;
        break;
      }
      default: {
        const size_t count = bytes / 4;
        fill(count * 4);
        r.assign(count * 4, 0);
        c.entries.push_back(
            BatchEntry::Broadcast(s.data(), r.data(), count, DType::kI32, (e / 4) % n));
        c.bytes_per_rank += me == (e / 4) % n ? count * 4 : 0;
        break;
      }
    }
  }
  return c;
}

// The entries as separate calls, issued back to back, then waited for.
void RunSeparate(const Group& g, const std::vector<BatchEntry>& es, std::vector<Work>& works) {
  works.clear();
  for (const BatchEntry& e : es) {
    switch (e.kind) {
      case BatchKind::kAllReduce:
        works.push_back(AllReduce(g, e.send, e.recv, e.count, e.dtype, e.op));
        break;
      case BatchKind::kAllGather:
        works.push_back(AllGather(g, e.send, e.recv, e.count, e.dtype));
        break;
      case BatchKind::kReduceScatter:
        works.push_back(ReduceScatter(g, e.send, e.recv, e.count, e.dtype, e.op));
        break;
      case BatchKind::kBroadcast:
        works.push_back(Broadcast(g, e.send, e.recv, e.count, e.dtype, e.root));
        break;
    }
  }
  for (Work& w : works) w.Wait();
}

// Outputs of the batch that differ from the separate calls' (bytes compared
// entry by entry).
int64_t CountWrong(const Group& g, Case& c) {
  std::vector<Work> works;
  RunSeparate(g, c.entries, works);
  std::vector<std::vector<char>> want = c.recv;
  for (auto& r : c.recv) std::fill(r.begin(), r.end(), 0x5A);
  Batch(g, c.entries).Wait();
  int64_t wrong = 0;
  for (size_t e = 0; e < want.size(); ++e) wrong += want[e] != c.recv[e];
  int64_t total = 0;
  AllReduce(g, &wrong, &total, 1, DType::kI64, ReduceOp::kSum).Wait();
  return total;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

struct Row {
  std::string name;
  int entries;
  size_t bytes_per_rank;
  double separate_us, batch_us;
  int64_t wrong;
};

Row Measure(const Group& g, Case& c, const BatchArgs& a) {
  std::vector<Work> works;
  auto time_way = [&](bool batch) {
    Barrier(g).Wait();
    const auto t0 = Clock::now();
    for (int i = 0; i < a.iters; ++i) {
      if (batch) {
        Batch(g, c.entries).Wait();
      } else {
        RunSeparate(g, c.entries, works);
      }
    }
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / a.iters;
    double slowest = 0;
    AllReduce(g, &us, &slowest, 1, DType::kF64, ReduceOp::kMax).Wait();
    return slowest;
  };
  for (int i = 0; i < a.warmup; ++i) {
    RunSeparate(g, c.entries, works);
    Batch(g, c.entries).Wait();
  }
  std::vector<double> sep, bat;
  for (int r = 0; r < a.reps; ++r) {
    if (r % 2 == 0) {
      sep.push_back(time_way(false));
      bat.push_back(time_way(true));
    } else {
      bat.push_back(time_way(true));
      sep.push_back(time_way(false));
    }
  }
  return {c.name, static_cast<int>(c.entries.size()), c.bytes_per_rank, Median(sep), Median(bat),
          0};
}

int RunRank(const BatchArgs& a) {
  ReserveStdoutForJson(a.json);
  Group g = Group::FromEnv();
  std::vector<Row> rows;
  for (bool mixed : {false, true}) {
    Case c = MakeCase(g, mixed, a.entries, a.bytes);
    const int64_t wrong = CountWrong(g, c);
    Row row = Measure(g, c, a);
    row.wrong = wrong;
    rows.push_back(row);
  }
  if (g.rank() != 0) return 0;
  fmt::print(
      "# mc2 bench batch: {} ranks, {} entries of ~{} B per rank, {} iterations x {} "
      "repetitions (medians; slowest rank)\n",
      g.size(), a.entries, a.bytes, a.iters, a.reps);
  fmt::print("{:>12} {:>8} {:>14} {:>14} {:>12} {:>8} {:>7}\n", "case", "entries", "bytes/rank",
             "separate_us", "batch_us", "speedup", "#wrong");
  bool ok = true;
  for (const Row& r : rows) {
    fmt::print("{:>12} {:>8} {:>14} {:>14.1f} {:>12.1f} {:>7.2f}x {:>7}\n", r.name, r.entries,
               r.bytes_per_rank, r.separate_us, r.batch_us, r.separate_us / r.batch_us, r.wrong);
    ok = ok && r.wrong == 0;
  }
  if (!a.json.empty()) {
    std::string j = fmt::format(
        "{{\"tool\": \"mc2 bench batch\", \"ranks\": {}, \"entries\": {}, \"bytes\": {}, "
        "\"iters\": {}, \"reps\": {}, \"cases\": [",
        g.size(), a.entries, a.bytes, a.iters, a.reps);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      j += fmt::format(
          "{}{{\"case\": \"{}\", \"entries\": {}, \"bytes_per_rank\": {}, \"separate_us\": {:.3f}, "
          "\"batch_us\": {:.3f}, \"speedup\": {:.3f}, \"wrong\": {}}}",
          i ? ", " : "", r.name, r.entries, r.bytes_per_rank, r.separate_us, r.batch_us,
          r.separate_us / r.batch_us, r.wrong);
    }
    j += "]}\n";
    const std::string err = WriteOutputFile(a.json, j);
    if (!err.empty()) {
      fmt::print(stderr, "mc2 bench batch: cannot write --json {}: {}\n", a.json, err);
      ok = false;
    }
  }
  return ok ? 0 : 1;
}

}  // namespace

void RegisterBenchBatch(CLI::App& bench) {
  auto a = std::make_shared<BatchArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "batch",
      "A batch of collectives (one exchange) against the same collectives as separate "
      "calls");
  cmd->add_option("-n,--nranks", a->nranks, "Ranks (inside a job: the job's size)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--entries", a->entries, "Collectives per batch")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--bytes", a->bytes_text,
                  "Bytes per entry and rank (about, for the mixed case), e.g. 16K")
      ->capture_default_str()
      ->check(BytesValidator(8));
  cmd->add_option("-i,--iters", a->iters, "Timed iterations per repetition and way")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-w,--warmup", a->warmup, "Untimed iterations")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--reps", a->reps, "Repetitions (the rows show medians)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--json", a->json,
                  "Also write the rows to this JSON file (- for standard output)");
  cmd->callback([a] {
    a->bytes = core::ParseBytes(a->bytes_text, "--bytes");
    const bool in_job = Group::LaunchedByMc2() || Group::LaunchedByMpi();
    if (in_job) {
      const int status = RunRank(*a);
      if (status != 0) throw CLI::RuntimeError(status);
      return;
    }
    if (!a->json.empty() && a->json != "-") {
      try {
        CheckWritableFile(a->json, "--json");
      } catch (const Error& e) {
        fmt::print(stderr, "mc2 bench batch: {}\n", e.message());
        throw CLI::RuntimeError(2);
      }
    }
    LaunchOptions lo;
    lo.nranks = a->nranks;
    lo.argv = {SelfExe(),
               "bench",
               "batch",
               "--entries",
               std::to_string(a->entries),
               "--bytes",
               a->bytes_text,
               "--iters",
               std::to_string(a->iters),
               "--warmup",
               std::to_string(a->warmup),
               "--reps",
               std::to_string(a->reps)};
    if (!a->json.empty()) lo.argv.insert(lo.argv.end(), {"--json", a->json});
    lo.prefix_output = false;
    lo.direct_output = true;
    const int status = RunLaunch(lo);
    if (status != 0) throw CLI::RuntimeError(status);
  });
}

}  // namespace mc2::tools
