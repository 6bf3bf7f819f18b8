// The arrival protocol's types: what a rank publishes when it enters an
// operation, so that every member can check that all called the same one.
//
// Works as follows. Most operations start with GroupImpl::Arrive(): each
// rank publishes its fingerprint and buffer offsets in its arrive slot
// (an ArrivalSlot, in its control area, control_area.h) and waits for all
// members to do the same; a fingerprint that differs fails the operation
// with kMismatch on every rank before any data moves. Eager small-message
// operations (collectives/eager.cc) skip that full handshake: a rank
// publishes its fingerprint and data without offsets and waits only for the
// peers whose data it needs (GroupImpl::WaitArrival checks their
// fingerprints), so a broadcast root can run up to slots() operations ahead
// of its receivers, as MPI's eager protocol lets a sender run ahead while
// its messages fit the buffers.
//
// Reuse safety. Every operation ends by publishing done = seq (once; the
// engine adds it if the body did not), and no rank writes the slots of
// operation `seq` (arrive and inline, indexed by seq % slots()) before
// every member's done >= seq - slots() (GroupImpl::AwaitReuse), so a slot
// is never overwritten while still being read. A full arrival proves every
// member finished seq - 2, so AwaitReuse costs nothing after it. User
// buffers read in place by peers (symmetric zero-copy) are protected by
// FinishReads()/WaitReadersDone() at the end of an operation.
#ifndef MC2_ENGINE_ARRIVAL_H_
#define MC2_ENGINE_ARRIVAL_H_

#include <cstdint>
#include <string>

namespace mc2::internal {

// What kind of operation a rank is in; part of the fingerprint.
enum class OpKind : uint16_t {
  kInit = 1,
  kExchange,
  kBarrier,
  kAllReduce,
  kReduce,
  kBroadcast,
  kAllGather,
  kAllGatherV,
  kGather,
  kScatter,
  kReduceScatter,
  kReduceScatterV,
  kAllToAll,
  kAllToAllV,
  kBatch,       // many collectives as one exchange (include/mc2/batch.h)
  kFused = 64,  // fused operators add their own kinds from here on
};
const char* OpKindName(OpKind kind);

// Identifies an operation across ranks: every member must publish the same
// fingerprint for the same sequence number, or the operation fails with
// kMismatch on every rank before any data moves.
struct Fingerprint {
  uint16_t kind = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  int32_t root = -1;
  uint64_t count = 0;     // elements (or bytes for byte-oriented operations)
  uint64_t aux = 0;       // operation-specific (e.g. a hash of per-rank counts)
  uint8_t algorithm = 0;  // mc2::Algorithm that runs it (ranks must agree)
  bool operator==(const Fingerprint&) const = default;
  std::string Describe() const;
};

// Marks a buffer that is not in the symmetric heap.
inline constexpr uint64_t kPrivate = ~uint64_t{0};

// Published by each rank at the start of every operation. Eager
// operations publish no buffer offsets; a small one stages its data in
// their place (GroupImpl::StageOff), so all of it shares the flag's line.
struct alignas(64) ArrivalSlot {
  uint64_t seq;  // the flag: seq of the operation this slot describes
  uint64_t send_off;
  uint64_t recv_off;
  uint64_t pad;
  Fingerprint fp;
};
// One line: the next line of the arrive slot may hold a stage (StageOff).
static_assert(sizeof(ArrivalSlot) <= 64);

}  // namespace mc2::internal

#endif  // MC2_ENGINE_ARRIVAL_H_
