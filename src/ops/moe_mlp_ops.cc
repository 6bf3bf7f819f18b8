// MoeMlp (include/mc2/moe.h): the MoE layer's dispatch, two expert GEMMs
// with the activation between them, and the combine, in one pipeline (see
// the top of moe_ops.cc for the layout and the pipelines).
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/reduce.h"
#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/ops.h"
#include "ops/cost_model.h"
#include "ops/fused_common.h"
#include "ops/gemm.h"
#include "ops/moe_common.h"

namespace mc2 {
namespace moe {
namespace {

// ------------------------------------------------------------------ MLP
struct MlpArgs {
  const char* w1;
  const char* w2;
  const MoeActivation* act;  // empty: identity
  const char* xs;            // tokens in send order
  char* xr;                  // received tokens, source-major
  char* dx;                  // received tokens, expert-grouped (saved), or null
  float* y1;                 // [R x h] f32, expert-grouped
  float* act_out;            // [R x h2] f32 scratch (bf16 only; f32 acts into hidden)
  char* hidden;              // [R x h2] of dtype, expert-grouped
  char* ys;                  // results for other ranks, source-major
  char* yr;                  // results back home, in send order
  fused::OverlapWork* overlap;
};

// hidden rows [at, at + rows) = act(y1 rows), rounded to dtype.
void Activate(const MoePlan& p, const MlpArgs& x, size_t at, size_t rows) {
  if (rows == 0 || p.h2 == 0) return;
  OpSpan span("moe_mlp.activation", trace::Category::kCompute, p.pipeline);
  const float* in = x.y1 + at * p.h;
  const bool f32 = p.dtype == DType::kF32;
  float* o;
  if (!*x.act && !f32) {
    o = const_cast<float*>(in);  // identity: round y1 itself (act_out is not allocated)
  } else {
    o = f32 ? reinterpret_cast<float*>(x.hidden) + at * p.h2 : x.act_out + at * p.h2;
    if (*x.act)
      (*x.act)(in, rows, o);
    else
      std::memcpy(o, in, rows * p.h2 * sizeof(float));
  }
  if (!f32) {
    auto* b = reinterpret_cast<uint16_t*>(x.hidden) + at * p.h2;
    for (size_t i = 0; i < rows * p.h2; ++i) b[i] = core::F32ToBF16(o[i]);
  }
}

// Rows [lo, hi) of the block from rank q (tokens at `in`, rows of d): both
// GEMMs and the activation, the products into `out` (rows of d, dtype; the
// same rows of the block).
void MlpRows(const MoePlan& p, const MlpArgs& x, int q, const char* in, char* out, size_t lo,
             size_t hi) {
  const size_t rb = p.d * p.esize;
  ForSubBlocks(p, q, lo, hi, [&](int le, size_t a, size_t b, size_t at) {
    const size_t rows = b - a;
    ExpertGemm(p, "moe_mlp.gemm1", rows, p.h, p.d, in + a * rb, x.w1 + le * p.d * p.h * p.esize,
               x.y1 + at * p.h);
    if (x.dx && rows * rb > 0) std::memcpy(x.dx + at * rb, in + a * rb, rows * rb);
    Activate(p, x, at, rows);
    ExpertGemm(p, "moe_mlp.gemm2", rows, p.d, p.h2, x.hidden + at * p.h2 * p.esize,
               x.w2 + le * p.h2 * p.d * p.esize, out + a * rb, p.dtype);
  });
}

// Rows [lo, hi) of the block from rank q, computed and sent back.
void MlpChunk(const Group& g, const MoePlan& p, const MlpArgs& x, int q, size_t lo, size_t hi,
              Pending& pend) {
  const size_t rb = p.d * p.esize;
  char* out = x.ys + p.in_blk_off[q] * rb;
  MlpRows(p, x, q, x.xr + p.in_blk_off[q] * rb, out, lo, hi);
  if ((hi - lo) * rb > 0)
    pend.Add(internal::Channel::Of(g).Send(out + lo * rb, (hi - lo) * rb, q, kCombineTag));
}

// Rows [lo, hi) of the own block: from the packed tokens straight into Yr.
void MlpOwnRows(const MoePlan& p, const MlpArgs& x, size_t lo, size_t hi) {
  const size_t rb = p.d * p.esize;
  MlpRows(p, x, p.rank, x.xs + p.out_blk_off[p.rank] * rb, x.yr + p.out_blk_off[p.rank] * rb, lo,
          hi);
}

// The combine's receives, chunk j of every block from every rank for j <
// s, posted up front: each expert rank sends a block's chunks in order.
void PostCombineReceives(const Group& g, const MoePlan& p, const MlpArgs& x, Pending& pend) {
  for (int j = 0; j < p.splits; ++j) {
    PostBlocks(g, p, false, kCombineTag, x.yr, p.out_blk, p.out_blk_off, p.d * p.esize, j, p.splits,
               pend);
  }
}

// The classic sequence: all-to-all-v, sort by expert, the first GEMM per
// expert, the activation, the second GEMM per expert, sort back to
// source-major, all-to-all-v back.
void MlpSerial(const Group& g, const MoePlan& p, const MlpArgs& x, Pending& pend) {
  const size_t rb = p.d * p.esize;
  ExchangeAllBlocks(g, p, kDispatchTag, x.xs, p.out_blk, p.out_blk_off, x.xr, p.in_blk,
                    p.in_blk_off, "moe_mlp.wait", pend);
  SortRows(p, "moe_mlp.sort", true, x.xr, x.dx);
  for (int le = 0; le < p.El; ++le) {
    ExpertGemm(p, "moe_mlp.gemm1", ExpertRows(p, le), p.h, p.d, x.dx + p.in_exp[le] * rb,
               x.w1 + le * p.d * p.h * p.esize, x.y1 + p.in_exp[le] * p.h);
  }
  Activate(p, x, 0, p.R);
  fused::Scratch<char> ye(p.R * rb);  // the second GEMM's rows, expert-grouped
  for (int le = 0; le < p.El; ++le) {
    ExpertGemm(p, "moe_mlp.gemm2", ExpertRows(p, le), p.d, p.h2,
               x.hidden + p.in_exp[le] * p.h2 * p.esize, x.w2 + le * p.h2 * p.d * p.esize,
               ye.data() + p.in_exp[le] * rb, p.dtype);
  }
  SortRows(p, "moe_mlp.sort", false, x.ys, ye.data());
  // Serial never overlaps: the overlap work runs after the call (CompleteOp).
  ExchangeAllBlocks(g, p, kCombineTag, x.ys, p.in_blk, p.in_blk_off, x.yr, p.out_blk, p.out_blk_off,
                    "moe_mlp.wait", pend);
}

// Every chunk posted at once (as DispatchChunked); chunk j of every block,
// in ring order, computed and sent back as it arrives; the own rows in
// between (they need no transfer either way).
void MlpChunked(const Group& g, const MoePlan& p, const MlpArgs& x, Pending& pend) {
  const int P = p.size, me = p.rank, s = p.splits;
  PostCombineReceives(g, p, x, pend);
  std::vector<std::vector<Work>> recv = PostChunkedDispatch(g, p, x.xs, x.xr, pend);
  // The own rows in s + 1 parts: one before the first chunks arrive, one
  // after each round of chunks, the last under the last results' return.
  auto own = [&](int part) {
    MlpOwnRows(p, x, ChunkLo(p.in_blk[me], part, s + 1), ChunkLo(p.in_blk[me], part + 1, s + 1));
  };
  own(0);
  for (int j = 0; j < s; ++j) {
    for (int i = 1; i < P; ++i) {
      int q = fused::Mod(me - i, P);
      WaitOne(p, x.overlap, "moe_mlp.wait", recv[j][q]);
      MlpChunk(g, p, x, q, ChunkLo(p.in_blk[q], j, s), ChunkLo(p.in_blk[q], j + 1, s), pend);
    }
    own(j + 1);
  }
  WaitAllAfterOverlap(p, x.overlap, "moe_mlp.wait", pend);
}

// AllToAllMatmul's fused dispatch; each chunk sent back as soon as its
// GEMMs are done, so the combine moves under the remaining chunks' GEMMs.
void MlpFused(const Group& g, const MoePlan& p, const MlpArgs& x, Pending& pend) {
  PostCombineReceives(g, p, x, pend);
  // Results are sent as soon as they are done, queued behind any dispatch
  // block posted before them. (Holding them until this rank had posted all
  // its dispatch blocks, which feed other ranks' GEMMs, gains nothing.)
  RunFusedDispatch(
      g, p, x.xs, x.xr, "moe_mlp.wait", x.overlap, pend,
      [&](size_t lo, size_t hi) { MlpOwnRows(p, x, lo, hi); },
      [&](int q, size_t lo, size_t hi) { MlpChunk(g, p, x, q, lo, hi, pend); }, p.splits);
  WaitAllAfterOverlap(p, x.overlap, "moe_mlp.wait", pend);
}

}  // namespace
}  // namespace moe

using moe::CheckMoeArgs;
using moe::Combine;
using moe::kMlpName;
using moe::MlpArgs;
using moe::MlpChunked;
using moe::MlpFused;
using moe::MlpSerial;
using moe::MoePlan;
using moe::MoeSizes;
using moe::PackSendRows;
using moe::Pending;
using moe::RunMoeOp;
using moe::Str;

FusedReport MoeMlp(const Group& g, const MoeRouting& routing, const MoeMlpArgs& args,
                   const FusedOptions& options) {
  // The fields under local names (references, not a structured binding:
  // clang 14 lets no lambda capture one).
  const auto& x = args.a;
  const auto& w1 = args.w1;
  const auto& w2 = args.w2;
  const auto& out = args.c;
  const auto& d = args.d;
  const auto& h1 = args.h1;
  const auto& h2 = args.h2;
  const auto& dtype = args.dtype;
  const auto& act = args.act;
  const auto& probs = args.probs;
  const auto& saved = args.saved;
  std::string err = CheckMoeArgs(g, routing, dtype, [&](const MoeSizes& z) {
    return fused::ArgChecks(
        dtype, options,
        {{"x (num_tokens x args.d)", {z.T, d, z.es}},
         {"w1 (experts_per_rank x args.d x args.h1)", {z.El, d, h1, z.es}},
         {"w2 (experts_per_rank x args.h2 x args.d)", {z.El, h2, d, z.es}},
         {"the hidden rows (received rows x args.h1)", {z.R, h1, sizeof(float)}},
         {"the hidden rows (received rows x args.h2)", {z.R, h2, sizeof(float)}},
         {"the dispatched x (received rows x args.d)", {z.R, d, sizeof(float)}},
         {"out (num_tokens x args.d)", {z.T, d, sizeof(float)}}},
        {{x == nullptr && z.T > 0 && d > 0, "args.a"},
         {w1 == nullptr && z.El > 0 && d > 0 && h1 > 0, "args.w1"},
         {w2 == nullptr && z.El > 0 && h2 > 0 && d > 0, "args.w2"},
         {out == nullptr && z.T > 0 && d > 0, "args.c"}});
  });
  if (err.empty() && !act && h1 != h2) {
    err = "args.act is null (the identity), so args.h2 (" + Str(h2) + ") must equal args.h1 (" +
          Str(h1) + ")";
  }
  return RunMoeOp(g, kMlpName, routing, dtype, d, h1, h2, err, options,
                  [&](const MoePlan& p, fused::OverlapWork& overlap, Pending& pend) {
                    const size_t rb = p.d * p.esize;
                    fused::Scratch<char> xs(p.S * rb), xr(p.R * rb), ys(p.R * rb), yr(p.S * rb),
                        own_dx, own_hidden;
                    fused::Scratch<float> own_y1, act_out;
                    PackSendRows(p, routing, x, xs.data(), "moe_mlp.pack");
                    MlpArgs a{static_cast<const char*>(w1),
                              static_cast<const char*>(w2),
                              &act,
                              xs.data(),
                              xr.data(),
                              static_cast<char*>(saved.dispatched_x),
                              saved.y1,
                              nullptr,
                              static_cast<char*>(saved.hidden),
                              ys.data(),
                              yr.data(),
                              &overlap};
                    if (a.y1 == nullptr) {
                      own_y1.Resize(p.R * p.h);
                      a.y1 = own_y1.data();
                    }
                    if (a.hidden == nullptr) {
                      own_hidden.Resize(p.R * p.h2 * p.esize);
                      a.hidden = own_hidden.data();
                    }
                    if (p.dtype != DType::kF32 && act) {
                      act_out.Resize(p.R * p.h2);
                      a.act_out = act_out.data();
                    }
                    if (p.pipeline == Pipeline::kSerial) {
                      if (a.dx == nullptr) {  // serial sorts the received rows by expert
                        own_dx.Resize(p.R * rb);
                        a.dx = own_dx.data();
                      }
                      MlpSerial(g, p, a, pend);
                    } else if (p.pipeline == Pipeline::kChunked) {
                      MlpChunked(g, p, a, pend);
                    } else {
                      MlpFused(g, p, a, pend);
                    }
                    Combine(p, routing, yr.data(), probs, out);
                  });
}

}  // namespace mc2
