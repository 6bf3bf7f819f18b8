// The net transport through its interface (transport/net_transport.h), as
// the factory starts it: run under mpirun by
// tests/integration/net_transport_test.cc, one case per run:
//
//   net_transport CASE
//
// Every rank checks what it received against what the sender's formula
// says it sent, and prints "ok CASE rank R" once everything held; any
// mismatch prints "FAIL ..." and exits 1. The failure cases record a
// failure on purpose, so their job ends non-zero (the transport aborts the
// job at exit after a failure): the test reads the lines, not the status.
// So that no rank's exit (MPI_Abort) ends another still checking, every
// rank waits at the end until each rank has left a file in
// NET_TRANSPORT_DIR: a barrier that needs no working transport.
#include "transport/net_transport.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using mc2::Error;
using mc2::ErrorCode;
using mc2::transport::CommId;
using mc2::transport::Completion;
using mc2::transport::kJobComm;
using mc2::transport::NetTransport;
using Clock = std::chrono::steady_clock;

constexpr auto kNoDeadline = NetTransport::kNoDeadline;

[[noreturn]] void Fail(int rank, const std::string& what) {
  fmt::print("FAIL rank {}: {}\n", rank, what);
  std::fflush(stdout);
  _exit(1);
}

void Check(int rank, bool cond, const std::string& what) {
  if (!cond) Fail(rank, what);
}

Clock::time_point Soon() { return Clock::now() + std::chrono::seconds(30); }

void Wait(NetTransport& tx, const Completion& c) {
  c.Wait(
      Soon(), [&] { tx.CheckHealth(); }, [] { return std::string("a test message"); });
}

// Byte i of the message of `bytes` from src to dst (index k).
uint8_t Pattern(int src, int dst, int k, size_t i) {
  return static_cast<uint8_t>((i * 131 + src * 17 + dst * 7 + k * 3 + (i >> 12)) & 0xff);
}

// Every rank sends every other one message of each size (0 B, 1 B, an odd
// size, several pieces of MC2_MPI_PIECE_BYTES) and checks what it gets;
// every completion's callback runs exactly once.
void Messages(NetTransport& tx) {
  const int me = tx.rank(), n = tx.size();
  const std::vector<size_t> sizes = {0, 1, 4099, (size_t{3} << 20) + 5};
  std::vector<std::vector<uint8_t>> out, in;
  std::vector<std::shared_ptr<Completion>> pending;
  std::atomic<int> callbacks{0};
  auto count = [&](std::exception_ptr ep) {
    if (!ep) callbacks.fetch_add(1);
  };
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    for (size_t k = 0; k < sizes.size(); ++k) {
      out.emplace_back(sizes[k]);
      for (size_t i = 0; i < sizes[k]; ++i) out.back()[i] = Pattern(me, p, k, i);
      in.emplace_back(sizes[k], 0xee);
      pending.push_back(
          tx.Irecv(kJobComm, p, 10 + k, in.back().data(), sizes[k], count, kNoDeadline));
      pending.push_back(
          tx.Isend(kJobComm, p, 10 + k, out.back().data(), sizes[k], count, kNoDeadline));
    }
  }
  for (auto& c : pending) Wait(tx, *c);
  size_t m = 0;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    for (size_t k = 0; k < sizes.size(); ++k, ++m)
      for (size_t i = 0; i < sizes[k]; ++i)
        Check(me, in[m][i] == Pattern(p, me, k, i),
              fmt::format("byte {} of the {}-byte message from rank {}", i, sizes[k], p));
  }
  // Callbacks run on the transport's thread right after done() is seen.
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (callbacks.load() != static_cast<int>(pending.size()) && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  Check(me, callbacks.load() == static_cast<int>(pending.size()),
        fmt::format("{} callbacks for {} requests", callbacks.load(), pending.size()));
}

// Messages of one (communicator, peer, tag) match in posting order: rank 0
// sends 40 numbered messages to rank 1 on one tag, rank 1 posts its
// receives before and after they arrive.
void Order(NetTransport& tx) {
  const int me = tx.rank();
  constexpr int kCount = 40;
  std::vector<int64_t> vals(kCount, -1);
  std::vector<std::shared_ptr<Completion>> pending;
  if (me == 0) {
    for (int i = 0; i < kCount; ++i) vals[i] = 1000 + i;
    for (int i = 0; i < kCount; ++i)
      pending.push_back(tx.Isend(kJobComm, 1, 3, &vals[i], sizeof(int64_t), {}, kNoDeadline));
  } else if (me == 1) {
    for (int i = 0; i < kCount / 2; ++i)
      pending.push_back(tx.Irecv(kJobComm, 0, 3, &vals[i], sizeof(int64_t), {}, kNoDeadline));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (int i = kCount / 2; i < kCount; ++i)
      pending.push_back(tx.Irecv(kJobComm, 0, 3, &vals[i], sizeof(int64_t), {}, kNoDeadline));
  }
  for (auto& c : pending) Wait(tx, *c);
  if (me == 1)
    for (int i = 0; i < kCount; ++i)
      Check(me, vals[i] == 1000 + i, fmt::format("message {} carried {}", i, vals[i]));
}

// The member part of Split: `c` holds job ranks 0..m-1 in reverse order.
void SplitMessages(NetTransport& tx, CommId c, int m, int me) {
  const int mine = m - 1 - me;  // my rank in the new communicator
  std::vector<std::string> all =
      tx.AllGatherStrings(c, std::string(static_cast<size_t>(mine + 1), 'x'));
  for (int r = 0; r < m; ++r)
    Check(me, all[r] == std::string(static_cast<size_t>(r + 1), 'x'),
          fmt::format("split string {} was {}", r, all[r]));
  if (m < 2) return;
  // New-communicator rank 0 (job rank m-1) sends on both communicators,
  // split first; new rank 1 (job rank m-2) receives the job one first.
  int64_t on_split = -1, on_job = -1;
  const int64_t a = 111, b = 222;
  if (mine == 0) {
    auto s1 = tx.Isend(c, 1, 5, &a, sizeof(a), {}, kNoDeadline);
    auto s2 = tx.Isend(kJobComm, m - 2, 5, &b, sizeof(b), {}, kNoDeadline);
    Wait(tx, *s1);
    Wait(tx, *s2);
  } else if (mine == 1) {
    auto r_job = tx.Irecv(kJobComm, m - 1, 5, &on_job, sizeof(on_job), {}, kNoDeadline);
    auto r_split = tx.Irecv(c, 0, 5, &on_split, sizeof(on_split), {}, kNoDeadline);
    Wait(tx, *r_job);
    Wait(tx, *r_split);
    Check(me, on_split == a && on_job == b,
          fmt::format("split message {} (sent {}), job message {} (sent {})", on_split, a, on_job,
                      b));
  }
}

// Split orders by key, then by rank; a color < 0 gets no communicator; the
// new communicator's messages never match a receive of another one with
// the same peer and tag.
void Split(NetTransport& tx) {
  const int me = tx.rank(), n = tx.size();
  // Ranks 0..n-2 in reverse order (key = -rank); the last rank opts out.
  const bool member = me < n - 1;
  std::optional<CommId> c = tx.Split(kJobComm, member ? 7 : -1, -me);
  Check(me, c.has_value() == member, "Split's result for this rank's color");
  std::vector<std::string> all = tx.AllGatherStrings(kJobComm, fmt::format("r{}", me));
  Check(me, static_cast<int>(all.size()) == n, "AllGatherStrings gave one string per rank");
  for (int r = 0; r < n; ++r)
    Check(me, all[r] == fmt::format("r{}", r), fmt::format("string of rank {}: {}", r, all[r]));
  if (member) SplitMessages(tx, *c, n - 1, me);
  tx.AllGatherStrings(kJobComm, "");  // both communicators idle before Free
  if (c) tx.Free(*c);
}

// A standing receive completes when its message comes; a cancelled one
// fails with kAborted and calls its callback once with that error.
void Standing(NetTransport& tx) {
  const int me = tx.rank();
  if (me > 1) return;
  const int peer = 1 - me;
  int64_t got = -1, never = -1;
  std::atomic<int> aborted{0};
  auto standing = tx.IrecvStanding(kJobComm, peer, 9, &got, sizeof(got), {});
  auto doomed =
      tx.IrecvStanding(kJobComm, peer, 10, &never, sizeof(never), [&](std::exception_ptr ep) {
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const Error& e) {
          if (e.code() == ErrorCode::kAborted) aborted.fetch_add(1);
        }
      });
  const int64_t mine = 40 + me;
  auto s = tx.Isend(kJobComm, peer, 9, &mine, sizeof(mine), {}, kNoDeadline);
  Wait(tx, *s);
  Wait(tx, *standing);
  Check(me, got == 40 + peer, fmt::format("standing receive got {}", got));
  tx.Cancel(doomed);
  bool threw = false;
  try {
    Wait(tx, *doomed);
  } catch (const Error& e) {
    threw = e.code() == ErrorCode::kAborted;
  }
  Check(me, threw, "a cancelled standing receive fails with kAborted");
  // The callback runs on the transport's thread right after done() is seen.
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (aborted.load() == 0 && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  Check(me, aborted.load() == 1, "its callback saw kAborted once");
  Check(me, never == -1, "a cancelled receive wrote nothing");
}

// Abort on the last rank reaches every rank: on_failure runs once with the
// error, CheckHealth throws it, a pending receive fails with it.
void AbortReachesEveryRank(NetTransport& tx) {
  const int me = tx.rank(), n = tx.size();
  std::atomic<int> seen{0};
  tx.SetCallbacks(
      [&](const Error& e) {
        if (e.message().find("deliberate failure") != std::string::npos) seen.fetch_add(1);
      },
      {});
  int64_t never = 0;
  auto r = tx.Irecv(kJobComm, (me + 1) % n, 77, &never, sizeof(never), {}, kNoDeadline);
  tx.AllGatherStrings(kJobComm, "");  // every rank's receive is posted
  if (me == n - 1) tx.Abort(Error(ErrorCode::kPeerDied, "deliberate failure", me));
  std::string what;
  try {
    Wait(tx, *r);
  } catch (const Error& e) {
    what = e.message();
    Check(me, e.code() == ErrorCode::kPeerDied, fmt::format("the error's code ({})", what));
  }
  Check(me, what.find("deliberate failure") != std::string::npos,
        fmt::format("the pending receive failed with the recorded error ({})", what));
  bool threw = false;
  try {
    tx.CheckHealth();
  } catch (const Error&) {
    threw = true;
  }
  Check(me, threw && tx.failed(), "CheckHealth throws after the failure");
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (seen.load() == 0 && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  Check(me, seen.load() == 1, fmt::format("on_failure ran {} times", seen.load()));
}

// What the owner's probe throws on rank 0 becomes every rank's failure.
void ProbeFailure(NetTransport& tx) {
  const int me = tx.rank();
  tx.SetCallbacks({}, [me] {
    if (me == 0) throw Error(ErrorCode::kPeerDied, "the probe found a dead neighbour", 0);
  });
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (!tx.failed() && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::string what;
  try {
    tx.CheckHealth();
  } catch (const Error& e) {
    what = e.message();
  }
  Check(me, what.find("dead neighbour") != std::string::npos,
        fmt::format("the probe's failure reached this rank ({})", what));
}

// A receive past its deadline records kTimeout on every rank.
void Deadline(NetTransport& tx) {
  const int me = tx.rank();
  int64_t never = 0;
  std::shared_ptr<Completion> r;
  if (me == 0)
    r = tx.Irecv(kJobComm, 1, 99, &never, sizeof(never), {},
                 Clock::now() + std::chrono::milliseconds(300));
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (!tx.failed() && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::string what;
  ErrorCode code = ErrorCode::kInternal;
  try {
    tx.CheckHealth();
  } catch (const Error& e) {
    what = e.message();
    code = e.code();
  }
  Check(me, code == ErrorCode::kTimeout && what.find("receive from rank 1") != std::string::npos,
        fmt::format("a timeout naming the receive reached this rank ({})", what));
}

// Leaves this rank's file, then waits (at most 60 s) for every rank's.
void FileBarrier(int rank, int size) {
  const char* dir = std::getenv("NET_TRANSPORT_DIR");
  if (!dir) return;
  const int fd = ::open(fmt::format("{}/done.{}", dir, rank).c_str(), O_CREAT | O_WRONLY, 0600);
  if (fd >= 0) ::close(fd);
  const auto until = Clock::now() + std::chrono::seconds(60);
  for (int r = 0; r < size && Clock::now() < until; ++r)
    while (access(fmt::format("{}/done.{}", dir, r).c_str(), F_OK) != 0 && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr,
                 "usage: net_transport messages|order|split|standing|abort|probe|deadline\n");
    return 2;
  }
  const std::string what = argv[1];
  std::shared_ptr<NetTransport> tx = mc2::transport::StartNetTransport({});
  if (what == "messages") {
    Messages(*tx);
  } else if (what == "order") {
    Order(*tx);
  } else if (what == "split") {
    Split(*tx);
  } else if (what == "standing") {
    Standing(*tx);
  } else if (what == "abort") {
    AbortReachesEveryRank(*tx);
  } else if (what == "probe") {
    ProbeFailure(*tx);
  } else if (what == "deadline") {
    Deadline(*tx);
  } else {
    std::fprintf(stderr, "unknown case '%s'\n", what.c_str());
    return 2;
  }
  fmt::print("ok {} rank {} of {} over {}\n", what, tx->rank(), tx->size(), tx->name());
  std::fflush(stdout);
  FileBarrier(tx->rank(), tx->size());
  return 0;
}
