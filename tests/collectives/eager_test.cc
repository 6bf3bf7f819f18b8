// The eager small-message path (src/collectives/eager.cc): ranks skip the
// full arrival handshake, so a root may run ahead of its receivers. These
// tests make ranks drift apart on purpose and check every value, and check
// how mismatches are reported with and without MC2_CHECK=1.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mc2/mc2.h"

namespace mc2 {
namespace {

// A failed assertion ends one rank early; the others then time out soon.
WorldOptions Quick() {
  WorldOptions o;
  o.timeout = std::chrono::seconds(20);
  return o;
}

// Value rank r contributes at element i of iteration it: small integers, so
// sums are exact in any order and a stale or foreign buffer shows.
int32_t Val(int it, int r, size_t i) { return it * 1000 + r * 100 + static_cast<int32_t>(i % 97); }

// Many small rooted and all-to-all calls with rotating roots, interleaved
// with a large all_reduce (full handshake path), while random ranks sleep.
// Broadcast roots and reduce contributors return early, so ranks are up to
// two operations apart; every result is checked against its closed form.
// `c` elements per block: 37 stages in the inline area; 1, 3 and 5 stage
// (some calls, at some rank counts) beside the flag in the arrive line,
// whose offset words the full-handshake calls in between overwrite; 3, 5
// and 12 (some calls, with more ranks than CPUs) in the arrive slot's
// second line (GroupImpl::StageOff).
void DriftingMix(Group& g, int iters, size_t c) {
  const int n = g.size(), me = g.rank();
  std::mt19937 rng(1234 + me);
  std::vector<int32_t> send(c * n), recv(c * n);
  std::vector<float> big(300000), big_out(big.size());
  for (int it = 0; it < iters; ++it) {
    if (rng() % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));
    int root = it % n;
    switch (it % 7) {
      case 0: {  // broadcast
        for (size_t i = 0; i < c; ++i) send[i] = Val(it, root, i);
        std::vector<int32_t> out(c, -1);
        Broadcast(g, me == root ? send.data() : nullptr, out.data(), c, DType::kI32, root).Wait();
        for (size_t i = 0; i < c; ++i) ASSERT_EQ(out[i], Val(it, root, i)) << it;
        break;
      }
      case 1: {  // reduce
        for (size_t i = 0; i < c; ++i) send[i] = Val(it, me, i);
        std::vector<int32_t> out(c, -1);
        Reduce(g, send.data(), out.data(), c, DType::kI32, ReduceOp::kSum, root).Wait();
        if (me == root) {
          for (size_t i = 0; i < c; ++i) {
            int32_t want = 0;
            for (int r = 0; r < n; ++r) want += Val(it, r, i);
            ASSERT_EQ(out[i], want) << it;
          }
        }
        break;
      }
      case 2: {  // gather
        for (size_t i = 0; i < c; ++i) send[i] = Val(it, me, i);
        std::fill(recv.begin(), recv.end(), -1);
        Gather(g, send.data(), recv.data(), c, DType::kI32, root).Wait();
        if (me == root) {
          for (int r = 0; r < n; ++r)
            for (size_t i = 0; i < c; ++i) ASSERT_EQ(recv[r * c + i], Val(it, r, i)) << it;
        }
        break;
      }
      case 3: {  // scatter
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < c; ++i) send[r * c + i] = Val(it, r, i);
        std::vector<int32_t> out(c, -1);
        Scatter(g, send.data(), out.data(), c, DType::kI32, root).Wait();
        for (size_t i = 0; i < c; ++i) ASSERT_EQ(out[i], Val(it, me, i)) << it;
        break;
      }
      case 4: {  // all_to_all: block for rank d from rank s holds Val(it, s, d*c+i)
        for (int d = 0; d < n; ++d)
          for (size_t i = 0; i < c; ++i) send[d * c + i] = Val(it, me, d * c + i);
        AllToAll(g, send.data(), recv.data(), c, DType::kI32).Wait();
        for (int s = 0; s < n; ++s)
          for (size_t i = 0; i < c; ++i) ASSERT_EQ(recv[s * c + i], Val(it, s, me * c + i)) << it;
        break;
      }
      case 5: {  // all_reduce, small (eager) then large (full handshake)
        for (size_t i = 0; i < c; ++i) send[i] = Val(it, me, i);
        AllReduce(g, send.data(), recv.data(), c, DType::kI32, ReduceOp::kMax).Wait();
        for (size_t i = 0; i < c; ++i) ASSERT_EQ(recv[i], Val(it, n - 1, i)) << it;
        std::fill(big.begin(), big.end(), static_cast<float>(me + 1));
        AllReduce(g, big.data(), big_out.data(), big.size(), DType::kF32, ReduceOp::kSum).Wait();
        ASSERT_EQ(big_out[12345], static_cast<float>(n * (n + 1) / 2)) << it;
        break;
      }
      case 6: {  // reduce_scatter and a barrier
        for (int d = 0; d < n; ++d)
          for (size_t i = 0; i < c; ++i) send[d * c + i] = Val(it, me, d * c + i);
        std::vector<int32_t> out(c, -1);
        ReduceScatter(g, send.data(), out.data(), c, DType::kI32, ReduceOp::kSum).Wait();
        for (size_t i = 0; i < c; ++i) {
          int32_t want = 0;
          for (int r = 0; r < n; ++r) want += Val(it, r, me * c + i);
          ASSERT_EQ(out[i], want) << it;
        }
        if (it % 3 == 0) Barrier(g).Wait();
        break;
      }
    }
  }
  Barrier(g).Wait();
}

TEST(Eager, DriftingRanksGetEveryValueRight) {
  for (size_t c : {37, 12, 5, 3, 1})
    for (int n : {2, 3, 4, 5})
      Group::RunInProcess(
          n, [c](Group& g) { DriftingMix(g, 210, c); }, Quick());
}

// A broadcast root that never waits: 500 back-to-back calls with changing
// data while one receiver keeps falling behind. Without the reuse bound the
// root would overwrite a slot the receiver has not read yet.
TEST(Eager, BroadcastRootRunsAheadOfASlowReceiver) {
  Group::RunInProcess(3, [](Group& g) {
    std::vector<int64_t> buf(64);
    for (int it = 0; it < 500; ++it) {
      if (g.rank() == 2 && it % 25 == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      if (g.rank() == 0)
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = it * 64 + static_cast<int64_t>(i);
      Broadcast(g, buf.data(), buf.data(), buf.size(), DType::kI64, 0).Wait();
      for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], it * 64 + static_cast<int64_t>(i));
    }
  }, Quick());
}

// In place, a small all_to_all stages the whole input before it writes any
// output, so it runs without the private input copy the staged algorithms
// need (Launch). Checked with private and symmetric (zero-copy) buffers,
// with ranks drifting apart, so a rank whose output overwrote its input too
// early, or a peer reading it late, would show a wrong value.
TEST(Eager, InPlaceAllToAllReadsEveryBlockBeforeWritingAny) {
  for (int n : {2, 3, 4}) {
    Group::RunInProcess(n, [](Group& g) {
      const int n = g.size(), me = g.rank();
      const size_t c = 29;
      std::mt19937 rng(77 + me);
      std::vector<int32_t> priv(c * n);
      SymmetricBuffer sym = g.AllocSymmetric(c * n * sizeof(int32_t));
      for (int it = 0; it < 120; ++it) {
        if (rng() % 5 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
        int32_t* buf = it % 2 ? sym.as<int32_t>() : priv.data();
        for (int d = 0; d < n; ++d)
          for (size_t i = 0; i < c; ++i) buf[d * c + i] = Val(it, me, d * c + i);
        AllToAll(g, buf, buf, c, DType::kI32).Wait();
        for (int s = 0; s < n; ++s)
          for (size_t i = 0; i < c; ++i) ASSERT_EQ(buf[s * c + i], Val(it, s, me * c + i)) << it;
      }
      Barrier(g).Wait();
    }, Quick());
  }
}

// The eager barrier: with a CPU per rank every rank waits for every
// arrival; with more ranks than CPUs it gathers at rank 0 and releases from
// it (on a 2-CPU host, n = 2 runs the first and n = 3, 5 the second). Either
// way no rank may leave before every rank arrived, whoever arrives last.
TEST(Eager, BarrierReleasesNoRankBeforeEveryRankArrived) {
  for (int n : {2, 3, 5}) {
    std::atomic<int> arrived{0};
    Group::RunInProcess(n, [&](Group& g) {
      std::mt19937 rng(5 + g.rank());
      for (int it = 0; it < 200; ++it) {
        // A different rank is the last to arrive each time, rank 0 included.
        if (it % g.size() == g.rank() || rng() % 4 == 0)
          std::this_thread::sleep_for(std::chrono::microseconds(50 + rng() % 200));
        arrived.fetch_add(1);
        Barrier(g).Wait();
        ASSERT_GE(arrived.load(), (it + 1) * g.size()) << "rank " << g.rank() << " at " << it;
      }
    }, Quick());
  }
}

// Default mode: the receiver that sees the mismatch raises kMismatch at the
// call; the root, which read from nobody, fails at its next call (the world
// was aborted) with the same explanation.
TEST(Eager, MismatchRaisesAtTheReceiverAndLaterAtTheRoot) {
  std::vector<std::string> errors(3);
  std::vector<int> codes(3, -1);
  EXPECT_THROW(Group::RunInProcess(3, [&](Group& g) {
    std::vector<int32_t> buf(8);
    size_t count = g.rank() == 2 ? 5 : 4;
    try {
      Broadcast(g, buf.data(), buf.data(), count, DType::kI32, 0).Wait();
      Barrier(g).Wait();
      ADD_FAILURE() << "rank " << g.rank() << ": no error";
    } catch (const Error& e) {
      errors[g.rank()] = e.what();
      codes[g.rank()] = static_cast<int>(e.code());
      throw;
    }
  }), Error);
  EXPECT_EQ(codes[2], static_cast<int>(ErrorCode::kMismatch)) << errors[2];
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(errors[r].find("mismatched operations"), std::string::npos) << r << ": " << errors[r];
}

// MC2_CHECK=1: every rank compares every fingerprint before data moves, so
// every rank raises kMismatch at the mismatched call itself.
TEST(Eager, StrictCheckRaisesKMismatchOnEveryRankAtTheCall) {
  ASSERT_EQ(setenv("MC2_CHECK", "1", 1), 0);
  std::vector<int> codes(3, -1);
  EXPECT_THROW(Group::RunInProcess(3, [&](Group& g) {
    std::vector<int32_t> buf(8);
    size_t count = g.rank() == 2 ? 5 : 4;
    try {
      Broadcast(g, buf.data(), buf.data(), count, DType::kI32, 0).Wait();
      ADD_FAILURE() << "rank " << g.rank() << ": no error";
    } catch (const Error& e) {
      codes[g.rank()] = static_cast<int>(e.code());
      throw;
    }
  }), Error);
  unsetenv("MC2_CHECK");
  for (int r = 0; r < 3; ++r) EXPECT_EQ(codes[r], static_cast<int>(ErrorCode::kMismatch)) << r;
}

// With MC2_CHECK=1 the full-handshake path runs the same mix correctly.
TEST(Eager, StrictCheckRunsTheSameMix) {
  ASSERT_EQ(setenv("MC2_CHECK", "1", 1), 0);
  Group::RunInProcess(
      4, [](Group& g) { DriftingMix(g, 70, 37); }, Quick());
  unsetenv("MC2_CHECK");
}

}  // namespace
}  // namespace mc2
