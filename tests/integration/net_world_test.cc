// A world across hosts started by mpirun, on this host: each rank claims a
// host of its own (MC2_HOSTNAME), so the job's world is a net world whose
// ranks talk through the net transport, as on separate machines. Each
// rank's trace clock is skewed by seconds (MC2_TRACE_CLOCK_SKEW_NS), as
// separate machines' clocks may be: the world must measure every rank's
// offset to rank 0 and store it in the trace, and the trace tools must
// align the ranks so that the all-reduces every rank joined at once line
// up again.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/process_util.h"
#include "common/temp_dir.h"
#include "mc2/trace_file.h"

namespace mc2 {
namespace {

using ::testing::HasSubstr;
using namespace ::mc2::testing;


constexpr int64_t kSkewNs = 5'000'000'000;  // rank r's clock runs r * 5 s ahead

class NetWorldTest : public TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    if (access(kMpirun, X_OK) != 0) GTEST_SKIP() << "mpirun is missing (Debian: openmpi-bin)";
  }
};

TEST_F(NetWorldTest, TracesOfSkewedClocksAreAligned) {
  constexpr int kRanks = 3, kRounds = 12;
  const std::string trace_dir = (dir_ / "trace").string();
  // Per rank: its own host name and clock skew, set from Open MPI's rank.
  const std::string script =
      "export MC2_HOSTNAME=host$OMPI_COMM_WORLD_RANK; "
      "export MC2_TRACE_CLOCK_SKEW_NS=$((OMPI_COMM_WORLD_RANK * " +
      std::to_string(kSkewNs) + ")); exec " + TestProgram("net_trace") + " " +
      std::to_string(kRounds);
  Launch l = SpawnProgram(kMpirun,
                          MpirunOnThisHost(kRanks, {"-x", "MC2_TRACE", "/bin/sh", "-c", script}),
                          MpiRankEnv({{"MC2_TRACE", trace_dir}, {"MC2_HEAP_BYTES", "32M"}}));
  Result r = Wait(l, 120);
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  for (int k = 0; k < kRanks; ++k)
    EXPECT_THAT(r.out, HasSubstr("rank " + std::to_string(k) + ": ok"));

  // Each rank stored its measured offset: the skew, to within a round trip.
  trace::TraceData raw = trace::LoadTrace(trace_dir, /*align=*/false);
  ASSERT_EQ(raw.ranks.size(), static_cast<size_t>(kRanks));
  for (int k = 0; k < kRanks; ++k) {
    EXPECT_NEAR(static_cast<double>(raw.ranks.at(k).clock_offset_ns), k * double(kSkewNs), 20e6)
        << "rank " << k;
  }
  // Aligned, the k-th all-reduce of every rank starts within milliseconds
  // of rank 0's (each round starts after a barrier); raw, seconds apart.
  trace::TraceData aligned = trace::LoadTrace(trace_dir);
  auto starts = [](const trace::TraceData& t, int rank) {
    std::vector<int64_t> s;
    for (const auto& span : t.spans)
      // The operations across hosts (their steps inside a host record
      // spans of their own, with the node-level algorithm).
      if (span.rank == rank && span.name == "all_reduce" &&
          (span.algorithm == "hierarchical" || span.algorithm == "flat"))
        s.push_back(span.start_ns);
    std::sort(s.begin(), s.end());
    return s;
  };
  const std::vector<int64_t> base = starts(aligned, 0);
  ASSERT_EQ(base.size(), static_cast<size_t>(kRounds));
  for (int k = 1; k < kRanks; ++k) {
    const std::vector<int64_t> mine = starts(aligned, k), unaligned = starts(raw, k);
    ASSERT_EQ(mine.size(), base.size()) << "rank " << k;
    for (size_t i = 0; i < base.size(); ++i) {
      EXPECT_LT(std::abs(mine[i] - base[i]), 50'000'000) << "rank " << k << " round " << i;
      EXPECT_GT(std::abs(unaligned[i] - base[i]), kSkewNs / 2) << "rank " << k << " round " << i;
    }
  }
}

}  // namespace
}  // namespace mc2
