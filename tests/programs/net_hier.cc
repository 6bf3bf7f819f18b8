// The flat and hierarchical collectives of groups that span hosts, each
// against the other and against a reference computed here, run as one job
// under mpirun on the cluster in a box (tests/cluster/net_check.sh).
//
//   test_prog_net_hier LAYOUT [table]
//   LAYOUT: what the job's hosts look like:
//     aligned    every host a contiguous power-of-two block (2x2)
//     single     one rank per host (4x1)
//     unaligned  neither (hosts of 2 and 1 ranks, or ranks dealt round
//                robin over the hosts)
//   table: MC2_TUNING_FILE names a table whose entries across hosts choose
//     flat for all_gather and hierarchical for all_to_all (2 hosts of 2
//     ranks): the defaults must follow it (an all_to_allv's choice ignores
//     the table: its counts are known only to their rank).
//
// For all_gather(v), reduce_scatter(v), all_to_all(v) and broadcast, with
// uneven and zero counts: the hierarchical and the flat algorithm
// (CollectiveOptions::algorithm kHierarchical / kDirect) and the default.
// Integer results are checked exactly against the reference; f32
// reductions against a double-precision reference, and the hierarchical
// one bitwise against the flat one (which is the one-host result) where the
// layout is aligned. The Work must report the algorithm that ran: the one
// asked for (a hierarchical reduce_scatter falls back to flat unless
// aligned), and by default the one docs/multi-host.md states.
// Prints "rank R: ok" or the failures, and exits 1 on any.
#include <mc2/mc2.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace {

using mc2::Algorithm;

int g_failures = 0;
std::string g_layout;
bool g_table = false;

void Check(const std::string& name, bool ok, const std::string& detail) {
  if (!ok) {
    ++g_failures;
    std::fprintf(stderr, "FAILED %s: %s\n", name.c_str(), detail.c_str());
  }
}

int32_t IntInput(int rank, int kase, size_t i) {
  return static_cast<int32_t>((rank + 1) * 1000003 + kase * 7919 + static_cast<int64_t>(i) * 31);
}
float FloatInput(int rank, int kase, size_t i) {
  double x = std::sin(0.37 * static_cast<double>(i) + 1.7 * rank + 0.11 * kase);
  const int e = static_cast<int>((static_cast<size_t>(rank) * 3 + i) % 7) - 3;
  return static_cast<float>(x * std::pow(10.0, e));
}

const char* Name(Algorithm a) {
  return a == Algorithm::kHierarchical ? "hierarchical" : a == Algorithm::kDirect ? "flat" : "auto";
}

// What the Work must report. `hier_default`: the default for this layout.
void CheckAlgo(const std::string& name, const mc2::Work& w, Algorithm a, bool hier_possible,
               bool hier_default) {
  std::string want = a == Algorithm::kDirect ? "flat"
                     : a == Algorithm::kHierarchical ? (hier_possible ? "hierarchical" : "flat")
                                                     : (hier_default ? "hierarchical" : "flat");
  Check(name + " algorithm", w.algorithm() == want,
        "reported '" + w.algorithm() + "', expected '" + want + "'");
}

std::vector<size_t> Packed(const std::vector<size_t>& counts) {
  std::vector<size_t> d(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

// Per-rank counts of a case: uniform, uneven with zeros, or all zero.
std::vector<size_t> Counts(int n, int shape, size_t base) {
  std::vector<size_t> c(n);
  for (int p = 0; p < n; ++p)
    c[p] = shape == 0 ? base : shape == 1 ? (p % 3 == 1 ? 0 : base + 13 * p) : 0;
  return c;
}

void AllGatherCases(const mc2::Group& g, bool several) {
  const int n = g.size(), r = g.rank();
  for (int shape = 0; shape < 3; ++shape)
    for (size_t base : {size_t{5}, size_t{70001}}) {
      const std::vector<size_t> counts = Counts(n, shape, base), displs = Packed(counts);
      const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
      const int kase = 10 + shape;
      std::vector<int32_t> want(total), mine(counts[r]);
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < counts[p]; ++i) want[displs[p] + i] = IntInput(p, kase, i);
      for (size_t i = 0; i < counts[r]; ++i) mine[i] = IntInput(r, kase, i);
      for (Algorithm a : {Algorithm::kHierarchical, Algorithm::kDirect, Algorithm::kAuto})
        for (int in_place = 0; in_place < 2; ++in_place) {
          const std::string name = std::string("all_gatherv ") + Name(a) + " shape " +
                                   std::to_string(shape) + " base " + std::to_string(base) +
                                   (in_place ? " in place" : "");
          std::vector<int32_t> got(total, -1);
          const void* src = mine.data();
          if (in_place) {
            std::memcpy(got.data() + displs[r], mine.data(), counts[r] * 4);
            src = got.data() + displs[r];
          }
          mc2::Work w = shape == 0 ? mc2::AllGather(g, src, got.data(), base, mc2::DType::kI32,
                                                    {.algorithm = a})
                                   : mc2::AllGatherV(g, src, got.data(), counts, displs,
                                                     mc2::DType::kI32, {.algorithm = a});
          w.Wait();
          Check(name, got == want, "wrong blocks");
          CheckAlgo(name, w, a, true, several && !g_table);
        }
    }
}

void ReduceScatterCases(const mc2::Group& g, bool aligned, bool several) {
  const int n = g.size(), r = g.rank();
  for (int shape = 0; shape < 3; ++shape)
    for (size_t base : {size_t{3}, size_t{40003}}) {
      const std::vector<size_t> counts = Counts(n, shape, base), displs = Packed(counts);
      const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
      const int kase = 20 + shape;
      const std::string tag = " shape " + std::to_string(shape) + " base " + std::to_string(base);
      // i32 sum: exact.
      std::vector<int32_t> iin(total);
      for (size_t i = 0; i < total; ++i) iin[i] = IntInput(r, kase, i);
      std::vector<int32_t> iwant(counts[r]);
      for (size_t i = 0; i < counts[r]; ++i) {
        uint32_t s = 0;  // integers wrap
        for (int p = 0; p < n; ++p) s += static_cast<uint32_t>(IntInput(p, kase, displs[r] + i));
        iwant[i] = static_cast<int32_t>(s);
      }
      // f32 sum and average against double precision.
      std::vector<float> fin(total);
      for (size_t i = 0; i < total; ++i) fin[i] = FloatInput(r, kase, i);
      std::vector<float> flat_sum, flat_avg;
      for (Algorithm a : {Algorithm::kDirect, Algorithm::kHierarchical, Algorithm::kAuto}) {
        const std::string name = std::string("reduce_scatterv ") + Name(a) + tag;
        mc2::CollectiveOptions o{.algorithm = a};
        std::vector<int32_t> igot(counts[r], -1);
        mc2::Work w = shape == 0 ? mc2::ReduceScatter(g, iin.data(), igot.data(), base,
                                                      mc2::DType::kI32, mc2::ReduceOp::kSum, o)
                                 : mc2::ReduceScatterV(g, iin.data(), igot.data(), counts,
                                                       mc2::DType::kI32, mc2::ReduceOp::kSum, o);
        w.Wait();
        Check(name + " i32", igot == iwant, "wrong sum");
        CheckAlgo(name, w, a, aligned, aligned && several);
        // In place: the output is this rank's block of the input.
        std::vector<int32_t> ip = iin;
        mc2::ReduceScatterV(g, ip.data(), ip.data() + displs[r], counts, mc2::DType::kI32,
                            mc2::ReduceOp::kSum, o)
            .Wait();
        Check(name + " i32 in place",
              std::equal(iwant.begin(), iwant.end(), ip.begin() + displs[r]), "wrong sum");
        for (mc2::ReduceOp op : {mc2::ReduceOp::kSum, mc2::ReduceOp::kAvg}) {
          std::vector<float> fgot(counts[r], NAN);
          mc2::ReduceScatterV(g, fin.data(), fgot.data(), counts, mc2::DType::kF32, op, o).Wait();
          bool close = true;
          for (size_t i = 0; i < counts[r] && close; ++i) {
            double s = 0, mag = 0;
            for (int p = 0; p < n; ++p) {
              double v = FloatInput(p, kase, displs[r] + i);
              s += v;
              mag += std::fabs(v);
            }
            if (op == mc2::ReduceOp::kAvg) s /= n, mag /= n;
            close = std::fabs(fgot[i] - s) <= 1e-6 * mag + 1e-30;
          }
          const std::string fname = name + (op == mc2::ReduceOp::kSum ? " f32 sum" : " f32 avg");
          Check(fname, close, "far from the double-precision reference");
          std::vector<float>& flat = op == mc2::ReduceOp::kSum ? flat_sum : flat_avg;
          if (a == Algorithm::kDirect) {
            flat = fgot;
          } else if (aligned) {
            Check(fname + " bitwise", std::memcmp(flat.data(), fgot.data(), flat.size() * 4) == 0,
                  "differs from the flat algorithm's bits");
          }
        }
      }
    }
}

void AllToAllCases(const mc2::Group& g) {
  const int n = g.size(), r = g.rank();
  // send_counts(s, p): what rank s sends to rank p.
  for (int shape = 0; shape < 3; ++shape)
    for (size_t base : {size_t{4}, size_t{30011}}) {
      auto count = [&](int s, int p) -> size_t {
        if (shape == 0) return base;
        if (shape == 2) return 0;
        return (s + 2 * p) % 4 == 1 ? 0 : base + 7 * s + 3 * p;
      };
      std::vector<size_t> sc(n), rc(n);
      for (int p = 0; p < n; ++p) sc[p] = count(r, p), rc[p] = count(p, r);
      const std::vector<size_t> sd = Packed(sc), rd = Packed(rc);
      const int kase = 30 + shape;
      std::vector<int32_t> in(sd[n - 1] + sc[n - 1]), want(rd[n - 1] + rc[n - 1]);
      // Element i of rank s's block for p.
      auto val = [&](int s, int p, size_t i) { return IntInput(s, kase, p * 100003 + i); };
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < sc[p]; ++i) in[sd[p] + i] = val(r, p, i);
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < rc[p]; ++i) want[rd[p] + i] = val(p, r, i);
      for (Algorithm a : {Algorithm::kHierarchical, Algorithm::kDirect, Algorithm::kAuto}) {
        const std::string name = std::string("all_to_allv ") + Name(a) + " shape " +
                                 std::to_string(shape) + " base " + std::to_string(base);
        mc2::CollectiveOptions o{.algorithm = a};
        std::vector<int32_t> got(want.size(), -1);
        mc2::Work w = shape == 0 ? mc2::AllToAll(g, in.data(), got.data(), base,
                                                 mc2::DType::kI32, o)
                                 : mc2::AllToAllV(g, in.data(), sc, sd, got.data(), rc, rd,
                                                  mc2::DType::kI32, o);
        w.Wait();
        Check(name, got == want, "wrong blocks");
        CheckAlgo(name, w, a, true, g_table && shape == 0);
        if (shape == 0) {
          std::vector<int32_t> ip = in;
          mc2::AllToAll(g, ip.data(), ip.data(), base, mc2::DType::kI32, o).Wait();
          Check(name + " in place", ip == want, "wrong blocks");
        }
      }
    }
}

void BroadcastCases(const mc2::Group& g) {
  const int n = g.size(), r = g.rank();
  for (int root : {0, n - 1})
    for (size_t count : {size_t{0}, size_t{9}, size_t{50021}})
      for (Algorithm a : {Algorithm::kHierarchical, Algorithm::kDirect, Algorithm::kAuto}) {
        const std::string name = std::string("broadcast ") + Name(a) + " root " +
                                 std::to_string(root) + " count " + std::to_string(count);
        std::vector<int32_t> buf(count, -1);
        if (r == root)
          for (size_t i = 0; i < count; ++i) buf[i] = IntInput(root, 40, i);
        mc2::Work w =
            mc2::Broadcast(g, buf.data(), buf.data(), count, mc2::DType::kI32, root, {.algorithm = a});
        w.Wait();
        bool ok = true;
        for (size_t i = 0; i < count; ++i) ok = ok && buf[i] == IntInput(root, 40, i);
        Check(name, ok, "wrong data");
        CheckAlgo(name, w, a, true, true);
      }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 ||
      (std::string(argv[1]) != "aligned" && std::string(argv[1]) != "single" &&
       std::string(argv[1]) != "unaligned") ||
      (argc == 3 && std::string(argv[2]) != "table")) {
    std::fprintf(stderr, "usage: %s aligned|single|unaligned [table]\n", argv[0]);
    return 2;
  }
  g_layout = argv[1];
  g_table = argc == 3;
  try {
    mc2::Group world = mc2::Group::FromEnv();
    const bool aligned = g_layout != "unaligned";
    // A host with several ranks: every layout here but one rank per host.
    const bool several = g_layout != "single";
    AllGatherCases(world, several);
    ReduceScatterCases(world, aligned, several);
    AllToAllCases(world);
    BroadcastCases(world);
    mc2::Barrier(world).Wait();
    std::printf("rank %d: %s\n", world.rank(), g_failures ? "FAILED" : "ok");
  } catch (const mc2::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return g_failures ? 1 : 0;
}
