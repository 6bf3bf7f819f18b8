// Batches of collectives (include/mc2/batch.h): every entry against the
// shared reference (reference/reference_reduce.h) on small-integer inputs,
// bitwise against the separate collective on random floats, in and out of
// place, on 1-4 ranks; the three ways the packed stream travels (inline
// slot, scratch, windows of a scratch half: the scratch is made small so
// that all three run at small sizes); mismatches on every rank; invalid
// arguments.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "mc2/mc2.h"
#include "reference/reference_reduce.h"

namespace mc2 {
namespace {

// A 16 KiB scratch: streams above 8 KiB use the scratch, above 32 KiB its
// windows.
WorldOptions Quick() {
  WorldOptions o;
  o.timeout = std::chrono::seconds(20);
  o.scratch_bytes = 16384;
  return o;
}

// Element i of rank r's input to entry e: a small positive integer, so that
// every reduction is exact in any order and type (products: 1 or 2).
int64_t Val(size_t e, int r, size_t i, ReduceOp op) {
  const uint64_t h = (i * 7 + static_cast<size_t>(r) * 3 + e * 5) % 11;
  return op == ReduceOp::kProd ? 1 + (h % 3 == 0) : 1 + static_cast<int64_t>(h % 5);
}

struct Spec {
  BatchKind kind;
  DType dtype;
  ReduceOp op;
  size_t count;
  bool in_place;
  int root;
};

// One entry's buffers on one rank, and its expected output.
struct Buffers {
  std::vector<char> send, recv, want;
};

Buffers Make(const Spec& s, size_t e, int n, int me) {
  const size_t es = DTypeSize(s.dtype), b = s.count * es;
  Buffers x;
  auto fill = [&](char* p, int r, size_t first, size_t cnt) {
    for (size_t i = 0; i < cnt; ++i)
      reference::StoreInt(s.dtype, Val(e, r, first + i, s.op), p + i * es);
  };
  auto reduced = [&](char* p, size_t first, size_t cnt) {
    for (size_t i = 0; i < cnt; ++i) {
      const int64_t acc =
          reference::ReduceInts(s.op, n, [&](int r) { return Val(e, r, first + i, s.op); });
      reference::StoreReduction(s.dtype, s.op, n, acc, p + i * es);
    }
  };
  switch (s.kind) {
    case BatchKind::kAllReduce:
      x.send.resize(b);
      fill(x.send.data(), me, 0, s.count);
      x.recv.assign(b, 0x5A);
      x.want.resize(b);
      reduced(x.want.data(), 0, s.count);
      break;
    case BatchKind::kAllGather:
      x.send.resize(b);
      fill(x.send.data(), me, 0, s.count);
      x.recv.assign(b * n, 0x5A);
      x.want.resize(b * n);
      for (int r = 0; r < n; ++r) fill(x.want.data() + r * b, r, 0, s.count);
      if (s.in_place && b > 0) std::memcpy(x.recv.data() + me * b, x.send.data(), b);
      break;
    case BatchKind::kReduceScatter:
      x.send.resize(b * n);
      fill(x.send.data(), me, 0, s.count * n);
      x.recv.assign(b, 0x5A);
      x.want.resize(b);
      reduced(x.want.data(), me * s.count, s.count);
      break;
    case BatchKind::kBroadcast:
      x.send.resize(b);
      fill(x.send.data(), s.root, 0, s.count);
      x.recv.assign(b, 0x5A);
      x.want = x.send;
      if (s.in_place && me == s.root) x.recv = x.send;
      break;
  }
  return x;
}

BatchEntry EntryOf(const Spec& s, Buffers& x, int me) {
  const size_t b = s.count * DTypeSize(s.dtype);
  switch (s.kind) {
    case BatchKind::kAllReduce:
      if (s.in_place) {
        x.recv = x.send;
        return BatchEntry::AllReduce(x.recv.data(), x.recv.data(), s.count, s.dtype, s.op);
      }
      return BatchEntry::AllReduce(x.send.data(), x.recv.data(), s.count, s.dtype, s.op);
    case BatchKind::kAllGather:
      return BatchEntry::AllGather(s.in_place ? x.recv.data() + me * b : x.send.data(),
                                   x.recv.data(), s.count, s.dtype);
    case BatchKind::kReduceScatter:
      if (s.in_place)
        return BatchEntry::ReduceScatter(x.send.data(), x.send.data() + me * b, s.count, s.dtype,
                                         s.op);
      return BatchEntry::ReduceScatter(x.send.data(), x.recv.data(), s.count, s.dtype, s.op);
    case BatchKind::kBroadcast:
      return BatchEntry::Broadcast(x.send.data(), x.recv.data(), s.count, s.dtype, s.root);
  }
  return {};
}

// The output of entry `s` as the batch left it.
std::vector<char> Output(const Spec& s, const Buffers& x, int me) {
  const size_t b = s.count * DTypeSize(s.dtype);
  if (s.kind == BatchKind::kReduceScatter && s.in_place)
    return {x.send.begin() + me * b, x.send.begin() + (me + 1) * b};
  return x.recv;
}

// A mixed batch: every kind, several dtypes and ops, in and out of place,
// counts of 0, 1, primes and odd sizes; `scale` grows the large entries.
std::vector<Spec> MixedSpecs(int n, size_t scale) {
  std::vector<Spec> v = {
      {BatchKind::kAllReduce, DType::kF32, ReduceOp::kSum, 1000 * scale + 3, false, 0},
      {BatchKind::kAllGather, DType::kI8, ReduceOp::kSum, 37, false, 0},
      {BatchKind::kReduceScatter, DType::kBF16, ReduceOp::kSum, 129 * scale, false, 0},
      {BatchKind::kBroadcast, DType::kI64, ReduceOp::kSum, 17, false, n - 1},
      {BatchKind::kAllReduce, DType::kI32, ReduceOp::kMax, 1, true, 0},
      {BatchKind::kAllReduce, DType::kF16, ReduceOp::kAvg, 0, false, 0},
      {BatchKind::kAllGather, DType::kF64, ReduceOp::kSum, 257 * scale, true, 0},
      {BatchKind::kReduceScatter, DType::kI32, ReduceOp::kProd, 31, true, 0},
      {BatchKind::kAllReduce, DType::kU8, ReduceOp::kBxor, 13, false, 0},
      {BatchKind::kBroadcast, DType::kF32, ReduceOp::kSum, 401 * scale, true, 0},
      {BatchKind::kAllReduce, DType::kF64, ReduceOp::kMin, 7, true, 0},
      {BatchKind::kReduceScatter, DType::kF16, ReduceOp::kAvg, 5, false, 0},
  };
  return v;
}

void RunAndCheck(Group& g, const std::vector<Spec>& specs) {
  const int n = g.size(), me = g.rank();
  std::vector<Buffers> bufs;
  for (size_t e = 0; e < specs.size(); ++e) bufs.push_back(Make(specs[e], e, n, me));
  std::vector<BatchEntry> entries;
  for (size_t e = 0; e < specs.size(); ++e) entries.push_back(EntryOf(specs[e], bufs[e], me));
  Batch(g, entries).Wait();
  for (size_t e = 0; e < specs.size(); ++e) {
    const std::vector<char> got = Output(specs[e], bufs[e], me);
    ASSERT_EQ(got.size(), bufs[e].want.size());
    EXPECT_TRUE(got == bufs[e].want)
        << "entry " << e << " (" << BatchKindName(specs[e].kind) << ", "
        << DTypeName(specs[e].dtype) << ") on rank " << me << " of " << n;
  }
}

class BatchRanks : public ::testing::TestWithParam<int> {};

// Inline slot (scale 0: a few hundred bytes), scratch (scale 1: ~20 KiB)
// and windows (scale 4: ~70 KiB per rank).
TEST_P(BatchRanks, MixedEntriesMatchTheReference) {
  Group::RunInProcess(
      GetParam(),
      [](Group& g) {
        for (size_t scale : {0, 1, 4}) RunAndCheck(g, MixedSpecs(g.size(), scale));
      },
      Quick());
}

// Many small all-reduces, the case batching is for, then the same in one
// batch larger than the scratch, twice in a row (the second batch packs
// while peers may still read the first's scratch).
TEST_P(BatchRanks, ManyAllReduces) {
  Group::RunInProcess(
      GetParam(),
      [](Group& g) {
        for (size_t count : {64, 700})
          for (int rep = 0; rep < 2; ++rep) {
            std::vector<Spec> specs(
                100, {BatchKind::kAllReduce, DType::kF32, ReduceOp::kSum, count, rep == 1, 0});
            RunAndCheck(g, specs);
          }
      },
      Quick());
}

INSTANTIATE_TEST_SUITE_P(Ranks, BatchRanks, ::testing::Values(1, 2, 3, 4));

// Deterministic mode: random floats, each entry's bits equal to the separate
// collective's, for batches in each of the three transports.
TEST(Batch, BitwiseEqualToSeparateCollectives) {
  Group::RunInProcess(
      4,
      [](Group& g) {
        const int n = g.size(), me = g.rank();
        std::mt19937 rng(77 + me);
        std::uniform_real_distribution<float> d(-1000.f, 1000.f);
        for (size_t count : {9, 1500, 6000}) {
          std::vector<float> a(count), rs(count * n);
          std::vector<uint16_t> h(count);
          for (float& x : a) x = d(rng) * (rng() % 2 ? 1e-3f : 1.f);
          for (float& x : rs) x = d(rng);
          for (auto& x : h) x = static_cast<uint16_t>(0x3C00 + rng() % 0x1000);  // f16 in [1, 8)
          std::vector<float> a_b(count), a_s(count), rs_b(count), rs_s(count);
          std::vector<uint16_t> h_b(count), h_s(count);
          std::vector<BatchEntry> e = {
              BatchEntry::AllReduce(a.data(), a_b.data(), count, DType::kF32, ReduceOp::kSum),
              BatchEntry::ReduceScatter(rs.data(), rs_b.data(), count, DType::kF32, ReduceOp::kAvg),
              BatchEntry::AllReduce(h.data(), h_b.data(), count, DType::kF16, ReduceOp::kSum)};
          Batch(g, e).Wait();
          AllReduce(g, a.data(), a_s.data(), count, DType::kF32, ReduceOp::kSum).Wait();
          ReduceScatter(g, rs.data(), rs_s.data(), count, DType::kF32, ReduceOp::kAvg).Wait();
          AllReduce(g, h.data(), h_s.data(), count, DType::kF16, ReduceOp::kSum).Wait();
          EXPECT_EQ(std::memcmp(a_b.data(), a_s.data(), count * 4), 0) << count;
          EXPECT_EQ(std::memcmp(rs_b.data(), rs_s.data(), count * 4), 0) << count;
          EXPECT_EQ(std::memcmp(h_b.data(), h_s.data(), count * 2), 0) << count;
        }
      },
      Quick());
}

// Runs `body` on 3 ranks and returns each rank's error (code -1: none).
struct RankError {
  int code = -1;
  std::string message;
};
std::array<RankError, 3> ErrorsOn3(const std::function<void(Group&)>& body) {
  std::array<RankError, 3> errors;
  try {
    Group::RunInProcess(
        3,
        [&](Group& g) {
          try {
            body(g);
          } catch (const Error& e) {
            errors[g.rank()] = {static_cast<int>(e.code()), e.what()};
          }
        },
        Quick());
  } catch (const Error&) {
  }
  return errors;
}

void ExpectMismatchOnEveryRank(const std::function<void(Group&)>& body) {
  const auto errors = ErrorsOn3(body);
  for (size_t r = 0; r < errors.size(); ++r)
    EXPECT_EQ(errors[r].code, static_cast<int>(ErrorCode::kMismatch))
        << "rank " << r << ": " << errors[r].message;
}

TEST(Batch, MismatchedEntriesFailOnEveryRank) {
  std::vector<float> a(5000), b(5000 * 3);
  // A different number of entries (in each of the three transports).
  for (size_t count : {10, 3000, 5000})
    ExpectMismatchOnEveryRank([&](Group& g) {
      std::vector<BatchEntry> e(
          g.rank() == 1 ? 1 : 2,
          BatchEntry::AllReduce(a.data(), a.data(), count, DType::kF32, ReduceOp::kSum));
      if (e.size() == 2) e[1] = BatchEntry::Broadcast(b.data(), b.data(), 4, DType::kF32, 0);
      Batch(g, e).Wait();
    });
  // A different dtype, kind, count or op in one entry.
  ExpectMismatchOnEveryRank([&](Group& g) {
    std::vector<float> s(8), r(8);
    Batch(g, std::vector{BatchEntry::AllReduce(
                 s.data(), r.data(), 2, g.rank() == 2 ? DType::kI32 : DType::kF32, ReduceOp::kSum)})
        .Wait();
  });
  ExpectMismatchOnEveryRank([&](Group& g) {
    std::vector<float> s(8), r(24);
    const BatchEntry e =
        g.rank() == 0 ? BatchEntry::AllGather(s.data(), r.data(), 2, DType::kF32)
                      : BatchEntry::AllReduce(s.data(), r.data(), 2, DType::kF32, ReduceOp::kSum);
    Batch(g, std::vector{e}).Wait();
  });
  ExpectMismatchOnEveryRank([&](Group& g) {
    std::vector<float> s(8), r(8);
    Batch(g, std::vector{BatchEntry::AllReduce(s.data(), r.data(), 2 + (g.rank() == 1), DType::kF32,
                                               ReduceOp::kSum)})
        .Wait();
  });
  ExpectMismatchOnEveryRank([&](Group& g) {
    std::vector<float> s(8), r(8);
    Batch(g, std::vector{BatchEntry::AllReduce(s.data(), r.data(), 2, DType::kF32,
                                               g.rank() ? ReduceOp::kSum : ReduceOp::kMax)})
        .Wait();
  });
  // An empty batch against a non-empty one, and a batch against a single
  // collective.
  ExpectMismatchOnEveryRank([&](Group& g) {
    std::vector<float> s(8), r(8);
    std::vector<BatchEntry> e;
    if (g.rank() != 0)
      e.push_back(BatchEntry::AllReduce(s.data(), r.data(), 2, DType::kF32, ReduceOp::kSum));
    Batch(g, e).Wait();
  });
  ExpectMismatchOnEveryRank([&](Group& g) {
    std::vector<float> s(8), r(8);
    if (g.rank() == 0) {
      AllReduce(g, s.data(), r.data(), 2, DType::kF32, ReduceOp::kSum).Wait();
    } else {
      Batch(g,
            std::vector{BatchEntry::AllReduce(s.data(), r.data(), 2, DType::kF32, ReduceOp::kSum)})
          .Wait();
    }
  });
}

TEST(Batch, EmptyBatchCompletesOnEveryRank) {
  Group::RunInProcess(
      3,
      [](Group& g) {
        Batch(g, {}).Wait();
        std::vector<int32_t> s(4, g.rank() + 1), r(4);
        Batch(g, std::vector{BatchEntry::AllReduce(s.data(), r.data(), 4, DType::kI32,
                                                   ReduceOp::kSum)})
            .Wait();
        EXPECT_EQ(r[3], 6);
      },
      Quick());
}

// Invalid arguments throw kInvalidArgument from the call on the rank that
// passes them, naming the entry; the group stays usable.
TEST(Batch, InvalidArgumentsNameTheEntry) {
  Group::RunInProcess(
      2,
      [](Group& g) {
        std::vector<float> a(64), b(64), c(64);
        auto expect_invalid = [&](std::vector<BatchEntry> e, const char* what,
                                  CollectiveOptions o = {}) {
          try {
            Batch(g, e, o).Wait();
            ADD_FAILURE() << "no error for " << what;
          } catch (const Error& err) {
            EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument) << what << ": " << err.what();
            EXPECT_NE(std::string(err.what()).find("batch"), std::string::npos) << err.what();
          }
        };
        const auto ar = [&](const void* s, void* r, size_t n) {
          return BatchEntry::AllReduce(s, r, n, DType::kF32, ReduceOp::kSum);
        };
        expect_invalid({ar(a.data(), b.data(), 4), ar(nullptr, c.data(), 4)}, "null send");
        expect_invalid({BatchEntry::AllReduce(a.data(), b.data(), 4, DType::kF32, ReduceOp::kBand)},
                       "bitwise op on floats");
        expect_invalid({BatchEntry::Broadcast(a.data(), b.data(), 4, DType::kF32, 2)},
                       "root out of range");
        expect_invalid({BatchEntry::AllGather(a.data(), b.data(), SIZE_MAX / 4, DType::kF32)},
                       "size overflow");
        expect_invalid({ar(a.data(), b.data(), 8), ar(c.data(), b.data() + 4, 8)},
                       "two outputs overlap");
        expect_invalid({ar(a.data(), b.data(), 8), ar(b.data() + 2, c.data(), 8)},
                       "an output overlaps another entry's input");
        expect_invalid({ar(a.data(), a.data() + 1, 8)}, "send and recv overlap");
        expect_invalid({ar(a.data(), b.data(), 8)}, "algorithm",
                       CollectiveOptions{.algorithm = Algorithm::kRing});
        BatchEntry bad = ar(a.data(), b.data(), 4);
        bad.dtype = static_cast<DType>(99);
        expect_invalid({bad}, "bad dtype");
        // Inputs may overlap each other; the group still works.
        std::vector<float> s(8, 1.f + g.rank());
        Batch(g, std::vector{ar(s.data(), b.data(), 8), ar(s.data(), c.data(), 8)}).Wait();
        EXPECT_EQ(b[7], 3.f);
        EXPECT_EQ(c[0], 3.f);
      },
      Quick());
}

// Asynchronous: a batch queued behind other work (may_run_inline off)
// completes in order with the group's other collectives.
TEST(Batch, QueuedBatchesKeepTheGroupsOrder) {
  Group::RunInProcess(
      2,
      [](Group& g) {
        CollectiveOptions bg;
        bg.may_run_inline = false;
        std::vector<int32_t> s(3000, g.rank() + 1), r1(3000), r2(3000), r3(3000);
        Work w1 = AllReduce(g, s.data(), r1.data(), s.size(), DType::kI32, ReduceOp::kSum, bg);
        Work w2 = Batch(g,
                        std::vector{BatchEntry::AllReduce(s.data(), r2.data(), s.size(),
                                                          DType::kI32, ReduceOp::kMax)},
                        bg);
        Work w3 = AllReduce(g, s.data(), r3.data(), s.size(), DType::kI32, ReduceOp::kMin, bg);
        w3.Wait();
        w2.Wait();
        w1.Wait();
        EXPECT_EQ(r1[2999], 3);
        EXPECT_EQ(r2[0], 2);
        EXPECT_EQ(r3[5], 1);
        EXPECT_EQ(w2.algorithm(), "batch");
      },
      Quick());
}

}  // namespace
}  // namespace mc2
