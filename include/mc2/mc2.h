// mc2/mc2.h: the library's whole public API: groups, collectives, batches of collectives, fused
// operators, GEMM, gradient synchronisation and tracing. The reference
// models are not part of it: they have their own header, <mc2/models.h>,
// and library (mc2::models).
#ifndef MC2_MC2_H_
#define MC2_MC2_H_

#include "mc2/batch.h"
#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/grad.h"
#include "mc2/group.h"
#include "mc2/ops.h"
#include "mc2/tensor.h"
#include "mc2/trace.h"
#include "mc2/work.h"

#endif  // MC2_MC2_H_
