// Link emulation: the MC2_LINK parser, the port model, delayed visibility
// of payload-carrying flags (timing with generous upper bounds: only the
// lower bounds are tight, since a loaded machine can only make things late),
// per-flag ordering, no CPU burnt while waiting, and collectives under
// emulation: still correct, and as slow as the model says.
#include "transport/link_emulation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "core/env.h"
#include "core/link_config.h"
#include "engine/access.h"
#include "engine/group_impl.h"
#include "mc2/mc2.h"

namespace mc2 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using transport::Clock;
using namespace std::chrono_literals;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

template <typename F>
std::string InvalidArgument(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------------------
// Parser

TEST(LinkConfig, ParsesValidForms) {
  auto c = core::ParseLinkConfig("bw=10GB/s,lat=5us", "MC2_LINK");
  EXPECT_TRUE(c.enabled);
  EXPECT_DOUBLE_EQ(c.bytes_per_second, 10e9);
  EXPECT_EQ(c.latency, 5us);
  EXPECT_EQ(c.Describe(), "bw=10 GB/s, lat=5 us");

  c = core::ParseLinkConfig(" lat = 250ns , bw = 10Gbps ", "x");
  EXPECT_DOUBLE_EQ(c.bytes_per_second, 1.25e9);
  EXPECT_EQ(c.latency, 250ns);
  c = core::ParseLinkConfig("bw=1Gb/s", "x");
  EXPECT_DOUBLE_EQ(c.bytes_per_second, 1.25e8);
  EXPECT_EQ(c.latency, 0ns);
  c = core::ParseLinkConfig("bw=100MB/s,lat=1.5ms", "x");
  EXPECT_DOUBLE_EQ(c.bytes_per_second, 1e8);
  EXPECT_EQ(c.latency, 1500us);
  c = core::ParseLinkConfig("bw=2GiB/s,lat=0", "x");
  EXPECT_DOUBLE_EQ(c.bytes_per_second, 2.0 * 1024 * 1024 * 1024);
  c = core::ParseLinkConfig("bw=0.5KB/s,lat=1s", "x");
  EXPECT_DOUBLE_EQ(c.bytes_per_second, 500);
  EXPECT_EQ(c.latency, 1s);
  EXPECT_DOUBLE_EQ(core::ParseLinkConfig("bw=3B/s", "x").bytes_per_second, 3);
  EXPECT_DOUBLE_EQ(core::ParseLinkConfig("bw=1TB/s", "x").bytes_per_second, 1e12);
  EXPECT_DOUBLE_EQ(core::ParseLinkConfig("bw=8Mb/s", "x").bytes_per_second, 1e6);
  EXPECT_FALSE(core::ParseLinkConfig("none", "x").enabled);
  EXPECT_FALSE(core::ParseLinkConfig("off", "x").enabled);
  EXPECT_EQ(core::ParseLinkConfig("none", "x").Describe(), "none");
}

TEST(LinkConfig, RejectsInvalidFormsNamingTheVariableAndTheForm) {
  for (const char* bad : {"",
                          "bw",
                          "bw=",
                          "bw=10",
                          "bw=10GB",
                          "bw=10gb/s",
                          "bw=10GiBs",
                          "bw=10Gib/s",
                          "bw=10XB/s",
                          "bw=0GB/s",
                          "bw=-1GB/s",
                          "bw=abc",
                          "lat=5us",
                          "bw=1GB/s,lat=5",
                          "bw=1GB/s,lat=5xs",
                          "bw=1GB/s,lat=-1us",
                          "bw=1GB/s,foo=1",
                          "bw=1GB/s,bw=2GB/s",
                          "bw=1GB/s,lat=1us,lat=2us",
                          "bw=1GB/s,",
                          "bw=1GB/s;lat=1us",
                          "fast"}) {
    EXPECT_THAT(InvalidArgument([&] { core::ParseLinkConfig(bad, "MC2_LINK"); }),
                AllOf(HasSubstr("MC2_LINK"), HasSubstr("bw=10GB/s,lat=5us"), HasSubstr("none")))
        << "'" << bad << "'";
  }
  EXPECT_THAT(InvalidArgument([&] { core::ParseLinkConfig("bw=10", "MC2_LINK"); }),
              HasSubstr("no unit"));
  EXPECT_THAT(InvalidArgument([&] { core::ParseLinkConfig("lat=1us", "MC2_LINK"); }),
              HasSubstr("bw is missing"));
}

TEST(LinkConfig, ValidateEnvironmentChecksMC2_LINK) {
  setenv("MC2_LINK", "bw=fast", 1);
  EXPECT_THAT(InvalidArgument([] { core::ValidateEnvironment(); }), HasSubstr("MC2_LINK"));
  setenv("MC2_LINK", "bw=10GB/s,lat=5us", 1);
  EXPECT_EQ(InvalidArgument([] { core::ValidateEnvironment(); }), "");
  EXPECT_TRUE(core::LinkConfigFromEnv().enabled);
  unsetenv("MC2_LINK");
  EXPECT_FALSE(core::LinkConfigFromEnv().enabled);
}

// ---------------------------------------------------------------------------
// The port model

TEST(LinkModel, PostSerializesOnThePortAndAddsLatency) {
  transport::LinkModel m(core::ParseLinkConfig("bw=1GB/s,lat=10us", "x"));
  const Clock::time_point t0 = Clock::time_point{} + 1s;
  EXPECT_EQ(m.TransferTime(1000000), 1ms + 10us);
  EXPECT_EQ(m.SerializationTime(1000000), 1ms);
  EXPECT_EQ(m.Post(1000000, t0), t0 + 1ms + 10us);
  // Posted at the same time: waits for the port, latency overlaps.
  EXPECT_EQ(m.Post(1000000, t0), t0 + 2ms + 10us);
  EXPECT_EQ(m.Post(0, t0), t0 + 2ms + 10us);
  EXPECT_EQ(m.busy_until(), t0 + 2ms);
  // After the port went idle: from the posting time.
  EXPECT_EQ(m.Post(500000, t0 + 10ms), t0 + 10ms + 500us + 10us);
  EXPECT_EQ(m.transfers(), 4u);
  EXPECT_EQ(m.bytes_posted(), 2500000u);
  EXPECT_EQ(m.Label(), "emulated link: bw=1 GB/s, lat=10 us");
}

// ---------------------------------------------------------------------------
// The transport decorator

class LinkTransport : public ::testing::Test {
 protected:
  void Make(const char* link) {
    txs_ = transport::CreateInProcessTransports(2, 1 << 20, link);
    ASSERT_NE(txs_[0]->link(), nullptr);
    EXPECT_STREQ(txs_[0]->name(), "threads+link");
  }
  // A flag word in rank 0's heap (fresh heaps are zero).
  static uint64_t Off(int i) { return transport::kHeapHeaderBytes + 64 * i; }
  // Rank 1 waits for rank 0's flag `i` to reach `value`; returns when.
  Clock::time_point WaitFor(int i, uint64_t value) {
    transport::WaitContext ctx;
    Clock::time_point deadline{};
    ctx.op = "test";
    ctx.deadline = &deadline;
    ctx.timeout = 20s;
    txs_[1]->WaitGE(0, Off(i), value, ctx);
    return Clock::now();
  }
  std::vector<std::unique_ptr<transport::Transport>> txs_;
};

TEST_F(LinkTransport, PayloadBecomesVisibleAfterItsTransferTime) {
  Make("bw=1GB/s");
  const auto t0 = Clock::now();
  txs_[0]->Publish(Off(0), 1, 1000000);  // 1 MB at 1 GB/s: 1 ms
  uint64_t early = txs_[1]->Peek(0, Off(0));
  EXPECT_TRUE(early == 0 || Clock::now() - t0 >= 1ms) << "visible before its transfer time";
  const double ms = Ms(WaitFor(0, 1) - t0);
  std::printf("1 MB at 1 GB/s became visible after %.3f ms (model: 1 ms)\n", ms);
  // A lower bound the model guarantees; a loaded machine only makes it later.
  EXPECT_GE(ms, 1.0);
  // Without a payload: immediate.
  txs_[0]->Publish(Off(1), 7, 0);
  EXPECT_EQ(txs_[1]->Peek(0, Off(1)), 7u);
}

TEST_F(LinkTransport, BackToBackPayloadsSerializeOnThePort) {
  Make("bw=1GB/s,lat=100us");
  const auto t0 = Clock::now();
  for (int i = 0; i < 4; ++i) txs_[0]->Publish(Off(i), 1, 1000000);
  double at[4];
  for (int i = 0; i < 4; ++i) at[i] = Ms(WaitFor(i, 1) - t0);
  std::printf("4 x 1 MB at 1 GB/s, lat 100 us: visible at %.3f %.3f %.3f %.3f ms\n", at[0], at[1],
              at[2], at[3]);
  for (int i = 0; i < 4; ++i) EXPECT_GE(at[i], (i + 1) * 1.0 + 0.1) << i;
  EXPECT_EQ(txs_[0]->link()->bytes_posted(), 4000000u);
}

TEST_F(LinkTransport, AFlagNeverOvertakesItsOwnDelayedValue) {
  Make("bw=1GB/s");
  std::atomic<bool> stop{false};
  std::atomic<int> backwards{0};
  std::thread watcher([&] {
    uint64_t last = 0;
    while (!stop.load()) {
      uint64_t v = txs_[1]->Peek(0, Off(0));
      if (v < last) ++backwards;
      last = v;
    }
  });
  const auto t0 = Clock::now();
  txs_[0]->Publish(Off(0), 1, 1000000);
  txs_[0]->Publish(Off(0), 2, 0);  // queued behind 1, not visible before it
  uint64_t now_value = txs_[1]->Peek(0, Off(0));
  EXPECT_TRUE(now_value == 0 || Clock::now() - t0 >= 1ms) << now_value;
  txs_[0]->Publish(Off(0), 3, 500000);
  txs_[0]->Publish(Off(0), 4, 0);
  // Another flag without payload is not held back by flag 0's queue.
  txs_[0]->Publish(Off(1), 9, 0);
  EXPECT_EQ(txs_[1]->Peek(0, Off(1)), 9u);
  const double ms = Ms(WaitFor(0, 4) - t0);
  EXPECT_GE(ms, 1.5);
  stop = true;
  watcher.join();
  EXPECT_EQ(backwards.load(), 0);
  EXPECT_EQ(txs_[1]->Peek(0, Off(0)), 4u);
}

TEST_F(LinkTransport, RemoteAddIsDelayedAndOrderedPerWord) {
  Make("bw=1GB/s");
  const auto t0 = Clock::now();
  // Rank 0 bumps a counter in rank 1's heap.
  txs_[0]->RemoteAdd(1, Off(2), 5, 1000000);
  txs_[0]->RemoteAdd(1, Off(2), 1, 0);  // behind the first
  uint64_t early = txs_[1]->Peek(1, Off(2));
  EXPECT_TRUE(early == 0 || Clock::now() - t0 >= 1ms) << early;
  txs_[0]->Drain();
  EXPECT_GE(Ms(Clock::now() - t0), 1.0);
  EXPECT_EQ(txs_[1]->Peek(1, Off(2)), 6u);
  EXPECT_EQ(static_cast<transport::LinkEmulationTransport*>(txs_[0].get())->pending(), 0u);
}

// CPU time (ms) used so far by this process's link delivery threads, from
// /proc/self/task/*/schedstat (nanoseconds on the CPU).
double DeliveryThreadsCpuMs() {
  double ms = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name != "mc2-link") continue;
    std::ifstream stat(task.path() / "schedstat");
    double run_ns = 0;
    stat >> run_ns;
    ms += run_ns / 1e6;
  }
  return ms;
}

TEST_F(LinkTransport, WaitingBurnsNoCpu) {
  Make("bw=1GB/s");
  const double delivery0 = DeliveryThreadsCpuMs();
  rusage before, after;
  getrusage(RUSAGE_SELF, &before);
  timespec tc0, tc1;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &tc0);
  const auto t0 = Clock::now();
  txs_[0]->Publish(Off(0), 1, 100000000);  // 100 MB: 100 ms
  WaitFor(0, 1);
  const double wall = Ms(Clock::now() - t0);
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &tc1);
  getrusage(RUSAGE_SELF, &after);
  auto tv = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec / 1e3; };
  const double process_cpu =
      tv(after.ru_utime) - tv(before.ru_utime) + tv(after.ru_stime) - tv(before.ru_stime);
  const double waiter_cpu = (tc1.tv_sec - tc0.tv_sec) * 1e3 + (tc1.tv_nsec - tc0.tv_nsec) / 1e6;
  const double delivery_cpu = DeliveryThreadsCpuMs() - delivery0;
  std::printf(
      "waited %.1f ms: waiter thread used %.2f ms of CPU, the delivery threads %.2f ms, "
      "the whole process %.2f ms\n",
      wall, waiter_cpu, delivery_cpu, process_cpu);
  // A spinning waiter or delivery thread would use about `wall` each. (The
  // whole process is only printed: a sanitizer's runtime adds its own.)
  EXPECT_GE(wall, 100.0);
  EXPECT_LT(waiter_cpu, 10.0);
  EXPECT_LT(delivery_cpu, 10.0);
}

TEST_F(LinkTransport, DestructionDeliversWhatIsPending) {
  Make("bw=1MB/s");
  const auto t0 = Clock::now();
  txs_[0]->Publish(Off(0), 42, 10000000);  // 10 s
  txs_[0].reset();
  // Delivered, not waited for: the transfer the model says ends 10 s after
  // the publish had not ended when the destructor returned.
  EXPECT_LT(Ms(Clock::now() - t0), 10000.0);
  EXPECT_EQ(txs_[1]->Peek(0, Off(0)), 42u);
}

TEST_F(LinkTransport, DrainWaitsForTheModelButNotInAFailedWorld) {
  Make("bw=1GB/s");
  auto t0 = Clock::now();
  txs_[0]->Publish(Off(0), 1, 2000000);  // 2 ms
  txs_[0]->Drain();
  EXPECT_GE(Ms(Clock::now() - t0), 2.0);
  EXPECT_EQ(txs_[1]->Peek(0, Off(0)), 1u);
  t0 = Clock::now();
  txs_[0]->Publish(Off(0), 2, 10000000000);  // 10 s
  txs_[0]->Abort(Error(ErrorCode::kInternal, "test"));
  txs_[0]->Drain();
  // Not waited for: Drain returned before the modeled 10 s transfer ended.
  EXPECT_LT(Ms(Clock::now() - t0), 10000.0);
  EXPECT_EQ(txs_[1]->Peek(0, Off(0)), 2u);
}

TEST(LinkTransportFactory, NoneAndInvalidOptions) {
  auto txs = transport::CreateInProcessTransports(1, 1 << 20, "none");
  EXPECT_EQ(txs[0]->link(), nullptr);
  EXPECT_STREQ(txs[0]->name(), "threads");
  EXPECT_THAT(InvalidArgument([] { transport::CreateInProcessTransports(1, 1 << 20, "bw=1"); }),
              HasSubstr("WorldOptions::link"));
  WorldOptions o;
  o.link = "bw=fast";
  EXPECT_THAT(InvalidArgument([&] {
                Group::RunInProcess(
                    2, [](Group&) {}, o);
              }),
              HasSubstr("WorldOptions::link"));
}

// ---------------------------------------------------------------------------
// Collectives under emulation

void CheckCollectives(Group& g) {
  const int n = g.size(), me = g.rank();
  for (size_t count : {size_t{1000}, size_t{300000}}) {
    std::vector<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((i + me * 7) % 13);
    for (auto algo : {Algorithm::kDirect, Algorithm::kRabenseifner}) {
      AllReduce(g, in.data(), out.data(), count, DType::kF32, ReduceOp::kSum, {.algorithm = algo})
          .Wait();
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += static_cast<float>((i + r * 7) % 13);
        ASSERT_EQ(out[i], want) << "all_reduce " << AlgorithmName(algo) << " i=" << i;
      }
    }
    std::vector<float> all(count * n);
    AllGather(g, in.data(), all.data(), count, DType::kF32).Wait();
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; i += 97)
        ASSERT_EQ(all[r * count + i], static_cast<float>((i + r * 7) % 13));
    std::vector<float> big(count * n), part(count);
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 5 + me);
    ReduceScatter(g, big.data(), part.data(), count, DType::kF32, ReduceOp::kSum).Wait();
    for (size_t i = 0; i < count; i += 89) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += static_cast<float>((me * count + i) % 5 + r);
      ASSERT_EQ(part[i], want);
    }
    std::vector<float> b = in;
    Broadcast(g, b.data(), b.data(), count, DType::kF32, n - 1).Wait();
    for (size_t i = 0; i < count; i += 101)
      ASSERT_EQ(b[i], static_cast<float>((i + (n - 1) * 7) % 13));
  }
  // Point-to-point rides on delayed "sent" flags and deferred wake-ups.
  if (n == 1) return;
  std::vector<int32_t> msg(300000), got(300000);
  std::iota(msg.begin(), msg.end(), me * 1000);
  int to = (me + 1) % n, from = (me + n - 1) % n;
  Work s = g.Send(msg.data(), msg.size() * 4, to, 3);
  Work r = g.Recv(got.data(), got.size() * 4, from, 3);
  s.Wait();
  r.Wait();
  for (size_t i = 0; i < got.size(); i += 1000) ASSERT_EQ(got[i], from * 1000 + int32_t(i));
  Barrier(g).Wait();
}

TEST(LinkCollectives, CorrectUnderMC2_LINK) {
  setenv("MC2_LINK", "bw=2GB/s,lat=5us", 1);
  for (int n : {2, 3}) {
    Group::RunInProcess(n, [&](Group& g) {
      EXPECT_STREQ(internal::Access::Impl(g)->tx().name(), "threads+link");
      ASSERT_NE(internal::Access::Impl(g)->tx().link(), nullptr);
      CheckCollectives(g);
      // Sub-groups too; their areas are freed with pending flags drained.
      Group sub = g.Split(g.rank() % 2, 0);
      CheckCollectives(sub);
    });
  }
  // WorldOptions::link = "none" overrides MC2_LINK.
  WorldOptions o;
  o.link = "none";
  Group::RunInProcess(
      2, [&](Group& g) { EXPECT_EQ(internal::Access::Impl(g)->tx().link(), nullptr); }, o);
  unsetenv("MC2_LINK");
}

TEST(LinkCollectives, CorrectWithTheWorldOption) {
  WorldOptions o;
  o.link = "bw=5GB/s,lat=20us";
  Group::RunInProcess(
      4,
      [&](Group& g) {
        ASSERT_NE(internal::Access::Impl(g)->tx().link(), nullptr);
        CheckCollectives(g);
      },
      o);
}

// The measured effect: an 8 MiB all-reduce at np=2 over a 1 GB/s link takes
// (at least, and about) the time the model gives for the bytes each rank
// declared on its port.
TEST(LinkCollectives, AllReduceTakesTheModeledTime) {
  const size_t count = (8u << 20) / sizeof(float);
  double raw_ms = 0;
  auto run = [&](const char* link, double* ms, double* modeled_ms) {
    WorldOptions o;
    o.link = link;
    std::vector<double> elapsed(2), modeled(2);
    Group::RunInProcess(
        2,
        [&](Group& g) {
          std::vector<float> in(count, 1.0f + g.rank()), out(count);
          auto* port = internal::Access::Impl(g)->tx().link();
          // Warm up (page faults, scratch), then measure.
          AllReduce(g, in.data(), out.data(), count, DType::kF32, ReduceOp::kSum,
                    {.algorithm = Algorithm::kRabenseifner})
              .Wait();
          Barrier(g).Wait();
          if (port) internal::Access::Impl(g)->tx().Drain();
          Barrier(g).Wait();
          const uint64_t bytes0 = port ? port->bytes_posted() : 0;
          const auto t0 = Clock::now();
          AllReduce(g, in.data(), out.data(), count, DType::kF32, ReduceOp::kSum,
                    {.algorithm = Algorithm::kRabenseifner})
              .Wait();
          elapsed[g.rank()] = Ms(Clock::now() - t0);
          ASSERT_EQ(out[count - 1], 3.0f);
          if (port)
            modeled[g.rank()] = static_cast<double>(port->bytes_posted() - bytes0) /
                                port->config().bytes_per_second * 1e3;
        },
        o);
    *ms = std::max(elapsed[0], elapsed[1]);
    if (modeled_ms) *modeled_ms = std::max(modeled[0], modeled[1]);
  };
  run("none", &raw_ms, nullptr);
  double ms = 0, modeled = 0;
  run("bw=1GB/s", &ms, &modeled);
  std::printf(
      "all_reduce 8 MiB np=2 rabenseifner: raw shm %.2f ms; emulated link bw=1 GB/s: "
      "%.2f ms, modeled link time %.2f ms (bytes declared per rank / bw)\n",
      raw_ms, ms, modeled);
  // At least the 4 MiB the reduce-scatter phase stages for the peer plus the
  // 4 MiB chunk the all-gather phase hands it: 8 MiB, 8.39 ms at 1 GB/s.
  EXPECT_GT(modeled, 8.0);
  // A lower bound the link model guarantees (an upper one would be broken
  // by any load on the machine).
  EXPECT_GE(ms, 0.95 * modeled);
}

}  // namespace
}  // namespace mc2
