// The pipeline schedules (PipelineSchedule in include/mc2/models/pipeline.h): the
// order in which one stage runs the forwards and backwards of its chunks on
// the micro-batches. A pure function of (schedule, pp, stage, m, v): every
// stage derives its own list, and the lists of all stages together never
// wait in a cycle (each operation waits only for its input, which an
// earlier operation of another stage produces).
#ifndef MC2_MODELS_SCHEDULE_H_
#define MC2_MODELS_SCHEDULE_H_

#include <vector>

#include "mc2/models.h"

namespace mc2::models {

struct ScheduleOp {
  bool forward = true;
  int local_chunk = 0;  // 0..v-1; the model's chunk is local_chunk * pp + stage
  int micro = 0;
};

// Stage `stage`'s operations, in order: m * v forwards and as many
// backwards. Arguments as ValidatePipeline accepts them.
std::vector<ScheduleOp> MakeSchedule(const PipelineConfig& pipe, int pp, int stage);

// Runs every stage's list as fast as the dependencies allow, with the
// given times per operation (forward of one chunk, backward of one chunk)
// and per transfer: an operation's output leaves its stage when it ends,
// through the stage's one egress port (its transfers one after the other,
// `transfer_seconds` each), and can be used once it has arrived. Returns
// the makespan, each stage's busy time (the reference the measured bubble
// is checked against) and its uncovered time: waiting for an input whose
// sender had already finished computing it (PipelineOp::uncovered).
// Throws kInternal if the lists would wait in a cycle.
struct SimulatedSchedule {
  double makespan = 0;
  std::vector<double> busy;       // per stage
  std::vector<double> uncovered;  // per stage
};
SimulatedSchedule SimulateSchedule(const PipelineConfig& pipe, int pp, double forward_seconds,
                                   double backward_seconds, double transfer_seconds = 0);

}  // namespace mc2::models

#endif  // MC2_MODELS_SCHEDULE_H_
