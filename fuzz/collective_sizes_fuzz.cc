// libFuzzer target: every public collective and group call with sizes
// decoded from the input (small, near SIZE_MAX / k, near PTRDIFF_MAX, powers
// of two, raw 64-bit values), on a 1- or 2-rank in-process world.
//
// Contract (mc2/collectives.h, mc2/group.h, docs/errors.md): a call either
// succeeds or throws mc2::Error(kInvalidArgument) before any rank waits;
// never a crash, a hang or another error (AllocSymmetric may also report a
// full heap, kShmExhausted). Every rank gets the same arguments, so every
// rank fails or succeeds alike.
//
// The harness computes each call's byte extents itself, in 128-bit
// arithmetic, and picks its buffers by them (the regimes of
// size_harness.h), so nothing large is ever allocated.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "size_harness.h"
#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/group.h"

namespace {

using mc2::DType;
using mc2::ErrorCode;
using namespace mc2::fuzz;

enum class Call {
  kAllReduce,
  kReduce,
  kBroadcast,
  kAllGather,
  kAllGatherV,
  kGather,
  kScatter,
  kReduceScatter,
  kReduceScatterV,
  kAllToAll,
  kAllToAllV,
  kBarrier,
  kAllocSymmetric,
  kPutGet,
  kSendRecv,
  kCount
};

// One call's arguments, the same on every rank (all-to-all-v: each rank's
// row of a matrix whose rows are permutations of each other, so that every
// rank's extents are equal and the counts agree pairwise).
struct Args {
  Call call = Call::kBarrier;
  int dtype = 0;  // may be out of range: then the call must throw
  int op = 0;
  int root = 0;
  mc2::CollectiveOptions opts;
  size_t count = 0;
  std::vector<size_t> counts, displs;  // V variants (displs empty: packed)
  size_t diag = 0, off = 0;            // all_to_allv counts (self, other)
  std::vector<size_t> sdispls, rdispls;
  size_t offset = 0, bytes = 0;  // Put/Get, AllocSymmetric, Send/Recv
};

Args Decode(Reader& in, int n) {
  Args a;
  a.call = static_cast<Call>(in.U8() % static_cast<int>(Call::kCount));
  const uint8_t t = in.U8();
  a.dtype = t % 16 == 15 ? 200 : t % mc2::kNumDTypes;
  a.op = in.U8() % mc2::kNumReduceOps;
  a.root = in.U8() % n;
  const uint8_t o = in.U8();
  a.opts.algorithm = static_cast<mc2::Algorithm>(o % mc2::kNumAlgorithms);
  a.opts.may_run_inline = (o & 0x80) == 0;
  a.count = in.Size();
  const bool displaced = in.U8() & 1;
  for (int r = 0; r < n; ++r) a.counts.push_back(in.Size());
  if (displaced)
    for (int r = 0; r < n; ++r) a.displs.push_back(in.Size());
  a.diag = in.Size();
  a.off = in.Size();
  if (in.U8() & 1)
    for (int r = 0; r < n; ++r) a.sdispls.push_back(in.Size());
  if (in.U8() & 1)
    for (int r = 0; r < n; ++r) a.rdispls.push_back(in.Size());
  a.offset = in.Size();
  a.bytes = in.Size();
  return a;
}

// The largest extent, in bytes, any buffer of the call needs.
u128 Extent(const Args& a, int n, size_t e) {
  const u128 c = a.count;
  switch (a.call) {
    case Call::kAllReduce:
    case Call::kReduce:
    case Call::kBroadcast:
      return c * e;
    case Call::kAllGather:
    case Call::kGather:
    case Call::kScatter:
    case Call::kReduceScatter:
    case Call::kAllToAll:
      return c * e * static_cast<u128>(n);
    case Call::kAllGatherV:
    case Call::kReduceScatterV: {
      u128 end = 0, sum = 0;
      for (int r = 0; r < n; ++r) {
        const bool packed = a.displs.empty() || a.call == Call::kReduceScatterV;
        end = Max(end, (packed ? sum : a.displs[r]) + a.counts[r]);
        sum += a.counts[r];
      }
      return end * e;
    }
    case Call::kAllToAllV: {
      // Rank r's row is (diag, off) rotated by r; its displacements are the
      // given ones rotated alike, so every rank's extents are equal.
      u128 s = 0, rcv = 0;
      const size_t row[2] = {a.diag, a.off};
      for (int p = 0; p < n; ++p) {
        s = Max(s, (a.sdispls.empty() ? (p ? u128{row[0]} : 0) : a.sdispls[p]) + row[p]);
        rcv = Max(rcv, (a.rdispls.empty() ? (p ? u128{row[0]} : 0) : a.rdispls[p]) + row[p]);
      }
      return Max(s, rcv) * e;
    }
    default:
      return 0;
  }
}

template <typename T>
std::vector<T> Rotated(const std::vector<T>& v, int by) {
  std::vector<T> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = v[(i + by) % v.size()];
  return r;
}

std::string Describe(const Args& a, int n) {
  std::string s = "call " + std::to_string(static_cast<int>(a.call)) + " on " + std::to_string(n) +
                  " ranks, dtype " + std::to_string(a.dtype) + ", count " +
                  std::to_string(a.count) + ", counts";
  for (size_t c : a.counts) s += " " + std::to_string(c);
  s += ", displs";
  for (size_t d : a.displs) s += " " + std::to_string(d);
  s += ", a2a " + std::to_string(a.diag) + "/" + std::to_string(a.off) + ", offset " +
       std::to_string(a.offset) + ", bytes " + std::to_string(a.bytes);
  return s;
}

enum class Expect { kMayPass, kMustThrow };

// Runs the collective of `a` on this rank with buffers chosen by regime.
void RunCollective(const mc2::Group& g, const Args& a) {
  const int n = g.size(), me = g.rank();
  const bool valid_dtype = a.dtype < mc2::kNumDTypes;
  const auto dtype = static_cast<DType>(a.dtype);
  const size_t e = valid_dtype ? mc2::DTypeSize(dtype) : 1;
  const u128 extent = Extent(a, n, e);
  Expect expect = Expect::kMayPass;
  std::vector<unsigned char> sbuf, rbuf;
  void *send = nullptr, *recv = nullptr;
  if (!valid_dtype || extent > kMaxBuffer) {
    expect = Expect::kMustThrow;
    sbuf.assign(kSmallBytes, 0);
    rbuf.assign(kSmallBytes, 0);
    send = sbuf.data();
    recv = rbuf.data();
  } else if (extent <= kRealBytes) {
    sbuf.assign(static_cast<size_t>(extent) + 1, 0);
    rbuf.assign(static_cast<size_t>(extent) + 1, 0);
    send = sbuf.data();
    recv = rbuf.data();
  } else {
    expect = Expect::kMustThrow;  // null buffers with a non-zero size
  }
  if (a.call == Call::kBarrier) expect = Expect::kMayPass;  // it has no sizes
  const auto op = static_cast<mc2::ReduceOp>(a.op);
  mc2::Work w;
  switch (a.call) {
    case Call::kAllReduce:
      w = mc2::AllReduce(g, send, recv, a.count, dtype, op, a.opts);
      break;
    case Call::kReduce:
      w = mc2::Reduce(g, send, recv, a.count, dtype, op, a.root, a.opts);
      break;
    case Call::kBroadcast:
      w = mc2::Broadcast(g, send, recv, a.count, dtype, a.root, a.opts);
      break;
    case Call::kAllGather:
      w = mc2::AllGather(g, send, recv, a.count, dtype, a.opts);
      break;
    case Call::kAllGatherV:
      w = mc2::AllGatherV(g, send, recv, a.counts, a.displs, dtype, a.opts);
      break;
    case Call::kGather:
      w = mc2::Gather(g, send, recv, a.count, dtype, a.root, a.opts);
      break;
    case Call::kScatter:
      w = mc2::Scatter(g, send, recv, a.count, dtype, a.root, a.opts);
      break;
    case Call::kReduceScatter:
      w = mc2::ReduceScatter(g, send, recv, a.count, dtype, op, a.opts);
      break;
    case Call::kReduceScatterV:
      w = mc2::ReduceScatterV(g, send, recv, a.counts, dtype, op, a.opts);
      break;
    case Call::kAllToAll:
      w = mc2::AllToAll(g, send, recv, a.count, dtype, a.opts);
      break;
    case Call::kAllToAllV: {
      const std::vector<size_t> base =
          n == 1 ? std::vector<size_t>{a.diag} : std::vector<size_t>{a.diag, a.off};
      // Rank r sends row[p] to p and receives the same from p: pairwise equal.
      const std::vector<size_t> row = Rotated(base, me);
      std::vector<size_t> sd = a.sdispls, rd = a.rdispls;
      if (!sd.empty()) sd = Rotated(sd, me);
      if (!rd.empty()) rd = Rotated(rd, me);
      w = mc2::AllToAllV(g, send, row, sd, recv, row, rd, dtype, a.opts);
      break;
    }
    default:
      w = mc2::Barrier(g, a.opts);
      break;
  }
  if (expect == Expect::kMustThrow) Fail("accepted: " + Describe(a, n));
  w.Wait();
}

void RunGroupCall(const mc2::Group& g, const Args& a) {
  const int n = g.size(), me = g.rank();
  switch (a.call) {
    case Call::kAllocSymmetric: {
      const bool too_large = a.bytes > static_cast<size_t>(kMaxBuffer);
      try {
        mc2::SymmetricBuffer b = g.AllocSymmetric(a.bytes);
        if (too_large) Fail("AllocSymmetric accepted " + std::to_string(a.bytes) + " bytes");
      } catch (const mc2::Error& e) {
        if (e.code() != ErrorCode::kShmExhausted) throw;
        if (too_large) Fail("AllocSymmetric: kShmExhausted instead of kInvalidArgument");
      }
      mc2::Barrier(g).Wait();  // no peer touches a freed buffer
      return;
    }
    case Call::kPutGet: {
      mc2::SymmetricBuffer b = g.AllocSymmetric(kSmallBytes);
      const bool in_range = a.offset <= kSmallBytes && a.bytes <= kSmallBytes - a.offset;
      std::vector<unsigned char> local(kSmallBytes, 0);
      const int peer = (me + 1) % n;
      for (int get = 0; get < 2; ++get) {
        try {
          if (get)
            g.Get(b, peer, a.offset, local.data(), a.bytes);
          else
            g.Put(b, peer, a.offset, local.data(), a.bytes);
          if (!in_range) Fail("Put/Get accepted " + Describe(a, n));
        } catch (const mc2::Error& e) {
          if (e.code() != ErrorCode::kInvalidArgument || in_range) throw;
        }
      }
      mc2::Barrier(g).Wait();
      return;
    }
    case Call::kSendRecv: {
      if (n < 2) return;
      const u128 bytes = a.bytes;
      std::vector<unsigned char> buf(kSmallBytes, 0);
      void* data = buf.data();
      bool must_throw = true;
      if (bytes <= kRealBytes) {
        buf.assign(a.bytes + 1, 0);
        data = buf.data();
        must_throw = false;
      } else if (bytes <= kMaxBuffer) {
        data = nullptr;
      }
      try {
        mc2::Work w = me == 0 ? g.Send(data, a.bytes, 1, 3) : g.Recv(data, a.bytes, 0, 3);
        if (must_throw) Fail("Send/Recv accepted " + std::to_string(a.bytes) + " bytes");
        w.Wait();
      } catch (const mc2::Error& e) {
        if (e.code() != ErrorCode::kInvalidArgument || !must_throw) throw;
      }
      return;
    }
    default:
      return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader in(data, size);
  const int n = 1 + in.U8() % 2;
  std::vector<Args> calls;
  while (!in.empty() && static_cast<int>(calls.size()) < kMaxCalls) calls.push_back(Decode(in, n));
  RunCalls(
      n, calls,
      [](const mc2::Group& g, const Args& a) {
        if (a.call >= Call::kAllocSymmetric)
          RunGroupCall(g, a);
        else
          RunCollective(g, a);
      },
      Describe);
  return 0;
}
