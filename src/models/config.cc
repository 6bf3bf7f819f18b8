// ValidateConfig and IsMoeLayer of include/mc2/models/config.h: every invariant of
// a TransformerConfig on a grid, checked once, before any communication.
#include <string>

#include "mc2/error.h"
#include "mc2/models.h"

namespace mc2::models {

namespace {

[[noreturn]] void Invalid(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "TransformerConfig: " + msg);
}

std::string Str(long long v) { return std::to_string(v); }

}  // namespace

bool IsMoeLayer(const TransformerConfig& c, int layer) {
  return c.moe_experts > 0 && c.moe_every >= 1 && (layer + 1) % c.moe_every == 0;
}

void ValidateConfig(const TransformerConfig& c, int tp, int dp, int ep, int cp) {
  ValidateConfig(c, tp, dp, ep);
  if (cp < 1) Invalid("cp must be >= 1, not " + Str(cp));
  if (cp == 1) return;
  if (c.seq_len % (2 * cp) != 0) {
    Invalid("seq_len (" + Str(c.seq_len) + ") must be divisible by 2 * cp (" + Str(2 * cp) +
            "): every CP rank holds two of 2 * cp equal chunks of the sequence");
  }
  if ((c.seq_len / cp) % tp != 0) {
    Invalid("seq_len / cp (" + Str(c.seq_len / cp) + ") must be divisible by tp (" + Str(tp) +
            "): a CP rank's positions are sharded across the TP ranks");
  }
  if (ep != 1 || c.moe_experts > 0) {
    Invalid("cp (" + Str(cp) + ") > 1 needs a dense model (moe_experts = 0) and ep = 1");
  }
}

void ValidateConfig(const TransformerConfig& c, int tp, int dp, int ep) {
  auto positive = [](const char* name, long long v) {
    if (v < 1) Invalid(std::string(name) + " must be >= 1, not " + Str(v));
  };
  positive("vocab", c.vocab);
  positive("hidden", c.hidden);
  positive("heads", c.heads);
  positive("ffn", c.ffn);
  positive("layers", c.layers);
  positive("seq_len", c.seq_len);
  positive("batch", c.batch);
  positive("task_param", c.task_param);
  if (tp < 1) Invalid("tp must be >= 1, not " + Str(tp));
  if (dp < 1) Invalid("dp must be >= 1, not " + Str(dp));
  if (ep < 1 || dp % ep != 0) {
    Invalid("ep (" + Str(ep) + ") must be >= 1 and divide dp (" + Str(dp) +
            "): EP groups are carved out of the DP dimension");
  }
  // NOTES: experts are whole on a rank (not split over TP), E / ep per EP
  // rank; top-k picks distinct experts, so k <= E.
  if (c.moe_experts < 0) {
    Invalid("moe_experts must be >= 0 (0: dense MLP), not " + Str(c.moe_experts));
  }
  if (c.moe_experts == 0 && ep > 1) {
    Invalid("ep (" + Str(ep) +
            ") > 1 needs MoE layers (moe_experts > 0): a dense model has "
            "nothing to spread over the EP group");
  }
  if (c.moe_experts > 0) {
    if (c.moe_experts % ep != 0) {
      Invalid("moe_experts (" + Str(c.moe_experts) + ") must be a multiple of ep (" + Str(ep) +
              "): every EP rank holds moe_experts / ep experts");
    }
    if (c.moe_topk < 1 || c.moe_topk > c.moe_experts) {
      Invalid("moe_topk (" + Str(c.moe_topk) + ") must be in 1..moe_experts (" +
              Str(c.moe_experts) + ")");
    }
    if (c.moe_ffn < 0) Invalid("moe_ffn must be >= 0 (0: ffn), not " + Str(c.moe_ffn));
    if (c.moe_every < 1) Invalid("moe_every must be >= 1, not " + Str(c.moe_every));
    if (!(c.moe_aux_loss_coef >= 0.0f)) Invalid("moe_aux_loss_coef must be >= 0");
  }
  if (c.vocab < 2) Invalid("vocab must be >= 2, not " + Str(c.vocab));
  if (c.hidden % c.heads != 0) {
    Invalid("heads (" + Str(c.heads) + ") must divide hidden (" + Str(c.hidden) + ")");
  }
  if ((c.hidden / c.heads) % 2 != 0) {
    Invalid("head_dim = hidden / heads = " + Str(c.hidden / c.heads) + " must be even (RoPE)");
  }
  if (c.heads % tp != 0) {
    Invalid("heads (" + Str(c.heads) + ") must be divisible by tp (" + Str(tp) +
            "): heads are split across the TP ranks");
  }
  if (c.ffn % tp != 0) {
    Invalid("ffn (" + Str(c.ffn) + ") must be divisible by tp (" + Str(tp) + ")");
  }
  if (c.seq_len % tp != 0) {
    Invalid("seq_len (" + Str(c.seq_len) + ") must be divisible by tp (" + Str(tp) +
            "): the sequence is sharded across the TP ranks");
  }
  if (c.batch % dp != 0) {
    Invalid("batch (" + Str(c.batch) + ") must be divisible by dp (" + Str(dp) +
            "): it is the global batch, split across the DP ranks");
  }
  if (c.task == Task::kCopy && c.task_param >= c.seq_len) {
    Invalid("task_param (the copy period, " + Str(c.task_param) + ") must be < seq_len (" +
            Str(c.seq_len) + ")");
  }
  if (c.task != Task::kModAdd && c.task != Task::kCopy) Invalid("unknown task");
  if (c.gemm_dtype != DType::kF32 && c.gemm_dtype != DType::kBF16) {
    Invalid(std::string("gemm_dtype must be f32 or bf16, not ") + DTypeName(c.gemm_dtype));
  }
  if (c.fused.splits < 1 || c.fused.splits > 16) {
    Invalid("fused.splits must be in 1..16, not " + Str(c.fused.splits));
  }
  if (static_cast<int>(c.fused.pipeline) >= kNumPipelines) Invalid("fused.pipeline is invalid");
  if (!(c.norm_eps > 0.0f)) Invalid("norm_eps must be > 0");
  if (!(c.rope_base > 1.0f)) Invalid("rope_base must be > 1");
  if (!(c.lr >= 0.0f)) Invalid("lr must be >= 0");
  if (!(c.beta1 >= 0.0f && c.beta1 < 1.0f)) Invalid("beta1 must be in [0, 1)");
  if (!(c.beta2 >= 0.0f && c.beta2 < 1.0f)) Invalid("beta2 must be in [0, 1)");
  if (!(c.adam_eps > 0.0f)) Invalid("adam_eps must be > 0");
  if (!(c.weight_decay >= 0.0f)) Invalid("weight_decay must be >= 0");
}

}  // namespace mc2::models
