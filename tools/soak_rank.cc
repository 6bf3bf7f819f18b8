// `mc2 soak`, one rank of a job: random collectives and fused operators,
// each result compared with a reference this rank computes by itself.
//
// How the ranks stay in step without talking: every rank draws the same
// sequence from the job's seed. At each step that sequence picks a group
// (the world or one of three Split families) and a per-step seed; the
// members of one subgroup then draw the operation itself (kind, dtype, op,
// sizes, algorithm, pipeline, in/out of place, buffer kind, batching) from
// that seed and their subgroup's color, so they agree with each other while
// other subgroups do something else at the same step.
//
// How results are checked: see soak_cases.h.
#include <fmt/format.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mc2/mc2.h"
#include "soak.h"
#include "soak_cases.h"

namespace mc2::tools::soak {

namespace {

int64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// ---------------------------------------------------------------------------
// The rank.

struct Outcome {
  uint64_t ops = 0, checked = 0, wrong = 0;
  std::vector<std::string> bad;
  std::string error;  // "CODE T_NS WHAT", empty if none
  bool noerror = false;

  void Bad(std::string text) {
    if (bad.size() < 8) bad.push_back(std::move(text));
  }
};

std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

void WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
  }
  std::rename(tmp.c_str(), path.c_str());
}

void WriteOutcome(const std::string& dir, int rank, const Outcome& o) {
  std::string text = fmt::format("ops {}\nchecked {}\nwrong {}\n", o.ops, o.checked, o.wrong);
  if (!o.error.empty()) text += "error " + o.error + "\n";
  if (o.noerror) text += "noerror\n";
  for (const auto& b : o.bad) text += "bad " + OneLine(b) + "\n";
  text += "end\n";
  WriteFileAtomically(fmt::format("{}/rank-{}.out", dir, rank), text);
}

// The victim's fault: note it for the driver, then signal ourselves.
void InjectFault(const RankArgs& a) {
  const int sig = a.fault == "stop" ? SIGSTOP : SIGKILL;
  WriteFileAtomically(a.dir + "/victim",
                      fmt::format("{} {} {}\n", a.fault, getpid(), MonoNs()));
  kill(getpid(), sig);
}

// The four group families: the world, then three Split families (parity
// with reversed order, halves, everyone but the last rank).
std::vector<SoakGroup> MakeGroups(const Group& world) {
  const int n = world.size(), r = world.rank();
  std::vector<SoakGroup> groups(4);
  groups[0].g = world;
  groups[1].color = r % 2;
  groups[1].g = world.Split(groups[1].color, -r);
  groups[2].color = r < n / 2 ? 0 : 1;
  groups[2].g = world.Split(groups[2].color, r);
  groups[3].color = (n > 2 && r == n - 1) ? -1 : 0;
  groups[3].g = world.Split(groups[3].color, r);
  for (auto& sg : groups) {
    if (!sg.g.valid()) continue;
    sg.a = sg.g.AllocSymmetric(kMaxBufferBytes);
    sg.b = sg.g.AllocSymmetric(kMaxBufferBytes);
  }
  return groups;
}

// One step on this rank's group of `sg`'s family: a batch of 1-3
// collectives issued before any is waited for, or one fused operator.
void Step(SoakGroup& sg, uint64_t step_seed, int corrupt_every, Outcome& o) {
  std::mt19937_64 rng(step_seed ^ Mix(static_cast<uint64_t>(sg.color) + 77));
  const int n = sg.g.size();
  if (rng() % 6 == 0) {
    const FusedPlan p = PlanFused(rng, n);
    std::string what;
    const size_t wrong = RunFused(p, sg.g, &o.checked, &what);
    ++o.ops;
    if (wrong) {
      o.wrong += wrong;
      o.Bad(fmt::format("{} wrong: {} {}", wrong, p.Describe(), what));
    }
    return;
  }
  const int batch = 1 + static_cast<int>(rng() % 3);
  std::vector<CollRun> runs(batch);
  for (int i = 0; i < batch; ++i) {
    // Only the first of a batch may use the group's symmetric buffers.
    runs[i].plan = PlanCollective(rng, n, i == 0);
    Prepare(runs[i], sg);
  }
  std::vector<Work> works;
  std::exception_ptr first;
  for (auto& run : runs) {
    try {
      works.push_back(Issue(run, sg.g));
    } catch (...) {
      first = std::current_exception();
      break;
    }
  }
  // Wait for every issued operation before the buffers go away, even after
  // an error (a failed world fails the rest quickly).
  for (auto& w : works) {
    try {
      w.Wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  for (auto& run : runs) {
    ++o.ops;
    if (corrupt_every > 0 && sg.g.world_rank() == 0 && o.ops % corrupt_every == 0 &&
        run.recv.bytes > 0)
      run.recv.p[run.recv.bytes / 2] ^= 0x40;
    const size_t wrong = Check(run, &o.checked);
    if (wrong) {
      o.wrong += wrong;
      o.Bad(fmt::format("{} wrong: {} (rank {} of {})", wrong, run.plan.Describe(run.n), run.me,
                        run.n));
    }
  }
}

}  // namespace

int RunSoakRank(const RankArgs& a) {
  const char* env_rank = std::getenv("MC2_RANK");
  const int rank = env_rank ? std::atoi(env_rank) : 0;
  WriteFileAtomically(fmt::format("{}/rank-{}.pid", a.dir, rank), fmt::format("{}\n", getpid()));
  const bool faults = !a.fault.empty();
  if (faults && rank == a.victim) {
    if (a.delay_ms <= 0) {
      InjectFault(a);  // during set-up: before the world exists
    } else {
      std::thread([a] {
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(a.delay_ms));
        InjectFault(a);
      }).detach();
    }
  }
  Outcome o;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  int status = 0;
  try {
    Group world = Group::FromEnv();
    std::vector<SoakGroup> groups = MakeGroups(world);
    std::mt19937_64 rng(a.seed);
    for (uint64_t step = 0;; ++step) {
      if (faults) {
        if (elapsed() > a.max_seconds) {
          o.noerror = true;
          break;
        }
      } else if (step % 16 == 0) {
        // Stop together: any rank past the run time stops everyone.
        int32_t stop = elapsed() >= a.seconds ? 1 : 0;
        AllReduce(world, &stop, &stop, 1, DType::kI32, ReduceOp::kMax).Wait();
        if (stop) break;
      }
      SoakGroup& sg = groups[rng() % groups.size()];
      const uint64_t step_seed = rng();
      if (!sg.g.valid()) continue;  // not a member of this family
      Step(sg, step_seed, a.corrupt_every, o);
    }
    if (!faults) Barrier(world).Wait();  // nobody frees memory a peer reads
  } catch (const Error& e) {
    o.error = fmt::format("{} {} {}", ErrorCodeName(e.code()), MonoNs(), OneLine(e.what()));
  } catch (const std::exception& e) {
    o.error = fmt::format("exception {} {}", MonoNs(), OneLine(e.what()));
  }
  if (!o.error.empty() || o.wrong || o.noerror) status = faults && !o.error.empty() ? 3 : 1;
  if (faults && o.error.empty()) status = 1;
  WriteOutcome(a.dir, rank, o);
  return status;
}

}  // namespace mc2::tools::soak
