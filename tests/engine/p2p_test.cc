#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <numeric>
#include <vector>

#include "mc2/mc2.h"

namespace mc2 {
namespace {

std::vector<int32_t> Pattern(size_t n, int from, int tag) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(i * 31 + from * 1000003 + tag * 7);
  return v;
}

// Every rank sends to every other and receives from every other, all posted
// before any wait: completes only if progress never blocks on one message.
TEST(P2P, AllPairsExchangeOfLargeMessages) {
  for (int n : {2, 3, 4}) {
    Group::RunInProcess(n, [&](Group& g) {
      const size_t count = (3 << 20) / 4 + 17;  // several chunks, odd tail
      std::vector<std::vector<int32_t>> out(n), in(n);
      std::vector<Work> works;
      for (int p = 0; p < n; ++p) {
        if (p == g.rank()) continue;
        out[p] = Pattern(count, g.rank(), p);
        in[p].assign(count, -1);
        works.push_back(g.Send(out[p].data(), count * 4, p, /*tag=*/p));
        works.push_back(g.Recv(in[p].data(), count * 4, p, /*tag=*/g.rank()));
      }
      for (auto& w : works) w.Wait();
      for (int p = 0; p < n; ++p) {
        if (p == g.rank()) continue;
        EXPECT_EQ(in[p], Pattern(count, p, g.rank())) << "from " << p;
      }
    });
  }
}

// Sends to different peers take the (emulated) egress port in the order
// they were posted: rank 0 sends 768 KiB to rank 2, then 256 KiB to rank 1,
// over a 4 MB/s link. In posting order rank 1's message is behind all
// 1 MiB, so it cannot complete before 1 MiB / 4 MB/s = 262 ms (the link
// never delivers early); advancing peers in rank order instead completes it
// at ~66 ms. The bound is on rank 1 alone: comparing the two receivers'
// completion order also measures how fast rank 2's thread gets to run,
// which under a sanitizer on two loaded cores it sometimes does not.
TEST(P2P, SendsToDifferentPeersTakeThePortInPostingOrder) {
  WorldOptions o;
  o.link = "bw=4MB/s,lat=0";
  using Clock = std::chrono::steady_clock;
  std::atomic<int64_t> posted_ns{0}, rank1_ns{0};
  Group::RunInProcess(
      3,
      [&](Group& g) {
        const size_t big = (768 << 10) / 4, small = (256 << 10) / 4;
        if (g.rank() == 0) {
          auto a = Pattern(big, 0, 2), b = Pattern(small, 0, 1);
          posted_ns = Clock::now().time_since_epoch().count();
          Work wa = g.Send(a.data(), big * 4, 2, 0);
          Work wb = g.Send(b.data(), small * 4, 1, 0);
          wa.Wait();
          wb.Wait();
        } else {
          const size_t n = g.rank() == 2 ? big : small;
          std::vector<int32_t> in(n, -1);
          g.Recv(in.data(), n * 4, 0, 0).Wait();
          if (g.rank() == 1) rank1_ns = Clock::now().time_since_epoch().count();
          EXPECT_EQ(in, Pattern(n, 0, g.rank()));
        }
      },
      o);
  const double rank1_ms = (rank1_ns.load() - posted_ns.load()) / 1e6;
  const double both_ms = (1 << 20) / 4e6 * 1e3;
  EXPECT_GE(rank1_ms, 0.95 * both_ms)
      << "rank 1's later-posted message did not wait for rank 2's on the port";
}

TEST(P2P, MessagesArriveInOrderIncludingEmptyOnes) {
  Group::RunInProcess(2, [&](Group& g) {
    const int peer = 1 - g.rank();
    std::vector<size_t> sizes = {0, 1, 4096, 0, 300000, 7};
    std::vector<std::vector<int32_t>> bufs;
    std::vector<Work> works;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (g.rank() == 0) {
        bufs.push_back(Pattern(sizes[i], 0, static_cast<int>(i)));
        works.push_back(g.Send(bufs.back().data(), sizes[i] * 4, peer, static_cast<int>(i)));
      } else {
        bufs.emplace_back(sizes[i], -1);
        works.push_back(g.Recv(bufs.back().data(), sizes[i] * 4, peer, static_cast<int>(i)));
      }
    }
    for (auto& w : works) w.Wait();
    if (g.rank() == 1) {
      for (size_t i = 0; i < sizes.size(); ++i)
        EXPECT_EQ(bufs[i], Pattern(sizes[i], 0, static_cast<int>(i)));
    }
  });
}

// Messages match Recvs by (source, tag), not by arrival order: rank 0 sends
// tags 1, 2, 3 (one of them several chunks long); rank 1 posts the Recvs in
// the order 3, 1, 2 and waits for each before posting the next.
TEST(P2P, RecvsMatchByTagWhateverTheOrder) {
  Group::RunInProcess(2, [&](Group& g) {
    const std::vector<size_t> sizes = {10, 700000, 33};
    if (g.rank() == 0) {
      std::vector<std::vector<int32_t>> out;
      std::vector<Work> works;
      for (int t = 1; t <= 3; ++t) {
        out.push_back(Pattern(sizes[t - 1], 0, t));
        works.push_back(g.Send(out.back().data(), out.back().size() * 4, 1, t));
      }
      for (auto& w : works) w.Wait();
    } else {
      for (int t : {3, 1, 2}) {
        std::vector<int32_t> in(sizes[t - 1], -1);
        g.Recv(in.data(), in.size() * 4, 0, t).Wait();
        EXPECT_EQ(in, Pattern(sizes[t - 1], 0, t)) << "tag " << t;
      }
    }
  });
}

// Messages with the same source and tag never overtake each other.
TEST(P2P, SameTagMessagesStayInOrder) {
  Group::RunInProcess(2, [&](Group& g) {
    if (g.rank() == 0) {
      std::vector<std::vector<int32_t>> out;
      std::vector<Work> works;
      for (int i = 0; i < 6; ++i) {
        out.push_back(Pattern(100, 0, i));
        works.push_back(g.Send(out.back().data(), 400, 1, /*tag=*/7));
      }
      for (auto& w : works) w.Wait();
    } else {
      for (int i = 0; i < 6; ++i) {
        std::vector<int32_t> in(100);
        g.Recv(in.data(), 400, 0, 7).Wait();
        EXPECT_EQ(in, Pattern(100, 0, i)) << "message " << i;
      }
    }
  });
}

TEST(P2P, SizeMismatchFailsBothSides) {
  std::atomic<int> errors{0};
  EXPECT_THROW(Group::RunInProcess(2, [&](Group& g) {
    int32_t x[2] = {5, 6};
    try {
      if (g.rank() == 0) {
        g.Send(x, 8, 1, /*tag=*/1).Wait();
        // The receiver's failure aborts the world: the next operation fails.
        Barrier(g).Wait();
      } else {
        g.Recv(x, 4, 0, /*tag=*/1).Wait();
      }
    } catch (const Error& e) {
      if (g.rank() == 1) {
        EXPECT_EQ(e.code(), ErrorCode::kMismatch) << e.what();
      }
      ++errors;
      throw;
    }
  }), Error);
  EXPECT_EQ(errors.load(), 2);
}

TEST(P2P, InvalidArgumentsAreRejected) {
  Group::RunInProcess(2, [&](Group& g) {
    int32_t x = 0;
    EXPECT_THROW(g.Send(&x, 4, g.rank()), Error);  // to itself
    EXPECT_THROW(g.Send(&x, 4, 7), Error);         // out of range
    EXPECT_THROW(g.Recv(nullptr, 4, 1 - g.rank()), Error);
  });
}

}  // namespace
}  // namespace mc2
