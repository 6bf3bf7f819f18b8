// The engine channel (engine/channel.h): a producer's window bytes are
// readable in place by the consumer once its notification was waited for;
// counters carry across calls (Consumed); Landed never blocks; a missing
// notification times out naming what is missing; link emulation charges
// each notified transfer to the producer's port; internal messages never
// match a user's tag.
#include "engine/channel.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "engine/access.h"
#include "engine/group_impl.h"
#include "mc2/mc2.h"
#include "transport/link_emulation.h"

namespace mc2::internal {
namespace {

TEST(Channel, WindowBytesAreReadInPlaceAfterTheWait) {
  Group::RunInProcess(3, [](Group& g) {
    const int me = g.rank(), n = g.size();
    Channel& ch = Channel::Of(g);
    EXPECT_EQ(&ch, &Channel::Of(g));  // one per group
    for (int call = 0; call < 3; ++call) {
      const size_t bytes = 1000 + 4096 * call;  // grows the window
      ch.Begin(bytes, {"channel_test", "test", std::chrono::seconds(30)});
      // Two chunks per peer, each in its own region of our window.
      for (int c = 0; c < 2; ++c) {
        for (int i = 1; i < n; ++i) {
          const int dst = (me + i) % n;
          const size_t off = (c * n + dst) * 8;
          const uint64_t v = 1000000 * call + 1000 * me + 10 * dst + c;
          std::memcpy(ch.Window() + off, &v, 8);
          ch.Notify(dst, c % Channel::kPhases, off, 8);
        }
      }
      for (int c = 0; c < 2; ++c) {
        for (int i = 1; i < n; ++i) {
          const int src = (me - i + n) % n;
          ch.Wait(src, c % Channel::kPhases, 1, [] { return std::string("test chunk"); });
          EXPECT_TRUE(ch.Landed(src, c % Channel::kPhases, 1));
          const size_t off = (c * n + me) * 8;
          uint64_t v;
          std::memcpy(&v, ch.View(src, off, 8), 8);
          EXPECT_EQ(v, 1000000u * call + 1000 * src + 10 * me + c);
        }
      }
      // Nothing more was sent: the next chunk has not landed.
      EXPECT_FALSE(ch.Landed((me + 1) % n, 0, 2));
      ch.Consumed(0, 1);
      ch.Consumed(1, 1);
      // Every rank has read its chunks before anyone rewrites its window
      // (the operators' agreement step does this).
      g.AllocSymmetric(64);
    }
  });
}

TEST(Channel, ViewIsThePeersWindowMappedInPlace) {
  Group::RunInProcess(2, [](Group& g) {
    Channel& ch = Channel::Of(g);
    ch.Begin(4096, {});
    std::vector<const char*> windows(2);
    const char* mine = ch.Window();
    AllGather(g, &mine, windows.data(), sizeof(mine), DType::kU8).Wait();
    // Threads share one address space: the view of the peer is its window.
    EXPECT_EQ(ch.View(1 - g.rank(), 128, 16), windows[1 - g.rank()] + 128);
  });
}

// A group's first call may move nothing (an empty product): its window
// still exists on every member, so the views the pipeline forms are the
// peers' windows, not garbage.
TEST(Channel, AnEmptyFirstCallStillHasWindows) {
  Group::RunInProcess(3, [](Group& g) {
    Channel& ch = Channel::Of(g);
    ch.Begin(0, {});
    ASSERT_NE(ch.Window(), nullptr);
    std::vector<const char*> windows(3);
    const char* mine = ch.Window();
    AllGather(g, &mine, windows.data(), sizeof(mine), DType::kU8).Wait();
    for (int r = 0; r < 3; ++r) EXPECT_EQ(ch.View(r, 0, 0), windows[r]);
  });
}

// Regression: a fused operator whose first call on a group has an empty
// product (n = 0), then one that moves data.
TEST(Channel, FusedCallsAfterAnEmptyFirstCall) {
  Group::RunInProcess(2, [](Group& g) {
    FusedOptions o;
    o.pipeline = Pipeline::kFused;
    o.splits = 2;
    std::vector<float> a(8 * 4, 1.0f), b(4 * 3, 1.0f), c(8 * 3, -1.0f);
    MatmulAllReduce(
        g,
        {.a = a.data(), .b = b.data(), .c = c.data(), .m = 8, .k = 4, .n = 0, .dtype = DType::kF32},
        o);
    MatmulAllReduce(
        g,
        {.a = a.data(), .b = b.data(), .c = c.data(), .m = 8, .k = 4, .n = 3, .dtype = DType::kF32},
        o);
    // Every entry sums 4 products of ones on each of the 2 ranks.
    for (float v : c) EXPECT_EQ(v, 8.0f);
  });
}

TEST(Channel, AMissingChunkTimesOutNamingIt) {
  WorldOptions wo;
  wo.timeout = std::chrono::milliseconds(300);
  Group::RunInProcess(
      2,
      [](Group& g) {
        Channel& ch = Channel::Of(g);
        ch.Begin(64, {"channel_test", "test", std::chrono::milliseconds(200)});
        if (g.rank() == 0) {
          try {
            ch.Wait(1, 0, 1, [] { return std::string("chunk 1 of 1 from rank 1"); });
            ADD_FAILURE() << "no timeout";
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::kTimeout);
            EXPECT_NE(std::string(e.what()).find("chunk 1 of 1 from rank 1"), std::string::npos)
                << e.what();
          }
        }
      },
      wo);
}

TEST(Channel, EmulatedLinkChargesEachNotifiedTransfer) {
  WorldOptions wo;
  wo.link = "bw=1GB/s,lat=1us";
  Group::RunInProcess(
      2,
      [](Group& g) {
        Channel& ch = Channel::Of(g);
        EXPECT_TRUE(ch.link().emulated());
        EXPECT_DOUBLE_EQ(ch.link().bytes_per_second, 1e9);
        ch.Begin(1 << 20, {});
        transport::LinkModel* port = internal::Access::Impl(g)->tx().link();
        ASSERT_NE(port, nullptr);
        const uint64_t before = port->bytes_posted();
        ch.Notify(1 - g.rank(), 0, 0, 1 << 20);
        EXPECT_EQ(port->bytes_posted() - before, uint64_t{1} << 20);
        ch.Wait(1 - g.rank(), 0, 1, [] { return std::string(); });
        ch.Consumed(0, 1);
      },
      wo);
}

TEST(Channel, InternalMessagesNeverMatchUserTags) {
  Group::RunInProcess(2, [](Group& g) {
    Channel& ch = Channel::Of(g);
    const int peer = 1 - g.rank();
    // The internal tag's low 32 bits are a valid user tag: it must not match.
    const int user_tag =
        static_cast<int>(static_cast<int64_t>(InternalTag::kMoeDispatch) & 0x7fffffff);
    int user = 100 + g.rank(), internal = 200 + g.rank();
    Work a = g.Send(&user, 4, peer, user_tag);
    Work b = ch.Send(&internal, 4, peer, InternalTag::kMoeDispatch);
    int got_internal = -1, got_user = -1;
    ch.Recv(&got_internal, 4, peer, InternalTag::kMoeDispatch).Wait();
    g.Recv(&got_user, 4, peer, user_tag).Wait();
    EXPECT_EQ(got_internal, 200 + peer);
    EXPECT_EQ(got_user, 100 + peer);
    a.Wait();
    b.Wait();
  });
}

}  // namespace
}  // namespace mc2::internal
