// Shared vocabulary of the collective algorithms: the validated arguments of
// one call, and the helpers algorithms use to reach peers' data.
//
// Every algorithm is a "pull" schedule: a rank writes only its own output
// (and its own heap), and reads peers' data either in place (when the peer's
// buffer is in its symmetric heap) or from the peer's scratch, where the peer
// staged it. Flags in the group's control area order these accesses.
#ifndef MC2_COLLECTIVES_ALGORITHM_H_
#define MC2_COLLECTIVES_ALGORITHM_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "engine/group_impl.h"
#include "mc2/collectives.h"

namespace mc2::collectives {

using internal::GroupImpl;
using internal::OpContext;
using internal::OpKind;

// CollArgs::root of the collectives that have none.
inline constexpr int kNoRoot = -1;

struct CollArgs {
  OpKind kind = OpKind::kBarrier;
  const char* send = nullptr;
  char* recv = nullptr;
  size_t count = 0;  // elements: per rank block for gather/scatter/rs/a2a kinds
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = kNoRoot;
  size_t esize = 4;
  bool in_place = false;
  bool deterministic = true;
  // V variants (elements). all_gatherv / reduce_scatterv: counts, displs of
  // every rank's block. all_to_allv: send/recv counts and displs.
  std::vector<size_t> counts, displs;
  std::vector<size_t> send_counts, send_displs, recv_counts, recv_displs;
  // Bytes of this rank's send and recv buffers (for the symmetric test).
  size_t send_bytes = 0, recv_bytes = 0;
  // A private copy of the input that the call owns (in-place all-to-all).
  std::shared_ptr<std::vector<char>> owned_send;
};

using AlgorithmFn = void (*)(OpContext&, const CollArgs&);

// Runs `rounds` staged rounds on flag stream `stream`. In round k every rank
// calls stage(k, half) to copy what peers will need into its scratch half
// k % 2, publishes, waits for every member, then calls consume(k, half_off)
// where half_off is the area-relative offset of half k % 2 (use g->Ptr(peer,
// half_off) to read a peer's staged data). Halves are reused two rounds later
// only after every peer has moved past them. stage returns the bytes the
// peers will read of what it staged, summed over the readers: the payload
// of the round's publish (what link emulation charges).
void RunStagedRounds(OpContext& ctx, int stream, size_t rounds,
                     const std::function<size_t(size_t k, char* my_half)>& stage,
                     const std::function<void(size_t k, uint64_t half_off)>& consume);

inline size_t CeilDiv(size_t a, size_t b) { return b == 0 ? 0 : (a + b - 1) / b; }
inline int Mod(int x, int n) { return ((x % n) + n) % n; }
// Step numbers share a flag word with the sequence number (FlagValue).
inline constexpr uint64_t kMaxSteps = (uint64_t{1} << 24) - 2;

// Elements per part such that `parts` parts of `esize`-byte elements fit in
// one scratch half, rounded down to a multiple of 16 (vector-aligned parts)
// when at least 16 fit. Throws kInvalidArgument naming `algorithm` when not
// even one element per part fits.
size_t PartElems(const OpContext& ctx, size_t esize, size_t parts, const char* algorithm);

// Throws kInvalidArgument naming `algorithm` when `rounds` rounds of
// `steps_per_round` flag steps would overflow the step field of a flag.
void CheckSteps(const OpContext& ctx, size_t rounds, size_t steps_per_round,
                const char* algorithm);

// Waits until every member's flag on `stream` reaches FlagValue(seq, step).
void WaitAll(OpContext& ctx, int stream, uint64_t step);
// Publishes FlagValue(seq, step) on `stream`.
void PublishStep(OpContext& ctx, int stream, uint64_t step, size_t payload = 0);

// Ends an operation whose peers may have read this rank's user buffers in
// place: everyone publishes done, and a rank whose buffers were exposed
// waits until every peer is done.
void FinishOperation(OpContext& ctx, bool my_buffers_exposed);

// Algorithms, one file each. A null entry means "not provided".
struct AlgorithmTable {
  AlgorithmFn fn[kNumAlgorithms][16] = {};  // [algorithm][OpKind]
};
const AlgorithmTable& Algorithms();
// Adds the algorithms beyond direct/rabenseifner (registry.cc).
void RegisterMoreAlgorithms(AlgorithmTable& table);

// direct.cc
// Whether a direct call's inputs are small enough to be staged in the inline
// area before arrival; decided identically on every rank from arguments the
// fingerprint checks. DirectInlineBytes: what each rank would stage.
bool DirectInline(const CollArgs& a, int n);
size_t DirectInlineBytes(const CollArgs& a, int n);
// The bytes rank `me`'s peers read of its data in a direct (or eager) call,
// summed over the readers: what its egress port carries on a network, where
// every reader gets its own copy. Under link emulation a direct call
// publishes this as the payload of the flag that makes the data readable.
size_t DirectPeerBytes(const CollArgs& a, int n, int me);
void DirectAllReduce(OpContext&, const CollArgs&);
void DirectReduce(OpContext&, const CollArgs&);
void DirectBroadcast(OpContext&, const CollArgs&);
void DirectAllGatherV(OpContext&, const CollArgs&);
void DirectGather(OpContext&, const CollArgs&);
void DirectScatter(OpContext&, const CollArgs&);
void DirectReduceScatterV(OpContext&, const CollArgs&);
void DirectAllToAllV(OpContext&, const CollArgs&);
void DirectBarrier(OpContext&, const CollArgs&);
// eager.cc: the direct algorithm's small-message path, which skips the full
// arrival handshake (see the file). A call is eligible when its largest
// stage (EagerStagedBytes) fits an inline slot. That depends only on
// fingerprinted arguments, so every rank takes the same path.
size_t EagerStagedBytes(const CollArgs& a, int n);
// `stage_bytes`: EagerStagedBytes(a, group size).
void RunEager(OpContext& ctx, const CollArgs& a, const internal::Fingerprint& fp,
              size_t stage_bytes);
// RunEager for an all_reduce, from its arguments without a CollArgs (the
// latency path of the smallest calls; see AllReduce).
void RunEagerAllReduce(OpContext& ctx, const void* send, void* recv, size_t count, DType dtype,
                       ReduceOp op, const internal::Fingerprint& fp);
// rabenseifner.cc
void RabenseifnerAllReduce(OpContext&, const CollArgs&);
// ring.cc
void RingAllReduce(OpContext&, const CollArgs&);
void RingAllGatherV(OpContext&, const CollArgs&);
void RingReduceScatterV(OpContext&, const CollArgs&);
void RingBroadcast(OpContext&, const CollArgs&);
// recursive_doubling.cc
void RecursiveDoublingAllReduce(OpContext&, const CollArgs&);
void RecursiveDoublingAllGatherV(OpContext&, const CollArgs&);
// tree.cc
void TreeReduce(OpContext&, const CollArgs&);
void TreeAllReduce(OpContext&, const CollArgs&);
void TreeBroadcast(OpContext&, const CollArgs&);
void TreeGather(OpContext&, const CollArgs&);
void TreeScatter(OpContext&, const CollArgs&);
void TreeBarrier(OpContext&, const CollArgs&);

}  // namespace mc2::collectives

#endif  // MC2_COLLECTIVES_ALGORITHM_H_
