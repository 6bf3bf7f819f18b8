// libFuzzer target: the GEMM and every fused operator (mc2/gemm.h,
// fused_ops.h, batch_matmul.h, moe.h) with shapes decoded from the input
// (small, near SIZE_MAX / k, near PTRDIFF_MAX, powers of two, raw 64-bit
// values), on a 1- or 2-rank in-process world.
//
// Contract (the headers, docs/errors.md): a call either succeeds or throws
// mc2::Error(kInvalidArgument) on every rank alike; never a crash, a hang
// or another error. Every rank gets the same shapes (MatmulReduceScatter's
// m_local: a valid partition of m), so every rank fails or succeeds alike.
// The harness computes every buffer's byte extent in 128-bit arithmetic and
// picks the buffers by the largest (the regimes of size_harness.h): a call
// whose extents exceed PTRDIFF_MAX must throw before it touches the small
// buffers it gets, one with null buffers must throw, one with real buffers
// may pass. Nothing large is ever allocated or computed.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mc2/batch_matmul.h"
#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/fused_ops.h"
#include "mc2/gemm.h"
#include "mc2/group.h"
#include "mc2/moe.h"
#include "size_harness.h"

namespace {

using mc2::DType;
using mc2::ErrorCode;
using namespace mc2::fuzz;

enum class Call {
  kGemm,
  kAllGatherMatmul,
  kMatmulReduceScatter,
  kMatmulAllReduce,
  kAllGatherBatchMatmul,
  kAllToAllMatmul,
  kMatmulAllToAll,
  kMoeMlp,
  kCount
};

struct Args {
  Call call = Call::kGemm;
  int dtype = 0;  // index into kDTypes; out of range: an invalid dtype
  int c_dtype = 0;
  size_t m = 0, k = 0, n = 0, batch = 0, h2 = 0;
  size_t lda = 0, ldb = 0, ldc = 0;
  bool trans_a = false, trans_b = false, flag = false;
  mc2::FusedOptions opts;
  size_t tokens = 0;  // MoE: T, topk and E
  int topk = 1, experts = 1;
};

// The operators' dtypes, and one they must refuse.
constexpr DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF64, DType::kI32};

Args Decode(Reader& in) {
  Args a;
  a.call = static_cast<Call>(in.U8() % static_cast<int>(Call::kCount));
  a.dtype = in.U8() % 5;  // 4: out of the enum's range
  a.c_dtype = in.U8() % 2;
  a.m = in.Size();
  a.k = in.Size();
  a.n = in.Size();
  a.batch = in.Size();
  a.h2 = in.U8() & 1 ? a.n : in.Size();
  const uint8_t f = in.U8();
  a.trans_a = f & 1;
  a.trans_b = f & 2;
  a.flag = f & 4;
  if (f & 8) a.lda = in.Size();
  if (f & 16) a.ldb = in.Size();
  if (f & 32) a.ldc = in.Size();
  const uint8_t p = in.U8();
  a.opts.pipeline = static_cast<mc2::Pipeline>(p % 5);  // 4: not a pipeline
  a.opts.splits = static_cast<int>(in.U8() % 20);
  a.tokens = in.Size();
  a.topk = 1 + in.U8() % 4;
  a.experts = 1 + in.U8() % 8;
  return a;
}

DType TypeOf(int i) {
  return i < 4 ? kDTypes[i] : static_cast<DType>(200);
}

std::string Describe(const Args& a, int n) {
  return "call " + std::to_string(static_cast<int>(a.call)) + " on " + std::to_string(n) +
         " ranks, dtype " + std::to_string(a.dtype) + ", m " + std::to_string(a.m) + ", k " +
         std::to_string(a.k) + ", n " + std::to_string(a.n) + ", batch " +
         std::to_string(a.batch) + ", h2 " + std::to_string(a.h2) + ", ld " +
         std::to_string(a.lda) + "/" + std::to_string(a.ldb) + "/" + std::to_string(a.ldc) +
         ", tokens " + std::to_string(a.tokens) + ", pipeline " +
         std::to_string(static_cast<int>(a.opts.pipeline)) + " s=" +
         std::to_string(a.opts.splits);
}

// Bytes of a stored rows x cols matrix with row stride ld (0: tight).
u128 MatrixBytes(size_t rows, size_t cols, size_t ld, size_t esize) {
  if (rows == 0 || cols == 0) return 0;
  const u128 stride = ld != 0 ? ld : cols;
  return ((static_cast<u128>(rows) - 1) * stride + cols) * esize;
}

// The buffers of one call: one per extent, chosen by the largest extent.
class Buffers {
 public:
  explicit Buffers(const std::vector<u128>& extents) {
    u128 largest = 0;
    for (u128 e : extents) largest = Max(largest, e);
    if (largest > kMaxBuffer) {
      must_throw_ = true;
      for (size_t i = 0; i < extents.size(); ++i) store_.emplace_back(kSmallBytes, 0);
    } else if (largest <= kRealBytes) {
      for (u128 e : extents) store_.emplace_back(static_cast<size_t>(e) + 1, 0);
    } else {
      must_throw_ = true;  // null buffers with sizes that are not zero
      null_ = true;
    }
  }
  bool must_throw() const { return must_throw_; }
  bool null() const { return null_; }
  void* at(size_t i) { return null_ ? nullptr : store_[i].data(); }
  float* f32(size_t i) { return static_cast<float*>(at(i)); }

 private:
  std::vector<std::vector<unsigned char>> store_;
  bool must_throw_ = false;
  bool null_ = false;
};

// Rank r's rows of MatmulReduceScatter: a valid partition of m.
size_t LocalRows(size_t m, int n, int r) { return m / n + (r == n - 1 ? m % n : 0); }

void RunGemm(const Args& a) {
  const DType ab = TypeOf(a.dtype);
  const DType c_type = a.c_dtype ? DType::kBF16 : DType::kF32;
  const size_t e = a.dtype < 4 ? mc2::DTypeSize(ab) : 1;
  const size_t ce = mc2::DTypeSize(c_type);
  const u128 ea = a.trans_a ? MatrixBytes(a.k, a.m, a.lda, e) : MatrixBytes(a.m, a.k, a.lda, e);
  const u128 eb = a.trans_b ? MatrixBytes(a.n, a.k, a.ldb, e) : MatrixBytes(a.k, a.n, a.ldb, e);
  const u128 ec = MatrixBytes(a.m, a.n, a.ldc, ce);
  Buffers buf({ea, eb, ec});
  mc2::GemmOptions o;
  o.trans_a = a.trans_a;
  o.trans_b = a.trans_b;
  o.lda = a.lda;
  o.ldb = a.ldb;
  o.ldc = a.ldc;
  mc2::Gemm(a.m, a.n, a.k, ab, buf.at(0), buf.at(1), c_type, buf.at(2), o);
  // An empty product needs no matrices (mc2/gemm.h): null ones may pass.
  const bool empty = a.m == 0 || a.n == 0;
  if (buf.must_throw() && !(buf.null() && empty)) Fail("Gemm accepted " + Describe(a, 1));
}

void RunDense(const mc2::Group& g, const Args& a) {
  const int n = g.size();
  const DType t = TypeOf(a.dtype);
  const size_t e = a.dtype < 4 ? mc2::DTypeSize(t) : 1;
  const u128 m = a.m, k = a.k, nn = a.n, rows = m * static_cast<u128>(n);
  // The gathered A (M x k, times the batch) is scratch the gathering
  // operators allocate themselves when the caller passes none: kept small
  // here like the caller's buffers (see kMoeMlp below).
  const u128 batch_rows = a.call == Call::kAllGatherBatchMatmul ? rows * a.batch : rows;
  if (batch_rows * k * e > kRealBytes) return;
  switch (a.call) {
    case Call::kAllGatherMatmul: {
      Buffers buf({m * k * e, k * nn * e, rows * nn * 4, a.flag ? rows * k * e : 0});
      mc2::AllGatherMatmul(g, {.a = buf.at(0), .b = buf.at(1), .c = buf.f32(2), .m = a.m,
                               .k = a.k, .n = a.n, .dtype = t,
                               .gathered_a = a.flag ? buf.at(3) : nullptr},
                           a.opts);
      if (buf.must_throw()) Fail("AllGatherMatmul accepted " + Describe(a, n));
      return;
    }
    case Call::kMatmulReduceScatter: {
      // Buffers by the largest rank's rows, so that every rank is in the
      // same regime (a rank alone with null buffers would leave the other
      // waiting in the operator's agreement step).
      const size_t local = LocalRows(a.m, n, g.rank());
      Buffers buf({m * k * e, k * nn * e, static_cast<u128>(LocalRows(a.m, n, n - 1)) * nn * 4});
      mc2::MatmulReduceScatter(g, {.a = buf.at(0), .b = buf.at(1), .c = buf.f32(2), .m = a.m,
                                   .k = a.k, .n = a.n, .dtype = t, .m_local = local},
                               a.opts);
      if (buf.must_throw()) Fail("MatmulReduceScatter accepted " + Describe(a, n));
      return;
    }
    case Call::kMatmulAllReduce: {
      Buffers buf({m * k * e, k * nn * e, m * nn * 4});
      mc2::MatmulAllReduce(g, {.a = buf.at(0), .b = buf.at(1), .c = buf.f32(2), .m = a.m,
                               .k = a.k, .n = a.n, .dtype = t},
                           a.opts);
      if (buf.must_throw()) Fail("MatmulAllReduce accepted " + Describe(a, n));
      return;
    }
    default: {  // kAllGatherBatchMatmul
      const u128 batch = a.batch;
      const auto layout = a.trans_b ? mc2::BatchB::kShared : mc2::BatchB::kPerBatch;
      const u128 b_entries = layout == mc2::BatchB::kShared ? 1 : batch;
      Buffers buf({batch * m * k * e, b_entries * k * nn * e, batch * rows * nn * 4,
                   a.flag ? batch * rows * k * e : 0});
      mc2::AllGatherBatchMatmul(g, {.a = buf.at(0), .b = buf.at(1), .c = buf.f32(2), .m = a.m,
                                    .k = a.k, .n = a.n, .dtype = t, .batch = a.batch,
                                    .b_layout = layout,
                                    .gathered_a = a.flag ? buf.at(3) : nullptr},
                                a.opts);
      if (buf.must_throw()) Fail("AllGatherBatchMatmul accepted " + Describe(a, n));
      return;
    }
  }
}

void RunMoe(const mc2::Group& g, const Args& a) {
  const int n = g.size();
  // The routing: token t's j-th choice is expert (t + j) % E, the same on
  // every rank; its ids are a real buffer only when they are small.
  const u128 id_bytes = static_cast<u128>(a.tokens) * static_cast<u128>(a.topk) * 4;
  std::vector<int32_t> ids;
  const int32_t* ids_ptr = nullptr;
  bool ids_must_throw = false;
  if (id_bytes > kMaxBuffer) {
    ids.assign(kSmallBytes / 4, 0);
    ids_ptr = ids.data();
    ids_must_throw = true;
  } else if (id_bytes <= kRealBytes) {
    for (size_t t = 0; t < a.tokens; ++t)
      for (int j = 0; j < a.topk; ++j) ids.push_back(static_cast<int32_t>((t + j) % a.experts));
    ids_ptr = ids.data();
  } else {
    ids_must_throw = true;
  }
  mc2::MoeRouting routing = mc2::MoeRoute(g, ids_ptr, a.tokens, a.topk, a.experts);
  if (ids_must_throw) Fail("MoeRoute accepted " + Describe(a, n));

  const DType t = TypeOf(a.dtype);
  const size_t e = a.dtype < 4 ? mc2::DTypeSize(t) : 1;
  // Buffers by the most rows any rank receives, so that every rank is in
  // the same regime.
  int64_t most = static_cast<int64_t>(routing.num_received());
  mc2::AllReduce(g, &most, &most, 1, DType::kI64, mc2::ReduceOp::kMax).Wait();
  const u128 tokens = a.tokens, got = static_cast<u128>(most), k = a.k, nn = a.n;
  const u128 local_experts = static_cast<u128>(routing.experts_per_rank);
  switch (a.call) {
    case Call::kAllToAllMatmul: {
      Buffers buf({tokens * k * e, local_experts * k * nn * e, got * nn * 4,
                   a.flag ? got * k * e : 0});
      mc2::AllToAllMatmul(g, routing,
                          {.a = buf.at(0), .b = buf.at(1), .c = buf.f32(2), .k = a.k, .n = a.n,
                           .dtype = t, .dispatched_a = a.flag ? buf.at(3) : nullptr},
                          a.opts);
      if (buf.must_throw()) Fail("AllToAllMatmul accepted " + Describe(a, n));
      return;
    }
    case Call::kMatmulAllToAll: {
      const u128 topk = static_cast<u128>(a.topk);
      Buffers buf({got * k * e, local_experts * k * nn * e, tokens * nn * 4,
                   a.flag ? tokens * topk * 4 : 0});
      mc2::MatmulAllToAll(g, routing,
                          {.a = buf.at(0), .b = buf.at(1), .c = buf.f32(2), .k = a.k, .n = a.n,
                           .dtype = t, .probs = a.flag ? buf.f32(3) : nullptr},
                          a.opts);
      if (buf.must_throw()) Fail("MatmulAllToAll accepted " + Describe(a, n));
      return;
    }
    default: {  // kMoeMlp: d = k, h1 = n, h2; the identity activation
      const u128 h2 = a.h2;
      // The hidden rows (received rows x h1, x h2, f32) are scratch the
      // operator allocates itself, beyond the caller's buffers: kept small
      // here like those, as an allocation the size of the machine would
      // only fail in the allocator (std::bad_alloc), not in the checks.
      if (got * nn * 4 > kRealBytes || got * h2 * 4 > kRealBytes) return;
      Buffers buf({tokens * k * e, local_experts * k * nn * e, local_experts * h2 * k * e,
                   tokens * k * 4});
      mc2::MoeMlp(g, routing,
                  {.a = buf.at(0), .w1 = buf.at(1), .w2 = buf.at(2), .c = buf.f32(3), .d = a.k,
                   .h1 = a.n, .h2 = a.h2, .dtype = t},
                  a.opts);
      if (buf.must_throw()) Fail("MoeMlp accepted " + Describe(a, n));
      return;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader in(data, size);
  const int n = 1 + in.U8() % 2;
  std::vector<Args> calls;
  while (!in.empty() && static_cast<int>(calls.size()) < kMaxCalls) calls.push_back(Decode(in));
  RunCalls(
      n, calls,
      [](const mc2::Group& g, const Args& a) {
        if (a.call == Call::kGemm)
          RunGemm(a);
        else if (a.call <= Call::kAllGatherBatchMatmul)
          RunDense(g, a);
        else
          RunMoe(g, a);
      },
      Describe);
  return 0;
}
