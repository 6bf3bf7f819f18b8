// Worlds made by their own ranks (Group::FromRendezvous): real processes,
// forked here, exchanging their strings through a board of shared memory
// that stands in for a launcher's key-value store.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/process_util.h"
#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/group.h"

namespace mc2 {
namespace {

constexpr int kMaxRanks = 4;
constexpr int kRounds = 4;
constexpr size_t kSlotBytes = 4096;

// A process-shared all-gather: round k's strings go into slots[k][rank].
struct Board {
  std::atomic<int> arrived[kRounds];
  char slots[kRounds][kMaxRanks][kSlotBytes];
};

Board* NewBoard() {
  void* p = mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  return new (p) Board();
}

Group::AllGatherStrings BoardAllGather(Board* board, int rank, int size) {
  auto round = std::make_shared<int>(0);
  return [=](const std::string& mine) {
    const int k = (*round)++;
    if (k >= kRounds || mine.size() >= kSlotBytes) _exit(90);
    std::memcpy(board->slots[k][rank], mine.c_str(), mine.size() + 1);
    board->arrived[k].fetch_add(1, std::memory_order_acq_rel);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (board->arrived[k].load(std::memory_order_acquire) < size) {
      if (std::chrono::steady_clock::now() > deadline) _exit(91);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    std::vector<std::string> all;
    for (int r = 0; r < size; ++r) all.emplace_back(board->slots[k][r]);
    return all;
  };
}

// Forks `size` ranks, each running body(rank) (its exit status), and
// returns their statuses (128 + signal when killed; -1 on timeout).
std::vector<int> RunRanks(int size, const std::function<int(int rank, Board*)>& body,
                          double timeout_s = 30) {
  Board* board = NewBoard();
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int status = 99;
      try {
        status = body(r, board);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        status = 98;
      }
      _exit(status);
    }
    pids.push_back(pid);
  }
  std::vector<int> statuses(size, -1);
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int>(timeout_s * 1000));
  for (int r = 0; r < size; ++r) {
    int st = 0;
    while (waitpid(pids[r], &st, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (pid_t p : pids) kill(p, SIGKILL);
        waitpid(pids[r], &st, 0);
        st = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    statuses[r] = st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  munmap(board, sizeof(Board));
  return statuses;
}

WorldOptions SmallWorld() {
  WorldOptions o;
  o.heap_bytes = size_t{16} << 20;
  o.timeout = std::chrono::seconds(10);
  return o;
}

TEST(Rendezvous, RanksMakeAWorldAndReduceWithoutALauncher) {
  const auto before = testing::ShmEntries();
  for (int size : {1, 3}) {
    auto statuses = RunRanks(size, [size, &before](int rank, Board* board) {
      Group g = Group::FromRendezvous(rank, size, BoardAllGather(board, rank, size), SmallWorld());
      if (g.rank() != rank || g.size() != size) return 10;
      // Rank r contributes i * (r + 1); the sum is i * size (size + 1) / 2.
      std::vector<float> in(1000), out(1000);
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * (rank + 1);
      AllReduce(g, in.data(), out.data(), in.size(), DType::kF32, ReduceOp::kSum).Wait();
      for (size_t i = 0; i < out.size(); ++i)
        if (out[i] != static_cast<float>(i) * size * (size + 1) / 2) return 11;
      // Point-to-point around the ring.
      if (size > 1) {
        int token = rank, got = -1;
        Work s = g.Send(&token, sizeof token, (rank + 1) % size, 7);
        g.Recv(&got, sizeof got, (rank + size - 1) % size, 7).Wait();
        s.Wait();
        if (got != (rank + size - 1) % size) return 12;
      }
      // Nothing of this world has a name in /dev/shm, even while it runs.
      for (const auto& name : testing::ShmEntries())
        if (!before.count(name)) return 13;
      Barrier(g).Wait();
      return 0;
    });
    EXPECT_EQ(statuses, std::vector<int>(size, 0)) << "world of " << size;
  }
  EXPECT_EQ(testing::ShmEntries(), before);
}

// The error of `body` as an exit status: 0 when it threw `want` naming
// `fragment`, 20 when it did not throw, 21 for another code, 22 for a
// message without the fragment.
int ExpectError(const std::function<void()>& body, ErrorCode want, const std::string& fragment) {
  try {
    body();
  } catch (const Error& e) {
    if (e.code() != want) return 21;
    if (std::string(e.what()).find(fragment) == std::string::npos) return 22;
    return 0;
  }
  return 20;
}

TEST(Rendezvous, RanksThatDisagreeOnTheSizeAllFail) {
  // Rank 2 believes in a world of 4; every rank learns it from the exchange.
  auto statuses = RunRanks(3, [](int rank, Board* board) {
    const int claimed = rank == 2 ? 4 : 3;
    return ExpectError(
        [&] { Group::FromRendezvous(rank, claimed, BoardAllGather(board, rank, 3), SmallWorld()); },
        ErrorCode::kInvalidArgument, "a world of 4");
  });
  EXPECT_EQ(statuses, std::vector<int>(3, 0));
}

TEST(Rendezvous, AHeapTooLargeForTheDirectoryFailsEveryRank) {
  // Rank 0 cannot reserve the heaps; the others hear why instead of waiting.
  auto statuses = RunRanks(2, [](int rank, Board* board) {
    WorldOptions o = SmallWorld();
    o.heap_bytes = size_t{1} << 50;
    return ExpectError(
        [&] { Group::FromRendezvous(rank, 2, BoardAllGather(board, rank, 2), o); },
        ErrorCode::kShmExhausted, "/dev/shm");
  });
  EXPECT_EQ(statuses, std::vector<int>(2, 0));
}

TEST(Rendezvous, ARankThatDiesIsNamedByTheOthers) {
  // Rank 1 dies after start-up; rank 0's next collective fails naming it.
  auto statuses = RunRanks(2, [](int rank, Board* board) {
    Group g = Group::FromRendezvous(rank, 2, BoardAllGather(board, rank, 2), SmallWorld());
    if (rank == 1) raise(SIGKILL);
    float x = 1, y = 0;
    return ExpectError([&] { AllReduce(g, &x, &y, 1, DType::kF32, ReduceOp::kSum).Wait(); },
                       ErrorCode::kPeerDied, "rank 1");
  });
  EXPECT_EQ(statuses[0], 0);
  EXPECT_EQ(statuses[1], 128 + SIGKILL);
}

TEST(Rendezvous, InvalidArgumentsAreRefusedBeforeAnyExchange) {
  auto none = [](const std::string&) -> std::vector<std::string> {
    ADD_FAILURE() << "no exchange expected";
    return {};
  };
  EXPECT_THROW(Group::FromRendezvous(3, 3, none, SmallWorld()), Error);
  EXPECT_THROW(Group::FromRendezvous(0, 0, none, SmallWorld()), Error);
  EXPECT_THROW(Group::FromRendezvous(0, 1, nullptr, SmallWorld()), Error);
}

}  // namespace
}  // namespace mc2
