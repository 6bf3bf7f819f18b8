// Fused operators (include/mc2/fused_ops.h): every pipeline and split count gives
// the serial result bit for bit in deterministic mode, for f32 and bf16,
// random (non-divisible) shapes and 1-5 ranks; serial is close to a double
// reference; B stored transposed gives the plain result bit for bit
// (fused_ops_errors_test.cc: bad arguments).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/operands.h"
#include "engine/group_impl.h"
#include "mc2/mc2.h"
#include "transport/link_emulation.h"

namespace mc2 {
namespace {

using test::Close;
using test::Mat;
using test::Random;
using test::SameBits;

constexpr int kSplits[] = {1, 2, 3, 4, 7};

struct Counters {
  std::atomic<int> runs{0}, not_bitwise{0}, not_close{0}, wrong_report{0};
};

std::vector<FusedOptions> AllPipelines() {
  std::vector<FusedOptions> v;
  FusedOptions o;
  o.pipeline = Pipeline::kAuto;
  v.push_back(o);
  for (int s : kSplits) {
    o.splits = s;
    o.pipeline = Pipeline::kChunked;
    v.push_back(o);
    // Fused cuts every block into `splits` chunks, each its own transfer.
    o.pipeline = Pipeline::kFused;
    v.push_back(o);
  }
  return v;
}

class FusedOpsSweep : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(FusedOpsSweep, AllGatherMatmul) {
  auto [size, dtype] = GetParam();
  Counters cnt;
  for (uint64_t trial = 0; trial < 3; ++trial) {
    std::mt19937_64 shape_rng(1000 * size + trial + (dtype == DType::kBF16 ? 77 : 0));
    size_t k = 1 + shape_rng() % 37;
    std::vector<size_t> rows(size), ns(size);
    for (int r = 0; r < size; ++r) {
      rows[r] = (trial == 2 && r == 0) ? 0 : shape_rng() % 11;
      ns[r] = 1 + shape_rng() % 29;
    }
    Group::RunInProcess(size, [&](Group& g) {
      const int me = g.rank();
      size_t M = 0;
      std::vector<size_t> off(size);
      std::vector<Mat> shards;
      for (int r = 0; r < size; ++r) {
        off[r] = M;
        M += rows[r];
        shards.push_back(Random(rows[r] * k, dtype, trial * 100 + r));
      }
      size_t n = ns[me];
      Mat b = Random(k * n, dtype, trial * 100 + 50 + me);
      std::vector<float> serial(M * n);
      std::vector<char> gathered(M * k * DTypeSize(dtype));
      FusedOptions so;
      so.pipeline = Pipeline::kSerial;
      AllGatherMatmul(g,
                      {.a = shards[me].bytes.data(),
                       .b = b.bytes.data(),
                       .c = serial.data(),
                       .m = rows[me],
                       .k = k,
                       .n = n,
                       .dtype = dtype,
                       .gathered_a = gathered.data()},
                      so);
      // Gathered A and the reference.
      for (int r = 0; r < size; ++r) {
        if (!shards[r].bytes.empty() &&
            std::memcmp(gathered.data() + off[r] * k * DTypeSize(dtype), shards[r].bytes.data(),
                        shards[r].bytes.size()) != 0) {
          cnt.not_bitwise++;
        }
        for (size_t i = 0; i < rows[r]; ++i) {
          for (size_t j = 0; j < n; ++j) {
            double ref = 0, abs_sum = 0;
            for (size_t q = 0; q < k; ++q) {
              double p = shards[r].value[i * k + q] * b.value[q * n + j];
              ref += p;
              abs_sum += std::fabs(p);
            }
            if (!Close(serial[(off[r] + i) * n + j], ref, abs_sum)) cnt.not_close++;
          }
        }
      }
      for (const FusedOptions& o : AllPipelines()) {
        std::vector<float> c(M * n, -7.0f);
        std::vector<char> ga(M * k * DTypeSize(dtype));
        FusedReport rep;
        rep = AllGatherMatmul(g,
                              {.a = shards[me].bytes.data(),
                               .b = b.bytes.data(),
                               .c = c.data(),
                               .m = rows[me],
                               .k = k,
                               .n = n,
                               .dtype = dtype,
                               .gathered_a = ga.data()},
                              o);
        cnt.runs++;
        if (o.pipeline != Pipeline::kAuto && rep.pipeline != o.pipeline) cnt.wrong_report++;
        if (!SameBits(c, serial)) cnt.not_bitwise++;
        if (ga != gathered) cnt.not_bitwise++;
      }
      // Without the gathered output too.
      std::vector<float> c(M * n);
      FusedOptions fo;
      fo.pipeline = Pipeline::kFused;
      AllGatherMatmul(g,
                      {.a = shards[me].bytes.data(),
                       .b = b.bytes.data(),
                       .c = c.data(),
                       .m = rows[me],
                       .k = k,
                       .n = n,
                       .dtype = dtype},
                      fo);
      if (!SameBits(c, serial)) cnt.not_bitwise++;
    });
  }
  EXPECT_GT(cnt.runs.load(), 0);
  EXPECT_EQ(cnt.not_bitwise.load(), 0);
  EXPECT_EQ(cnt.not_close.load(), 0);
  EXPECT_EQ(cnt.wrong_report.load(), 0);
}

// Shared by MatmulReduceScatter and MatmulAllReduce: the full reference sum
// over ranks of A_r B_r (M x n) and its |.| sums.
struct Reference {
  std::vector<double> sum, abs_sum;
};

Reference FullReference(const std::vector<Mat>& a, const std::vector<Mat>& b,
                        const std::vector<size_t>& ks, size_t M, size_t n) {
  Reference ref;
  ref.sum.assign(M * n, 0);
  ref.abs_sum.assign(M * n, 0);
  for (size_t r = 0; r < a.size(); ++r) {
    for (size_t i = 0; i < M; ++i) {
      for (size_t j = 0; j < n; ++j) {
        double s = 0, as = 0;
        for (size_t q = 0; q < ks[r]; ++q) {
          double p = a[r].value[i * ks[r] + q] * b[r].value[q * n + j];
          s += p;
          as += std::fabs(p);
        }
        ref.sum[i * n + j] += s;
        ref.abs_sum[i * n + j] += as;
      }
    }
  }
  return ref;
}

TEST_P(FusedOpsSweep, MatmulReduceScatterAndAllReduce) {
  auto [size, dtype] = GetParam();
  Counters cnt;
  for (uint64_t trial = 0; trial < 3; ++trial) {
    std::mt19937_64 shape_rng(2000 * size + trial + (dtype == DType::kBF16 ? 77 : 0));
    size_t n = 1 + shape_rng() % 31;
    std::vector<size_t> rows(size), ks(size);
    size_t M = 0;
    for (int r = 0; r < size; ++r) {
      rows[r] = (trial == 1 && r == size - 1) ? 0 : shape_rng() % 13;
      ks[r] = 1 + shape_rng() % 41;
      M += rows[r];
    }
    Group::RunInProcess(size, [&](Group& g) {
      const int me = g.rank();
      std::vector<Mat> a, b;
      for (int r = 0; r < size; ++r) {
        a.push_back(Random(M * ks[r], dtype, trial * 100 + r));
        b.push_back(Random(ks[r] * n, dtype, trial * 100 + 50 + r));
      }
      Reference ref = FullReference(a, b, ks, M, n);
      size_t off = 0;
      for (int r = 0; r < me; ++r) off += rows[r];
      // Reduce-scatter.
      std::vector<float> rs_serial(rows[me] * n);
      FusedOptions so;
      so.pipeline = Pipeline::kSerial;
      MatmulReduceScatter(g,
                          {.a = a[me].bytes.data(),
                           .b = b[me].bytes.data(),
                           .c = rs_serial.data(),
                           .m = M,
                           .k = ks[me],
                           .n = n,
                           .dtype = dtype,
                           .m_local = rows[me]},
                          so);
      for (size_t i = 0; i < rows[me] * n; ++i) {
        if (!Close(rs_serial[i], ref.sum[off * n + i], ref.abs_sum[off * n + i])) cnt.not_close++;
      }
      // All-reduce.
      std::vector<float> ar_serial(M * n);
      MatmulAllReduce(g,
                      {.a = a[me].bytes.data(),
                       .b = b[me].bytes.data(),
                       .c = ar_serial.data(),
                       .m = M,
                       .k = ks[me],
                       .n = n,
                       .dtype = dtype},
                      so);
      for (size_t i = 0; i < M * n; ++i) {
        if (!Close(ar_serial[i], ref.sum[i], ref.abs_sum[i])) cnt.not_close++;
      }
      for (const FusedOptions& o : AllPipelines()) {
        std::vector<float> c(rows[me] * n, -7.0f);
        FusedReport rep;
        rep = MatmulReduceScatter(g,
                                  {.a = a[me].bytes.data(),
                                   .b = b[me].bytes.data(),
                                   .c = c.data(),
                                   .m = M,
                                   .k = ks[me],
                                   .n = n,
                                   .dtype = dtype,
                                   .m_local = rows[me]},
                                  o);
        if (o.pipeline != Pipeline::kAuto && rep.pipeline != o.pipeline) cnt.wrong_report++;
        if (!SameBits(c, rs_serial)) cnt.not_bitwise++;
        std::vector<float> d(M * n, -7.0f);
        MatmulAllReduce(g,
                        {.a = a[me].bytes.data(),
                         .b = b[me].bytes.data(),
                         .c = d.data(),
                         .m = M,
                         .k = ks[me],
                         .n = n,
                         .dtype = dtype},
                        o);
        if (!SameBits(d, ar_serial)) cnt.not_bitwise++;
        cnt.runs++;
      }
    });
  }
  EXPECT_GT(cnt.runs.load(), 0);
  EXPECT_EQ(cnt.not_bitwise.load(), 0);
  EXPECT_EQ(cnt.not_close.load(), 0);
  EXPECT_EQ(cnt.wrong_report.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(RanksDtypes, FusedOpsSweep,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                  DTypeName(std::get<1>(info.param));
                         });

// Larger shapes, where the GEMM kernels block rows and K: still bitwise.
TEST(FusedOps, LargerShapesBitwise) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Counters cnt;
    Group::RunInProcess(3, [&](Group& g) {
      const size_t M = 301, k = 129, n = 67;
      Mat a = Random(M * k, dtype, 5 + g.rank());
      Mat b = Random(k * n, dtype, 9 + g.rank());
      std::vector<float> serial(M * n), c(M * n);
      FusedOptions o;
      o.pipeline = Pipeline::kSerial;
      MatmulAllReduce(g,
                      {.a = a.bytes.data(),
                       .b = b.bytes.data(),
                       .c = serial.data(),
                       .m = M,
                       .k = k,
                       .n = n,
                       .dtype = dtype},
                      o);
      for (const FusedOptions& p : AllPipelines()) {
        MatmulAllReduce(g,
                        {.a = a.bytes.data(),
                         .b = b.bytes.data(),
                         .c = c.data(),
                         .m = M,
                         .k = k,
                         .n = n,
                         .dtype = dtype},
                        p);
        if (c != serial) cnt.not_bitwise++;
      }
      // AllGatherMatmul with 100 rows per rank.
      std::vector<float> ag_serial(300 * n), ag(300 * n);
      AllGatherMatmul(g,
                      {.a = a.bytes.data(),
                       .b = b.bytes.data(),
                       .c = ag_serial.data(),
                       .m = 100,
                       .k = k,
                       .n = n,
                       .dtype = dtype},
                      o);
      for (const FusedOptions& p : AllPipelines()) {
        AllGatherMatmul(g,
                        {.a = a.bytes.data(),
                         .b = b.bytes.data(),
                         .c = ag.data(),
                         .m = 100,
                         .k = k,
                         .n = n,
                         .dtype = dtype},
                        p);
        if (ag != ag_serial) cnt.not_bitwise++;
      }
    });
    EXPECT_EQ(cnt.not_bitwise.load(), 0) << DTypeName(dtype);
  }
}

// B stored transposed (args.trans_b: B^T, [n x k]) gives bitwise the result
// of B stored plain, for every operator, pipeline and split count, f32 and
// bf16, with shapes large enough for the blocked kernels; ranks' k differ
// in the reduce-scatter and all-reduce (each its own B^T), and one rank
// keeps B plain (trans_b is a rank's own layout).
TEST(FusedOps, TransposedBEqualsPlainBitwise) {
  // B^T of the k x n matrix `b` (elements of `esize` bytes).
  auto transposed = [](const Mat& b, size_t k, size_t n, size_t esize) {
    std::vector<char> t(b.bytes.size());
    for (size_t i = 0; i < k; ++i)
      for (size_t j = 0; j < n; ++j)
        std::memcpy(&t[(j * k + i) * esize], &b.bytes[(i * n + j) * esize], esize);
    return t;
  };
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Counters cnt;
    Group::RunInProcess(3, [&](Group& g) {
      const int me = g.rank();
      const size_t es = DTypeSize(dtype), M = 301, m = 100, n = 67;
      const size_t k = 129 + 16 * static_cast<size_t>(me);  // this rank's slice
      const bool trans = me != 1;
      Mat a = Random(M * k, dtype, 5 + me);
      Mat b = Random(k * n, dtype, 9 + me);
      const std::vector<char> bt = transposed(b, k, n, es);
      const void* bb = trans ? static_cast<const void*>(bt.data()) : b.bytes.data();
      FusedOptions serial;
      serial.pipeline = Pipeline::kSerial;
      const size_t m_local = me == 2 ? M - 2 * m : m, m_ag = me == 2 ? m + 1 : m;
      std::vector<float> ar_ref(M * n), rs_ref(m_local * n), ag_ref(M * n);
      MatmulAllReduce(g, {.a = a.bytes.data(), .b = b.bytes.data(), .c = ar_ref.data(), .m = M,
                          .k = k, .n = n, .dtype = dtype}, serial);
      MatmulReduceScatter(g, {.a = a.bytes.data(), .b = b.bytes.data(), .c = rs_ref.data(),
                              .m = M, .k = k, .n = n, .dtype = dtype,
                              .m_local = m_local}, serial);
      // (AllGatherMatmul: every rank's k must agree; n is its own.)
      const size_t kg = 129;
      Mat bg = Random(kg * n, dtype, 20 + me);
      const std::vector<char> bgt = transposed(bg, kg, n, es);
      const void* bgb = trans ? static_cast<const void*>(bgt.data()) : bg.bytes.data();
      AllGatherMatmul(g, {.a = a.bytes.data(), .b = bg.bytes.data(), .c = ag_ref.data(),
                          .m = m_ag, .k = kg, .n = n, .dtype = dtype}, serial);
      std::vector<FusedOptions> ways = AllPipelines();
      ways.push_back(serial);
      for (const FusedOptions& o : ways) {
        std::vector<float> ar(M * n, -7.0f), rs(m_local * n, -7.0f), ag(M * n, -7.0f);
        MatmulAllReduce(g, {.a = a.bytes.data(), .b = bb, .c = ar.data(), .m = M, .k = k,
                            .n = n, .dtype = dtype, .trans_b = trans}, o);
        MatmulReduceScatter(g, {.a = a.bytes.data(), .b = bb, .c = rs.data(), .m = M, .k = k,
                                .n = n, .dtype = dtype, .m_local = m_local, .trans_b = trans},
                            o);
        AllGatherMatmul(g, {.a = a.bytes.data(), .b = bgb, .c = ag.data(), .m = m_ag, .k = kg,
                            .n = n, .dtype = dtype, .trans_b = trans}, o);
        if (!SameBits(ar, ar_ref) || !SameBits(rs, rs_ref) || !SameBits(ag, ag_ref))
          cnt.not_bitwise++;
        cnt.runs++;
      }
    });
    EXPECT_GT(cnt.runs.load(), 0);
    EXPECT_EQ(cnt.not_bitwise.load(), 0) << DTypeName(dtype);
  }
}

// Under link emulation the fused pipeline's transfers go through the
// rank's egress port: exactly the bytes the pipeline hands to its peers are
// posted (the shape exchange and the workspace set-up declare none), no
// call finishes before its port could have carried them, and the results
// stay bitwise equal to serial.
TEST(FusedOps, EmulatedLinkPacesFusedTransfers) {
  WorldOptions wo;
  wo.link = "bw=100MB/s,lat=20us";
  Counters cnt;
  std::atomic<int> wrong_bytes{0}, too_fast{0};
  Group::RunInProcess(3, [&](Group& g) {
    const int me = g.rank();
    const size_t rows[3] = {40, 0, 57};
    const size_t k = 512, n = 64, M = 97;
    transport::LinkModel* port = internal::Access::Impl(g)->tx().link();
    ASSERT_NE(port, nullptr);
    // Every call starts with the argument exchange, an all-gather of an
    // 88-byte message (ShapeMsg, fused_ops.cc): to each of the 2 peers.
    const uint64_t args = 2 * 88;
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const size_t es = DTypeSize(dtype);
      Mat a = Random(rows[me] * k, dtype, 70 + me), b = Random(k * n, dtype, 80 + me);
      FusedOptions so, fo;
      so.pipeline = Pipeline::kSerial;
      fo.pipeline = Pipeline::kFused;
      fo.splits = 3;
      std::vector<float> serial(M * n), c(M * n);
      std::vector<char> ga(M * k * es);
      AllGatherMatmul(g,
                      {.a = a.bytes.data(),
                       .b = b.bytes.data(),
                       .c = serial.data(),
                       .m = rows[me],
                       .k = k,
                       .n = n,
                       .dtype = dtype},
                      so);
      // AllGatherMatmul: our shard to each of the 2 peers.
      uint64_t before = port->bytes_posted();
      auto t0 = std::chrono::steady_clock::now();
      AllGatherMatmul(g,
                      {.a = a.bytes.data(),
                       .b = b.bytes.data(),
                       .c = c.data(),
                       .m = rows[me],
                       .k = k,
                       .n = n,
                       .dtype = dtype,
                       .gathered_a = ga.data()},
                      fo);
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (port->bytes_posted() - before != args + 2 * rows[me] * k * es) wrong_bytes++;
      // Every rank waits for the largest shard (57 rows) crossing one port.
      if (secs < 0.95 * (2 * 57 * k * es) / 100e6) too_fast++;
      if (!SameBits(c, serial)) cnt.not_bitwise++;
      // MatmulReduceScatter: our partial of every other block, f32.
      Mat ar = Random(M * k, dtype, 90 + me);
      std::vector<float> rs_serial(rows[me] * n), rs(rows[me] * n);
      MatmulReduceScatter(g,
                          {.a = ar.bytes.data(),
                           .b = b.bytes.data(),
                           .c = rs_serial.data(),
                           .m = M,
                           .k = k,
                           .n = n,
                           .dtype = dtype,
                           .m_local = rows[me]},
                          so);
      before = port->bytes_posted();
      MatmulReduceScatter(g,
                          {.a = ar.bytes.data(),
                           .b = b.bytes.data(),
                           .c = rs.data(),
                           .m = M,
                           .k = k,
                           .n = n,
                           .dtype = dtype,
                           .m_local = rows[me]},
                          fo);
      if (port->bytes_posted() - before != args + (M - rows[me]) * n * 4) wrong_bytes++;
      if (!SameBits(rs, rs_serial)) cnt.not_bitwise++;
      // MatmulAllReduce: the partials, then our reduced block to 2 peers
      // (blocks of M/3 rows: 32, 32, 33).
      const size_t mine = M * (me + 1) / 3 - M * me / 3;
      std::vector<float> d_serial(M * n), d(M * n);
      MatmulAllReduce(g,
                      {.a = ar.bytes.data(),
                       .b = b.bytes.data(),
                       .c = d_serial.data(),
                       .m = M,
                       .k = k,
                       .n = n,
                       .dtype = dtype},
                      so);
      before = port->bytes_posted();
      MatmulAllReduce(g,
                      {.a = ar.bytes.data(),
                       .b = b.bytes.data(),
                       .c = d.data(),
                       .m = M,
                       .k = k,
                       .n = n,
                       .dtype = dtype},
                      fo);
      if (port->bytes_posted() - before != args + ((M - mine) + 2 * mine) * n * 4) wrong_bytes++;
      if (!SameBits(d, d_serial)) cnt.not_bitwise++;
      cnt.runs++;
    }
  }, wo);
  EXPECT_EQ(cnt.runs.load(), 6);
  EXPECT_EQ(cnt.not_bitwise.load(), 0);
  EXPECT_EQ(wrong_bytes.load(), 0);
  EXPECT_EQ(too_fast.load(), 0);
}

// FusedOptions::overlap_work runs exactly once and leaves the result
// bitwise unchanged. Over a slow emulated link (every chunk takes ~30 ms,
// the GEMMs well under that), chunked and fused run it while they wait for
// a transfer: the peer, which needs this rank's data still on the link,
// cannot have finished the call yet. That holds only while the ranks keep
// within a transfer of each other: a rank that falls further behind finds
// the peer's data landed, never waits, and runs the work at the end (as it
// should), by when the peer, which need not wait for its own sends to
// land, may be done. So each call starts after a barrier, and the GEMM
// shapes are warmed first (below). Serial runs it after the
// communication: the result is already complete inside it. (The chunked
// and fused check looks at the peer's call counter, not at the output,
// which the progress thread may be writing at that moment.)
TEST(FusedOps, OverlapWorkRunsOnceWhileTheOperatorWaits) {
  WorldOptions wo;
  wo.link = "bw=1MB/s,lat=20us";
  std::atomic<int> wrong_count{0}, not_bitwise{0}, serial_incomplete{0}, not_overlapped{0};
  std::atomic<int> finished[2] = {0, 0};  // calls each rank has returned from
  Group::RunInProcess(2, [&](Group& g) {
    const int me = g.rank();
    const size_t M = 256, k = 256, n = 512, rows = 128;
    Mat a = Random(M * k, DType::kF32, 5 + me), b = Random(k * n, DType::kF32, 9 + me);
    Mat shard = Random(rows * k, DType::kF32, 13 + me);
    std::vector<float> rs_ref(rows * n), ag_ref(M * n);
    FusedOptions so;
    so.pipeline = Pipeline::kSerial;
    MatmulReduceScatter(g,
                        {.a = a.bytes.data(),
                         .b = b.bytes.data(),
                         .c = rs_ref.data(),
                         .m = M,
                         .k = k,
                         .n = n,
                         .dtype = DType::kF32,
                         .m_local = rows},
                        so);
    AllGatherMatmul(g,
                    {.a = shard.bytes.data(),
                     .b = b.bytes.data(),
                     .c = ag_ref.data(),
                     .m = rows,
                     .k = k,
                     .n = n,
                     .dtype = DType::kF32},
                    so);
    // Every GEMM shape the pipelines use, once before the checked calls:
    // a shape's first use builds its kernel, which under ThreadSanitizer
    // can take longer than the whole transfer, so the rank that builds it
    // finds its peer's data landed and never waits.
    for (Pipeline pl : {Pipeline::kChunked, Pipeline::kFused}) {
      FusedOptions wo4;
      wo4.pipeline = pl;
      wo4.splits = 4;
      std::vector<float> rs(rows * n), ag(M * n);
      MatmulReduceScatter(g,
                          {.a = a.bytes.data(),
                           .b = b.bytes.data(),
                           .c = rs.data(),
                           .m = M,
                           .k = k,
                           .n = n,
                           .dtype = DType::kF32,
                           .m_local = rows},
                          wo4);
      AllGatherMatmul(g,
                      {.a = shard.bytes.data(),
                       .b = b.bytes.data(),
                       .c = ag.data(),
                       .m = rows,
                       .k = k,
                       .n = n,
                       .dtype = DType::kF32},
                      wo4);
    }
    int call = 0;
    for (Pipeline pl : {Pipeline::kSerial, Pipeline::kChunked, Pipeline::kFused}) {
      for (int op = 0; op < 2; ++op, ++call) {
        std::vector<float> c(op == 0 ? rows * n : M * n);
        const std::vector<float>& ref = op == 0 ? rs_ref : ag_ref;
        int calls = 0;
        FusedOptions o;
        o.pipeline = pl;
        o.splits = 4;
        o.overlap_work = [&] {
          ++calls;
          if (pl == Pipeline::kSerial) {
            if (!SameBits(c, ref)) serial_incomplete++;
          } else if (finished[1 - me].load() > call) {
            not_overlapped++;
          }
        };
        Barrier(g).Wait();
        if (op == 0) {
          MatmulReduceScatter(g,
                              {.a = a.bytes.data(),
                               .b = b.bytes.data(),
                               .c = c.data(),
                               .m = M,
                               .k = k,
                               .n = n,
                               .dtype = DType::kF32,
                               .m_local = rows},
                              o);
        } else {
          AllGatherMatmul(g,
                          {.a = shard.bytes.data(),
                           .b = b.bytes.data(),
                           .c = c.data(),
                           .m = rows,
                           .k = k,
                           .n = n,
                           .dtype = DType::kF32},
                          o);
        }
        finished[me]++;
        if (!SameBits(c, ref)) not_bitwise++;
        if (calls != 1) wrong_count++;
      }
    }
  }, wo);
  EXPECT_EQ(wrong_count.load(), 0);
  EXPECT_EQ(not_bitwise.load(), 0);
  EXPECT_EQ(serial_incomplete.load(), 0);
  EXPECT_EQ(not_overlapped.load(), 0);
}

// One group, many calls: the workspace grows (and is reused) across
// operators, shapes and pipelines, and every result stays exact.
TEST(FusedOps, WorkspaceGrowsAndIsReusedAcrossCalls) {
  Counters cnt;
  WorldOptions wo;
  wo.heap_bytes = size_t{32} << 20;
  Group::RunInProcess(4, [&](Group& g) {
    const int me = g.rank();
    for (size_t M : {5, 300, 17, 1200, 64, 2000, 3}) {
      const size_t k = 33, n = 70;
      Mat a = Random(M * k, DType::kF32, M + me), b = Random(k * n, DType::kF32, 7 * M + me);
      const size_t rows = M * (me + 1) / 4 - M * me / 4;
      FusedOptions so, fo, co;
      so.pipeline = Pipeline::kSerial;
      fo.pipeline = Pipeline::kFused;
      fo.splits = 1 + M % 5;
      co.pipeline = Pipeline::kChunked;
      co.splits = 2;
      std::vector<float> want(M * n), got(M * n);
      MatmulAllReduce(g,
                      {.a = a.bytes.data(),
                       .b = b.bytes.data(),
                       .c = want.data(),
                       .m = M,
                       .k = k,
                       .n = n,
                       .dtype = DType::kF32},
                      so);
      for (const FusedOptions& o : {fo, co, fo}) {
        MatmulAllReduce(g,
                        {.a = a.bytes.data(),
                         .b = b.bytes.data(),
                         .c = got.data(),
                         .m = M,
                         .k = k,
                         .n = n,
                         .dtype = DType::kF32},
                        o);
        if (!SameBits(got, want)) cnt.not_bitwise++;
      }
      std::vector<float> rs_want(rows * n), rs(rows * n);
      MatmulReduceScatter(g,
                          {.a = a.bytes.data(),
                           .b = b.bytes.data(),
                           .c = rs_want.data(),
                           .m = M,
                           .k = k,
                           .n = n,
                           .dtype = DType::kF32,
                           .m_local = rows},
                          so);
      MatmulReduceScatter(g,
                          {.a = a.bytes.data(),
                           .b = b.bytes.data(),
                           .c = rs.data(),
                           .m = M,
                           .k = k,
                           .n = n,
                           .dtype = DType::kF32,
                           .m_local = rows},
                          fo);
      if (!SameBits(rs, rs_want)) cnt.not_bitwise++;
      std::vector<float> ag_want(M * n), ag(M * n);
      AllGatherMatmul(g,
                      {.a = a.bytes.data(),
                       .b = b.bytes.data(),
                       .c = ag_want.data(),
                       .m = rows,
                       .k = k,
                       .n = n,
                       .dtype = DType::kF32},
                      so);
      AllGatherMatmul(g,
                      {.a = a.bytes.data(),
                       .b = b.bytes.data(),
                       .c = ag.data(),
                       .m = rows,
                       .k = k,
                       .n = n,
                       .dtype = DType::kF32},
                      fo);
      if (!SameBits(ag, ag_want)) cnt.not_bitwise++;
      cnt.runs++;
    }
  }, wo);
  EXPECT_EQ(cnt.runs.load(), 4 * 7);
  EXPECT_EQ(cnt.not_bitwise.load(), 0);
}

}  // namespace
}  // namespace mc2
