// GEMMs on several threads per rank (GemmOptions::threads,
// FusedOptions::gemm_threads): oneDNN calls cut C into row blocks, one
// single-threaded primitive per thread, so the result is bitwise the
// one-thread result. Checked for mc2::Gemm (f32 on oneDNN, bf16 to f32 and
// to bf16, transposes, bias and beta, row counts around the block size),
// and for every pipeline of the three dense operators on 1 rank x 2
// threads and 2 ranks x 2 threads, f32 and bf16, against the serial
// one-thread result; the one-thread results against a double reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <string>
#include <vector>

#include "common/operands.h"
#include "mc2/mc2.h"
#include "ops/gemm.h"
#include "ops/helper_threads.h"

namespace mc2 {
namespace {

using test::Close;
using test::Mat;
using test::Random;
using test::SameBits;

// C = A B (+ bias) in double from the stored values; `ta`: A stored k x m.
std::vector<double> Reference(const Mat& a, const Mat& b, size_t m, size_t n, size_t k, bool ta,
                              const std::vector<float>& bias, std::vector<double>* abs_sum) {
  std::vector<double> c(m * n, 0.0);
  abs_sum->assign(m * n, 0.0);
  for (size_t i = 0; i < m; ++i)
    for (size_t j = 0; j < n; ++j) {
      double s = bias.empty() ? 0.0 : bias[j], as = std::abs(s);
      for (size_t p = 0; p < k; ++p) {
        const double x = (ta ? a.value[p * m + i] : a.value[i * k + p]) * b.value[p * n + j];
        s += x;
        as += std::abs(x);
      }
      c[i * n + j] = s;
      (*abs_sum)[i * n + j] = as;
    }
  return c;
}

struct GemmCase {
  DType ab, c_type;
  size_t m;
  bool trans_a, bias, beta;
};

std::string Name(const GemmCase& c) {
  return std::string(DTypeName(c.ab)) + "->" + DTypeName(c.c_type) + " m=" +
         std::to_string(c.m) + (c.trans_a ? " A^T" : "") + (c.bias ? " bias" : "") +
         (c.beta ? " beta" : "");
}

TEST(GemmThreads, HelperThreadsRunEveryBlockOnceAndRethrowTheFirstError) {
  // Growing and shrinking teams: every block runs once per call, block 0
  // on the caller, the others on threads of their own.
  for (int blocks : {2, 4, 1, 3, 4, 2}) {
    std::vector<int> runs(blocks, 0);
    std::vector<std::thread::id> ids(blocks);
    ops::RunBlocks(blocks, [&](int b) {
      ++runs[b];
      ids[b] = std::this_thread::get_id();
    });
    EXPECT_EQ(runs, std::vector<int>(blocks, 1)) << blocks;
    EXPECT_EQ(ids[0], std::this_thread::get_id());
    for (int b = 1; b < blocks; ++b) EXPECT_NE(ids[b], ids[0]);
  }
  std::vector<int> finished(3, 0);
  EXPECT_THROW(ops::RunBlocks(3,
                              [&](int b) {
                                finished[b] = 1;
                                if (b == 2) throw std::runtime_error("block 2");
                              }),
               std::runtime_error);
  EXPECT_EQ(finished, std::vector<int>(3, 1));  // the others still ran
}

TEST(GemmThreads, RowBlocksOnSeveralThreadsGiveTheOneThreadBits) {
  const size_t n = 40, k = 75;
  std::vector<GemmCase> cases;
  for (size_t m : {1, 15, 16, 33, 97, 256})
    for (DType c_type : {DType::kF32, DType::kBF16}) cases.push_back({DType::kBF16, c_type, m, false, false, false});
  for (size_t m : {1, 31, 32, 100}) cases.push_back({DType::kF32, DType::kF32, m, false, false, false});
  cases.push_back({DType::kF32, DType::kF32, 77, true, true, true});
  cases.push_back({DType::kBF16, DType::kF32, 77, true, true, false});
  cases.push_back({DType::kBF16, DType::kBF16, 64, false, true, true});
  for (const GemmCase& gc : cases) {
    SCOPED_TRACE(Name(gc));
    const size_t m = gc.m;
    Mat a = Random(m * k, gc.ab, 1 + m), b = Random(k * n, gc.ab, 2 + m);
    std::vector<float> bias(gc.bias ? n : 0);
    for (size_t j = 0; j < bias.size(); ++j) bias[j] = 0.25f * static_cast<float>(j % 5);
    const size_t cbytes = m * n * DTypeSize(gc.c_type);
    std::vector<char> c0(cbytes);
    Mat init = Random(m * n, gc.c_type, 3 + m);  // what beta reads
    auto run = [&](int threads) {
      std::vector<char> c = gc.beta ? init.bytes : std::vector<char>(cbytes);
      GemmOptions o;
      o.threads = threads;
      o.trans_a = gc.trans_a;
      o.bias = gc.bias ? bias.data() : nullptr;
      o.beta = gc.beta ? 0.5f : 0.0f;
      o.backend = GemmBackend::kOneDNN;
      Gemm(m, n, k, gc.ab, a.bytes.data(), b.bytes.data(), gc.c_type, c.data(), o);
      return c;
    };
    const std::vector<char> one = run(1);
    for (int threads : {2, 3}) EXPECT_EQ(run(threads), one) << threads << " threads";
    if (gc.c_type != DType::kF32 || gc.beta) continue;
    std::vector<double> abs_sum;
    const std::vector<double> ref = Reference(a, b, m, n, k, gc.trans_a, bias, &abs_sum);
    std::vector<float> got(m * n);
    std::memcpy(got.data(), one.data(), cbytes);
    int bad = 0;
    for (size_t i = 0; i < m * n; ++i) bad += !Close(got[i], ref[i], abs_sum[i]);
    EXPECT_EQ(bad, 0);
  }
}

TEST(GemmThreads, PackedBOnSeveralThreadsGivesTheOneThreadBits) {
  const size_t m = 90, n = 48, k = 64;
  for (DType ab : {DType::kF32, DType::kBF16}) {
    Mat a = Random(m * k, ab, 11), b = Random(k * n, ab, 12);
    GemmOptions o;
    o.backend = GemmBackend::kOneDNN;
    o.threads = 1;
    std::vector<float> plain(m * n), packed(m * n);
    Gemm(m, n, k, ab, a.bytes.data(), b.bytes.data(), DType::kF32, plain.data(), o);
    o.threads = 2;
    ops::PackedGemmB pb(k, n, ab, b.bytes.data(), o);
    pb.Multiply(m, a.bytes.data(), DType::kF32, packed.data());
    EXPECT_TRUE(SameBits(plain, packed)) << DTypeName(ab);
  }
}

// The three dense operators, every pipeline, `threads` GEMM threads per
// rank, against serial on one thread; serial on one thread against double.
void CheckOperators(int ranks, int threads, DType dtype) {
  const size_t k = 48, n = 40;
  const size_t rows[2] = {70, 57};  // per rank (AllGatherMatmul, m_local)
  size_t m_total = 0;
  for (int r = 0; r < ranks; ++r) m_total += rows[r];
  std::vector<FusedOptions> pipelines;
  for (Pipeline p : {Pipeline::kSerial, Pipeline::kChunked, Pipeline::kFused})
    for (int s : {1, 2, 3}) {
      if (p == Pipeline::kSerial && s > 1) continue;
      FusedOptions o;
      o.pipeline = p;
      o.splits = s;
      o.gemm_threads = threads;
      pipelines.push_back(o);
    }
  int mismatches = 0, far = 0, runs = 0;
  std::mutex mu;
  Group::RunInProcess(ranks, [&](Group& g) {
    const int me = g.rank();
    FusedOptions serial1;
    serial1.pipeline = Pipeline::kSerial;
    serial1.gemm_threads = 1;
    int my_mismatch = 0, my_far = 0, my_runs = 0;
    // AllGatherMatmul: shard r holds rows[r] rows.
    {
      std::vector<Mat> shards;
      for (int r = 0; r < ranks; ++r) shards.push_back(Random(rows[r] * k, dtype, 100 + r));
      Mat b = Random(k * n, dtype, 200 + me);
      AllGatherMatmulArgs args{.a = shards[me].bytes.data(), .b = b.bytes.data(), .c = nullptr,
                               .m = rows[me], .k = k, .n = n, .dtype = dtype};
      std::vector<float> ref1(m_total * n);
      args.c = ref1.data();
      AllGatherMatmul(g, args, serial1);
      Mat all;
      for (const Mat& s : shards) all.value.insert(all.value.end(), s.value.begin(), s.value.end());
      std::vector<double> abs_sum;
      auto ref = Reference(all, b, m_total, n, k, false, {}, &abs_sum);
      for (size_t i = 0; i < ref.size(); ++i) my_far += !Close(ref1[i], ref[i], abs_sum[i]);
      for (const FusedOptions& o : pipelines) {
        std::vector<float> c(m_total * n);
        args.c = c.data();
        AllGatherMatmul(g, args, o);
        my_mismatch += !SameBits(c, ref1);
        ++my_runs;
      }
    }
    // MatmulReduceScatter and MatmulAllReduce: A [m_total x k_r], k_r per rank.
    {
      const size_t kr = k - 8 * me;
      Mat a = Random(m_total * kr, dtype, 300 + me), b = Random(kr * n, dtype, 400 + me);
      MatmulReduceScatterArgs rs{.a = a.bytes.data(), .b = b.bytes.data(), .c = nullptr,
                                 .m = m_total, .k = kr, .n = n, .dtype = dtype,
                                 .m_local = rows[me]};
      MatmulAllReduceArgs ar{.a = a.bytes.data(), .b = b.bytes.data(), .c = nullptr,
                             .m = m_total, .k = kr, .n = n, .dtype = dtype};
      std::vector<float> rs1(rows[me] * n), ar1(m_total * n);
      rs.c = rs1.data();
      ar.c = ar1.data();
      MatmulReduceScatter(g, rs, serial1);
      MatmulAllReduce(g, ar, serial1);
      for (const FusedOptions& o : pipelines) {
        std::vector<float> c(rows[me] * n), d(m_total * n);
        rs.c = c.data();
        ar.c = d.data();
        MatmulReduceScatter(g, rs, o);
        MatmulAllReduce(g, ar, o);
        my_mismatch += !SameBits(c, rs1) + !SameBits(d, ar1);
        my_runs += 2;
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    mismatches += my_mismatch;
    far += my_far;
    runs += my_runs;
  });
  EXPECT_EQ(runs, ranks * 3 * static_cast<int>(pipelines.size()));
  EXPECT_EQ(mismatches, 0) << "of " << runs << " operator calls";
  EXPECT_EQ(far, 0);
}

TEST(GemmThreads, OneRankTwoThreadsEveryPipelineF32) { CheckOperators(1, 2, DType::kF32); }
TEST(GemmThreads, OneRankTwoThreadsEveryPipelineBF16) { CheckOperators(1, 2, DType::kBF16); }
TEST(GemmThreads, TwoRanksTwoThreadsEveryPipelineF32) { CheckOperators(2, 2, DType::kF32); }
TEST(GemmThreads, TwoRanksTwoThreadsEveryPipelineBF16) { CheckOperators(2, 2, DType::kBF16); }

}  // namespace
}  // namespace mc2
