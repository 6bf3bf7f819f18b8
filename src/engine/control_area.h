// The control area: the memory through which the members of a group
// synchronise, and where small operations stage their data.
//
// Each member of a group owns an area in its heap, laid out identically on
// every member (offsets below are relative to the area):
//
//   [arrive kSlots x 128 B][done 64 B][steps kNumStreams x 64 B]
//   [signals 64 x 8 B][p2p: size x 64 B][inline slots() x kInlineBytes]
//   [scratch 2 x scratch_bytes]
//
// Flags (arrive, done, steps, p2p words) are written only by their owner and
// only increase, so waits are "peer flag >= target". A flag's value for
// operation `seq` is FlagValue(seq, step): monotonic across operations. The
// slots of operation `seq` are those at seq % slots() (arrival.h says when
// they may be rewritten).
//
// Thread safety: constants and pure functions, except ClearArea, which
// writes the caller's own memory before any peer knows where it is.
#ifndef MC2_ENGINE_CONTROL_AREA_H_
#define MC2_ENGINE_CONTROL_AREA_H_

#include <cstddef>
#include <cstdint>

#include "engine/arrival.h"
#include "mc2/group.h"

namespace mc2::internal {

struct ControlArea {
  static constexpr int kNumStreams = 8;
  static constexpr size_t kInlineBytes = 8192;
  // Operation slots in the layout: at most how far an eager rank may run
  // ahead. A world uses all of them when it has more ranks than CPUs, and
  // kDedicatedSlots otherwise (World::slots, SlotsFor). Ranks that share a
  // core switch less often the further they can run ahead; with a core per
  // rank the run ahead gains nothing, while each slot's lines are cold at
  // their first use after the caller touched much memory, so fewer slots
  // are faster (docs/benchmarks.md).
  static constexpr uint64_t kSlots = 128;
  static constexpr uint64_t kDedicatedSlots = 32;
  static_assert((kSlots & (kSlots - 1)) == 0 && (kDedicatedSlots & (kDedicatedSlots - 1)) == 0,
                "slots are indexed by a mask (Slot)");
  static uint64_t SlotsFor(bool oversubscribed);
  static constexpr size_t kArriveOff = 0;
  // An arrive slot: the line of the flag (ArrivalSlot) and one line of
  // stage (StageOff).
  static constexpr size_t kArriveSlotBytes = 128;
  static constexpr size_t kDoneOff = kArriveOff + kSlots * kArriveSlotBytes;
  static constexpr size_t kStepsOff = kDoneOff + 64;
  static constexpr size_t kSignalsOff = kStepsOff + kNumStreams * 64;
  static constexpr size_t kP2POff = kSignalsOff + Group::kNumSignals * 8;

  // Bytes of heap a group of `size` members needs for its control area in a
  // world of `slots` operation slots (World::slots): the inline data of the
  // unused slots is neither allocated nor cleared nor touched.
  static size_t AreaBytes(int size, uint64_t slots, size_t scratch_bytes);
  // Bytes of the fixed part of a control area for a group of `size`
  // members (arrive slots, flags, signals, p2p lines), rounded up to whole
  // pages: the inline slots follow it.
  static size_t FixedBytes(int size);
  // Zeroes the flags and inline areas of a control area at `area` (this
  // rank's memory) for a group of `size` members; scratch needs no reset.
  static void ClearArea(char* area, int size, uint64_t slots);
  // Scratch per half of the groups of a world whose options leave it 0:
  // MC2_SCRATCH_BYTES, default 2 MiB.
  static size_t DefaultScratchBytes();
  // Throws kInvalidArgument, naming `source`, unless `bytes` is a valid
  // scratch size (a multiple of 64, at least 4096); returns it.
  static size_t CheckScratchBytes(size_t bytes, const char* source);

  static uint64_t StepOff(int stream) { return kStepsOff + stream * 64; }
  static uint64_t SignalOff(int slot) { return kSignalsOff + slot * 8; }
  static uint64_t FlagValue(uint64_t seq, uint64_t step) { return (seq << 24) | step; }

  // Staging policy: where an eager operation whose largest stage is
  // `stage_bytes` stages a rank's data (GroupImpl::StageOff): up to
  // kArriveStageBytes in its arrive line, beside the flag, in place of the
  // buffer offsets eager operations do not publish (a reader then takes one
  // line from the writer, not two); else, in a world with more ranks than
  // CPUs, up to kArriveSlotStageBytes in the second line of the arrive
  // slot; else the inline area. The stage size follows from the
  // fingerprint, and World::oversubscribed is the same on every rank
  // (World::slots depends on it too), so writer and readers agree.
  static constexpr size_t kArriveStageBytes = 24;
  static bool StagesInArriveLine(size_t stage_bytes) { return stage_bytes <= kArriveStageBytes; }
  // The arrive slots are contiguous, the inline slots kInlineBytes apart.
  // Ranks that take turns on a core keep losing the inline slots' pages
  // from their TLBs, so small stages go to the arrive slot there; with a
  // CPU per rank the inline slots are better, as a reader polling the flag
  // pulls in the line beside it before the writer has filled it. Stages
  // above a line stay in the inline slots.
  static constexpr size_t kArriveSlotStageBytes = kArriveSlotBytes - 64;
  // Bytes of the next slot's stage an eager operation asks for in
  // exclusive state once its arrival is out (GroupImpl::PrepareNextSlot):
  // the whole stage up to this size; more would queue the requests ahead
  // of the operation's own misses.
  static constexpr size_t kPrepareBytes = 2048;
  // The largest payload GroupImpl::WaitArrival loads while it polls. Only a
  // payload loaded whole gains: a reader that loads the first lines of a
  // larger stage takes them from the writer while it is still filling the
  // stage behind them, and both pay more round trips.
  static constexpr size_t kHintBytes = 256;
  // Flag checks of WaitArrival's first polling stretch (a few
  // microseconds); a single one with more ranks than CPUs, where a wait
  // hands its core to the peer at once (see ShmTransport::WaitGE).
  static constexpr int kHintPolls = 128;
};

// The stage StageOff puts in the arrive line fits between the flag and the
// fingerprint.
static_assert(offsetof(ArrivalSlot, fp) - offsetof(ArrivalSlot, send_off) >=
              ControlArea::kArriveStageBytes);

}  // namespace mc2::internal

#endif  // MC2_ENGINE_CONTROL_AREA_H_
