// What link emulation charges each collective: the bytes a rank's port
// carries, counted by its LinkModel (bytes_posted), against what the rank
// sends on a network where every reader gets its own copy:
//
//   all_gather, all_gatherv      (N-1) x my block
//   all_to_all(v)                sum over peers p of what I send to p
//   reduce_scatter               (N-1) x block (each peer's block of my input)
//   broadcast                    root: (N-1) x buffer; others: nothing
//   all_reduce, direct           (N-1) x buffer
//   all_reduce, rabenseifner     2 (N-1)/N x buffer
//   batch                        the sum of its entries'
//
// Accounting only: the link is fast and no time is asserted. The scratch is
// small (WorldOptions::scratch_bytes = 8192) so that the staged multi-round paths run;
// buffers are private, symmetric (read in place) or mixed, and sizes take
// the eager, inline (MC2_CHECK=1), exposed and staged paths.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "engine/access.h"
#include "engine/group_impl.h"
#include "mc2/mc2.h"
#include "transport/link_emulation.h"

namespace mc2 {
namespace {

constexpr const char* kLink = "bw=100GB/s,lat=0";
// An 8 KiB scratch: large messages stage in several windows.
constexpr size_t kScratchBytes = 8192;

enum class Mem { kPrivate, kSymmetric, kMixed };
const char* MemName(Mem m) {
  return m == Mem::kPrivate ? "private" : m == Mem::kSymmetric ? "symmetric" : "mixed";
}

// A float buffer of `count` elements, in the symmetric heap or not. The
// symmetric allocation is collective: every rank makes it, of `sym_count`
// (the same on every rank, at least `count`), and uses it or not.
class Buf {
 public:
  Buf(const Group& g, size_t count, bool symmetric, size_t sym_count = 0) {
    sym_ = g.AllocSymmetric(std::max({sym_count, count, size_t{1}}) * sizeof(float));
    if (symmetric) {
      p_ = sym_.as<float>();
    } else {
      own_.resize(std::max<size_t>(count, 1));
      p_ = own_.data();
    }
    for (size_t i = 0; i < count; ++i) p_[i] = static_cast<float>(g.rank() + 1 + i % 7);
  }
  float* get() { return p_; }

 private:
  SymmetricBuffer sym_;
  std::vector<float> own_;
  float* p_ = nullptr;
};

bool Symmetric(Mem m, int rank) {
  return m == Mem::kSymmetric || (m == Mem::kMixed && rank % 2 == 1);
}

// One collective: runs it on `g` (buffers as `mem` says) and returns the
// bytes this rank should be charged.
struct Case {
  std::string name;
  std::function<uint64_t(Group& g, Mem mem)> run;
};

uint64_t Peers(const Group& g) { return static_cast<uint64_t>(g.size() - 1); }

std::vector<Case> Cases(size_t c) {
  const uint64_t f = sizeof(float);
  std::vector<Case> cases;
  cases.push_back({"all_gather", [c, f](Group& g, Mem mem) {
                     bool s = Symmetric(mem, g.rank());
                     Buf in(g, c, s), out(g, c * g.size(), s);
                     AllGather(g, in.get(), out.get(), c, DType::kF32).Wait();
                     return Peers(g) * c * f;
                   }});
  cases.push_back({"all_gather_ring", [c, f](Group& g, Mem mem) {
                     bool s = Symmetric(mem, g.rank());
                     Buf in(g, c, s), out(g, c * g.size(), s);
                     CollectiveOptions o;
                     o.algorithm = Algorithm::kRing;
                     AllGather(g, in.get(), out.get(), c, DType::kF32, o).Wait();
                     return Peers(g) * c * f;
                   }});
  cases.push_back({"all_gatherv", [c, f](Group& g, Mem mem) {
                     bool s = Symmetric(mem, g.rank());
                     std::vector<size_t> counts(g.size());
                     for (int r = 0; r < g.size(); ++r) counts[r] = c + 3 * r;
                     size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
                     Buf in(g, counts[g.rank()], s, counts.back()), out(g, total, s);
                     AllGatherV(g, in.get(), out.get(), counts, {}, DType::kF32).Wait();
                     return Peers(g) * counts[g.rank()] * f;
                   }});
  cases.push_back({"all_to_all", [c, f](Group& g, Mem mem) {
                     bool s = Symmetric(mem, g.rank());
                     Buf in(g, c * g.size(), s), out(g, c * g.size(), s);
                     AllToAll(g, in.get(), out.get(), c, DType::kF32).Wait();
                     return Peers(g) * c * f;
                   }});
  cases.push_back({"all_to_allv", [c, f](Group& g, Mem mem) {
                     const int n = g.size(), me = g.rank();
                     bool s = Symmetric(mem, me);
                     // Rank a sends c + 5a + 2b elements to rank b.
                     auto amount = [c](int a, int b) { return c + 5 * a + 2 * b; };
                     std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
                     size_t st = 0, rt = 0;
                     uint64_t expected = 0;
                     for (int p = 0; p < n; ++p) {
                       sc[p] = amount(me, p), sd[p] = st, st += sc[p];
                       rc[p] = amount(p, me), rd[p] = rt, rt += rc[p];
                       if (p != me) expected += sc[p] * f;
                     }
                     // The largest totals: rank n-1's.
                     size_t max_total = 0;
                     for (int p = 0; p < n; ++p) max_total += amount(n - 1, p) + amount(p, n - 1);
                     Buf in(g, st, s, max_total), out(g, rt, s, max_total);
                     AllToAllV(g, in.get(), sc, sd, out.get(), rc, rd, DType::kF32).Wait();
                     return expected;
                   }});
  cases.push_back({"reduce_scatter", [c, f](Group& g, Mem mem) {
                     bool s = Symmetric(mem, g.rank());
                     Buf in(g, c * g.size(), s), out(g, c, s);
                     ReduceScatter(g, in.get(), out.get(), c, DType::kF32, ReduceOp::kSum).Wait();
                     return Peers(g) * c * f;
                   }});
  cases.push_back({"broadcast", [c, f](Group& g, Mem mem) {
                     bool s = Symmetric(mem, g.rank());
                     Buf in(g, c, s), out(g, c, s);
                     Broadcast(g, in.get(), out.get(), c, DType::kF32, 1).Wait();
                     return g.rank() == 1 ? Peers(g) * c * f : 0;
                   }});
  cases.push_back({"all_reduce_direct", [c, f](Group& g, Mem mem) {
                     bool s = Symmetric(mem, g.rank());
                     Buf in(g, c, s), out(g, c, s);
                     CollectiveOptions o;
                     o.algorithm = Algorithm::kDirect;
                     AllReduce(g, in.get(), out.get(), c, DType::kF32, ReduceOp::kSum, o).Wait();
                     return Peers(g) * c * f;
                   }});
  cases.push_back({"batch", [c, f](Group& g, Mem mem) {
                     const int n = g.size();
                     bool s = Symmetric(mem, g.rank());
                     const size_t ar = c, ag = c / 2 + 1, rs = c / 3 + 2, bc = c + 9;
                     Buf ar_in(g, ar, s), ar_out(g, ar, s), ag_in(g, ag, s), ag_out(g, ag * n, s),
                         rs_in(g, rs * n, s), rs_out(g, rs, s), bc_in(g, bc, s), bc_out(g, bc, s);
                     const BatchEntry entries[] = {
                         BatchEntry::AllReduce(ar_in.get(), ar_out.get(), ar, DType::kF32,
                                               ReduceOp::kSum),
                         BatchEntry::AllGather(ag_in.get(), ag_out.get(), ag, DType::kF32),
                         BatchEntry::ReduceScatter(rs_in.get(), rs_out.get(), rs, DType::kF32,
                                                   ReduceOp::kSum),
                         BatchEntry::Broadcast(bc_in.get(), bc_out.get(), bc, DType::kF32, 1)};
                     Batch(g, entries).Wait();
                     return Peers(g) * (ar + ag + rs + (g.rank() == 1 ? bc : 0)) * f;
                   }});
  return cases;
}

// Runs every case at every size, group size and memory kind and checks the
// charged bytes on every rank.
void CheckCharges(const std::vector<size_t>& sizes) {
  WorldOptions wo;
  wo.link = kLink;
  wo.scratch_bytes = kScratchBytes;
  for (int n : {2, 3, 4})
    for (Mem mem : {Mem::kPrivate, Mem::kSymmetric, Mem::kMixed}) {
      std::vector<std::string> wrong;
      std::mutex mu;
      Group::RunInProcess(
          n,
          [&](Group& g) {
            transport::LinkModel* port = internal::Access::Impl(g)->tx().link();
            ASSERT_NE(port, nullptr);
            for (size_t c : sizes)
              for (const Case& k : Cases(c)) {
                const uint64_t before = port->bytes_posted();
                const uint64_t expected = k.run(g, mem);
                const uint64_t charged = port->bytes_posted() - before;
                if (charged != expected) {
                  std::lock_guard<std::mutex> lock(mu);
                  wrong.push_back(fmt::format("{} count={} rank {}: charged {} expected {}",
                                              k.name, c, g.rank(), charged, expected));
                }
              }
          },
          wo);
      EXPECT_TRUE(wrong.empty()) << n << " ranks, " << MemName(mem) << ":\n"
                                 << fmt::format("{}", fmt::join(wrong, "\n"));
    }
}

// Sizes: eager (a few elements), beyond the inline area (exposed in place or
// staged), and beyond a scratch half (several staged rounds), odd counts.
TEST(LinkCharge, EveryCollectiveIsChargedTheBytesItSends) { CheckCharges({1, 7, 901, 5003}); }

// MC2_CHECK=1 turns the eager path off: small direct calls then stage in the
// inline area and the arrival carries their bytes.
TEST(LinkCharge, InlineStagedCallsAreChargedAtArrival) {
  ASSERT_EQ(setenv("MC2_CHECK", "1", 1), 0);
  CheckCharges({1, 7, 300});
  unsetenv("MC2_CHECK");
}

// The default large all-reduce (Rabenseifner) sends a chunk to each peer
// (reduce-scatter) and its reduced chunk to each peer (all-gather).
TEST(LinkCharge, RabenseifnerAllReduceIsChargedTwoNMinusOneOverN) {
  WorldOptions wo;
  wo.link = kLink;
  wo.scratch_bytes = kScratchBytes;
  const size_t count = 12 * 1500;  // above the direct cut-over; every N below divides it
  for (int n : {2, 3, 4})
    for (Mem mem : {Mem::kPrivate, Mem::kSymmetric}) {
      std::atomic<int> wrong{0};
      Group::RunInProcess(
          n,
          [&](Group& g) {
            transport::LinkModel* port = internal::Access::Impl(g)->tx().link();
            ASSERT_NE(port, nullptr);
            Buf in(g, count, mem == Mem::kSymmetric), out(g, count, mem == Mem::kSymmetric);
            CollectiveOptions o;
            o.algorithm = Algorithm::kRabenseifner;
            const uint64_t before = port->bytes_posted();
            AllReduce(g, in.get(), out.get(), count, DType::kF32, ReduceOp::kSum, o).Wait();
            const uint64_t expected = 2 * (n - 1) * (count / n) * sizeof(float);
            EXPECT_EQ(port->bytes_posted() - before, expected)
                << n << " ranks, " << MemName(mem) << ", rank " << g.rank();
            // Every element: the sum of 1 + r + i % 7 over the ranks.
            for (size_t i = 0; i < count; i += 997)
              if (out.get()[i] != static_cast<float>(n * (n + 1) / 2 + n * (i % 7))) ++wrong;
          },
          wo);
      EXPECT_EQ(wrong.load(), 0);
    }
}

}  // namespace
}  // namespace mc2
