// The 1F1B, eager 1F1B and interleaved 1F1B schedules (schedule.h) and
// their simulation with uniform operation and transfer times.
#include "models/schedule.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "mc2/error.h"

namespace mc2::models {

const char* ScheduleName(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::k1F1B: return "1f1b";
    case PipelineSchedule::kInterleaved: return "interleaved";
    case PipelineSchedule::kEager1F1B: return "eager-1f1b";
  }
  return "?";
}

std::optional<PipelineSchedule> ParseSchedule(std::string_view name) {
  if (name == "1f1b") return PipelineSchedule::k1F1B;
  if (name == "interleaved") return PipelineSchedule::kInterleaved;
  if (name == "eager-1f1b") return PipelineSchedule::kEager1F1B;
  return std::nullopt;
}

double BubbleFormula(const PipelineConfig& pipe, int pp) {
  const double p = pp, m = pipe.micro_batches;
  const double v = pipe.schedule == PipelineSchedule::kInterleaved ? pipe.virtual_stages : 1;
  return (p - 1) / (v * m + p - 1);
}

std::vector<ScheduleOp> MakeSchedule(const PipelineConfig& pipe, int pp, int stage) {
  const int m = pipe.micro_batches;
  const int v = pipe.schedule == PipelineSchedule::kInterleaved ? pipe.virtual_stages : 1;
  const int total = m * v;
  // The k-th forward (backward) of this stage: micro-batches go in groups
  // of pp, each group through chunk 0, 1, ... v-1 (backward: v-1 ... 0);
  // with v = 1 this is micro-batch k of the only chunk.
  auto op = [&](int k, bool forward) {
    ScheduleOp o;
    o.forward = forward;
    const int in_group = k % (pp * v);
    o.local_chunk = in_group / pp;
    if (!forward) o.local_chunk = v - 1 - o.local_chunk;
    o.micro = (k / (pp * v)) * pp + k % pp;
    if (v == 1) o.micro = k;
    return o;
  };
  // Warm-up forwards: enough that the last stage's first backward can
  // start as soon as its input exists; with v chunks, the whole first
  // round of the other chunks too (Megatron-LM's interleaved schedule).
  // Eager 1F1B doubles the lead of each stage over the next: the next
  // stage then sends the gradient of micro-batch j while stage r runs its
  // backward of j - 1, not when it is due, and it travels while stage r
  // runs the forward of micro-batch j + 2 (p - r - 1) in between.
  int warmup;
  if (pipe.schedule == PipelineSchedule::kEager1F1B) {
    warmup = std::min(2 * (pp - stage - 1), m);
  } else if (v == 1) {
    warmup = std::min(pp - stage - 1, m);
  } else if (m == pp) {
    warmup = total;
  } else {
    warmup = std::min((pp - stage - 1) * 2 + (v - 1) * pp, total);
  }
  std::vector<ScheduleOp> out;
  out.reserve(2 * total);
  for (int k = 0; k < warmup; ++k) out.push_back(op(k, true));
  const int steady = total - warmup;
  for (int k = 0; k < steady; ++k) {
    out.push_back(op(warmup + k, true));
    out.push_back(op(k, false));
  }
  for (int k = steady; k < total; ++k) out.push_back(op(k, false));
  return out;
}

SimulatedSchedule SimulateSchedule(const PipelineConfig& pipe, int pp, double forward_seconds,
                                   double backward_seconds, double transfer_seconds) {
  const int v = pipe.schedule == PipelineSchedule::kInterleaved ? pipe.virtual_stages : 1;
  const int chunks = pp * v;
  std::vector<std::vector<ScheduleOp>> lists(pp);
  for (int r = 0; r < pp; ++r) lists[r] = MakeSchedule(pipe, pp, r);
  // (forward, model chunk, micro) -> when it ended, and when its output
  // reached the stage that needs it.
  struct Done {
    double end = 0, arrived = 0;
  };
  std::map<std::tuple<bool, int, int>, Done> done;
  std::vector<size_t> next(pp, 0);
  std::vector<double> free_at(pp, 0.0), port_free(pp, 0.0);
  SimulatedSchedule sim;
  sim.busy.assign(pp, 0.0);
  sim.uncovered.assign(pp, 0.0);
  size_t left = 0;
  for (const auto& l : lists) left += l.size();
  while (left > 0) {
    bool progress = false;
    for (int r = 0; r < pp; ++r) {
      while (next[r] < lists[r].size()) {
        const ScheduleOp& o = lists[r][next[r]];
        const int g = o.local_chunk * pp + r;
        // Its input: the previous chunk's forward, or the next chunk's
        // backward (the last chunk: its own forward).
        std::tuple<bool, int, int> dep;
        bool has_dep = true;
        if (o.forward) {
          has_dep = g > 0;
          dep = {true, g - 1, o.micro};
        } else {
          dep = g + 1 < chunks ? std::make_tuple(false, g + 1, o.micro)
                               : std::make_tuple(true, g, o.micro);
        }
        double start = free_at[r];
        if (has_dep) {
          auto it = done.find(dep);
          if (it == done.end()) break;
          const Done& in = it->second;
          start = std::max(start, in.arrived);
          sim.uncovered[r] += std::max(0.0, start - std::max(free_at[r], in.end));
        }
        const double dur = o.forward ? forward_seconds : backward_seconds;
        free_at[r] = start + dur;
        sim.busy[r] += dur;
        Done d;
        d.end = d.arrived = free_at[r];
        // Its output goes to chunk g + 1 (forward) or g - 1 (backward):
        // through the port when that chunk is on another stage.
        const int to = o.forward ? g + 1 : g - 1;
        if (to >= 0 && to < chunks && to % pp != r) {
          const double leave = std::max(free_at[r], port_free[r]);
          port_free[r] = leave + transfer_seconds;
          d.arrived = port_free[r];
        }
        done[{o.forward, g, o.micro}] = d;
        sim.makespan = std::max(sim.makespan, free_at[r]);
        ++next[r];
        --left;
        progress = true;
      }
    }
    if (!progress) {
      throw Error(ErrorCode::kInternal, std::string("pipeline schedule ") +
                                            ScheduleName(pipe.schedule) +
                                            " waits in a cycle");
    }
  }
  return sim;
}

}  // namespace mc2::models
