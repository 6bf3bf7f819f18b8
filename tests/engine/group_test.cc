#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "engine/access.h"
#include "engine/group_impl.h"
#include "mc2/mc2.h"

namespace mc2 {
namespace {

// The public handles expose no internal type: their internal constructors
// and the group's state are reachable only through internal::Access.
template <typename G>
concept HasPublicImpl = requires(const G& g) {
  g.impl();
};
static_assert(!HasPublicImpl<Group>);
static_assert(!std::is_constructible_v<Group, std::shared_ptr<internal::GroupImpl>>);
static_assert(!std::is_constructible_v<Work, std::shared_ptr<internal::WorkState>>);

TEST(Group, AccessReachesTheStateBehindTheHandles) {
  EXPECT_EQ(internal::Access::Impl(Group()), nullptr);
  Group::RunInProcess(2, [&](Group& g) {
    internal::GroupImpl* impl = internal::Access::Impl(g);
    ASSERT_NE(impl, nullptr);
    EXPECT_EQ(impl->rank(), g.rank());
    // A handle made from the state is the same group: it shares the state
    // and runs collectives with the other rank's original handle.
    Group same = internal::Access::MakeGroup(impl->shared_from_this());
    EXPECT_EQ(internal::Access::Impl(same), impl);
    int32_t in = g.rank() + 1, out = 0;
    AllReduce(same, &in, &out, 1, DType::kI32, ReduceOp::kSum).Wait();
    EXPECT_EQ(out, 3);
  });
  auto state = std::make_shared<internal::WorkState>(7, "probe");
  Work work = internal::Access::MakeWork(state);
  EXPECT_EQ(work.seq(), 7u);
  EXPECT_FALSE(work.Test());
  state->Complete();
  EXPECT_TRUE(work.Test());
  work.Wait();
}

TEST(Group, RankAndSize) {
  std::atomic<int> sum{0};
  Group::RunInProcess(5, [&](Group& g) {
    EXPECT_EQ(g.size(), 5);
    sum += g.rank();
    EXPECT_EQ(g.world_rank(), g.rank());
  });
  EXPECT_EQ(sum.load(), 0 + 1 + 2 + 3 + 4);
}

// A trace identity must be a rank of its world size, both or neither set.
TEST(Group, AnInvalidTraceIdentityIsRefused) {
  for (auto [rank, size] : {std::pair{2, 2}, std::pair{-1, 2}, std::pair{0, -1}}) {
    WorldOptions o;
    o.trace_rank = rank;
    o.trace_world_size = size;
    try {
      Group::RunInProcess(2, [](Group&) {}, o);
      ADD_FAILURE() << "trace_rank " << rank << " of " << size << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("trace_rank"), std::string::npos) << e.what();
    }
  }
}

// Split by parity, ordered by descending key: each subgroup runs its own
// collectives concurrently with the other's, and sees the expected members.
TEST(Group, SplitOrdersByKeyAndRunsIndependently) {
  Group::RunInProcess(6, [&](Group& g) {
    int color = g.rank() % 2;
    Group sub = g.Split(color, /*key=*/-g.rank());
    ASSERT_TRUE(sub.valid());
    EXPECT_EQ(sub.size(), 3);
    // Highest world rank first.
    int expected_rank = (color == 0 ? (4 - g.rank()) : (5 - g.rank())) / 2;
    EXPECT_EQ(sub.rank(), expected_rank);
    int64_t mine = g.rank(), total = 0;
    AllReduce(sub, &mine, &total, 1, DType::kI64, ReduceOp::kSum).Wait();
    EXPECT_EQ(total, color == 0 ? 0 + 2 + 4 : 1 + 3 + 5);
    // The parent still works after the split, interleaved with the child.
    int64_t all = 0;
    Work w1 = AllReduce(g, &mine, &all, 1, DType::kI64, ReduceOp::kSum);
    int64_t gathered[3];
    Work w2 = AllGather(sub, &mine, gathered, 1, DType::kI64);
    w1.Wait();
    w2.Wait();
    EXPECT_EQ(all, 15);
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(gathered[r], color == 0 ? 4 - 2 * r : 5 - 2 * r);
  });
}

TEST(Group, NegativeColorJoinsNoGroup) {
  Group::RunInProcess(3, [&](Group& g) {
    Group sub = g.Split(g.rank() == 0 ? -1 : 7, 0);
    EXPECT_EQ(sub.valid(), g.rank() != 0);
    if (sub.valid()) {
      EXPECT_EQ(sub.size(), 2);
      Barrier(sub).Wait();
    }
    EXPECT_THROW(Barrier(Group()), Error);
  });
}

TEST(Group, NestedSplits) {
  Group::RunInProcess(8, [&](Group& g) {
    Group a = g.Split(g.rank() / 4, g.rank());   // two groups of 4
    Group b = a.Split(a.rank() / 2, a.rank());   // four groups of 2
    EXPECT_EQ(b.size(), 2);
    int32_t v = g.rank(), s = 0;
    AllReduce(b, &v, &s, 1, DType::kI32, ReduceOp::kSum).Wait();
    int base = g.rank() / 2 * 2;
    EXPECT_EQ(s, base + base + 1);
  });
}

TEST(Group, SymmetricPutGetAndSignals) {
  Group::RunInProcess(4, [&](Group& g) {
    const int n = g.size();
    auto buf = g.AllocSymmetric(n * sizeof(int64_t));
    std::fill_n(buf.as<int64_t>(), n, -1);
    Barrier(g).Wait();
    // Each rank writes its id into slot `rank` of every peer, then signals.
    int64_t me = 100 + g.rank();
    for (int p = 0; p < n; ++p) {
      g.Put(buf, p, g.rank() * sizeof(int64_t), &me, sizeof(me));
      g.SignalAdd(p, /*slot=*/3, 1);
    }
    g.WaitSignal(3, n);
    for (int p = 0; p < n; ++p) EXPECT_EQ(buf.as<int64_t>()[p], 100 + p);
    int64_t got = 0;
    g.Get(buf, (g.rank() + 1) % n, g.rank() * sizeof(int64_t), &got, sizeof(got));
    EXPECT_EQ(got, me);
    EXPECT_EQ(g.ReadSignal(3), static_cast<uint64_t>(n));
    Barrier(g).Wait();
  });
}

TEST(Group, PutOutOfBoundsIsRejected) {
  Group::RunInProcess(2, [&](Group& g) {
    auto buf = g.AllocSymmetric(64);
    char x[8] = {};
    EXPECT_THROW(g.Put(buf, 1, 60, x, 8), Error);
    EXPECT_THROW(g.Put(buf, 2, 0, x, 8), Error);
    EXPECT_THROW(g.SignalAdd(0, Group::kNumSignals, 1), Error);
    Barrier(g).Wait();
  });
}

TEST(Group, MismatchedSymmetricSizesRaiseOnEveryRank) {
  std::atomic<int> raised{0};
  EXPECT_THROW(Group::RunInProcess(3, [&](Group& g) {
    try {
      g.AllocSymmetric(g.rank() == 2 ? 128 : 64);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kMismatch) << e.what();
      ++raised;
      throw;
    }
  }), Error);
  EXPECT_EQ(raised.load(), 3);
}

TEST(Group, ExhaustedHeapIsAClearErrorAndTheGroupStaysUsable) {
  Group::RunInProcess(2, [&](Group& g) {
    try {
      g.AllocSymmetric(size_t{1} << 40);
      ADD_FAILURE() << "allocation of 1 TiB succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kShmExhausted);
      EXPECT_NE(std::string(e.what()).find("MC2_HEAP_BYTES"), std::string::npos) << e.what();
    }
    auto ok = g.AllocSymmetric(4096);
    Barrier(g).Wait();
  }, {.heap_bytes = 32 << 20});
}

TEST(Group, OperationsAreAsynchronousAndCompleteInOrder) {
  Group::RunInProcess(3, [&](Group& g) {
    const size_t count = 1 << 18;
    std::vector<std::vector<float>> bufs(8, std::vector<float>(count, 1.0f));
    std::vector<Work> works;
    for (auto& b : bufs)
      works.push_back(AllReduce(g, b.data(), b.data(), count, DType::kF32, ReduceOp::kSum));
    for (auto& w : works) {
      w.Wait();
      EXPECT_TRUE(w.Test());
      EXPECT_FALSE(w.algorithm().empty());
    }
    for (auto& b : bufs) EXPECT_EQ(b[count - 1], 3.0f);
    // Sequence numbers increase in issue order.
    for (size_t i = 1; i < works.size(); ++i) EXPECT_GT(works[i].seq(), works[i - 1].seq());
  });
}

// Inline operations recycle the state of the previous one when its caller
// let go of every handle (GroupImpl::InlineWorkState). A handle still held
// must keep describing its own operation, and a failed operation's error
// must not leak into the next one that reuses its state.
TEST(Group, WorkHandlesSurviveStateRecycling) {
  Group::RunInProcess(2, [&](Group& g) {
    std::vector<float> x(16, 1.0f), y(16);
    Work kept = AllReduce(g, x.data(), y.data(), x.size(), DType::kF32, ReduceOp::kSum);
    kept.Wait();
    const uint64_t kept_seq = kept.seq();
    uint64_t last = kept_seq;
    for (int i = 0; i < 50; ++i) {
      // Dropped at once: the next call may reuse its state.
      Work w = Broadcast(g, x.data(), y.data(), x.size(), DType::kF32, 0);
      w.Wait();
      EXPECT_EQ(w.seq(), last + 1);
      EXPECT_EQ(w.algorithm(), "direct");
      EXPECT_EQ(w.error(), nullptr);
      last = w.seq();
    }
    EXPECT_EQ(kept.seq(), kept_seq);
    EXPECT_TRUE(kept.Test());
    EXPECT_EQ(kept.algorithm(), "direct");
    EXPECT_EQ(y[0], 1.0f);
    // An invalid call fails without taking an operation; the next succeeds.
    EXPECT_THROW(Broadcast(g, x.data(), y.data(), x.size(), DType::kF32, 7), Error);
    Work after = AllReduce(g, x.data(), y.data(), x.size(), DType::kF32, ReduceOp::kSum);
    after.Wait();
    EXPECT_EQ(after.seq(), last + 1);
    EXPECT_EQ(y[0], 2.0f);
  });
}

TEST(Group, TimeoutNamesTheMissingRank) {
  std::atomic<int> timeouts{0};
  EXPECT_THROW(Group::RunInProcess(3, [&](Group& g) {
    if (g.rank() == 2) {
      // Never joins; waits until the others gave up and aborted the world.
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      return;
    }
    try {
      Barrier(g).Wait();
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kTimeout) ++timeouts;
      EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
      throw;
    }
  }, {.timeout = std::chrono::milliseconds(300)}), Error);
  EXPECT_GE(timeouts.load(), 1);
}

}  // namespace
}  // namespace mc2

namespace mc2 {
namespace {

// Regression: a new group's control area may reuse the memory of a freed
// one, whose flags were high; stale flags must not let a rank run ahead.
TEST(Group, ReusedControlAreasStartClean) {
  Group::RunInProcess(3, [&](Group& g) {
    for (int round = 0; round < 20; ++round) {
      Group sub = g.Split(0, g.rank());
      for (int i = 0; i < 5; ++i) {
        // Rank 0 lags, so that a rank fooled by a stale flag would read
        // its input before it is written.
        if (sub.rank() == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        std::vector<int32_t> v(5000, sub.rank() + round + i), out(5000);
        AllReduce(sub, v.data(), out.data(), v.size(), DType::kI32, ReduceOp::kSum,
                  {.algorithm = Algorithm::kRing}).Wait();
        ASSERT_EQ(out[4999], 3 * (round + i) + 3) << "round " << round << " op " << i;
      }
      Barrier(g).Wait();  // everyone is done with `sub` before it is freed
    }
  });
}

}  // namespace
}  // namespace mc2

namespace mc2 {
namespace {

// may_run_inline = false keeps even a tiny call in the background: the call
// returns at once while a peer is late, and completes when it arrives.
// Rank 1 arrives only once rank 0's call has returned (or after a deadline
// that only a call blocking on rank 1 can reach), so returning first is an
// ordering of events, not a duration.
TEST(Group, BackgroundCallsReturnBeforeTheyComplete) {
  std::promise<void> rank0_returned;
  std::shared_future<void> returned = rank0_returned.get_future().share();
  std::atomic<bool> peer_arrived_first{false};
  Group::RunInProcess(2, [&](Group& g) {
    int32_t v = 1, out = 0;
    if (g.rank() == 1 &&
        returned.wait_for(std::chrono::seconds(20)) != std::future_status::ready)
      peer_arrived_first = true;
    Work w = AllReduce(g, &v, &out, 1, DType::kI32, ReduceOp::kSum,
                       {.may_run_inline = false});
    if (g.rank() == 0) {
      EXPECT_FALSE(w.Test()) << "complete before rank 1 called";
      rank0_returned.set_value();
    }
    w.Wait();
    EXPECT_EQ(out, 2);
  });
  EXPECT_FALSE(peer_arrived_first.load()) << "rank 0's call waited for rank 1";
}

// A task may hold the last handle of its group when the caller let go of
// every other while it ran. The world then goes on its own progress thread,
// which ~World cannot join: it must be destroyed on another thread, before
// the process ends (it writes the rank's trace).
TEST(Group, TheLastHandleMayGoOnTheWorldsProgressThread) {
  std::promise<void> callers_gone;
  std::shared_future<void> go = callers_gone.get_future().share();
  std::weak_ptr<internal::World> world;
  Group::RunInProcess(2, [&](Group& g) {
    if (g.rank() != 0) return;
    world = internal::Access::Impl(g)->world_ptr();
    // The body's copy of the group is released with the finished task, on
    // the progress thread.
    internal::Access::Impl(g)->Submit(
        "hold", /*inline_ok=*/false, [copy = g, go](internal::OpContext&) { go.wait(); },
        /*collective=*/false);
  });
  ASSERT_FALSE(world.expired()) << "the task does not hold the group";
  callers_gone.set_value();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!world.expired() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(world.expired()) << "the world was never released";
  internal::WaitForDeferredWorlds();
}

}  // namespace
}  // namespace mc2

namespace mc2 {
namespace {

// WorldOptions::scratch_bytes sizes the scratch of the world group and of
// every group split from it; an invalid size fails the world, naming the
// option.
TEST(Group, ScratchBytesOptionReachesEveryGroupOfTheWorld) {
  std::atomic<int> wrong{0};
  WorldOptions o;
  o.scratch_bytes = 8192;
  Group::RunInProcess(
      3,
      [&](Group& g) {
        wrong += internal::Access::Impl(g)->scratch_bytes() != 8192;
        Group sub = g.Split(g.rank() % 2, g.rank());
        wrong += internal::Access::Impl(sub)->scratch_bytes() != 8192;
        int32_t v = 1, out = 0;
        AllReduce(sub, &v, &out, 1, DType::kI32, ReduceOp::kSum).Wait();
        wrong += out != sub.size();
      },
      o);
  EXPECT_EQ(wrong.load(), 0);
  for (size_t bad : {size_t{4032}, size_t{8200}}) {
    o.scratch_bytes = bad;
    try {
      Group::RunInProcess(2, [](Group&) {}, o);
      ADD_FAILURE() << "scratch_bytes " << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find("WorldOptions::scratch_bytes=" + std::to_string(bad)),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace mc2
