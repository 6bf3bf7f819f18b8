// mc2 demo: how much of the data-parallel gradient all-reduces (GradSync,
// docs/grad.md) the backward hid, from a run's trace.
//
// Works as follows. A gradient all-reduce is an `all_reduce` communication
// span that starts during a backward: at or after a `backward` span's start
// and before the rank's next `forward` span starts (the world's replicated
// gradients are all-reduced at the very end of backward and may finish in
// the next forward; the loss all-reduce starts inside a forward and is not
// counted). Per rank, the union of those spans inside the analysed windows
// (the marked steps) is intersected with the rank's compute: hidden = the
// part some compute covered, exposed = the rest.
#ifndef MC2_TOOLS_DEMO_GRAD_SYNC_H_
#define MC2_TOOLS_DEMO_GRAD_SYNC_H_

#include <cstdint>

#include "mc2/trace_file.h"

namespace mc2::tools {

struct GradSyncOverlap {
  int64_t calls = 0;        // gradient all-reduces (and Batches of buckets), all ranks
  int64_t comm_ns = 0;      // their union's length, summed over ranks
  int64_t hidden_ns = 0;    // the part under compute, summed over ranks
  int ranks = 0;            // ranks with a gradient all-reduce
  double HiddenPct() const { return comm_ns > 0 ? 100.0 * hidden_ns / comm_ns : 0.0; }
};

GradSyncOverlap AnalyzeGradSync(const trace::TraceData& t);

}  // namespace mc2::tools

#endif  // MC2_TOOLS_DEMO_GRAD_SYNC_H_
