// The MoE operators' shared pieces (moe_common.h): the plan, the block
// exchanges, the fused dispatch, the combine.
#include "ops/moe_common.h"

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

namespace mc2::moe {
namespace {

// What every rank publishes at the start of a dispatch or combine.
struct MoeMsg {
  uint64_t op;  // 1 dispatch, 2 combine, 3 MLP
  uint64_t dtype;
  uint64_t d;
  uint64_t h;
  uint64_t h2;  // the MLP's second hidden width (0 for the others)
  uint64_t num_experts;
  uint64_t topk;
  uint64_t fingerprint;
  uint64_t pipeline_splits;
  uint64_t link_bw;     // emulated link bytes/s (0: none): auto depends on it
  uint64_t model_hash;  // the operator tuning in effect: auto depends on it
  uint64_t error;
};

uint64_t OpCode(const char* op) { return op == kDispatchName ? 1 : op == kCombineName ? 2 : 3; }
const char* OpOfCode(uint64_t code) {
  return code == 1 ? kDispatchName : code == 2 ? kCombineName : kMlpName;
}

}  // namespace

MoePlan MakeMoePlan(const Group& g, const char* op, const MoeRouting& r, DType dtype, size_t d,
                    size_t h, const std::string& local_error, const FusedOptions& o, size_t h2) {
  MoeMsg mine{};
  mine.op = OpCode(op);
  mine.dtype = static_cast<uint64_t>(dtype);
  mine.d = d;
  mine.h = h;
  mine.h2 = h2;
  mine.num_experts = static_cast<uint64_t>(std::max(r.num_experts, 0));
  mine.topk = static_cast<uint64_t>(std::max(r.topk, 0));
  // Recomputed, not taken from the routing: a routing whose counts were
  // changed on one rank must fail everywhere, not leave messages of the
  // wrong size in flight.
  mine.fingerprint =
      local_error.empty() ? RoutingFingerprint(r.ranks, r.num_experts, r.topk, r.counts) : 0;
  mine.pipeline_splits = fused::PackPipelineSplits(o);
  if (g.valid()) {
    const ops::Environment env = fused::ModelEnvironment(g, o.timeout);
    mine.link_bw = static_cast<uint64_t>(env.link_bytes_per_second);
    mine.model_hash = fused::ModelHash(env);
  }
  const ops::CostParams& params = ops::LoadedCostParams();
  std::vector<MoeMsg> all =
      fused::ExchangeArgs(g, op, mine, local_error, &MoeMsg::error, o.timeout);
  MoePlan p;
  p.op = op;
  p.rank = g.rank();
  p.size = g.size();
  for (size_t q = 1; q < all.size(); ++q) {
    if (all[q].op != all[0].op) {
      fused::Fail(ErrorCode::kMismatch, op, p.rank,
                  "ranks called different operators: rank 0 " + std::string(OpOfCode(all[0].op)) +
                      ", rank " + std::to_string(q) + " " + OpOfCode(all[q].op));
    }
  }
  auto same = [&](const char* what, auto get) { fused::RequireSame(all, op, p.rank, what, get); };
  same("dtype", [](const MoeMsg& m) { return m.dtype; });
  same("d (model dimension)", [](const MoeMsg& m) { return m.d; });
  same(op == kMlpName ? "h1 (w1's columns)" : "h (expert hidden dimension)",
       [](const MoeMsg& m) { return m.h; });
  same("h2 (w2's rows)", [](const MoeMsg& m) { return m.h2; });
  same("num_experts", [](const MoeMsg& m) { return m.num_experts; });
  same("topk", [](const MoeMsg& m) { return m.topk; });
  same("routing fingerprint (routings of different batches?)",
       [](const MoeMsg& m) { return m.fingerprint; });
  fused::RequireSameSettings(all, op, p.rank);

  const int P = p.size, me = p.rank;
  p.dtype = dtype;
  p.esize = DTypeSize(dtype);
  p.d = d;
  p.h = h;
  p.h2 = h2;
  p.E = static_cast<size_t>(r.num_experts);
  p.El = r.experts_per_rank;
  const size_t El = static_cast<size_t>(p.El);
  p.in_cnt.resize(P * El);
  p.in_src.resize(P * El);
  p.in_exp.resize(P * El);
  p.in_blk.assign(P, 0);
  p.in_blk_off.resize(P);
  p.out_blk.assign(P, 0);
  p.out_blk_off.resize(P);
  for (int q = 0; q < P; ++q) {
    p.in_blk_off[q] = p.R;
    for (size_t le = 0; le < El; ++le) {
      size_t c = r.counts[q * p.E + me * El + le];
      p.in_cnt[q * El + le] = c;
      p.in_src[q * El + le] = p.R;
      p.R += c;
      p.in_blk[q] += c;
    }
    p.out_blk_off[q] = p.S;
    for (size_t le = 0; le < El; ++le) p.out_blk[q] += r.counts[me * p.E + q * El + le];
    p.S += p.out_blk[q];
  }
  p.flow.assign(size_t(P) * P, 0);
  p.load.assign(P, 0);
  for (int a = 0; a < P; ++a) {
    for (int b = 0; b < P; ++b) {
      for (size_t le = 0; le < El; ++le) p.flow[a * P + b] += r.counts[a * p.E + b * El + le];
      p.load[b] += p.flow[a * P + b];
    }
  }
  size_t at = 0;
  for (size_t le = 0; le < El; ++le) {
    for (int q = 0; q < P; ++q) {
      p.in_exp[q * El + le] = at;
      at += p.in_cnt[q * El + le];
    }
  }
  p.pipeline = static_cast<Pipeline>(all[0].pipeline_splits >> 32);
  p.splits = static_cast<int>(all[0].pipeline_splits & 0xffffffff);
  if (p.pipeline == Pipeline::kAuto) {
    // From the count matrix, d, h and the link: the same on every rank. The
    // busiest rank's GEMM rows (load) and port bytes (the rows it sends to
    // others: flow out in the dispatch, flow in for the combine; both
    // directions move rows in dtype; the MLP both: its dispatch and its
    // combine share the port, and it runs two GEMMs per row).
    const bool dispatch = op == kDispatchName, mlp = op == kMlpName;
    double rows = 0, port = 0;
    for (int a = 0; a < P; ++a) {
      double out = 0;
      for (int b = 0; b < P; ++b) {
        if (b == a) continue;
        if (dispatch || mlp) out += p.flow[a * P + b];
        if (!dispatch || mlp) out += p.flow[b * P + a];
      }
      rows = std::max(rows, double(p.load[a]));
      port = std::max(port, out * d * p.esize);
    }
    // Fused rather than chunked: it sends one block per port at a time, so
    // the first blocks arrive early. Calls: a GEMM per local expert per
    // chunk.
    ops::SplitProblem sp;
    sp.dtype = dtype;
    sp.ranks = P;
    sp.rows = rows;
    // The MLP's two GEMMs (rows x d x h, rows x h2 x d) have the flops of
    // one rows x d x (h + h2), in twice the calls.
    sp.n = double(h + (mlp ? h2 : 0));
    sp.k = double(d);
    sp.fixed_calls = (mlp ? 2 : 1) * p.El;
    sp.calls_per_stage = (mlp ? 2 : 1) * p.El;
    sp.exposed_stages = mlp ? 2 : 1;
    sp.blocks = P - 1;
    sp.port_bytes = port;
    sp.link_bytes_per_second = double(all[0].link_bw);
    ops::Choice c = ops::ChooseSplitPipeline(params, sp);
    p.pipeline = c.pipeline;
    p.splits = c.splits;
  }
  fused::FinishPlan(g, o, p);
  return p;
}

// One direction of an all-to-all-v over the point-to-point channels: the
// rows of `rows[q]` starting at row `first[q]` of `base` go to (or come from)
// every other rank q. Chunk j of s posts rows [ChunkLo(rows, j, s),
// ChunkLo(rows, j + 1, s)) of each block, in ring order (to r+1, r+2, ...;
// from r-1, r-2, ...). Both ends compute the same sizes from the routing,
// so empty messages are skipped alike. Returns the posted works per rank.
std::vector<Work> PostBlocks(const Group& g, const MoePlan& p, bool send, internal::InternalTag tag,
                             char* base, const std::vector<size_t>& rows,
                             const std::vector<size_t>& first, size_t row_bytes, int j, int s,
                             Pending& pend) {
  std::vector<Work> works(p.size);
  for (int i = 1; i < p.size; ++i) {
    int q = fused::Mod(send ? p.rank + i : p.rank - i, p.size);
    size_t lo = ChunkLo(rows[q], j, s), hi = ChunkLo(rows[q], j + 1, s);
    if ((hi - lo) * row_bytes == 0) continue;
    char* at = base + (first[q] + lo) * row_bytes;
    works[q] = send ? internal::Channel::Of(g).Send(at, (hi - lo) * row_bytes, q, tag)
                    : internal::Channel::Of(g).Recv(at, (hi - lo) * row_bytes, q, tag);
    pend.Add(works[q]);
  }
  return works;
}

// rows x n (c_type: f32, or bf16 rounded from f32 sums) = A (rows x k,
// dtype) * W (k x n); zeros when k == 0.
void ExpertGemm(const MoePlan& p, const char* name, size_t rows, size_t n, size_t k, const char* a,
                const char* w, void* c, DType c_type) {
  if (rows == 0 || n == 0) return;
  OpSpan span(name, trace::Category::kCompute, p.pipeline,
              static_cast<uint64_t>(GemmFlops(rows, n, k)));
  if (k == 0) {
    std::memset(c, 0, rows * n * DTypeSize(c_type));  // 0.0 in f32 and bf16
    return;
  }
  p.gemms.Gemm(rows, n, k, a, w, c_type, c);
}

// Rows local expert `le` receives from every rank: rows [in_exp[le],
// in_exp[le] + ExpertRows) in expert-grouped order.
size_t ExpertRows(const MoePlan& p, int le) {
  size_t rows = 0;
  for (int q = 0; q < p.size; ++q) rows += p.in_cnt[q * p.El + le];
  return rows;
}

// Rows of d (dtype) between source-major order (`source_major`: the
// blocks as the all-to-all moves them) and expert-grouped order
// (`grouped`), one way or the other.
void SortRows(const MoePlan& p, const char* span_name, bool to_grouped, char* source_major,
              char* grouped) {
  const size_t rb = p.d * p.esize;
  if (rb == 0) return;
  OpSpan span(span_name, trace::Category::kHost, p.pipeline);
  for (int q = 0; q < p.size; ++q) {
    ForSubBlocks(p, q, 0, p.in_blk[q], [&](int, size_t a, size_t b, size_t at) {
      char* src = source_major + (p.in_blk_off[q] + a) * rb;
      char* grp = grouped + at * rb;
      if (to_grouped)
        std::memcpy(grp, src, (b - a) * rb);
      else
        std::memcpy(src, grp, (b - a) * rb);
    });
  }
}

// A serial pipeline's all-to-all-v, every block at once: block q of `send`
// (send_blk[q] rows from row send_off[q]) to rank q, block q of `recv`
// (recv_blk, recv_off) from rank q, the own block copied; then waits for
// all of it. The dispatch sends the token side's blocks and receives the
// expert side's; the combine the other way round.
void ExchangeAllBlocks(const Group& g, const MoePlan& p, internal::InternalTag tag,
                       const char* send, const std::vector<size_t>& send_blk,
                       const std::vector<size_t>& send_off, char* recv,
                       const std::vector<size_t>& recv_blk, const std::vector<size_t>& recv_off,
                       const char* wait_name, Pending& pend) {
  const size_t rb = p.d * p.esize;
  const int me = p.rank;
  PostBlocks(g, p, false, tag, recv, recv_blk, recv_off, rb, 0, 1, pend);
  PostBlocks(g, p, true, tag, const_cast<char*>(send), send_blk, send_off, rb, 0, 1, pend);
  if (recv_blk[me] * rb > 0)
    std::memcpy(recv + recv_off[me] * rb, send + send_off[me] * rb, recv_blk[me] * rb);
  OpSpan wait(wait_name, trace::Category::kWait, p.pipeline);
  pend.WaitAll();
}

// Every chunk of the dispatch posted at once: messages to one peer go in
// posting order, so chunk j of every block moves before chunk j+1. Returns
// the receives, [chunk][source rank].
std::vector<std::vector<Work>> PostChunkedDispatch(const Group& g, const MoePlan& p, const char* xs,
                                                   char* xr, Pending& pend) {
  const size_t rb = p.d * p.esize;
  std::vector<std::vector<Work>> recv(p.splits);
  for (int j = 0; j < p.splits; ++j) {
    recv[j] =
        PostBlocks(g, p, false, kDispatchTag, xr, p.in_blk, p.in_blk_off, rb, j, p.splits, pend);
    PostBlocks(g, p, true, kDispatchTag, const_cast<char*>(xs), p.out_blk, p.out_blk_off, rb, j,
               p.splits, pend);
  }
  return recv;
}

// Waits for one posted transfer, running the overlap work first if the
// transfer has not completed.
void WaitOne(const MoePlan& p, fused::OverlapWork* overlap, const char* wait_name, Work& w) {
  overlap->RunBefore(w);
  OpSpan wait(wait_name, trace::Category::kWait, p.pipeline);
  w.Wait();
}

// A pipeline's last wait: the overlap work runs before it unless every
// transfer already completed.
void WaitAllAfterOverlap(const MoePlan& p, fused::OverlapWork* overlap, const char* wait_name,
                         Pending& pend) {
  for (size_t i = 0; i < pend.size(); ++i) overlap->RunBefore(pend[i]);
  OpSpan wait(wait_name, trace::Category::kWait, p.pipeline);
  pend.WaitAll();
}

// The ranks `from` sends its blocks to, busiest receiver first (most
// expert rows: its GEMMs are the longest, so its first rows are the most
// urgent), ties in step order (from+1, from+2, ...). Every rank computes
// every rank's order alike.
std::vector<int> DispatchSendOrder(const MoePlan& p, int from) {
  const int P = p.size;
  std::vector<int> order;
  for (int i = 1; i < P; ++i) order.push_back(fused::Mod(from + i, P));
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p.load[a] > p.load[b]; });
  return order;
}

// The fused pipeline's dispatch (see the top), shared by AllToAllMatmul
// and MoeMlp: every receive posted up front, this rank's blocks sent one
// at a time in DispatchSendOrder; calls chunk(q, lo, hi) for rows [lo, hi)
// of the block from rank q as they arrive, the earliest due first, the
// chunks from one rank in order (the MLP sends each back when done, and
// its owner matches them in order), and own(lo, hi) for the own rows:
// with own_parts = 1 all of them first; else in own_parts chunks, one
// whenever no other rank's chunk is there, the rest at the end (the MLP:
// other ranks' rows first, as their results must travel home).
void RunFusedDispatch(const Group& g, const MoePlan& p, const char* xs, char* xr,
                      const char* wait_name, fused::OverlapWork* overlap, Pending& pend,
                      const std::function<void(size_t, size_t)>& own,
                      const std::function<void(int, size_t, size_t)>& chunk, int own_parts) {
  const int P = p.size, me = p.rank, s = p.splits;
  const size_t rb = p.d * p.esize;
  // Every chunk's receive up front, listed in the order they are due:
  // chunk j of the block from rank q after the rows q sends before its end
  // (every port moves rows at the same rate).
  struct Due {
    size_t row;  // rows its sender sends before its end
    int step, q, j;
    Work work;
    bool done = false;
  };
  std::vector<Due> due;
  for (int i = 1; i < P; ++i) {
    const int q = fused::Mod(me - i, P);
    size_t before = 0;
    for (int dst : DispatchSendOrder(p, q)) {
      if (dst == me) break;
      before += p.flow[q * P + dst];
    }
    for (int j = 0; j < s; ++j) {
      size_t lo = ChunkLo(p.in_blk[q], j, s), hi = ChunkLo(p.in_blk[q], j + 1, s);
      if ((hi - lo) * rb == 0) continue;
      Work w = internal::Channel::Of(g).Recv(xr + (p.in_blk_off[q] + lo) * rb, (hi - lo) * rb, q,
                                             kDispatchTag);
      pend.Add(w);
      due.push_back({before + hi, i, q, j, std::move(w)});
    }
  }
  std::stable_sort(due.begin(), due.end(), [](const Due& a, const Due& b) {
    return std::tie(a.row, a.step) < std::tie(b.row, b.step);
  });
  // One block at a time on this rank's port, in DispatchSendOrder: the next
  // block is posted once the last one is all in the channel (the engine
  // sends in posting order, but a block larger than the channel would
  // otherwise let the next one in between its chunks).
  const std::vector<int> order = DispatchSendOrder(p, me);
  size_t next = 0;
  std::vector<Work> sending;
  auto post_ready = [&] {
    while (next < order.size() &&
           std::all_of(sending.begin(), sending.end(), [](const Work& w) { return w.Test(); })) {
      const int dst = order[next++];
      sending.clear();
      for (int j = 0; j < s; ++j) {
        size_t lo = ChunkLo(p.out_blk[dst], j, s), hi = ChunkLo(p.out_blk[dst], j + 1, s);
        if ((hi - lo) * rb == 0) continue;
        sending.push_back(internal::Channel::Of(g).Send(xs + (p.out_blk_off[dst] + lo) * rb,
                                                        (hi - lo) * rb, dst, kDispatchTag));
        pend.Add(sending.back());
      }
    }
  };
  // A chunk may go once the earlier chunks from its rank went (they come
  // before it in `due`).
  auto ready = [&](size_t c) {
    for (size_t e = 0; e < c; ++e)
      if (due[e].q == due[c].q && !due[e].done) return false;
    return true;
  };
  // The first ready chunk in due order that has arrived, or due.size().
  auto arrived = [&] {
    for (size_t c = 0; c < due.size(); ++c)
      if (!due[c].done && ready(c) && due[c].work.Test()) return c;
    return due.size();
  };
  int own_done = 0;
  auto own_next = [&] {
    const size_t rows = p.in_blk[me];
    own(ChunkLo(rows, own_done, own_parts), ChunkLo(rows, own_done + 1, own_parts));
    ++own_done;
  };
  post_ready();
  if (own_parts == 1) own_next();
  // Chunks are multiplied as they arrive, the earliest due first: a
  // sender that started late (descheduled, on a shared core) holds up only
  // its own chunks. Results do not depend on the order (see the top).
  for (size_t left = due.size(); left > 0; --left) {
    post_ready();
    size_t c = arrived();
    if (c == due.size() && own_done < own_parts) {
      own_next();
      ++left;  // no chunk taken
      continue;
    }
    if (c == due.size()) {
      size_t first = 0;
      while (due[first].done) ++first;
      overlap->RunBefore(due[first].work);
      OpSpan wait(wait_name, trace::Category::kWait, p.pipeline);
      // Wakes every millisecond to post the next block and to look for a
      // chunk that came in before the first due.
      while (!due[first].work.Wait(std::chrono::milliseconds(1))) {
        post_ready();
        if ((c = arrived()) != due.size()) break;
      }
      if (c == due.size()) c = first;
    }
    due[c].work.Wait();  // throws its error, if it failed
    due[c].done = true;
    const int q = due[c].q;
    chunk(q, ChunkLo(p.in_blk[q], due[c].j, s), ChunkLo(p.in_blk[q], due[c].j + 1, s));
  }
  while (own_done < own_parts) own_next();
  while (next < order.size()) {
    for (const Work& w : sending) w.Wait();
    post_ready();
  }
}

// out[t] = sum over j ascending of probs[t, j] * Yr[row of slot (t, j)]
// (Yr rows of dtype, widened to f32).
void Combine(const MoePlan& p, const MoeRouting& r, const char* yr, const float* probs,
             float* out) {
  if (p.d == 0) return;
  OpSpan span(p.op == kMlpName ? "moe_mlp.combine" : "matmul_all_to_all.combine",
              trace::Category::kHost, p.pipeline);
  const size_t topk = static_cast<size_t>(r.topk);
  std::vector<int64_t> row_of(r.num_tokens * topk, -1);
  for (size_t pos = 0; pos < r.send_slots.size(); ++pos) row_of[r.send_slots[pos]] = pos;
  for (size_t t = 0; t < r.num_tokens; ++t) {
    float* o = out + t * p.d;
    std::fill(o, o + p.d, 0.0f);
    for (size_t j = 0; j < topk; ++j) {
      int64_t row = row_of[t * topk + j];
      if (row < 0) continue;
      const float wgt = probs ? probs[t * topk + j] : 1.0f;
      if (p.dtype == DType::kBF16) {
        const auto* y = reinterpret_cast<const uint16_t*>(yr) + row * p.d;
        for (size_t c = 0; c < p.d; ++c) o[c] += wgt * core::BF16ToF32(y[c]);
      } else {
        const auto* y = reinterpret_cast<const float*>(yr) + row * p.d;
        for (size_t c = 0; c < p.d; ++c) o[c] += wgt * y[c];
      }
    }
  }
}

// The send buffer: x's rows in send order (one copy of the routed tokens).
void PackSendRows(const MoePlan& p, const MoeRouting& routing, const void* x, char* xs,
                  const char* span) {
  OpSpan pack(span, trace::Category::kHost, p.pipeline);
  const size_t rb = p.d * p.esize;
  const char* src = static_cast<const char*>(x);
  for (size_t pos = 0; pos < p.S && rb > 0; ++pos) {
    std::memcpy(xs + pos * rb, src + (routing.send_slots[pos] / routing.topk) * rb, rb);
  }
}

}  // namespace mc2::moe
