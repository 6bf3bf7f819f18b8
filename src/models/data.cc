// The synthetic tasks of include/mc2/models/config.h (Task) and their batches.
#include "models/data.h"

#include "models/kernels.h"

namespace mc2::models {

const char* TaskName(Task t) {
  switch (t) {
    case Task::kModAdd: return "modadd";
    case Task::kCopy: return "copy";
  }
  return "?";
}

std::optional<Task> ParseTask(std::string_view name) {
  if (name == "modadd") return Task::kModAdd;
  if (name == "copy") return Task::kCopy;
  return std::nullopt;
}

int32_t SequenceToken(const TransformerConfig& c, int step, int64_t sequence, int t) {
  // Each (step, global sequence) is its own stream: the batch of a step is
  // the same whatever the grid, and no state is carried between steps.
  const uint64_t seed = c.seed ^ 0xDA7A5EEDull;
  const uint64_t stream = (static_cast<uint64_t>(step) << 32) ^ static_cast<uint64_t>(sequence);
  const uint32_t v = static_cast<uint32_t>(c.vocab);
  switch (c.task) {
    case Task::kModAdd: {
      uint64_t x0 = HashInt(seed, stream, 0, v);
      uint64_t d = 1 + HashInt(seed, stream, 1, static_cast<uint32_t>(c.task_param));
      return static_cast<int32_t>((x0 + static_cast<uint64_t>(t) * d) % v);
    }
    case Task::kCopy:
      return static_cast<int32_t>(HashInt(seed, stream, 2 + t % c.task_param, v));
  }
  return 0;
}

void MakeBatch(const TransformerConfig& c, int step, int64_t first_sequence, int sequences,
               int64_t row_begin, int64_t row_end, int32_t* inputs, int32_t* targets) {
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int t = static_cast<int>(row / sequences);
    const int64_t seq = first_sequence + row % sequences;
    inputs[row - row_begin] = SequenceToken(c, step, seq, t);
    targets[row - row_begin] = SequenceToken(c, step, seq, t + 1);
  }
}

}  // namespace mc2::models
