// The net transport through its interface (src/transport/net_transport.h),
// as the factory starts it, on real processes under mpirun on this host:
// messages of every size (pieces included) checked byte by byte, matching
// order, Split and the all-gather, standing receives and their
// cancellation, and the failure paths (Abort, the owner's probe, a request
// past its deadline) reaching every rank. The program is
// tests/programs/net_transport.cc; each rank prints "ok CASE rank R" once
// its checks held.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/process_util.h"
#include "common/temp_dir.h"

namespace mc2 {
namespace {

using ::testing::HasSubstr;
using namespace ::mc2::testing;



class NetTransportTest : public TempDirTest {
 protected:
  // Runs CASE on `ranks` processes of this host; returns mpirun's result.
  Result RunCase(const std::string& name, int ranks) {
    std::vector<std::string> args = MpirunOnThisHost(
        ranks, {"-x", "NET_TRANSPORT_DIR", TestProgram("net_transport"), name});
    Launch l = SpawnProgram(kMpirun, args, MpiRankEnv({{"NET_TRANSPORT_DIR", dir_.string()}}));
    return Wait(l, 120);
  }

  // Every rank printed its "ok" line.
  void ExpectEveryRankOk(const Result& r, const std::string& name, int ranks) {
    ASSERT_FALSE(r.timed_out) << r.out << r.err;
    for (int k = 0; k < ranks; ++k)
      EXPECT_THAT(r.out, HasSubstr("ok " + name + " rank " + std::to_string(k) + " of " +
                                   std::to_string(ranks) + " over mpi"))
          << "stdout:\n"
          << r.out << "stderr:\n"
          << r.err;
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("FAIL"))) << r.out;
  }

  void SetUp() override {
    TempDirTest::SetUp();
    if (access(kMpirun, X_OK) != 0) GTEST_SKIP() << "mpirun is missing (Debian: openmpi-bin)";
  }
};

TEST_F(NetTransportTest, MessagesOfEverySizeArriveIntact) {
  Result r = RunCase("messages", 3);
  ExpectEveryRankOk(r, "messages", 3);
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST_F(NetTransportTest, MessagesOfOnePeerAndTagMatchInPostingOrder) {
  Result r = RunCase("order", 2);
  ExpectEveryRankOk(r, "order", 2);
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST_F(NetTransportTest, SplitOrdersByKeyAndKeepsCommunicatorsApart) {
  Result r = RunCase("split", 4);
  ExpectEveryRankOk(r, "split", 4);
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST_F(NetTransportTest, StandingReceivesCompleteOrAreCancelled) {
  Result r = RunCase("standing", 2);
  ExpectEveryRankOk(r, "standing", 2);
  EXPECT_EQ(r.status, 0) << r.err;
}

// The failure cases end the job non-zero on purpose (MPI_Abort at exit).
TEST_F(NetTransportTest, AbortReachesEveryRank) {
  Result r = RunCase("abort", 3);
  ExpectEveryRankOk(r, "abort", 3);
  EXPECT_NE(r.status, 0);
}

TEST_F(NetTransportTest, AFailingProbeBecomesEveryRanksFailure) {
  Result r = RunCase("probe", 2);
  ExpectEveryRankOk(r, "probe", 2);
  EXPECT_NE(r.status, 0);
}

TEST_F(NetTransportTest, ARequestPastItsDeadlineTimesOutEveryRank) {
  Result r = RunCase("deadline", 2);
  ExpectEveryRankOk(r, "deadline", 2);
  EXPECT_NE(r.status, 0);
}

}  // namespace
}  // namespace mc2
