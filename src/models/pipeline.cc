// Pipeline parallelism for the reference transformer
// (include/mc2/models/pipeline.h): a stage's chunks, the schedule's
// execution with the activations and their gradients moving by Send / Recv,
// gradient accumulation over the micro-batches, the DP exchange and AdamW.
//
// Each chunk is a TransformerImpl (model.h) running a range of blocks
// (StageSpec, dims.h) on micro-batches, whose grid's world is this stage's
// dp x cp x tp ranks: its TP-replicated gradients are summed over the
// stage, its shards' over the stage's DP group, as in the unpipelined
// model. The chunk keeps one micro-batch's activations in its `acts`;
// those of the micro-batches in flight (forward done, backward not yet) are
// swapped out into a pool and back in for the backward, with their ring attention state under
// context parallelism.
//
// A message is the [s x h] rows of one micro-batch (this TP rank's
// sequence-parallel rows) followed by the sender's clock when it finished
// computing them (one double, in two floats), from which the receiver
// tells the transfer it waited for from the schedule's own wait
// (PipelineOp::uncovered). Tags: (receiving chunk, micro-batch,
// direction), so no two messages in flight match the same receive. The
// receives of the current and next kRecvAhead operations' inputs stay
// posted (a message larger than the sender's channel can stall until a
// receive from its sender is posted, and the eager schedule's gradients
// arrive up to two operations before they are needed); a send's buffer
// goes as soon as the send completes, and no send is waited for before
// the last operation.
//
// MoE blocks run over the stage's EP group as in the unpipelined model. Their
// load-balancing loss is per micro-batch (Megatron-LM's definition): each
// forward's expert loads and probability sums are all-reduced over the
// stage (the micro-batch's global statistics, every rank of the stage
// holding a part of its tokens), kept with the micro-batch's activations
// for its backward, which adds the gradient of aux_mb / m; the step's aux
// loss is the mean over the micro-batches, summed over the MoE layers.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/models.h"
#include "mc2/trace.h"
#include "models/model.h"
#include "models/schedule.h"

namespace mc2::models {

namespace {

using Clock = std::chrono::steady_clock;
double Now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

[[noreturn]] void Invalid(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "PipelineConfig: " + msg);
}

std::string Str(long long v) { return std::to_string(v); }

// What one micro-batch's backward needs from its forward: the chunk's
// activations and, with context parallelism, its blocks' ring attention
// state (each ring keeps its forward's Q, K, V, output and LSE).
// With MoE blocks, also its statistics all-reduce (LossSync: the routed
// slots and probability sums of the micro-batch's tokens).
struct MicroState {
  std::unique_ptr<Activations> acts;
  std::vector<std::unique_ptr<RingAttention>> ring;
  LossSync loss;
};

// One chunk of the model on this stage.
struct Chunk {
  int index = 0;  // the model's chunk
  std::unique_ptr<TransformerImpl> m;
  std::vector<float> acc;                                  // accumulated gradients, by param
  std::vector<size_t> offset;                              // of each param in acc
  std::map<int, MicroState> in_flight;  // by micro-batch
  std::vector<MicroState> pool;         // free sets
  std::vector<double> aux;              // [MoE layer of the chunk][micro-batch]: its aux loss
};

constexpr size_t kStampFloats = 2;  // the sender's clock, a double
// Operations after the current one whose inputs' receives are posted
// (one message buffer each): the alternating steady state then has the
// next two of each direction in flight.
constexpr size_t kRecvAhead = 4;

// A send in flight and the buffer it reads.
struct PendingSend {
  Work work;
  std::vector<float> buf;
};

}  // namespace

void ValidatePipeline(const TransformerConfig& c, const PipelineConfig& pipe,
                      const GridShape& shape) {
  ValidateConfig(c, shape.tp, shape.dp, shape.ep, shape.cp);
  const int pp = shape.pp, dp = shape.dp;
  if (pp < 1) Invalid("pp must be >= 1, not " + Str(pp));
  const int m = pipe.micro_batches;
  if (m < 1) Invalid("micro_batches must be >= 1, not " + Str(m));
  if (pipe.schedule != PipelineSchedule::k1F1B && pipe.schedule != PipelineSchedule::kInterleaved &&
      pipe.schedule != PipelineSchedule::kEager1F1B) {
    Invalid("unknown schedule");
  }
  const bool interleaved = pipe.schedule == PipelineSchedule::kInterleaved;
  if (!interleaved && pipe.virtual_stages != 1) {
    Invalid("virtual_stages (" + Str(pipe.virtual_stages) + ") must be 1 with the " +
            ScheduleName(pipe.schedule) + " schedule (interleaved has virtual stages)");
  }
  if (interleaved) {
    if (pipe.virtual_stages < 2) {
      Invalid("virtual_stages (" + Str(pipe.virtual_stages) +
              ") must be >= 2 with the interleaved schedule");
    }
    if (pp < 2) Invalid("the interleaved schedule needs pp >= 2, not " + Str(pp));
    if (m % pp != 0) {
      Invalid("micro_batches (" + Str(m) + ") must be a multiple of pp (" + Str(pp) +
              ") with the interleaved schedule: micro-batches go through the chunks in "
              "groups of pp");
    }
  }
  const int v = interleaved ? pipe.virtual_stages : 1;
  if (c.layers % (pp * v) != 0) {
    Invalid("layers (" + Str(c.layers) + ") must be divisible by pp * virtual_stages (" +
            Str(pp) + " * " + Str(v) + "): every chunk has the same number of blocks");
  }
  if (c.batch % (dp * m) != 0) {
    Invalid("batch (" + Str(c.batch) + ") must be divisible by dp * micro_batches (" + Str(dp) +
            " * " + Str(m) + "): every DP rank takes whole sequences of every micro-batch");
  }
}

struct PipelineTransformer::Impl {
  ProcessGrid grid;
  TransformerConfig cfg;
  PipelineConfig pipe;
  int p = 1, v = 1, m = 1, chunks = 1;
  size_t rows = 0, width = 0;  // a message's payload: s x h
  std::vector<Chunk> local;    // by local chunk
  std::vector<ScheduleOp> ops;
  std::vector<PendingSend> sends;               // of the running step, not known complete
  std::map<int, std::vector<float>> recv_bufs;  // by tag
  std::map<int, Work> recvs;                    // posted, by tag

  Impl(const ProcessGrid& g, const TransformerConfig& c, const PipelineConfig& pc)
      : grid(g), cfg(c), pipe(pc) {
    ValidatePipeline(cfg, pipe,
                     {.dp = grid.dp_size,
                      .tp = grid.tp_size,
                      .pp = grid.pp_size,
                      .ep = grid.ep_size,
                      .cp = grid.cp_size});
    p = grid.pp_size;
    v = pipe.schedule == PipelineSchedule::kInterleaved ? pipe.virtual_stages : 1;
    m = pipe.micro_batches;
    chunks = p * v;
    const int per_chunk = cfg.layers / chunks;
    ProcessGrid sg = grid;
    sg.world = grid.stage;
    for (int lc = 0; lc < v; ++lc) {
      Chunk ch;
      ch.index = lc * p + grid.pp_rank;
      StageSpec spec;
      spec.first_layer = ch.index * per_chunk;
      spec.layers = per_chunk;
      spec.embed = ch.index == 0;
      spec.head = ch.index == chunks - 1;
      spec.micro_batches = m;
      ch.m = std::make_unique<TransformerImpl>(sg, cfg, spec);
      ch.m->sync.hold = true;
      size_t total = 0;
      for (const Param& prm : ch.m->params.list()) {
        ch.offset.push_back(total);
        total += prm.rows * prm.cols;
      }
      ch.acc.assign(total, 0.0f);
      ch.aux.assign(static_cast<size_t>(ch.m->dims.n_moe) * m, 0.0);
      local.push_back(std::move(ch));
    }
    rows = local[0].m->dims.s;
    width = local[0].m->dims.h;
    ops = MakeSchedule(pipe, p, grid.pp_rank);
  }

  ~Impl() { Drain(); }

  // Never leave a transfer running on buffers about to go.
  void Drain() noexcept {
    auto wait = [](Work& w) {
      try {
        w.Wait();
      } catch (...) {
      }
      w = Work();
    };
    for (Chunk& ch : local) {
      wait(ch.m->loss.work);
      for (auto& [micro, a] : ch.in_flight) wait(a.loss.work);
      for (MicroState& a : ch.pool) wait(a.loss.work);
    }
    for (PendingSend& ps : sends) {
      try {
        ps.work.Wait();
      } catch (...) {
      }
    }
    for (auto& [tag, w] : recvs) {
      try {
        w.Wait();
      } catch (...) {
      }
    }
    sends.clear();
    recvs.clear();
    recv_bufs.clear();
  }

  int Tag(int recv_chunk, int micro, bool gradient) const {
    return (recv_chunk * m + micro) * 2 + (gradient ? 1 : 0);
  }
  size_t MessageFloats() const { return rows * width + kStampFloats; }
  double Tokens() const {
    return static_cast<double>(cfg.batch) * static_cast<double>(cfg.seq_len);
  }

  // After a forward with MoE blocks: the micro-batch's load statistics,
  // summed over the stage in the background (the backward waits for them).
  static void SumMoeStats(TransformerImpl& mm) {
    LossSync& ls = mm.loss;
    const size_t n = ls.local.size() - 1;  // [0], the cross-entropy, is not needed
    if (mm.grid.world.size() == 1) {
      ls.total = ls.local;
      return;
    }
    CollectiveOptions o;
    o.may_run_inline = false;
    ls.work = AllReduce(mm.grid.world, ls.local.data() + 1, ls.total.data() + 1, n, DType::kF64,
                        ReduceOp::kSum, o);
  }
  // After its backward: the micro-batch's aux loss of each MoE block.
  void KeepAux(Chunk& ch, int micro) {
    TransformerImpl& mm = *ch.m;
    mm.loss.work.Wait();
    mm.loss.work = Work();
    const size_t E = mm.dims.E;
    for (int mi = 0; mi < mm.dims.n_moe; ++mi) {
      ch.aux[static_cast<size_t>(mi) * m + micro] =
          mm.LayerAuxLoss(mm.loss.total.data() + 1 + 2 * E * mi, Tokens() / m);
    }
  }
  // The step's aux loss: per MoE layer the mean over the micro-batches (in
  // micro-batch order), summed over the layers in model order; each layer's
  // value comes from its stage (one non-zero term per layer in the sum over
  // the pipeline, so it is exact), the same on every rank.
  double AuxLoss() {
    if (cfg.moe_experts == 0) return 0.0;
    std::vector<double> layer(cfg.layers, 0.0), sum(cfg.layers, 0.0);
    for (const Chunk& ch : local) {
      const Dims& d = ch.m->dims;
      for (size_t l = 0; l < d.L; ++l) {
        if (!d.is_moe[l]) continue;
        const double* a = ch.aux.data() + static_cast<size_t>(d.moe_index[l]) * m;
        double mean = 0;
        for (int j = 0; j < m; ++j) mean += a[j];
        layer[d.L0 + l] = mean / m;
      }
    }
    sum = layer;
    if (p > 1) {
      AllReduce(grid.pp, layer.data(), sum.data(), sum.size(), DType::kF64, ReduceOp::kSum).Wait();
    }
    double aux = 0;
    for (double a : sum) aux += a;
    return aux;
  }

  // The input of op k: posted once (the tag), or -1 if it has none.
  int InputTag(const ScheduleOp& o) const {
    const int g = o.local_chunk * p + grid.pp_rank;
    if (o.forward) return g > 0 ? Tag(g, o.micro, false) : -1;
    return g + 1 < chunks ? Tag(g, o.micro, true) : -1;
  }
  void PostInput(const ScheduleOp& o) {
    const int tag = InputTag(o);
    if (tag < 0 || recvs.count(tag) != 0) return;
    const int peer = o.forward ? (grid.pp_rank + p - 1) % p : (grid.pp_rank + 1) % p;
    std::vector<float>& buf = recv_bufs[tag];
    buf.assign(MessageFloats(), 0.0f);
    recvs[tag] = grid.pp.Recv(buf.data(), buf.size() * sizeof(float), peer, tag);
  }
  void Send(std::vector<float> buf, bool forward, int recv_chunk, int micro) {
    const double end = Now();
    std::memcpy(buf.data() + rows * width, &end, sizeof(double));
    const int peer = forward ? (grid.pp_rank + 1) % p : (grid.pp_rank + p - 1) % p;
    PendingSend ps;
    ps.buf = std::move(buf);
    ps.work = grid.pp.Send(ps.buf.data(), ps.buf.size() * sizeof(float), peer,
                           Tag(recv_chunk, micro, !forward));
    sends.push_back(std::move(ps));  // moving the vector keeps its data where the send reads it
  }
  // Frees the buffers of the sends that have completed, without waiting
  // for the others; throws a failed send's error.
  void ReapSends() {
    size_t kept = 0;
    for (size_t i = 0; i < sends.size(); ++i) {
      if (sends[i].work.Test()) {
        sends[i].work.Wait();  // returns at once, or throws its failure
        continue;
      }
      if (kept != i) sends[kept] = std::move(sends[i]);
      ++kept;
    }
    sends.resize(kept);
  }

  void Accumulate(Chunk& ch, int micro) {
    const std::vector<Param>& list = ch.m->params.list();
    for (size_t pi = 0; pi < list.size(); ++pi) {
      const size_t n = list[pi].rows * list[pi].cols;
      float* a = ch.acc.data() + ch.offset[pi];
      const float* g = list[pi].g;
      if (micro == 0) {
        std::memcpy(a, g, n * sizeof(float));
      } else {
        for (size_t i = 0; i < n; ++i) a[i] += g[i];
      }
    }
  }

  PipelineStepStats Step(int step);
  // One forward of `o` on its chunk from `in` (null: the chunk's own
  // input); returns the loss it adds (the last chunk's) or 0 after sending
  // the activations on.
  double Forward(int step, const ScheduleOp& o, Chunk& ch, const float* in);
  // One backward of `o` on its chunk from the gradient `in` (null: the
  // loss's); sends the input gradient on and keeps the weight gradients.
  void Backward(const ScheduleOp& o, Chunk& ch, const float* in);
  // After the schedule: the sends, the pipeline phase and the loss.
  void FinishPipeline(PipelineStepStats& st, double loss_sum, double t0, double last_end);
  // The accumulated gradients summed over DP, then the optimizer.
  void SyncAndUpdate(PipelineStepStats& st);
  int in_flight_ = 0;  // forwards whose backward has not run yet (this step)
};

double PipelineTransformer::Impl::Forward(int step, const ScheduleOp& o, Chunk& ch,
                                          const float* in) {
  trace::Scope span("pipeline.forward", trace::Category::kHost);
  TransformerImpl& mm = *ch.m;
  MicroState a;
  if (ch.pool.empty()) {
    a.acts = std::make_unique<Activations>(mm.dims);
    a.ring = mm.MakeRings();
    a.loss.local.assign(mm.loss.local.size(), 0.0);
    a.loss.total = a.loss.local;
  } else {
    a = std::move(ch.pool.back());
    ch.pool.pop_back();
  }
  std::swap(mm.acts, *a.acts);
  std::swap(mm.ring, a.ring);
  std::swap(mm.loss, a.loss);
  const bool last = ch.index == chunks - 1;
  std::vector<float> out;
  if (!last) out.assign(MessageFloats(), 0.0f);
  const double local_sum = mm.ChunkForward(step, o.micro, in, last ? nullptr : out.data());
  if (mm.dims.n_moe > 0) SumMoeStats(mm);
  std::swap(mm.acts, *a.acts);
  std::swap(mm.ring, a.ring);
  std::swap(mm.loss, a.loss);
  ch.in_flight[o.micro] = std::move(a);
  ++in_flight_;
  if (last) return local_sum;
  Send(std::move(out), /*forward=*/true, ch.index + 1, o.micro);
  return 0;
}

void PipelineTransformer::Impl::Backward(const ScheduleOp& o, Chunk& ch, const float* in) {
  trace::Scope span("pipeline.backward", trace::Category::kHost);
  TransformerImpl& mm = *ch.m;
  MicroState a = std::move(ch.in_flight.at(o.micro));
  ch.in_flight.erase(o.micro);
  std::swap(mm.acts, *a.acts);
  std::swap(mm.ring, a.ring);
  std::swap(mm.loss, a.loss);
  const bool first = ch.index == 0;
  std::vector<float> dx;
  if (!first) dx.assign(MessageFloats(), 0.0f);
  mm.ChunkBackward(in, first ? nullptr : dx.data());
  if (mm.dims.n_moe > 0) KeepAux(ch, o.micro);
  std::swap(mm.acts, *a.acts);
  std::swap(mm.ring, a.ring);
  std::swap(mm.loss, a.loss);
  ch.pool.push_back(std::move(a));
  --in_flight_;
  Accumulate(ch, o.micro);
  if (!first) Send(std::move(dx), /*forward=*/false, ch.index - 1, o.micro);
}

PipelineStepStats PipelineTransformer::Impl::Step(int step) {
  PipelineStepStats st;
  st.bubble_formula = BubbleFormula(pipe, p);
  const auto step_t0 = Clock::now();
  Barrier(grid.world).Wait();
  const double t0 = Now();
  double loss_sum = 0, last_end = t0;
  // Keep the ready-for-the-next-step state even when an op throws.
  struct Cleanup {
    Impl* self;
    ~Cleanup() { self->Drain(); }
  } cleanup{this};
  in_flight_ = 0;
  for (size_t k = 0; k < ops.size(); ++k) {
    const ScheduleOp& o = ops[k];
    // The next operations' receives go up before this op computes, so
    // their transfers travel under it.
    for (size_t j = k; j < std::min(ops.size(), k + 1 + kRecvAhead); ++j) PostInput(ops[j]);
    Chunk& ch = local[o.local_chunk];
    PipelineOp rec;
    rec.forward = o.forward;
    rec.chunk = ch.index;
    rec.micro = o.micro;
    const float* in = nullptr;
    const int tag = InputTag(o);
    if (tag >= 0) {
      trace::Scope span("pipeline.recv_wait", trace::Category::kWait);
      const double w0 = Now();
      recvs.at(tag).Wait();
      recvs.erase(tag);
      const double w1 = Now();
      double sent_end;
      const std::vector<float>& buf = recv_bufs.at(tag);
      std::memcpy(&sent_end, buf.data() + rows * width, sizeof(double));
      rec.recv_wait = w1 - w0;
      rec.uncovered = std::max(0.0, w1 - std::max(w0, sent_end));
      in = buf.data();
    }
    const double start = Now();
    if (o.forward) {
      loss_sum += Forward(step, o, ch, in);
      st.peak_in_flight = std::max(st.peak_in_flight, in_flight_);
    } else {
      Backward(o, ch, in);
    }
    if (tag >= 0) recv_bufs.erase(tag);
    const double end = Now();
    ReapSends();
    rec.start = start - t0;
    rec.end = end - t0;
    st.busy_seconds += end - start;
    st.recv_wait_seconds += rec.recv_wait;
    st.uncovered_seconds += rec.uncovered;
    (o.forward ? st.step.forward_seconds : st.step.backward_seconds) += end - start;
    last_end = end;
    st.ops.push_back(rec);
  }
  FinishPipeline(st, loss_sum, t0, last_end);
  SyncAndUpdate(st);
  st.step.step = step;
  st.step.sync_wait_seconds = st.dp_sync_seconds;
  st.step.optimizer_seconds = st.optimizer_seconds;
  st.step.tokens = static_cast<int64_t>(cfg.batch) * cfg.seq_len;
  st.step.seconds = std::chrono::duration<double>(Clock::now() - step_t0).count();
  return st;
}

PipelineTransformer::PipelineTransformer(const ProcessGrid& grid, const TransformerConfig& config,
                                         const PipelineConfig& pipe)
    : impl_(std::make_unique<Impl>(grid, config, pipe)) {}

PipelineTransformer::~PipelineTransformer() = default;

void PipelineTransformer::Impl::FinishPipeline(PipelineStepStats& st, double loss_sum, double t0,
                                               double last_end) {
  {
    trace::Scope span("pipeline.send_wait", trace::Category::kWait);
    const double w0 = Now();
    for (PendingSend& ps : sends) ps.work.Wait();
    sends.clear();
    st.send_wait_seconds = Now() - w0;
  }
  // The pipeline phase: the latest end over every stage.
  double mine = last_end - t0;
  AllReduce(grid.world, &mine, &st.pipeline_seconds, 1, DType::kF64, ReduceOp::kMax).Wait();
  if (st.pipeline_seconds > 0) {
    st.bubble = std::max(0.0, st.pipeline_seconds - st.busy_seconds - st.uncovered_seconds) /
                st.pipeline_seconds;
  }
  // The loss: summed over the last stage's ranks, then sent along the pipeline.
  double total = loss_sum;
  if (grid.pp_rank == p - 1 && grid.stage.size() > 1) {
    AllReduce(grid.stage, &loss_sum, &total, 1, DType::kF64, ReduceOp::kSum).Wait();
  }
  if (p > 1) {
    double root_total = total;
    Broadcast(grid.pp, &root_total, &total, 1, DType::kF64, p - 1).Wait();
  }
  const double aux = AuxLoss();
  st.step.loss = total / Tokens() + aux;  // as Transformer
  st.step.aux_loss = aux;
}

void PipelineTransformer::Impl::SyncAndUpdate(PipelineStepStats& st) {
  // The accumulated gradients, summed over DP, then AdamW.
  {
    trace::Scope span("pipeline.dp_sync", trace::Category::kHost);
    const double w0 = Now();
    for (Chunk& ch : local) {
      TransformerImpl& mm = *ch.m;
      const std::vector<Param>& list = mm.params.list();
      for (size_t pi = 0; pi < list.size(); ++pi) {
        std::memcpy(list[pi].g, ch.acc.data() + ch.offset[pi],
                    list[pi].rows * list[pi].cols * sizeof(float));
      }
      mm.sync.hold = false;
      for (int b = static_cast<int>(mm.params.buckets.size()); b-- > 0;) mm.sync.Issue(b);
    }
    for (Chunk& ch : local) {
      ch.m->sync.Wait();
      ch.m->sync.hold = true;
    }
    st.dp_sync_seconds = Now() - w0;
  }
  {
    trace::Scope span("optimizer", trace::Category::kHost);
    const double w0 = Now();
    for (Chunk& ch : local) {
      ParamStore& ps = ch.m->params;
      ps.NextStep();
      ps.UpdateAll(/*world=*/false);
      ps.UpdateAll(/*world=*/true);
      ps.Changed();
    }
    st.optimizer_seconds = Now() - w0;
  }
}

PipelineStepStats PipelineTransformer::TrainStep(int step) {
  trace::MarkStep(step);
  return impl_->Step(step);
}

std::vector<ParamView> PipelineTransformer::Parameters() {
  std::vector<ParamView> out;
  for (Chunk& ch : impl_->local) {
    ParamStore& ps = ch.m->params;
    const StageSpec& spec = ch.m->dims.stage;
    for (int pi = 0; pi < static_cast<int>(ps.size()); ++pi) {
      if (pi == ps.p_embed && !spec.embed) continue;
      if ((pi == ps.p_final_norm || pi == ps.p_lm_head) && !spec.head) continue;
      const Param& prm = ps[pi];
      ParamView view;
      view.name = prm.name;
      view.rows = prm.rows;
      view.cols = prm.cols;
      view.value = prm.w;
      view.grad = prm.g;
      view.tp_replicated = prm.replicated;
      view.ep_sharded = prm.experts;
      out.push_back(view);
    }
  }
  return out;
}

std::vector<PipelineStepStats> TrainPipelineSteps(
    const Group& world, const TransformerConfig& config, const PipelineConfig& pipe,
    const GridShape& shape, int steps,
    const std::function<void(const PipelineStepStats&)>& on_step) {
  if (steps < 0) throw Error(ErrorCode::kInvalidArgument, "TrainPipelineSteps: steps must be >= 0");
  // The sizes first, naming the cause, before splitting anything.
  if (!world.valid()) throw Error(ErrorCode::kInvalidArgument, "TrainPipelineSteps: invalid world");
  ValidateGridShape(shape, world.size());
  ValidatePipeline(config, pipe, shape);
  ProcessGrid grid = MakeGrid3D(world, shape);
  PipelineTransformer model(grid, config, pipe);
  std::vector<PipelineStepStats> out;
  for (int step = 0; step < steps; ++step) {
    out.push_back(model.TrainStep(step));
    if (on_step) on_step(out.back());
  }
  trace::EndStep();
  return out;
}

}  // namespace mc2::models
