// The dense transformer of FsdpTransformer (include/mc2/models.h), one
// data-parallel rank, no tensor parallelism: its parameters laid out as
// FSDP units (flat buffers, each cut into equal shards over the DP ranks)
// and the units' forward and backward on whole (gathered) parameters.
//
// Units, in forward order: 0 the embedding, 1..L the blocks (norm1, qkv,
// o, norm2, gate_up, down), L + 1 the head (final_norm, lm_head). The
// tensors and their initial values are the reference Transformer's at
// tp = 1 (the same names, shapes and seeded values), so a gathered model
// can be copied into one.
#ifndef MC2_MODELS_FSDP_LAYERS_H_
#define MC2_MODELS_FSDP_LAYERS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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
  size_t size() const { return rows * cols; }
};

struct FsdpUnit {
  std::vector<FsdpTensor> tensors;
  size_t numel = 0;  // parameters
  size_t shard = 0;  // per rank: ceil(numel / ranks); the last shards padded with zeros
};

// The units of `c` cut over `ranks`.
std::vector<FsdpUnit> FsdpLayout(const TransformerConfig& c, int ranks);
// The initial value of element `index` (row-major) of tensor `t`.
float FsdpInitValue(const TransformerConfig& c, const FsdpTensor& t, size_t index);

// The units' compute on one rank's Bl = batch / dp sequences, rows in
// sequence-major order (row = t Bl + b). Keeps the activations from
// forward to backward. Single-threaded, deterministic (fixed loop orders
// and GEMM shapes): the same inputs give the same bits.
class FsdpLayers {
 public:
  FsdpLayers(const TransformerConfig& c, int dp, int dp_rank);

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
  struct Acts {
    std::vector<float> x, rstd1, xn1, qkv, probs, ctx, x1, rstd2, xn2, gu, act;
  };
  void Linear(const float* a, const float* w, size_t m, size_t k, size_t n, float* y);
  void LinearBackward(const float* a, const float* w, const float* dy, size_t m, size_t k,
                      size_t n, float* da, float* dw);

  const TransformerConfig& cfg_;
  size_t V_, h_, heads_, d_, f_, T_, Bl_, S_;
  int dp_rank_;
  float grad_scale_;
  Rope rope_;
  std::vector<int32_t> inputs_, targets_;
  std::vector<Acts> acts_;           // per block
  std::vector<float> xL_, rstdf_, xf_, logits_;
  std::vector<float> dx_, dx1_, dtmp_, dS_, dqkv_, gu_grad_, scratch_;
};

}  // namespace mc2::models

#endif  // MC2_MODELS_FSDP_LAYERS_H_
