// `mc2 topo`: the map of hosts, ranks and cores of a job, and a short
// measurement of each level's link.
//
// Outside a job the command re-executes itself under the launcher with N
// ranks (-n, default 2); inside one (`mc2 run -n N mc2 topo`, or a job of
// mpirun / `mc2 run --hosts` across hosts) each rank describes itself --
// host name, topology counts, the CPUs its compute and progress threads may
// use -- and the records are all-gathered over the public Group API, so the
// same code maps a world that spans hosts. Rank 0 prints.
//
// Link levels, from the ranks' compute CPUs: two ranks on different hosts
// are "cross-host"; on one host, on different sockets "cross-socket", on
// one socket but different NUMA nodes "cross-numa", on one NUMA node
// "same-numa" (ranks sharing cores: "same-core"). For the first pair of
// each level present: latency = half the median round trip of an 8-byte
// Send/Recv ping-pong, bandwidth = bytes / half the median round trip of a
// --bytes message each way. Every rank walks the same list of pairs; the
// others wait at a barrier.
#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_validators.h"
#include "commands.h"
#include "core/env.h"
#include "core/placement.h"
#include "core/topology.h"
#include "launcher.h"
#include "mc2/mc2.h"
#include "output_paths.h"

namespace mc2::tools {
namespace {

constexpr int kMaxCpus = 1024;
constexpr int kExitFailed = 1;

struct TopoArgs {
  int nranks = 0;
  std::string json;  // --json FILE ("-": standard output)
  std::string bytes = "16M";
  int iters = 200;
};

// One rank's description, all-gathered as bytes (fixed size, no padding
// that matters: it is only copied).
struct RankInfo {
  char host[64];
  char policy[16];
  char source[16];
  int32_t local_rank, local_size;
  int32_t cpus, cores, sockets, numa_nodes;
  int32_t socket, numa, core;  // of the first compute CPU (-1: unknown)
  uint8_t compute[kMaxCpus / 8];
  uint8_t progress[kMaxCpus / 8];
};

void SetMask(uint8_t* mask, const std::vector<int>& cpus) {
  std::memset(mask, 0, kMaxCpus / 8);
  for (int c : cpus)
    if (c >= 0 && c < kMaxCpus) mask[c / 8] |= uint8_t(1u << (c % 8));
}

std::vector<int> GetMask(const uint8_t* mask) {
  std::vector<int> out;
  for (int c = 0; c < kMaxCpus; ++c)
    if (mask[c / 8] & (1u << (c % 8))) out.push_back(c);
  return out;
}

template <size_t N>
void Copy(char (&dst)[N], const std::string& s) {
  std::memset(dst, 0, N);
  std::memcpy(dst, s.data(), std::min(N - 1, s.size()));
}

// The CPUs the thread named mc2-progress may use, as the kernel reports
// them (sched_getaffinity takes any thread id of the process).
std::vector<int> ProgressCpus() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::string comm;
    std::getline(std::ifstream(entry.path() / "comm"), comm);
    if (comm != "mc2-progress") continue;
    cpu_set_t set;
    CPU_ZERO(&set);
    const pid_t tid = static_cast<pid_t>(std::stol(entry.path().filename().string()));
    if (sched_getaffinity(tid, sizeof(set), &set) != 0) return {};
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    return cpus;
  }
  return {};
}

RankInfo Describe(const Group& g) {
  RankInfo info;
  std::memset(&info, 0, sizeof(info));
  const core::Topology& t = core::HostTopology();
  Copy(info.host, t.host);
  Copy(info.source, t.source);
  const core::Placement* p = core::CurrentPlacement();
  Copy(info.policy, p ? core::BindPolicyName(p->policy) : "none");
  auto lr = core::LocalRankFromEnv();
  info.local_rank = lr ? lr->rank : 0;
  info.local_size = lr ? lr->size : 1;
  info.cpus = static_cast<int32_t>(t.cpus.size());
  info.cores = t.cores();
  info.sockets = t.sockets();
  info.numa_nodes = t.numa_nodes();
  const std::vector<int> compute = core::ThreadCpus();
  SetMask(info.compute, compute);
  SetMask(info.progress, ProgressCpus());
  const core::Cpu* first = compute.empty() ? nullptr : t.Find(compute.front());
  info.socket = first ? first->socket : -1;
  info.numa = first ? first->numa : -1;
  info.core = first ? first->core : -1;
  return info;
}

std::string Level(const RankInfo& a, const RankInfo& b) {
  if (std::strcmp(a.host, b.host) != 0) return "cross-host";
  if (a.socket != b.socket) return "cross-socket";
  if (a.numa != b.numa) return "cross-numa";
  if (a.core >= 0 && a.core == b.core) return "same-core";
  return "same-numa";
}

struct Link {
  std::string level;
  int a, b;
  double latency_us = 0, bandwidth_gbps = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Round trips between ranks a and b of `bytes` each way; a's median in
// seconds (b returns 0).
double PingPong(const Group& g, int a, int b, size_t bytes, int iters, std::vector<char>& buf) {
  using Clock = std::chrono::steady_clock;
  const int me = g.rank();
  const int peer = me == a ? b : a;
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    if (me == a) {
      g.Send(buf.data(), bytes, peer, 7).Wait();
      g.Recv(buf.data(), bytes, peer, 7).Wait();
    } else {
      g.Recv(buf.data(), bytes, peer, 7).Wait();
      g.Send(buf.data(), bytes, peer, 7).Wait();
    }
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return me == a ? Median(times) : 0.0;
}

std::vector<Link> MeasureLinks(const Group& g, const std::vector<RankInfo>& all,
                               const TopoArgs& args) {
  std::vector<Link> links;
  const int n = g.size();
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) {
      const std::string level = Level(all[i], all[j]);
      if (std::none_of(links.begin(), links.end(),
                       [&](const Link& l) { return l.level == level; }))
        links.push_back({level, i, j});
    }
  const size_t bytes = core::ParseBytes(args.bytes, "--bytes");
  std::vector<char> buf(std::max<size_t>(bytes, 8), 1);
  for (Link& l : links) {
    const int me = g.rank();
    if (me == l.a || me == l.b) {
      PingPong(g, l.a, l.b, 8, 10, buf);  // warm-up: the channel's first use
      const double lat = PingPong(g, l.a, l.b, 8, args.iters, buf);
      PingPong(g, l.a, l.b, bytes, 1, buf);
      const double big = PingPong(g, l.a, l.b, bytes, 5, buf);
      if (me == l.a) {
        l.latency_us = lat / 2 * 1e6;
        l.bandwidth_gbps = big > 0 ? bytes / (big / 2) / 1e9 : 0;
      }
    }
    // Rank 0 learns the figures from the pair's first rank.
    double figures[2] = {l.latency_us, l.bandwidth_gbps};
    Broadcast(g, figures, figures, 2, DType::kF64, l.a).Wait();
    l.latency_us = figures[0];
    l.bandwidth_gbps = figures[1];
  }
  return links;
}

void Print(const std::vector<RankInfo>& all, const std::vector<Link>& links, size_t bytes) {
  std::vector<std::string> hosts;
  for (const RankInfo& r : all)
    if (std::find(hosts.begin(), hosts.end(), r.host) == hosts.end()) hosts.push_back(r.host);
  fmt::print("# {} rank(s) on {} host(s)\n", all.size(), hosts.size());
  for (const std::string& h : hosts) {
    const RankInfo* first = nullptr;
    for (const RankInfo& r : all)
      if (h == r.host && !first) first = &r;
    fmt::print("host {}: {} socket(s), {} NUMA node(s), {} core(s), {} CPU(s) ({})\n", h,
               first->sockets, first->numa_nodes, first->cores, first->cpus, first->source);
    fmt::print("  {:>5} {:>5}  {:<6} {:>6} {:>5} {:>5}  {:<16} {:<16}\n", "rank", "local",
               "bind", "socket", "numa", "core", "compute cpus", "progress cpus");
    for (size_t i = 0; i < all.size(); ++i) {
      const RankInfo& r = all[i];
      if (h != r.host) continue;
      fmt::print("  {:>5} {:>5}  {:<6} {:>6} {:>5} {:>5}  {:<16} {:<16}\n", i, r.local_rank,
                 r.policy, r.socket, r.numa, r.core, core::FormatCpuList(GetMask(r.compute)),
                 core::FormatCpuList(GetMask(r.progress)));
    }
  }
  if (links.empty()) return;
  fmt::print("# links (latency: half an 8 B round trip; bandwidth: {} B each way)\n", bytes);
  fmt::print("  {:<13} {:>7} {:>12} {:>10}\n", "level", "ranks", "latency_us", "GB/s");
  for (const Link& l : links)
    fmt::print("  {:<13} {:>7} {:>12.2f} {:>10.2f}\n", l.level, fmt::format("{}-{}", l.a, l.b),
               l.latency_us, l.bandwidth_gbps);
}

nlohmann::json Json(const std::vector<RankInfo>& all, const std::vector<Link>& links,
                    size_t bytes) {
  nlohmann::json j;
  j["hosts"] = nlohmann::json::array();
  std::vector<std::string> seen;
  for (const RankInfo& r : all) {
    if (std::find(seen.begin(), seen.end(), r.host) != seen.end()) continue;
    seen.push_back(r.host);
    j["hosts"].push_back({{"host", r.host},
                          {"sockets", r.sockets},
                          {"numa_nodes", r.numa_nodes},
                          {"cores", r.cores},
                          {"cpus", r.cpus},
                          {"source", r.source}});
  }
  j["ranks"] = nlohmann::json::array();
  for (size_t i = 0; i < all.size(); ++i) {
    const RankInfo& r = all[i];
    j["ranks"].push_back({{"rank", i},
                          {"host", r.host},
                          {"local_rank", r.local_rank},
                          {"bind", r.policy},
                          {"socket", r.socket},
                          {"numa", r.numa},
                          {"core", r.core},
                          {"compute_cpus", GetMask(r.compute)},
                          {"progress_cpus", GetMask(r.progress)}});
  }
  j["link_bytes"] = bytes;
  j["links"] = nlohmann::json::array();
  for (const Link& l : links)
    j["links"].push_back({{"level", l.level},
                          {"ranks", {l.a, l.b}},
                          {"latency_us", l.latency_us},
                          {"bandwidth_GBps", l.bandwidth_gbps}});
  return j;
}

int RunRank(const TopoArgs& args) {
  ReserveStdoutForJson(args.json);
  Group g = Group::FromEnv();
  const RankInfo mine = Describe(g);
  std::vector<RankInfo> all(g.size());
  AllGather(g, &mine, all.data(), sizeof(RankInfo), DType::kU8).Wait();
  const std::vector<Link> links = MeasureLinks(g, all, args);
  const size_t bytes = core::ParseBytes(args.bytes, "--bytes");
  if (g.rank() == 0) {
    Print(all, links, bytes);
    if (!args.json.empty()) {
      const std::string err = WriteOutputFile(args.json, Json(all, links, bytes).dump(2) + "\n");
      if (!err.empty()) {
        fmt::print(stderr, "mc2 topo: cannot write --json {}: {}\n", args.json, err);
        Barrier(g).Wait();
        return kExitFailed;
      }
    }
  }
  Barrier(g).Wait();
  return 0;
}

std::vector<std::string> SelfArgs() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> out;
  for (std::string a; std::getline(in, a, '\0');) out.push_back(a);
  return out;
}

void Callback(const TopoArgs& args) {
  // Inside a job: of `mc2 run`, or of mpirun / `mc2 run --hosts` (ranks on
  // several hosts).
  if (Group::LaunchedByMc2() || Group::LaunchedByMpi()) {
    try {
      if (RunRank(args) != 0) throw CLI::RuntimeError(kExitFailed);
    } catch (const Error& e) {
      fmt::print(stderr, "mc2 topo: {}\n", e.what());
      throw CLI::RuntimeError(kExitFailed);
    }
    return;
  }
  if (!args.json.empty()) {
    try {
      CheckWritableFile(args.json, "--json");
    } catch (const Error& e) {
      fmt::print(stderr, "mc2 topo: {}\n", e.message());
      throw CLI::RuntimeError(2);  // a usage error, checked before any work
    }
  }
  LaunchOptions lo;
  lo.nranks = args.nranks ? args.nranks : 2;
  lo.argv = SelfArgs();
  if (lo.argv.empty()) {
    fmt::print(stderr, "mc2 topo: cannot read /proc/self/cmdline\n");
    throw CLI::RuntimeError(kExitFailed);
  }
  lo.argv[0] = SelfExe();
  lo.prefix_output = false;
  lo.direct_output = true;
  // Room for the ping-pong's point-to-point slots, whatever --bytes is.
  lo.heap_bytes = size_t{64} << 20;
  const int status = RunLaunch(lo);
  if (status != 0) throw CLI::RuntimeError(status);
}

}  // namespace

void RegisterTopo(CLI::App& app) {
  auto args = std::make_shared<TopoArgs>();
  CLI::App* cmd = app.add_subcommand(
      "topo", "Print the map of hosts, ranks and cores, and measure each level's link");
  cmd->add_option("-n,--nranks", args->nranks,
                  "Ranks to start on this host (default 2; inside a job, the job's)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--json", args->json,
                  "Also write the map and the links to this JSON file (- for standard output, "
                  "the table then going to standard error)");
  cmd->add_option("--bytes", args->bytes, "Message size of the bandwidth measurement")
      ->check(BytesValidator(8))
      ->default_str("16M");
  cmd->add_option("-i,--iters", args->iters, "Round trips of the latency measurement")
      ->check(CLI::Range(1, 100000))
      ->default_str("200");
  cmd->callback([args] { Callback(*args); });
}

}  // namespace mc2::tools
