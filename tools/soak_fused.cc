// `mc2 soak`: the fused operators of a step (AllGather+MatMul,
// MatMul+ReduceScatter, MatMul+AllReduce), checked against an exact integer
// product (see soak_cases.h).
#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "reference/reference_reduce.h"
#include "soak_cases.h"

namespace mc2::tools::soak {

namespace {

// Entry `i` of matrix `which` (0 = A, 1 = B) of group rank q: in [-2, 2].
int64_t MatVal(uint64_t s, int q, int which, size_t i) {
  return static_cast<int64_t>(
             Mix(s ^ Mix(static_cast<uint64_t>(q) * 2 + which) ^ (i * 0x9FB21C651E98DF25ull)) % 5) -
         2;
}

// The matrix `which` of rank q (rows x cols), as int64 and in dtype `t`.
std::vector<int64_t> MatInts(uint64_t s, int q, int which, size_t count) {
  std::vector<int64_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = MatVal(s, q, which, i);
  return v;
}

std::vector<unsigned char> Encode(const std::vector<int64_t>& v, DType t) {
  std::vector<unsigned char> out(std::max<size_t>(v.size(), 1) * DTypeSize(t));
  for (size_t i = 0; i < v.size(); ++i) reference::StoreInt(t, v[i], out.data() + i * DTypeSize(t));
  return out;
}

// acc[M x n] += a[M x k] * b[k x n] in exact integers.
void MatAcc(std::vector<int64_t>& acc, const int64_t* a, const int64_t* b, size_t m, size_t k,
            size_t n) {
  for (size_t i = 0; i < m; ++i)
    for (size_t l = 0; l < k; ++l) {
      const int64_t x = a[i * k + l];
      if (x == 0) continue;
      for (size_t j = 0; j < n; ++j) acc[i * n + j] += x * b[l * n + j];
    }
}

}  // namespace

std::string FusedPlan::Describe() const {
  static const char* const kNames[] = {"all_gather_matmul", "matmul_reduce_scatter",
                                       "matmul_all_reduce"};
  auto list = [](const std::vector<size_t>& v) {
    std::string out;
    for (size_t x : v) out += fmt::format("{}{}", out.empty() ? "" : ",", x);
    return out;
  };
  return fmt::format("{} dtype={} pipeline={} splits={} m=[{}] k=[{}] n=[{}]{}",
                     kNames[static_cast<int>(kind)], DTypeName(t), PipelineName(opts.pipeline),
                     opts.splits, list(m), list(k), list(n), gathered ? " gathered_a" : "");
}

FusedPlan PlanFused(std::mt19937_64& rng, int n) {
  FusedPlan p;
  p.kind = static_cast<FusedKind>(rng() % 3);
  p.t = rng() % 2 ? DType::kF32 : DType::kBF16;
  p.opts.pipeline = static_cast<Pipeline>(rng() % kNumPipelines);
  p.opts.splits = 1 + static_cast<int>(rng() % 8);
  p.gathered = rng() % 2;
  p.s = rng();
  auto dim = [&](size_t max) { return rng() % 8 == 0 ? size_t{0} : 1 + rng() % max; };
  p.m.resize(n);
  p.k.resize(n);
  p.n.resize(n);
  switch (p.kind) {
    case FusedKind::kAllGatherMatmul: {  // m and n per rank, k common
      const size_t k = 1 + rng() % 64;
      for (int q = 0; q < n; ++q) p.m[q] = dim(48), p.k[q] = k, p.n[q] = dim(64);
      break;
    }
    case FusedKind::kMatmulReduceScatter: {  // m_local per rank, k per rank, n common
      const size_t nn = dim(64);
      for (int q = 0; q < n; ++q) p.m[q] = dim(32), p.k[q] = dim(64), p.n[q] = nn;
      break;
    }
    case FusedKind::kMatmulAllReduce: {  // M and n common, k per rank
      const size_t mm = dim(64), nn = dim(64);
      for (int q = 0; q < n; ++q) p.m[q] = mm, p.k[q] = dim(64), p.n[q] = nn;
      break;
    }
  }
  return p;
}

// Runs the fused operator of `p` on `g` and returns its wrong elements.
size_t RunFused(const FusedPlan& p, const Group& g, size_t* checked, std::string* what) {
  const int n = g.size(), me = g.rank();
  const size_t e = DTypeSize(p.t);
  std::vector<float> c;
  std::vector<int64_t> expected;
  std::vector<unsigned char> gathered, gathered_expected;
  FusedReport report;
  switch (p.kind) {
    case FusedKind::kAllGatherMatmul: {
      const size_t k = p.k[0], nn = p.n[me];
      size_t M = 0;
      for (int q = 0; q < n; ++q) M += p.m[q];
      const auto a_ints = MatInts(p.s, me, 0, p.m[me] * k);
      const auto b_ints = MatInts(p.s, me, 1, k * nn);
      const auto a = Encode(a_ints, p.t), b = Encode(b_ints, p.t);
      c.assign(std::max<size_t>(M * nn, 1) + 16, -7.0f);
      expected.assign(M * nn, 0);
      std::vector<int64_t> all_a;
      for (int q = 0; q < n; ++q) {
        const auto aq = MatInts(p.s, q, 0, p.m[q] * k);
        all_a.insert(all_a.end(), aq.begin(), aq.end());
      }
      MatAcc(expected, all_a.data(), b_ints.data(), M, k, nn);
      if (p.gathered) {
        gathered.assign(std::max<size_t>(M * k, 1) * e + 64, kSentinel);
        gathered_expected = Encode(all_a, p.t);
        gathered_expected.resize(M * k * e);
      }
      report = AllGatherMatmul(g,
                               {.a = a.data(),
                                .b = b.data(),
                                .c = c.data(),
                                .m = p.m[me],
                                .k = k,
                                .n = nn,
                                .dtype = p.t,
                                .gathered_a = p.gathered ? gathered.data() : nullptr},
                               p.opts);
      break;
    }
    case FusedKind::kMatmulReduceScatter: {
      size_t M = 0, off = 0;
      for (int q = 0; q < n; ++q) {
        if (q < me) off += p.m[q];
        M += p.m[q];
      }
      const size_t nn = p.n[0];
      const auto a = Encode(MatInts(p.s, me, 0, M * p.k[me]), p.t);
      const auto b = Encode(MatInts(p.s, me, 1, p.k[me] * nn), p.t);
      std::vector<int64_t> full(M * nn, 0);
      for (int q = 0; q < n; ++q) {
        const auto aq = MatInts(p.s, q, 0, M * p.k[q]);
        const auto bq = MatInts(p.s, q, 1, p.k[q] * nn);
        MatAcc(full, aq.data(), bq.data(), M, p.k[q], nn);
      }
      expected.assign(full.begin() + off * nn, full.begin() + (off + p.m[me]) * nn);
      c.assign(std::max<size_t>(p.m[me] * nn, 1) + 16, -7.0f);
      report = MatmulReduceScatter(g,
                                   {.a = a.data(),
                                    .b = b.data(),
                                    .c = c.data(),
                                    .m = M,
                                    .k = p.k[me],
                                    .n = nn,
                                    .dtype = p.t,
                                    .m_local = p.m[me]},
                                   p.opts);
      break;
    }
    case FusedKind::kMatmulAllReduce: {
      const size_t M = p.m[0], nn = p.n[0];
      const auto a = Encode(MatInts(p.s, me, 0, M * p.k[me]), p.t);
      const auto b = Encode(MatInts(p.s, me, 1, p.k[me] * nn), p.t);
      expected.assign(M * nn, 0);
      for (int q = 0; q < n; ++q) {
        const auto aq = MatInts(p.s, q, 0, M * p.k[q]);
        const auto bq = MatInts(p.s, q, 1, p.k[q] * nn);
        MatAcc(expected, aq.data(), bq.data(), M, p.k[q], nn);
      }
      c.assign(std::max<size_t>(M * nn, 1) + 16, -7.0f);
      report = MatmulAllReduce(g,
                               {.a = a.data(),
                                .b = b.data(),
                                .c = c.data(),
                                .m = M,
                                .k = p.k[me],
                                .n = nn,
                                .dtype = p.t},
                               p.opts);
      break;
    }
  }
  size_t wrong = 0;
  for (size_t i = 0; i < expected.size(); ++i) wrong += c[i] != static_cast<float>(expected[i]);
  // Nothing past the output (16 floats) and gathered_a exactly the shards.
  for (size_t i = expected.size(); i < c.size(); ++i)
    if (i >= std::max<size_t>(expected.size(), 1)) wrong += c[i] != -7.0f;
  *checked += expected.size();
  if (p.gathered) {
    for (size_t i = 0; i < gathered_expected.size() / e; ++i)
      wrong += !SameElement(p.t, gathered.data() + i * e, gathered_expected.data() + i * e);
    for (size_t i = gathered_expected.size(); i < gathered.size(); ++i)
      wrong += gathered[i] != kSentinel;
    *checked += gathered_expected.size() / e;
  }
  if (p.opts.pipeline != Pipeline::kAuto && report.pipeline != p.opts.pipeline) {
    ++wrong;
    *what = fmt::format("asked for pipeline {} but {} ran", PipelineName(p.opts.pipeline),
                        PipelineName(report.pipeline));
  }
  return wrong;
}

}  // namespace mc2::tools::soak
