// FsdpTransformer (include/mc2/models/fsdp.h): the dense transformer's units
// (fsdp_layers.h) trained with their parameters, gradients and AdamW
// moments sharded over the data-parallel ranks, ZeRO-3 style.
//
// Per unit u (numel elements, shard c = ceil(numel / N)), rank r holds
// elements [r c, (r+1) c) of the flat parameters, their gradient and both
// moments. A step:
//   forward, unit by unit: issue the all-gathers of this unit and the next
//     `prefetch` ones (each into a slot of the window: symmetric memory,
//     in place), wait for this one, compute, give its slot back (the head
//     excepted: its backward follows);
//   backward, in reverse: the same prefetch; a full gradient slot per
//     unit, reduce-scattered (sum, deterministic) into the gradient shard
//     as soon as the unit's backward ends; the previous unit's
//     reduce-scatter is waited for (and its buffer freed) before the next
//     is issued, so at most one is in flight;
//   AdamW on the local shard, tensor by tensor (decay on the matrices).
// Plain data parallelism (FsdpOptions::shard = false) runs the same units
// and kernels with the whole model on every rank and all-reduces each
// unit's gradient as its backward ends: a sum in the same deterministic
// order as the reduce-scatter's, so both give the same bits.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/models.h"
#include "mc2/trace.h"
#include "models/fsdp_layers.h"
#include "models/kernels.h"

namespace mc2::models {

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void Invalid(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "FsdpTransformer: " + msg);
}

// The options and the config on tp x dp ranks, without communicating.
void CheckConfig(const TransformerConfig& c, const FsdpOptions& o, int tp, int dp) {
  if (o.prefetch < 0 || o.prefetch > 2) {
    Invalid("prefetch must be 0, 1 or 2, not " + std::to_string(o.prefetch));
  }
  if (c.moe_experts != 0) Invalid("moe_experts must be 0 (dense layers only)");
  if (c.gemm_dtype != DType::kF32) Invalid("gemm_dtype must be f32");
  if (c.grad_compression.scheme != Compression::kNone) {
    Invalid("grad_compression is not supported (the gradients are reduce-scattered)");
  }
  ValidateConfig(c, tp, dp);
}

// Checks everything before the members are built (FsdpLayers sizes its
// buffers from the config).
const TransformerConfig& Checked(const ProcessGrid& g, const TransformerConfig& c,
                                 const FsdpOptions& o) {
  if (!g.dp.valid()) Invalid("the data-parallel group is not valid");
  if (!g.tp.valid()) Invalid("the tensor-parallel group is not valid");
  if (g.pp_size != 1 || g.cp_size != 1 || g.ep_size != 1) {
    Invalid("the grid must be DP x TP only (pp, cp and ep 1)");
  }
  CheckConfig(c, o, g.tp.size(), g.dp.size());
  return c;
}

// A bare data-parallel group as a grid: dp and world the group itself, a
// TP group of one rank (collective over dp: one Split, after the checks).
ProcessGrid DpOnly(const Group& dp, const TransformerConfig& c, const FsdpOptions& o) {
  if (!dp.valid()) Invalid("the data-parallel group is not valid");
  CheckConfig(c, o, 1, dp.size());
  ProcessGrid g;
  g.world = dp;
  g.dp = dp;
  g.dp_size = dp.size();
  g.dp_rank = dp.rank();
  g.tp = dp.Split(/*color=*/dp.rank(), /*key=*/0);
  return g;
}

}  // namespace

struct FsdpTransformer::Impl {
  Impl(const ProcessGrid& g, const TransformerConfig& c, const FsdpOptions& o)
      : dp(g.dp),
        tp(g.tp),
        world(g.world),
        cfg(Checked(g, c, o)),
        opts(o),
        N(g.dp.size()),
        rank(g.dp.rank()),
        units(FsdpLayout(cfg, N, g.tp.size(), g.tp.rank())),
        layers(cfg, N, rank, g.tp) {
    const size_t U = units.size();
    w.resize(U);
    gs.resize(U);
    m.resize(U);
    v.resize(U);
    gathered.resize(U);
    grads.resize(U);
    for (size_t u = 0; u < U; ++u) {
      const size_t n = Local(u);
      for (std::vector<float>* x : {&w[u], &gs[u], &m[u], &v[u]}) x->assign(n, 0.0f);
      const size_t first = opts.shard ? rank * units[u].shard : 0;
      for (const FsdpTensor& t : units[u].tensors) {
        const size_t b = std::max(first, t.offset), e = std::min(first + n, t.offset + t.size());
        for (size_t i = b; i < e; ++i) w[u][i - first] = FsdpInitValue(cfg, t, i - t.offset);
      }
      parameters += static_cast<int64_t>(units[u].numel);
      persistent += 4 * static_cast<int64_t>(n * sizeof(float));
      largest = std::max(largest, static_cast<int64_t>(N * units[u].shard * sizeof(float)));
    }
    // The window: 1 + prefetch gathered units and 2 unit gradients at
    // most, each in a slot of symmetric memory (the collectives run
    // zero-copy on it), reserved once and reused unit after unit.
    if (opts.shard) {
      slots.resize(3 + static_cast<size_t>(opts.prefetch));
      for (Slot& sl : slots) sl.buf = dp.AllocSymmetric(static_cast<size_t>(largest));
    }
  }

  // A free slot for `floats` elements, counted as live until Release.
  int Acquire(size_t floats) {
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].floats != 0) continue;
      slots[i].floats = floats;
      live += static_cast<int64_t>(floats * sizeof(float));
      peak = std::max(peak, live);
      return static_cast<int>(i);
    }
    throw Error(ErrorCode::kInternal, "FsdpTransformer: no free window slot");
  }
  void Release(int& slot) {
    if (slot < 0) return;
    live -= static_cast<int64_t>(slots[slot].floats * sizeof(float));
    slots[slot].floats = 0;
    slot = -1;
  }
  float* SlotData(int slot) const { return slots[slot].buf.as<float>(); }

  // Elements this rank holds of unit u: its shard, or (plain) the whole unit.
  size_t Local(size_t u) const { return opts.shard ? units[u].shard : units[u].numel; }
  size_t Padded(size_t u) const { return N * units[u].shard; }

  // The options of the parameter and gradient collectives: in the
  // background, under the compute, whatever their size; by the ring, whose
  // steps move each block over the link (and so are paced by the emulated
  // link, docs/link-emulation.md, where the direct algorithms are not).
  static CollectiveOptions Overlapped() {
    CollectiveOptions co;
    co.may_run_inline = false;
    co.algorithm = Algorithm::kRing;
    return co;
  }

  // ---- parameters
  // In place: this rank's shard is copied to its block of the slot.
  void IssueGather(size_t u) {
    if (!opts.shard || gathered[u].slot >= 0) return;
    gathered[u].slot = Acquire(Padded(u));
    float* full = SlotData(gathered[u].slot);
    const size_t c = units[u].shard;
    std::memcpy(full + rank * c, w[u].data(), c * sizeof(float));
    gathered[u].work = AllGather(dp, full + rank * c, full, c, DType::kF32, Overlapped());
  }
  // Issues the gathers of order[i .. i + prefetch] and waits for order[i]'s.
  const float* Params(const std::vector<size_t>& order, size_t i, FsdpStepStats& st) {
    const size_t u = order[i];
    if (!opts.shard) return w[u].data();
    for (size_t j = i; j < std::min(order.size(), i + 1 + opts.prefetch); ++j) {
      IssueGather(order[j]);
    }
    const auto t0 = Clock::now();
    {
      trace::Scope span("all_gather.wait", trace::Category::kWait);
      gathered[u].work.Wait();
    }
    st.gather_wait_seconds += Since(t0);
    return SlotData(gathered[u].slot);
  }
  void FreeParams(size_t u) {
    gathered[u].work = Work();
    Release(gathered[u].slot);
  }

  // ---- gradients
  // With TP, the replicated tensors' gradients of unit u ([g, g + numel))
  // are partial sums over the TP ranks' rows: summed over TP first (in
  // place, deterministic), then reduced over DP like the rest.
  void SumOverTp(size_t u, float* g) {
    if (tp.size() == 1) return;
    trace::Scope span("tp_grad_sum", trace::Category::kHost);
    const std::vector<FsdpTensor>& ts = units[u].tensors;
    for (size_t i = 0; i < ts.size();) {
      if (!ts[i].tp_replicated) {
        ++i;
        continue;
      }
      size_t j = i, n = 0;  // a run of adjacent replicated tensors
      while (j < ts.size() && ts[j].tp_replicated) n += ts[j++].size();
      float* x = g + ts[i].offset;
      AllReduce(tp, x, x, n, DType::kF32, ReduceOp::kSum).Wait();
      i = j;
    }
  }
  float* GradBuffer(size_t u) {
    if (!opts.shard) return gs[u].data();
    grads[u].slot = Acquire(Padded(u));
    float* g = SlotData(grads[u].slot);
    std::fill(g + units[u].numel, g + Padded(u), 0.0f);  // the padding
    return g;
  }
  void WaitReduce(size_t u, FsdpStepStats& st) {
    const auto t0 = Clock::now();
    {
      trace::Scope span(opts.shard ? "reduce_scatter.wait" : "all_reduce.wait",
                        trace::Category::kWait);
      grads[u].work.Wait();
    }
    st.reduce_wait_seconds += Since(t0);
    grads[u].work = Work();
    if (grads[u].slot >= 0) {  // the reduced block, in place, to the shard
      const size_t c = units[u].shard;
      std::memcpy(gs[u].data(), SlotData(grads[u].slot) + rank * c, c * sizeof(float));
    }
    Release(grads[u].slot);
  }
  // Unit u's backward ended: its gradient goes to its owners now. Sharded:
  // the previous reduce-scatter is completed first (one in flight).
  void Reduce(size_t u, FsdpStepStats& st) {
    const CollectiveOptions co = Overlapped();
    if (opts.shard) {
      if (in_flight >= 0) WaitReduce(static_cast<size_t>(in_flight), st);
      float* g = SlotData(grads[u].slot);
      const size_t c = units[u].shard;
      grads[u].work = ReduceScatter(dp, g, g + rank * c, c, DType::kF32, ReduceOp::kSum, co);
      in_flight = static_cast<int>(u);
    } else {
      grads[u].work =
          AllReduce(dp, gs[u].data(), gs[u].data(), units[u].numel, DType::kF32, ReduceOp::kSum, co);
    }
  }

  // ---- optimizer
  void Adam() {
    trace::Scope span("adamw", trace::Category::kCompute);
    ++opt_step;
    for (size_t u = 0; u < units.size(); ++u) {
      const size_t first = opts.shard ? rank * units[u].shard : 0, n = Local(u);
      for (const FsdpTensor& t : units[u].tensors) {
        const size_t b = std::max(first, t.offset), e = std::min(first + n, t.offset + t.size());
        if (b >= e) continue;
        const size_t i = b - first;
        AdamW(w[u].data() + i, gs[u].data() + i, m[u].data() + i, v[u].data() + i, e - b,
              opt_step, cfg.lr, cfg.beta1, cfg.beta2, cfg.adam_eps,
              t.decay ? cfg.weight_decay : 0.0f);
      }
    }
  }

  FsdpStepStats Step(int step) {
    FsdpStepStats st;
    st.step = step;
    st.tokens = static_cast<int64_t>(cfg.batch) * cfg.seq_len;
    trace::MarkStep(step);
    const auto t0 = Clock::now();
    const size_t U = units.size(), L = U - 2;
    std::vector<size_t> fwd(U), bwd(U);
    for (size_t i = 0; i < U; ++i) fwd[i] = i, bwd[i] = U - 1 - i;
    layers.SetBatch(step);
    // ---- forward
    double local_loss = 0;
    for (size_t i = 0; i < U; ++i) {
      const size_t u = fwd[i];
      const float* p = Params(fwd, i, st);
      if (u == 0) {
        layers.EmbedForward(p);
      } else if (u <= L) {
        layers.BlockForward(u - 1, p);
      } else {
        local_loss = layers.HeadForward(p);
      }
      if (u != U - 1) FreeParams(u);
    }
    double loss_sum = 0;
    CollectiveOptions co;
    co.may_run_inline = false;
    Work loss_work = AllReduce(world, &local_loss, &loss_sum, 1, DType::kF64, ReduceOp::kSum, co);
    const auto t1 = Clock::now();
    st.forward_gather_wait_seconds = st.gather_wait_seconds;
    st.forward_seconds = std::chrono::duration<double>(t1 - t0).count();
    // ---- backward
    for (size_t i = 0; i < U; ++i) {
      const size_t u = bwd[i];
      const float* p = Params(bwd, i, st);
      float* g = GradBuffer(u);
      if (u == 0) {
        layers.EmbedBackward(g);
      } else if (u <= L) {
        layers.BlockBackward(u - 1, p, g);
      } else {
        layers.HeadBackward(p, g);
      }
      SumOverTp(u, g);
      FreeParams(u);
      Reduce(u, st);
    }
    const auto t2 = Clock::now();
    st.backward_seconds = std::chrono::duration<double>(t2 - t1).count();
    // ---- optimizer
    if (opts.shard) {
      if (in_flight >= 0) WaitReduce(static_cast<size_t>(in_flight), st);
      in_flight = -1;
    } else {
      for (size_t u = 0; u < U; ++u) WaitReduce(u, st);
    }
    Adam();
    loss_work.Wait();
    st.loss = loss_sum / static_cast<double>(st.tokens);
    st.optimizer_seconds = Since(t2);
    st.seconds = Since(t0);
    trace::EndStep();
    return st;
  }

  std::vector<std::pair<std::string, std::vector<float>>> Gather() {
    std::vector<std::pair<std::string, std::vector<float>>> out;
    for (size_t u = 0; u < units.size(); ++u) {
      std::vector<float> full;
      if (opts.shard) {
        full.resize(Padded(u));
        AllGather(dp, w[u].data(), full.data(), units[u].shard, DType::kF32).Wait();
      } else {
        full = w[u];
      }
      for (const FsdpTensor& t : units[u].tensors) {
        out.emplace_back(t.name, std::vector<float>(full.begin() + t.offset,
                                                    full.begin() + t.offset + t.size()));
      }
    }
    return out;
  }

  struct Pending {
    int slot = -1;  // in `slots`, or none (plain DP)
    Work work;
  };
  struct Slot {
    SymmetricBuffer buf;
    size_t floats = 0;  // in use (0: free)
  };

  Group dp, tp, world;
  const TransformerConfig cfg;
  const FsdpOptions opts;
  const size_t N, rank;
  std::vector<FsdpUnit> units;
  FsdpLayers layers;
  // Per unit, this rank's part: parameters, gradient, AdamW moments.
  std::vector<std::vector<float>> w, gs, m, v;
  std::vector<Slot> slots;
  std::vector<Pending> gathered, grads;
  int in_flight = -1;  // the unit whose gradient is being reduce-scattered
  int opt_step = 0;
  int64_t parameters = 0, persistent = 0, largest = 0;
  int64_t live = 0, peak = 0;  // bytes of the slots in use (gathered parameters, gradients)
};

FsdpTransformer::FsdpTransformer(const Group& dp, const TransformerConfig& config,
                                 const FsdpOptions& options)
    : impl_(std::make_unique<Impl>(DpOnly(dp, config, options), config, options)) {}

FsdpTransformer::FsdpTransformer(const ProcessGrid& grid, const TransformerConfig& config,
                                 const FsdpOptions& options)
    : impl_(std::make_unique<Impl>(grid, config, options)) {}

FsdpTransformer::~FsdpTransformer() = default;

FsdpStepStats FsdpTransformer::TrainStep(int step) { return impl_->Step(step); }

std::vector<std::pair<std::string, std::vector<float>>> FsdpTransformer::GatherParameters() {
  return impl_->Gather();
}

FsdpMemory FsdpTransformer::memory() const {
  const Impl& I = *impl_;
  FsdpMemory mem;
  mem.parameters = I.parameters;
  mem.unsharded_bytes = 16 * I.parameters;
  mem.persistent_bytes = I.persistent;
  mem.window_formula_bytes = I.opts.shard ? (1 + I.opts.prefetch + 2) * I.largest : 0;
  mem.peak_transient_bytes = I.peak;
  mem.peak_bytes = I.persistent + I.peak;
  return mem;
}

const FsdpOptions& FsdpTransformer::options() const { return impl_->opts; }

}  // namespace mc2::models
