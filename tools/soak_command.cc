// `mc2 soak -n N -t DURATION [--faults] [--seed X]`: the driver of the soak
// (soak.h). Outside a job it starts jobs through `mc2 run` (this same
// executable, so the ranks are exactly the `mc2` being tested), waits for
// each with a deadline of its own, reads every rank's outcome file, checks
// for leaked processes and /dev/shm files, and prints one summary line:
//
//   soak: 81234 ops, 0 wrong, 0 hangs, 0 errors; faults injected 6, reported 6
//
// ops: operations issued (rank 0's count; fused operators count one);
// wrong: output elements that differ from the reference (or bytes written
// where nothing may be); hangs: jobs that timed out (an mc2 kTimeout without
// an injected fault, or a job the driver had to kill); errors: any other
// failure of a rank (an unexpected mc2::Error, a crash, a leak). With
// --faults, each job has one victim rank, SIGKILLed or SIGSTOPped at a
// random time (sometimes before it creates the world), with MC2_TIMEOUT
// short (--fault-timeout); a fault counts as reported when every other rank
// raised an mc2::Error naming the victim -- for a kill "rank V (pid P) was
// killed by signal 9" within 2 s, for a stop "rank V (pid P) is stopped" (or
// "rank V never started") within the timeout plus 2 s -- and the job left no
// process and no /dev/shm file behind.
//
// Exits 0 when every count but ops is 0 and every fault was reported, 1
// otherwise, 2 on bad options. A failed job's directory (rank outcomes and
// the launcher's output) is kept and named.
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_validators.h"
#include "commands.h"
#include "core/env.h"
#include "launcher.h"
#include "mc2/mc2.h"
#include "soak.h"

namespace mc2::tools {

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

constexpr int kExitFailed = 1;
constexpr int kExitBadUsage = 2;

struct SoakArgs {
  int nranks = 4;
  std::string duration = "30";  // core::ParseDuration: a bare number is seconds
  double seconds = 30;          // `duration` in seconds
  bool faults = false;
  uint64_t seed = 0;  // 0: from the clock (printed, to replay a run)
  std::string fault_timeout = "1s";
  std::string heap = "96M";
  // Internal: set when a rank of a soak job runs this command.
  soak::RankArgs rank;
  bool is_rank = false;
};

[[noreturn]] void Usage(const std::string& message) {
  fmt::print(stderr, "mc2 soak: {}\n", message);
  throw CLI::RuntimeError(kExitBadUsage);
}


int64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// The mc2-* names in the segment directory (the launcher unlinks its files
// at once, so a name that stays is a leak).
std::set<std::string> ShmNames(const std::string& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("mc2-", 0) == 0) names.insert(name);
  }
  return names;
}

// A process that no longer runs code (gone, or a zombie).
bool ProcessGone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content;
  if (!stat || !std::getline(stat, content)) return true;
  const size_t paren = content.rfind(')');
  return paren == std::string::npos || paren + 2 >= content.size() ||
         content[paren + 2] == 'Z' || content[paren + 2] == 'X';
}

// What one rank wrote (soak.h).
struct RankOutcome {
  bool present = false, complete = false;
  uint64_t ops = 0, checked = 0, wrong = 0;
  std::string error_code, error_what;
  int64_t error_ns = 0;
  bool noerror = false;
  std::vector<std::string> bad;
  pid_t pid = 0;
};

RankOutcome ReadRank(const fs::path& dir, int r) {
  RankOutcome o;
  std::ifstream pid_in(dir / fmt::format("rank-{}.pid", r));
  pid_in >> o.pid;
  std::ifstream in(dir / fmt::format("rank-{}.out", r));
  if (!in) return o;
  o.present = true;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "ops") ls >> o.ops;
    else if (key == "checked") ls >> o.checked;
    else if (key == "wrong") ls >> o.wrong;
    else if (key == "noerror") o.noerror = true;
    else if (key == "end") o.complete = true;
    else if (key == "bad") o.bad.push_back(line.substr(4));
    else if (key == "error") {
      ls >> o.error_code >> o.error_ns;
      std::getline(ls, o.error_what);
      if (!o.error_what.empty() && o.error_what[0] == ' ') o.error_what.erase(0, 1);
    }
  }
  return o;
}

struct Totals {
  uint64_t ops = 0, checked = 0, wrong = 0, hangs = 0, errors = 0;
  uint64_t injected = 0, reported = 0;
  double worst_kill_ms = 0, worst_stop_ms = 0;
  int jobs = 0;
};

struct Job {
  fs::path dir;
  int status = -1;
  bool killed = false;  // the driver's deadline ended it
  double seconds = 0;
};

// Runs `mc2 run -n N ... mc2 soak <rank options>` with its output in
// dir/output, and waits at most `deadline_s`.
// With `progress_s` > 0, prints a progress line to stdout that often, with
// the time spent out of `a.seconds`.
Job RunJob(const SoakArgs& a, const fs::path& dir, const std::vector<std::string>& rank_args,
           const std::string& timeout, double deadline_s, double progress_s = 0) {
  Job job;
  job.dir = dir;
  const std::string self = SelfExe();
  std::vector<std::string> argv = {self, "run", "-n", std::to_string(a.nranks), "--heap", a.heap,
                                   self, "soak"};
  argv.insert(argv.end(), rank_args.begin(), rank_args.end());
  const auto start = Clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    fmt::print(stderr, "mc2 soak: fork: {}\n", std::strerror(errno));
    throw CLI::RuntimeError(kExitFailed);
  }
  if (pid == 0) {
    const int fd = open((dir / "output").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    setenv("MC2_TIMEOUT", timeout.c_str(), 1);
    std::vector<char*> cargv;
    for (auto& s : argv) cargv.push_back(s.data());
    cargv.push_back(nullptr);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  int status = 0;
  double next_progress = progress_s;
  for (;;) {
    const pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid) break;
    if (got < 0 && errno != EINTR) break;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (progress_s > 0 && elapsed >= next_progress) {
      fmt::print("soak: {:.0f} s of {:g} s{}\n", elapsed, a.seconds,
                 elapsed > a.seconds ? " (the ranks are finishing their last operations)" : "");
      std::fflush(stdout);
      next_progress += progress_s;
    }
    if (std::chrono::duration<double>(Clock::now() - start).count() > deadline_s && !job.killed) {
      // The ranks die with the launcher (PR_SET_PDEATHSIG).
      kill(pid, SIGKILL);
      job.killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  job.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  job.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return job;
}

// Leaks of a finished job: its ranks' processes still running, or new names
// in the segment directory. Returns a description, "" if none.
std::string CheckLeaks(const std::vector<RankOutcome>& ranks, const std::string& shm_dir,
                       const std::set<std::string>& shm_before) {
  std::string out;
  const auto start = Clock::now();
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].pid <= 0) continue;
    // The launcher reaps its ranks before it exits; allow a moment anyway.
    while (!ProcessGone(ranks[r].pid) &&
           std::chrono::duration<double>(Clock::now() - start).count() < 2)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!ProcessGone(ranks[r].pid)) {
      out += fmt::format(" rank {} (pid {}) still runs;", r, ranks[r].pid);
      kill(ranks[r].pid, SIGKILL);
    }
  }
  std::set<std::string> leaked;
  for (const auto& name : ShmNames(shm_dir))
    if (!shm_before.count(name)) leaked.insert(name);
  if (!leaked.empty()) {
    // Another job may be creating its files at this very moment.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto now = ShmNames(shm_dir);
    for (const auto& name : leaked)
      if (now.count(name)) out += fmt::format(" {}/{} left behind;", shm_dir, name);
  }
  return out;
}

void PrintRankProblems(const std::vector<RankOutcome>& ranks) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto& o = ranks[r];
    for (const auto& b : o.bad) fmt::print("  rank {}: {}\n", r, b);
    if (!o.error_code.empty()) fmt::print("  rank {}: {} {}\n", r, o.error_code, o.error_what);
  }
}

// How often a run of `seconds` reports progress: about five times, at
// least a second and at most ten seconds apart.
double ProgressInterval(double seconds) { return std::clamp(seconds / 5, 1.0, 10.0); }

// Runs the soak without faults: one job for the whole time.
void SoakPlain(const SoakArgs& a, const fs::path& root, Totals& t, bool* keep) {
  const char* user_timeout = std::getenv("MC2_TIMEOUT");
  // Without a fault nothing should wait long: a minute without progress is
  // a hang (the library raises kTimeout naming who is missing).
  const std::string timeout = user_timeout && *user_timeout ? user_timeout : "60s";
  const std::string shm_dir = std::getenv("MC2_SHM_DIR") ? std::getenv("MC2_SHM_DIR") : "/dev/shm";
  const fs::path dir = root / "job-0";
  fs::create_directories(dir);
  const auto shm_before = ShmNames(shm_dir);
  const Job job = RunJob(
      a, dir,
      {"--rank-dir", dir.string(), "--seed", std::to_string(a.seed), "--duration",
       fmt::format("{}", a.seconds), "--test-corrupt-every", std::to_string(a.rank.corrupt_every)},
      timeout, a.seconds + 300, ProgressInterval(a.seconds));
  ++t.jobs;
  std::vector<RankOutcome> ranks;
  for (int r = 0; r < a.nranks; ++r) ranks.push_back(ReadRank(dir, r));
  bool failed = job.killed || job.status != 0;
  if (job.killed) ++t.hangs;
  t.ops += ranks[0].ops;
  for (int r = 0; r < a.nranks; ++r) {
    const auto& o = ranks[r];
    t.checked += o.checked;
    t.wrong += o.wrong;
    if (o.wrong) failed = true;
    if (o.error_code == "timeout") {
      ++t.hangs;
      failed = true;
    } else if (!o.error_code.empty() || !o.complete) {
      if (!job.killed) ++t.errors;
      failed = true;
    }
  }
  const std::string leaks = CheckLeaks(ranks, shm_dir, shm_before);
  if (!leaks.empty()) {
    ++t.errors;
    failed = true;
    fmt::print("soak: leak after the job:{}\n", leaks);
  }
  if (failed) {
    *keep = true;
    fmt::print("soak: the job failed (launcher status {}{}); its files are in {}\n", job.status,
               job.killed ? ", killed by the driver's deadline" : "", dir.string());
    PrintRankProblems(ranks);
  }
}

double FaultTimeoutMs(const SoakArgs& a) {
  return std::chrono::duration<double, std::milli>(
             core::ParseDuration(a.fault_timeout, "--fault-timeout"))
      .count();
}

// Whether `what` names the victim as the fault did.
bool NamesVictim(const std::string& what, const std::string& fault, int victim, pid_t pid) {
  const std::string who = fmt::format("rank {} (pid {})", victim, pid);
  if (fault == "kill")
    return what.find(who + " was killed by signal 9") != std::string::npos ||
           what.find(fmt::format("rank {} was killed by signal 9", victim)) != std::string::npos;
  return what.find(who + " is stopped") != std::string::npos ||
         what.find(fmt::format("rank {} never started", victim)) != std::string::npos;
}

// Runs fault jobs until the time is up.
void SoakFaults(const SoakArgs& a, const fs::path& root, Totals& t, bool* keep) {
  const std::string shm_dir = std::getenv("MC2_SHM_DIR") ? std::getenv("MC2_SHM_DIR") : "/dev/shm";
  std::mt19937_64 rng(a.seed);
  const auto start = Clock::now();
  for (int j = 0;; ++j) {
    if (j > 0 && std::chrono::duration<double>(Clock::now() - start).count() >= a.seconds) break;
    const fs::path dir = root / fmt::format("job-{}", j);
    fs::create_directories(dir);
    const int victim = static_cast<int>(rng() % a.nranks);
    const std::string fault = rng() % 2 ? "kill" : "stop";
    // One job in six faults before the world exists; the others within
    // the first 1.5 s of operations.
    const double delay_ms = rng() % 6 == 0 ? 0.0 : 20.0 + static_cast<double>(rng() % 1500);
    const uint64_t seed = rng();
    const auto shm_before = ShmNames(shm_dir);
    const Job job = RunJob(a, dir,
                           {"--rank-dir", dir.string(), "--seed", std::to_string(seed),
                            "--victim", std::to_string(victim), "--fault", fault, "--delay-ms",
                            fmt::format("{}", delay_ms), "--max-seconds", "60"},
                           a.fault_timeout, 120);
    ++t.jobs;
    ++t.injected;
    std::vector<RankOutcome> ranks;
    for (int r = 0; r < a.nranks; ++r) ranks.push_back(ReadRank(dir, r));
    // The victim's own note: its pid and when it signalled itself.
    std::string vkind;
    pid_t vpid = 0;
    int64_t vns = 0;
    {
      std::ifstream in(dir / "victim");
      in >> vkind >> vpid >> vns;
    }
    bool ok = !job.killed && vpid > 0;
    std::string problems;
    if (job.killed) {
      ++t.hangs;
      problems += " the job had to be killed;";
    }
    if (vpid <= 0) problems += " the victim never injected its fault;";
    double worst_ms = 0;
    uint64_t ops = 0;
    for (int r = 0; r < a.nranks; ++r) {
      if (r == victim) continue;
      const auto& o = ranks[r];
      t.checked += o.checked;
      t.wrong += o.wrong;
      ops = std::max(ops, o.ops);
      if (o.wrong) {
        ok = false;
        problems += fmt::format(" rank {} saw {} wrong elements;", r, o.wrong);
      }
      if (!o.present || o.error_code.empty()) {
        ok = false;
        problems += fmt::format(" rank {} {};", r,
                                !o.present ? "wrote no outcome" : "raised no error");
        continue;
      }
      if (o.error_code == "exception" || !NamesVictim(o.error_what, fault, victim, vpid)) {
        ok = false;
        problems += fmt::format(" rank {} raised an error not naming the fault: {} {};", r,
                                o.error_code, o.error_what);
        continue;
      }
      const double ms = static_cast<double>(o.error_ns - vns) / 1e6;
      worst_ms = std::max(worst_ms, ms);
    }
    // A kill must be seen within 2 s; a stop once the timeout expires
    // (counted from when each survivor started waiting, so at most the
    // timeout after the stop) plus the same 2 s.
    const double allowed_ms = fault == "kill" ? 2000.0 : FaultTimeoutMs(a) + 2000.0;
    if (ok && worst_ms > allowed_ms) {
      ok = false;
      problems += fmt::format(" reported after {:.0f} ms (allowed {:.0f});", worst_ms, allowed_ms);
    }
    const std::string leaks = CheckLeaks(ranks, shm_dir, shm_before);
    if (!leaks.empty()) {
      ok = false;
      ++t.errors;
      problems += " leak:" + leaks;
    }
    t.ops += ops;
    if (ok) {
      ++t.reported;
      if (fault == "kill") t.worst_kill_ms = std::max(t.worst_kill_ms, worst_ms);
      else t.worst_stop_ms = std::max(t.worst_stop_ms, worst_ms);
    }
    fmt::print("soak: job {} (seed {}): {} rank {} {}: {}{}\n", j, seed, fault, victim,
               delay_ms == 0 ? "before set-up" : fmt::format("after {:.0f} ms", delay_ms),
               ok ? fmt::format("reported by all {} others in at most {:.0f} ms", a.nranks - 1,
                                worst_ms)
                  : "NOT REPORTED:",
               problems);
    if (!ok) {
      *keep = true;
      fmt::print("  files in {}\n", dir.string());
      PrintRankProblems(ranks);
    } else {
      fs::remove_all(dir);
    }
    std::fflush(stdout);
  }
}

void RunDriver(const SoakArgs& a) {
  if (a.faults && a.nranks < 2) Usage("--faults needs at least 2 ranks (a victim and a witness)");
  // Every job would fail on a bad MC2_* variable: say so once, up front.
  try {
    core::ValidateEnvironment();
  } catch (const Error& e) {
    Usage(e.message());
  }
  SoakArgs args = a;
  if (args.seed == 0) args.seed = static_cast<uint64_t>(MonoNs()) | 1;
  char tmpl[] = "/tmp/mc2-soak-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    fmt::print(stderr, "mc2 soak: cannot create a directory in /tmp: {}\n", std::strerror(errno));
    throw CLI::RuntimeError(kExitFailed);
  }
  const fs::path root = tmpl;
  fmt::print("soak: {} ranks, {} s{}, seed {}\n", args.nranks, args.seconds,
             args.faults ? fmt::format(", faults (MC2_TIMEOUT={})", args.fault_timeout) : "",
             args.seed);
  std::fflush(stdout);
  Totals t;
  bool keep = false;
  const auto start = Clock::now();
  if (args.faults) SoakFaults(args, root, t, &keep);
  else SoakPlain(args, root, t, &keep);
  if (!keep) fs::remove_all(root);
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  fmt::print("soak: {} jobs in {:.0f} s, {} elements checked{}\n", t.jobs, took, t.checked,
             args.faults ? fmt::format("; slowest report: kill {:.0f} ms, stop {:.0f} ms",
                                       t.worst_kill_ms, t.worst_stop_ms)
                         : "");
  fmt::print("soak: {} ops, {} wrong, {} hangs, {} errors; faults injected {}, reported {}\n",
             t.ops, t.wrong, t.hangs, t.errors, t.injected, t.reported);
  std::fflush(stdout);
  const bool ok = t.wrong == 0 && t.hangs == 0 && t.errors == 0 && t.reported == t.injected &&
                  (args.faults || t.ops > 0);
  if (!ok) throw CLI::RuntimeError(kExitFailed);
}

}  // namespace

void RegisterSoak(CLI::App& app) {
  auto a = std::make_shared<SoakArgs>();
  CLI::App* cmd = app.add_subcommand(
      "soak",
      "Run random collectives and fused operators for a while, checking every result "
      "(--faults: kill or stop a random rank in each job and check that every other rank "
      "reports it)");
  cmd->add_option("-n,--nranks", a->nranks, "Ranks per job")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("-t,--duration", a->duration, "How long to run: 30 (seconds), 90s, 5m, 1.5h")
      ->capture_default_str()
      ->check(DurationValidator());
  cmd->add_flag("--faults", a->faults,
                "Inject one fault (SIGKILL or SIGSTOP of a random rank) per job");
  cmd->add_option("--seed", a->seed, "Seed of the operation sequence (default: from the clock)");
  cmd->add_option("--fault-timeout", a->fault_timeout,
                  "MC2_TIMEOUT of the fault jobs (how long a stopped rank takes to be reported)")
      ->capture_default_str()
      ->check(DurationValidator());
  cmd->add_option("--heap", a->heap, "Shared heap per rank")
      ->capture_default_str()
      ->check(BytesValidator(1));
  // Internal: the options of a rank of a soak job.
  cmd->add_option("--rank-dir", a->rank.dir)->group("");
  cmd->add_option("--victim", a->rank.victim)->group("");
  cmd->add_option("--fault", a->rank.fault)->group("");
  cmd->add_option("--delay-ms", a->rank.delay_ms)->group("");
  cmd->add_option("--max-seconds", a->rank.max_seconds)->group("");
  cmd->add_option("--test-corrupt-every", a->rank.corrupt_every)->group("");
  cmd->callback([a] {
    if (!a->rank.dir.empty()) {
      if (!Group::LaunchedByMc2()) Usage("--rank-dir is internal to `mc2 soak`");
      soak::RankArgs r = a->rank;
      r.seed = a->seed;
      r.seconds =
          std::chrono::duration<double>(core::ParseDuration(a->duration, "--duration")).count();
      const int status = soak::RunSoakRank(r);
      if (status != 0) throw CLI::RuntimeError(status);
      return;
    }
    // The validators have checked the form.
    a->seconds =
        std::chrono::duration<double>(core::ParseDuration(a->duration, "--duration")).count();
    RunDriver(*a);
  });
}

}  // namespace mc2::tools
