// TransformerImpl: one rank's transformer, put together from its parts
// (dims.h, parameters.h, grad_sync.h, parallel_linear.h, activations.h).
// Its member functions live by concern: the attention sublayer in
// attention.cc, the dense MLP in mlp.cc, the MoE MLP in moe_layer.cc, and
// the forward / backward driver and the public Transformer in
// transformer.cc (whose opening comment explains how it all works).
#ifndef MC2_MODELS_MODEL_H_
#define MC2_MODELS_MODEL_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mc2/models.h"
#include "mc2/work.h"
#include "models/activations.h"
#include "models/dims.h"
#include "models/grad_sync.h"
#include "models/kernels.h"
#include "models/parallel_linear.h"
#include "models/parameters.h"

namespace mc2::models {

// The loss all-reduce (f64): [0] the cross-entropy sum, then per MoE layer
// its routed slots per expert (E) and probability sums (E), from which
// every rank computes the same load-balancing loss (and backward its
// gradient) for the global batch -- or, in a pipeline chunk, for the global
// micro-batch (pipeline.cc keeps one LossSync per micro-batch in flight).
struct LossSync {
  std::vector<double> local, total;
  Work work;
  double aux = 0;  // the load-balancing loss of the last TransformerImpl::WaitLoss
};

// Invariants: those of its parts; between ForwardBackward calls no
// deferred_wgrad is left.
// Thread safety: one thread per rank (the Transformer's contract).
struct TransformerImpl {
  // `stage`: the part of the model this rank runs (dims.h; default: all).
  TransformerImpl(const ProcessGrid& g, const TransformerConfig& c, const StageSpec& stage = {});

  ProcessGrid grid;
  TransformerConfig cfg;
  Dims dims;
  ParamStore params;
  DpSync sync;
  ParallelLinear linear;
  Activations acts;
  Rope rope;
  LossSync loss;
  // Context parallelism (grid.cp_size > 1): each block's ring attention
  // over grid.cp (it keeps its forward's state for the backward).
  std::vector<std::unique_ptr<RingAttention>> ring;
  // A ring per block of this rank's part (empty when cp == 1): the
  // pipeline keeps a set per micro-batch in flight.
  std::vector<std::unique_ptr<RingAttention>> MakeRings() const;
  // The global position of local position t (this CP rank's two chunks).
  size_t Position(size_t t) const {
    if (dims.cp == 1) return t;
    const size_t C = dims.T / 2, cp = static_cast<size_t>(dims.cp),
                 r = static_cast<size_t>(grid.cp_rank);
    return t < C ? r * C + t : (2 * cp - 1 - r) * C + (t - C);
  }

  // GEMMs over token rows (the LM head): in deterministic mode on the
  // kernel the fused operators use, whose row i does not depend on how many
  // rows a call has, so micro-batches give the whole batch's per-token bits.
  GemmOptions RowGemm() const {
    GemmOptions o;
    if (grid.world.deterministic()) o.backend = GemmBackend::kOneDNN;
    return o;
  }

  bool has_grads = false;
  bool updates_deferred = false;                 // set by TrainStep for its OptimizerStep
  std::vector<double> block_fwd_s, block_bwd_s;  // of the last step, per block
  std::vector<std::string> block_span_fwd, block_span_bwd;  // "block<l>.forward", ...

  // A weight gradient of the sublayer above, deferred to run under the
  // transfers of the next sublayer's first dgrad operator (see Backward).
  std::function<void()> deferred_wgrad;
  // Whether the backward runs collectives of its own (TP's fused operators,
  // CP's ring attention, MoE's exchanges, pipeline stages): then a
  // sublayer's last wgrad is deferred under the next sublayer's transfers
  // and its bucket is marked after them (grad_sync.h). Without any (data
  // parallel only) there is nothing to hide a wgrad under or to hold back:
  // each wgrad runs as early as its inputs allow, before the dgrads, and
  // its tensor is marked ready at once (WgradAndMark).
  bool backward_collectives = true;
  static bool BackwardCollectives(const ProcessGrid& grid, const Dims& dims);
  // The end of a sublayer's backward: marks the gradients of the previous
  // sublayer (backward_collectives; data parallel only, the sublayer has
  // marked its own already).
  void EndSublayerBackward(int bucket);
  // Data parallel only: grad(W_p) = a^T dy now (a: the layer's input
  // [S x rows] in the GEMM dtype, dy: its output gradient [S x cols], f32)
  // and the tensor marked ready for its all-reduce.
  void WgradAndMark(const void* a, const float* dy, int p);
  std::function<void()> TakeDeferred() {
    std::function<void()> f = std::move(deferred_wgrad);
    deferred_wgrad = nullptr;
    return f;
  }

  // Forward on the batch of `step`; the global loss is all-reduced in the
  // background: WaitLoss() returns it.
  void Forward(int step);
  double WaitLoss();
  void Backward();
  // The load-balancing loss of one MoE layer, coef * E * sum_e f_e P_e,
  // from its all-reduced statistics `st` (slots per expert, then
  // probability sums: 2E values) over `tokens` tokens (the global batch,
  // or the global micro-batch).
  double LayerAuxLoss(const double* st, double tokens) const;

  // The forward of this rank's part of the model (StageSpec) on micro-batch
  // `micro` of the batch of `step`: from x_in ([s x h], the previous
  // chunk's output) or, if null, the embedding (needs stage.embed); to
  // x_out ([s x h]) or, if null, the LM head and the loss (needs
  // stage.head). Returns this rank's cross-entropy sum (0 without the head),
  // unscaled. Keeps its activations in `acts` for ChunkBackward.
  double ChunkForward(int step, int micro, const float* x_in, float* x_out);
  // The backward of the last ChunkForward: from dy ([s x h], the gradient
  // of x_out) or, if null, the loss; to dx_in ([s x h]) or, if null, the
  // embedding's gradient. Gradients of the micro-batch in the Param::g
  // views (the projections' written, the replicated ones added after
  // sync.Restart); issues no gradient exchange but what the sublayers'
  // DpSync calls do.
  void ChunkBackward(const float* dy, float* dx_in);

  // A block is two sublayers, each with its own forward and backward, its
  // own gradient bucket and the same overlap scheme (transformer.cc). The
  // MoE MLP has the dense MLP's interface (acts.block[l].x1 in, the block
  // output out; backward: dout in, acts.dx1 out).
  void AttentionSublayerForward(size_t l, const float* x);
  void AttentionSublayerBackward(size_t l, float* dxio);
  void MlpForward(size_t l, float* out);
  void MlpBackward(size_t l, const float* dout);
  void MoeForward(size_t l, float* out);
  void MoeBackward(size_t l, const float* dout);
};

}  // namespace mc2::models

#endif  // MC2_MODELS_MODEL_H_
