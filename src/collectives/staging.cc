// Flag and staging helpers shared by the algorithms.
#include <fmt/format.h>

#include <algorithm>

#include "collectives/algorithm.h"

namespace mc2::collectives {

size_t PartElems(const OpContext& ctx, size_t esize, size_t parts, const char* algorithm) {
  size_t w = ctx.g->scratch_bytes() / (esize * std::max<size_t>(parts, 1));
  if (w == 0)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: a scratch half of {} bytes cannot hold {} elements of {} bytes "
                            "(raise MC2_SCRATCH_BYTES or use another algorithm)",
                            algorithm, ctx.g->scratch_bytes(), parts, esize),
                ctx.g->rank(), ctx.name, ctx.seq);
  return w >= 16 ? w / 16 * 16 : w;
}

void CheckSteps(const OpContext& ctx, size_t rounds, size_t steps_per_round,
                const char* algorithm) {
  if (rounds > kMaxSteps / std::max<size_t>(steps_per_round, 1))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: {} rounds of {} steps exceed the flag range (raise "
                            "MC2_SCRATCH_BYTES)",
                            algorithm, rounds, steps_per_round),
                ctx.g->rank(), ctx.name, ctx.seq);
}

void WaitAll(OpContext& ctx, int stream, uint64_t step) {
  GroupImpl* g = ctx.g;
  uint64_t v = GroupImpl::FlagValue(ctx.seq, step);
  for (int r = 0; r < g->size(); ++r)
    if (r != g->rank()) g->WaitFlag(ctx, r, GroupImpl::StepOff(stream), v);
}

void PublishStep(OpContext& ctx, int stream, uint64_t step, size_t payload) {
  ctx.g->Publish(GroupImpl::StepOff(stream), GroupImpl::FlagValue(ctx.seq, step), payload);
}

void RunStagedRounds(OpContext& ctx, int stream, size_t rounds,
                     const std::function<size_t(size_t k, char* my_half)>& stage,
                     const std::function<void(size_t k, uint64_t half_off)>& consume) {
  GroupImpl* g = ctx.g;
  for (size_t k = 0; k < rounds; ++k) {
    // Half k % 2 was last read in round k - 2; a peer that staged round
    // k - 1 has finished consuming round k - 2.
    if (k >= 2) WaitAll(ctx, stream, k);
    uint64_t half_off = g->ScratchOff(static_cast<int>(k % 2));
    const size_t payload = stage(k, g->Ptr(g->rank(), half_off));
    PublishStep(ctx, stream, k + 1, payload);
    WaitAll(ctx, stream, k + 1);
    consume(k, half_off);
  }
}

void FinishOperation(OpContext& ctx, bool my_buffers_exposed) {
  ctx.g->FinishReads(ctx);
  if (my_buffers_exposed) ctx.g->WaitReadersDone(ctx);
}

}  // namespace mc2::collectives
