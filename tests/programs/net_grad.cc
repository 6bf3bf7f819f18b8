// GradSync's per-bucket choice between the hierarchical and the flat
// all-reduce, run as one job: on one host (`mc2 run -n N`: one level, no
// choice) or across hosts (mpirun on the cluster in a box).
//
//   test_prog_net_grad hosts|one-host   (what the job's ranks span)
//
// Three GradSyncs with the same parameters and gradients (bucket_algorithm
// kAuto, kHierarchical, kFlat) and the reference, one all-reduce per
// tensor, for three steps. Every GradSync's mean must be bitwise the
// reference's (both algorithms follow the canonical reduction order). Each
// rank checks what reductions() reports: across hosts every bucket spans
// levels, kAuto measured both algorithms (agreed: the same numbers on every
// rank) and kHierarchical / kFlat ran what they name; on one host no bucket
// spans levels. Rank 0 prints a line per kAuto bucket; every rank prints
// "rank R: net_grad ok" or the first failure and exits 1.
#include <fmt/format.h>
#include <mc2/mc2.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

int g_failures = 0;

void Fail(int rank, const std::string& what) {
  if (g_failures++ == 0) std::printf("rank %d: FAILED: %s\n", rank, what.c_str());
}

// A gradient value that depends on (rank, step, parameter, element) and has
// a full mantissa, so that a different summation order would show.
float Value(int rank, int step, int param, size_t i) {
  uint64_t x = (uint64_t(rank) << 48) ^ (uint64_t(step) << 40) ^ (uint64_t(param) << 32) ^ i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<float>(static_cast<double>(x >> 11) / double(1ull << 53) - 0.5) * 3.1f;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string where = argc == 2 ? argv[1] : "";
  if (where != "hosts" && where != "one-host") {
    std::fprintf(stderr, "usage: %s hosts|one-host\n", argv[0]);
    return 2;
  }
  try {
    mc2::Group g = mc2::Group::FromEnv();
    const int r = g.rank();
    // Small parameters first (registration order reversed makes the last
    // one the first bucket): a small first bucket and larger ones.
    const std::vector<size_t> counts = {5000, 70000, 300000, 1000, 90000};
    const mc2::BucketAlgorithm policies[] = {mc2::BucketAlgorithm::kAuto,
                                             mc2::BucketAlgorithm::kHierarchical,
                                             mc2::BucketAlgorithm::kFlat};
    std::vector<std::unique_ptr<mc2::GradSync>> syncs;
    for (mc2::BucketAlgorithm p : policies) {
      mc2::GradSyncOptions o;
      o.bucket_cap_bytes = 512 << 10;
      o.first_bucket_cap_bytes = 64 << 10;
      o.bucket_algorithm = p;
      o.rebuild_buckets = false;
      auto s = std::make_unique<mc2::GradSync>(g, o);
      for (size_t i = 0; i < counts.size(); ++i)
        s->Register(fmt::format("p{}", i), counts[i], mc2::DType::kF32);
      s->Finalize();
      syncs.push_back(std::move(s));
    }
    const bool spans = where == "hosts";
    // What each GradSync reports.
    for (size_t k = 0; k < syncs.size(); ++k) {
      const auto red = syncs[k]->reductions();
      if (red.empty()) Fail(r, "no buckets reported");
      for (size_t b = 0; b < red.size(); ++b) {
        const mc2::BucketReduction& x = red[b];
        if (x.spans_levels != spans)
          Fail(r, fmt::format("bucket {} spans_levels {}", b, x.spans_levels));
        if (!spans) {
          if (x.measured || x.algorithm == "hierarchical" || x.algorithm == "flat")
            Fail(r, fmt::format("one host: bucket {} ran {}", b, x.algorithm));
          continue;
        }
        const char* want = k == 1 ? "hierarchical" : k == 2 ? "flat" : nullptr;
        if (want && x.algorithm != want)
          Fail(r, fmt::format("bucket {} ran {}, not {}", b, x.algorithm, want));
        if (k == 0) {
          if (!x.measured || !(x.hierarchical_seconds > 0) || !(x.flat_seconds > 0))
            Fail(r, fmt::format("kAuto did not measure bucket {}", b));
          const char* faster = x.flat_seconds < x.hierarchical_seconds ? "flat" : "hierarchical";
          if (x.algorithm != faster) Fail(r, fmt::format("kAuto chose {}, not {}", x.algorithm, faster));
          // Agreed: every rank holds the same numbers.
          double mine[2] = {x.hierarchical_seconds, x.flat_seconds}, lo[2];
          mc2::AllReduce(g, mine, lo, 2, mc2::DType::kF64, mc2::ReduceOp::kMin).Wait();
          if (lo[0] != mine[0] || lo[1] != mine[1]) Fail(r, "kAuto's times differ across ranks");
          if (r == 0)
            std::printf("bucket %zu: %zu bytes, hierarchical %.3f ms, flat %.3f ms: %s\n", b,
                        x.bytes, x.hierarchical_seconds * 1e3, x.flat_seconds * 1e3,
                        x.algorithm.c_str());
        }
      }
    }
    // Three steps: every GradSync's mean against one all-reduce per tensor.
    for (int step = 0; step < 3; ++step) {
      std::vector<std::vector<float>> ref(counts.size());
      for (size_t i = 0; i < counts.size(); ++i) {
        std::vector<float> mine(counts[i]);
        for (size_t e = 0; e < counts[i]; ++e) mine[e] = Value(r, step, int(i), e);
        ref[i].resize(counts[i]);
        mc2::AllReduce(g, mine.data(), ref[i].data(), counts[i], mc2::DType::kF32,
                       mc2::ReduceOp::kAvg)
            .Wait();
      }
      for (size_t k = 0; k < syncs.size(); ++k) {
        mc2::GradSync& s = *syncs[k];
        s.ZeroGrad();
        for (size_t i = counts.size(); i-- > 0;) {
          float* v = s.GradAs<float>(int(i));
          for (size_t e = 0; e < counts[i]; ++e) v[e] = Value(r, step, int(i), e);
          s.MarkReady(int(i));
        }
        s.Finish();
        for (size_t i = 0; i < counts.size(); ++i)
          if (std::memcmp(s.GradAs<float>(int(i)), ref[i].data(), counts[i] * 4) != 0)
            Fail(r, fmt::format("policy {} step {} parameter {} differs from the per-tensor mean",
                                k, step, i));
      }
    }
    mc2::Barrier(g).Wait();
    if (!g_failures) std::printf("rank %d: net_grad ok\n", r);
    return g_failures ? 1 : 0;
  } catch (const mc2::Error& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
}
