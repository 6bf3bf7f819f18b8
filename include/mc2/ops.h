// mc2/ops.h: the operators' umbrella: GEMM (mc2/gemm.h), the dense fused
// compute+communication operators (mc2/fused_ops.h), the batched one
// (mc2/batch_matmul.h) and the mixture-of-experts ones (mc2/moe.h).
#ifndef MC2_OPS_H_
#define MC2_OPS_H_

#include "mc2/batch_matmul.h"
#include "mc2/fused_ops.h"
#include "mc2/gemm.h"
#include "mc2/moe.h"

#endif  // MC2_OPS_H_
