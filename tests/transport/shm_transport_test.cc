// The shared-memory transport through the Transport interface
// (transport/transport.h), as the factory makes it for ranks that are
// threads of one process: flags published by their owner and waited for
// by others, RemoteAdd from many ranks, data through HeapBase, Wake and
// SleepUntil, timeouts that name what is missing, and an aborted world
// failing every wait.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mc2/error.h"
#include "transport/transport.h"

namespace mc2::transport {
namespace {

constexpr size_t kHeap = 1 << 20;
constexpr uint64_t kFlag = kHeapHeaderBytes;        // a flag word in each heap
constexpr uint64_t kCounter = kHeapHeaderBytes + 64;  // a RemoteAdd counter
constexpr uint64_t kData = kHeapHeaderBytes + 4096;   // a data area

WaitContext Context(Clock::time_point* deadline, std::chrono::milliseconds timeout,
                    std::string missing = "the test's flag") {
  WaitContext ctx;
  ctx.op = "test";
  ctx.deadline = deadline;
  ctx.timeout = timeout;
  ctx.describe_missing = [missing] { return missing; };
  return ctx;
}

// Runs body(rank, transport) on every rank's thread.
void OnEveryRank(std::vector<std::unique_ptr<Transport>>& txs,
                 const std::function<void(int, Transport&)>& body) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < txs.size(); ++r)
    threads.emplace_back([&, r] { body(static_cast<int>(r), *txs[r]); });
  for (auto& t : threads) t.join();
}

TEST(ShmTransport, PublishedDataIsVisibleToEveryWaiter) {
  auto txs = CreateInProcessTransports(4, kHeap, "none");
  ASSERT_EQ(txs.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(txs[r]->rank(), r);
    EXPECT_EQ(txs[r]->size(), 4);
    EXPECT_TRUE(txs[r]->ranks_are_threads());
    EXPECT_EQ(txs[r]->HeapBytes(), kHeap);
  }
  // Per round, rank r writes its data and publishes the round (flag);
  // every rank waits for the others' flags, reads their data, and
  // acknowledges (ack); nobody rewrites its data before every peer's ack.
  constexpr int kRounds = 300;
  constexpr uint64_t kAck = kFlag + 8;
  std::atomic<int> wrong{0};
  OnEveryRank(txs, [&](int me, Transport& tx) {
    auto wait_all = [&](uint64_t off, int round) {
      for (int peer = 0; peer < tx.size(); ++peer) {
        Clock::time_point deadline{};
        if (peer != me)
          tx.WaitGE(peer, off, static_cast<uint64_t>(round),
                    Context(&deadline, std::chrono::seconds(30)));
      }
    };
    for (int round = 1; round <= kRounds; ++round) {
      auto* mine = reinterpret_cast<int64_t*>(tx.HeapBase(me) + kData);
      for (int i = 0; i < 64; ++i) mine[i] = int64_t{me} * 1000000 + round * 100 + i;
      tx.Publish(kFlag, static_cast<uint64_t>(round), 64 * sizeof(int64_t));
      wait_all(kFlag, round);
      for (int peer = 0; peer < tx.size(); ++peer) {
        const auto* theirs = reinterpret_cast<const int64_t*>(tx.HeapBase(peer) + kData);
        for (int i = 0; i < 64; ++i)
          if (theirs[i] != int64_t{peer} * 1000000 + round * 100 + i) wrong.fetch_add(1);
      }
      tx.Publish(kAck, static_cast<uint64_t>(round));
      wait_all(kAck, round);
    }
  });
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(txs[0]->Peek(3, kFlag), static_cast<uint64_t>(kRounds));
}

TEST(ShmTransport, RemoteAddsFromEveryRankAllCount) {
  auto txs = CreateInProcessTransports(3, kHeap, "none");
  constexpr int kAdds = 2000;
  OnEveryRank(txs, [&](int me, Transport& tx) {
    for (int i = 0; i < kAdds; ++i) tx.RemoteAdd(0, kCounter, 1 + me);
  });
  Clock::time_point deadline{};
  txs[0]->WaitGE(0, kCounter, kAdds * (1 + 2 + 3), Context(&deadline, std::chrono::seconds(5)));
  EXPECT_EQ(txs[1]->Peek(0, kCounter), static_cast<uint64_t>(kAdds * 6));
}

TEST(ShmTransport, AWaitPastItsDeadlineNamesWhatIsMissing) {
  auto txs = CreateInProcessTransports(2, kHeap, "none");
  Clock::time_point deadline{};
  const auto start = Clock::now();
  try {
    txs[0]->WaitGE(1, kFlag, 1, Context(&deadline, std::chrono::milliseconds(100),
                                        "chunk 3 from rank 1"));
    FAIL() << "the wait returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_NE(e.message().find("chunk 3 from rank 1"), std::string::npos) << e.message();
  }
  // A timeout never fires early.
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(100));
}

TEST(ShmTransport, AnAbortFailsEveryRanksWaitsAndHealthChecks) {
  auto txs = CreateInProcessTransports(3, kHeap, "none");
  std::atomic<int> aborted{0};
  std::vector<std::thread> waiters;
  for (int r = 1; r < 3; ++r)
    waiters.emplace_back([&, r] {
      Clock::time_point deadline{};
      try {
        txs[r]->WaitGE(0, kFlag, 1, Context(&deadline, std::chrono::seconds(60)));
      } catch (const Error& e) {
        if (e.message().find("the test gives up") != std::string::npos) aborted.fetch_add(1);
      }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the waiters may sleep
  txs[0]->Abort(Error(ErrorCode::kAborted, "the test gives up", 0));
  for (auto& t : waiters) t.join();
  EXPECT_EQ(aborted.load(), 2);
  for (int r = 0; r < 3; ++r) EXPECT_THROW(txs[r]->CheckHealth(/*thorough=*/false), Error);
  // The first failure wins.
  txs[1]->Abort(Error(ErrorCode::kTimeout, "later", 1));
  try {
    txs[2]->CheckHealth(false);
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("the test gives up"), std::string::npos) << e.message();
  }
}

TEST(ShmTransport, WakeEndsASleepBeforeItsLimit) {
  auto txs = CreateInProcessTransports(2, kHeap, "none");
  std::atomic<bool> go{false};
  std::thread sleeper([&] {
    const auto start = Clock::now();
    while (!go.load()) txs[1]->SleepUntil([&] { return go.load(); }, std::chrono::seconds(30));
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  go = true;
  txs[0]->Wake(1);
  sleeper.join();
}

}  // namespace
}  // namespace mc2::transport
