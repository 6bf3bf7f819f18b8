// The transformer's parameters on one rank: the tensors, laid out in
// gradient buckets; their GEMM copies (bf16; the experts' transposed); the
// AdamW state and the deferred updates of TrainStep.
#ifndef MC2_MODELS_PARAMETERS_H_
#define MC2_MODELS_PARAMETERS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "mc2/models.h"
#include "models/dims.h"

namespace mc2::models {

// Where a tensor's gradient is summed and over which group: the world (TP-
// replicated tensors), the DP group (TP shards) or the ranks holding the
// same experts (grid.edp).
enum class Sync { kWorld, kDp, kExpert };

struct Param {
  std::string name;
  size_t rows = 0, cols = 0;
  bool replicated = false;
  bool decay = false;
  int bucket = 0;
  size_t offset = 0;
  float* w = nullptr;
  float* g = nullptr;
  // Trace span names of the projection's fused calls, made once (building
  // them per call would cost an allocation even with tracing off).
  std::string span_fwd, span_dgrad;
  bool experts = false;  // a MoE layer's experts: sharded over EP
};

// The tensors of one sublayer (or the replicated ones): their weights and
// AdamW moments, and where their gradients are summed. The gradients live
// in the GradSync buckets of grad_sync.h.
struct Bucket {
  Sync sync = Sync::kDp;
  std::vector<float> w, m, v;
};

// Parameter indices of one block.
struct BlockParams {
  int norm1, qkv, o, norm2;
  int gu = -1, down = -1;                 // dense MLP
  int router = -1, egu = -1, edown = -1;  // MoE: router, experts' gate|up, down
};

// Invariants: buckets' vectors are sized once in the constructor (Param::w
// points into them; Param::g is set by DpSync, grad_sync.h); cache[p].w
// (bf16) and .wt (experts only) match the values of tensor p when their
// w_version / wt_version == version (bumped by every optimizer step and by
// WeightsChanged); update_pending[p] marks a tensor whose AdamW update
// TrainStep left to the next forward (its copies are rebuilt when it is
// applied).
// Thread safety: one thread per rank (the Transformer's contract).
class ParamStore {
 public:
  // Lays the tensors out in buckets (0: the TP-replicated ones, summed over
  // the world; 1 + 2l: block l's attention; 2 + 2l: its MLP, over DP, or
  // its experts, over grid.edp) and initialises them from config.seed.
  // `wait_world_grads` is called before a deferred update of a world-summed
  // tensor, whose gradient's all-reduce may still be running.
  ParamStore(const Dims& dims, const ProcessGrid& grid, const TransformerConfig& cfg,
             std::function<void()> wait_world_grads);

  Param& operator[](int p) { return list_[p]; }
  const std::vector<Param>& list() const { return list_; }
  size_t size() const { return list_.size(); }
  bool world_synced(int p) const { return buckets[list_[p].bucket].sync == Sync::kWorld; }

  // The projections' weights as their GEMMs take them: W in the GEMM dtype
  // (RefreshWeights; the dense dgrads read it as B^T, with no copy), and
  // the experts' W^T (made by RefreshWeights too, since their forward uses
  // them).
  const void* W(int p) {
    if (dims_.dt == DType::kF32) return list_[p].w;
    return cache_[p].w.data();
  }
  const void* WT(int p) { return cache_[p].wt.data(); }
  void RefreshWeights();
  // Call after the values changed other than by an optimizer step.
  void Changed() { ++version_; }

  // Starts an optimizer step (AdamW's bias correction counts them).
  void NextStep() { ++opt_step_; }
  // AdamW on every tensor now: those summed over the world if `world`,
  // else the others.
  void UpdateAll(bool world);
  // The step's updates to be applied later, tensor by tensor (ApplyUpdate).
  void DeferUpdates();
  // A deferred update, if tensor p (p < 0: none) has one pending.
  void ApplyUpdate(int p);
  void ApplyUpdates(std::initializer_list<int> ps) {
    for (int p : ps) ApplyUpdate(p);
  }
  void ApplyAllUpdates();

  std::vector<Bucket> buckets;
  int p_embed = -1, p_final_norm = -1, p_lm_head = -1;
  std::vector<BlockParams> bp;  // by block

 private:
  // GEMM copies of a projection's weights (W in the GEMM dtype, W^T). An
  // expert tensor is El matrices stacked by rows ([El x k x n]); its W^T is
  // each one transposed ([El x n x k]), as the MoE operators take it.
  struct Cached {
    std::vector<char> w, wt;
    uint64_t w_version = ~0ull, wt_version = ~0ull;  // of w (bf16 only) and of wt
    size_t blocks = 1;                               // stacked matrices
  };

  void Add(const std::string& name, size_t rows, size_t cols, bool replicated, bool decay,
           int bucket, int* index);
  void Layout();
  void Init();
  void RefreshTranspose(int p);
  void AdamWUpdate(int p);

  const Dims& dims_;
  const ProcessGrid& grid_;
  const TransformerConfig& cfg_;
  std::function<void()> wait_world_grads_;
  std::vector<Param> list_;
  std::vector<Cached> cache_;                        // by param index
  std::vector<float> transpose_scratch_;             // f32 W^T before bf16 rounding
  std::vector<std::pair<int, size_t>> gemm_params_;  // (param, stacked matrices)
  uint64_t version_ = 0;
  int opt_step_ = 0;
  std::vector<char> update_pending_;  // by param index
  std::vector<char> is_gemm_param_;   // by param index: in gemm_params_
};

}  // namespace mc2::models

#endif  // MC2_MODELS_PARAMETERS_H_
