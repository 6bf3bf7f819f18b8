// The dense transformer of FsdpTransformer (include/mc2/models/fsdp.h), one
// data-parallel rank of one TP rank: its parameters laid out as FSDP units
// (flat buffers, each cut into equal shards over the DP ranks) and the
// units' forward and backward on whole (gathered) parameters.
//
// Units, in forward order: 0 the embedding, 1..L the blocks (norm1, qkv,
// o, norm2, gate_up, down), L + 1 the head (final_norm, lm_head). The
// tensors and their initial values are the reference Transformer's at the
// same tp (the same names, local shapes and seeded values: a TP rank's
// units hold its slices of qkv, o, gate_up and down and whole copies of
// the rest), so a gathered model can be copied into one.
//
// With tp > 1 the blocks are Megatron's tensor + sequence parallel ones,
// as in Transformer: a TP rank holds S / tp rows of the residual stream;
// qkv and gate_up are AllGatherMatmul, o and down MatmulReduceScatter over
// the TP group (and the reverse in backward), with cfg.fused's pipeline.
// The TP-replicated tensors' gradients (norms, embedding, head) are then
// partial sums over the TP ranks' rows (FsdpTensor::tp_replicated).
#ifndef MC2_MODELS_FSDP_LAYERS_H_
#define MC2_MODELS_FSDP_LAYERS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mc2/group.h"
#include "mc2/models.h"
#include "models/kernels.h"

namespace mc2::models {

struct FsdpTensor {
  std::string name;
  size_t rows = 0, cols = 0;
  size_t offset = 0;     // in the unit's flat buffer
  bool decay = false;    // AdamW weight decay (matrices, not norms or the embedding)
  bool ones = false;     // initialised to 1 (norm gains)
  uint64_t stream = 0;   // else uniform with std `stdev` from HashUniform(seed, stream, index)
  float stdev = 0;
  bool tp_replicated = true;  // every TP rank holds all of it (else its TP slice)
  // This TP slice's place in the whole tensor [global_rows x global_cols]:
  // local (i, j) is global row row0 + i and column (j / part) * part_global
  // + part_offset + j % part (part = 0: column j).
  size_t global_cols = 0, row0 = 0, part = 0, part_global = 0, part_offset = 0;
  size_t size() const { return rows * cols; }
  size_t GlobalIndex(size_t index) const;
};

struct FsdpUnit {
  std::vector<FsdpTensor> tensors;
  size_t numel = 0;  // parameters
  size_t shard = 0;  // per rank: ceil(numel / ranks); the last shards padded with zeros
};

// The units of `c` cut over `ranks` DP ranks, for TP rank `tp_rank` of `tp`.
std::vector<FsdpUnit> FsdpLayout(const TransformerConfig& c, int ranks, int tp = 1,
                                 int tp_rank = 0);
// The initial value of element `index` (row-major) of tensor `t`.
float FsdpInitValue(const TransformerConfig& c, const FsdpTensor& t, size_t index);

// The units' compute on one rank's Bl = batch / dp sequences, rows in
// sequence-major order (row = t Bl + b; with tp > 1 this TP rank's rows
// [tp_rank s, (tp_rank + 1) s), s = S / tp). Keeps the activations from
// forward to backward. One thread per rank, deterministic (fixed loop
// orders and GEMM shapes, deterministic TP operators): the same inputs
// give the same bits. Collective over `tp` when tp.size() > 1.
class FsdpLayers {
 public:
  FsdpLayers(const TransformerConfig& c, int dp, int dp_rank, const Group& tp);

  // Loads this rank's tokens and targets of the batch of `step`.
  void SetBatch(int step);
  // Forward of unit 0 / block l / the head (w: the unit's whole flat
  // parameters). HeadForward returns this rank's summed cross-entropy.
  void EmbedForward(const float* w);
  void BlockForward(size_t l, const float* w);
  double HeadForward(const float* w);
  // Backward, writing the unit's whole gradient into g (numel floats,
  // overwritten; the cross-entropy is scaled by 1 / global tokens).
  void HeadBackward(const float* w, float* g);
  void BlockBackward(size_t l, const float* w, float* g);
  void EmbedBackward(float* g);

  // Forward flops of block l and of the head (for trace spans and reports).
  uint64_t BlockFlops() const;

 private:
  // Rows: x, rstd1, x1, rstd2 this rank's s; xn1, xn2 all S (gathered
  // over TP); qkv, probs, ctx, gu, act all S rows of the local heads / ffn
  // columns.
  struct Acts {
    std::vector<float> x, rstd1, xn1, qkv, probs, ctx, x1, rstd2, xn2, gu, act;
  };
  void Linear(const float* a, const float* w, size_t m, size_t k, size_t n, float* y);
  void LinearBackward(const float* a, const float* w, const float* dy, size_t m, size_t k,
                      size_t n, float* da, float* dw);
  // tp > 1 (fsdp_tp.cc): column parallel y [S x n] = gather(x [s x h]) w
  // [h x n], the gathered x to xg [S x h]; row parallel y [s x h] = this
  // rank's rows of the sum over TP of a [S x k] w [k x h]; their dgrads
  // (with w^T) and the wgrad dw = a^T b (a, b: S rows).
  void ColumnParallel(const float* x, const float* w, size_t n, float* y, float* xg);
  void RowParallel(const float* a, const float* w, size_t k, float* y);
  void ColumnParallelDgrad(const float* dy, const float* w, size_t n, float* dx);
  void RowParallelDgrad(const float* dy, const float* w, size_t k, float* da, float* dyg);
  void Wgrad(const float* a, const float* b, size_t k, size_t n, float* dw);
  void BlockForwardTp(size_t l, const float* w);
  void BlockBackwardTp(size_t l, const float* w, float* g);
  // A block's tensors in its unit's flat parameters (or gradient) at
  // `base`, in the order the constructor adds them: norm1 [h], qkv
  // [h x 3 hd], o [hd x h], norm2 [h], gate_up [h x 2 fl], down [fl x h].
  template <typename T>
  struct BlockTensors {
    T *norm1, *qkv, *o, *norm2, *gu, *down;
  };
  template <typename T>
  BlockTensors<T> Block(T* base) const;

  const TransformerConfig& cfg_;
  Group tp_;
  size_t p_, tp_rank_;  // TP size and rank
  size_t V_, h_, heads_, d_, f_, T_, Bl_, S_;
  size_t hl_, fl_, s_;  // local heads, ffn columns and rows (hl_ = heads_ etc. at tp 1)
  int dp_rank_;
  float grad_scale_;
  Rope rope_;
  std::vector<int32_t> inputs_, targets_;
  std::vector<Acts> acts_;           // per block
  std::vector<float> xL_, rstdf_, xf_, logits_;
  std::vector<float> dx_, dx1_, dtmp_, dS_, dqkv_, gu_grad_, scratch_;
  std::vector<float> xn_rows_, dyg_;  // tp > 1: s normed rows, gathered dy
};

}  // namespace mc2::models

#endif  // MC2_MODELS_FSDP_LAYERS_H_
