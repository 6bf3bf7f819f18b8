// mc2/collectives.h: asynchronous collectives on a Group.
//
// Conventions shared by every function here:
// - Counts are in elements of `dtype`. Each returns a Work; buffers must stay
//   valid until it completes. Every rank of the group must make the same
//   calls in the same order with matching counts, dtype, op and root (a
//   mismatch raises mc2::Error(kMismatch) on every rank).
// - In place: pass the same pointer as input and output (for the gathering
//   and scattering collectives: the input is this rank's block of the
//   output, as in MPI_IN_PLACE). Otherwise the buffers must not overlap.
// - Buffers from Group::AllocSymmetric run zero-copy; any other memory works
//   and is staged through the group's scratch space.
// - Invalid arguments throw mc2::Error(kInvalidArgument) from the call
//   itself, before any rank waits; communication failures are reported by
//   the Work. Sizes are invalid when a byte count derived from them (count x
//   element size, x group size, a sum of counts, a displacement + count)
//   overflows size_t or exceeds PTRDIFF_MAX, the largest possible buffer.
// - Reductions are deterministic by default (see WorldOptions): the result
//   is bitwise identical for every algorithm, chunk size and run.
#ifndef MC2_COLLECTIVES_H_
#define MC2_COLLECTIVES_H_

#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

#include "mc2/group.h"
#include "mc2/tensor.h"
#include "mc2/work.h"

namespace mc2 {

// Collective algorithms. kAuto picks one per collective, group size and
// message size: from the tuning table (MC2_TUNING_FILE, else
// ~/.cache/mc2/tuning.json, written by `mc2 bench --tune`), else from
// built-in defaults; MC2_ALGO overrides kAuto for every call. Asking a
// collective for an algorithm that does not implement it throws
// kInvalidArgument naming the ones that do.
//
// On a group that spans hosts (docs/multi-host.md) the choice is between
// kHierarchical (inside each host over shared memory, between hosts only
// what must cross) and kDirect (flat: every rank with every other over
// MPI; "flat" parses as kDirect); kAuto (and any other algorithm) picks by
// MC2_ALGO, then the tuning table's entries measured across hosts, then
// the hierarchical algorithm where it carries fewer bytes between hosts.
// On one host kHierarchical implements nothing (MC2_ALGO's `hierarchical`
// applies only across hosts).
enum class Algorithm : uint8_t {
  kAuto = 0,
  kRing,               // bandwidth-optimal on rings; N-1 steps per phase
  kRecursiveDoubling,  // log2(N) steps; for small messages
  kRabenseifner,       // reduce-scatter + all-gather (halving/doubling)
  kBinomialTree,       // log2(N) steps rooted; reduce/broadcast/gather/scatter
  kDirect,             // one shot over symmetric memory; smallest latency
  kHierarchical,       // across hosts only: two levels (node, then hosts)
};
inline constexpr int kNumAlgorithms = 7;
// "auto", "ring", "recursive_doubling", "rabenseifner", "tree", "direct",
// "hierarchical".
const char* AlgorithmName(Algorithm a);
std::optional<Algorithm> ParseAlgorithm(std::string_view name);

struct CollectiveOptions {
  Algorithm algorithm = Algorithm::kAuto;
  // 0 = the group's timeout (MC2_TIMEOUT, default 300 s).
  std::chrono::nanoseconds timeout{0};
  // Calls of up to 4 MiB per rank run to completion on the calling thread
  // when the rank's progress thread is idle: the returned Work is then
  // already complete, and a thread hand-off is saved. Set to
  // false when the call must proceed in the background while the caller
  // computes (overlap), whatever its size.
  bool may_run_inline = true;
};

// recv[i] = send_0[i] (op) ... (op) send_{N-1}[i] on every rank.
Work AllReduce(const Group& g, const void* send, void* recv, size_t count, DType dtype,
               ReduceOp op, const CollectiveOptions& opts = {});
// As AllReduce, but only `root` receives (recv is ignored elsewhere).
Work Reduce(const Group& g, const void* send, void* recv, size_t count, DType dtype,
            ReduceOp op, int root, const CollectiveOptions& opts = {});
// recv = root's send on every rank (send is read on root only).
Work Broadcast(const Group& g, const void* send, void* recv, size_t count, DType dtype, int root,
               const CollectiveOptions& opts = {});
// recv[r*count ..] = rank r's send (count elements from each rank).
Work AllGather(const Group& g, const void* send, void* recv, size_t count, DType dtype,
               const CollectiveOptions& opts = {});
// recv[displs[r] ..] = rank r's counts[r] elements. displs empty: packed in
// rank order. In place: send == recv + displs[rank].
Work AllGatherV(const Group& g, const void* send, void* recv, std::span<const size_t> counts,
                std::span<const size_t> displs, DType dtype, const CollectiveOptions& opts = {});
// As AllGather, but only `root` receives.
Work Gather(const Group& g, const void* send, void* recv, size_t count, DType dtype, int root,
            const CollectiveOptions& opts = {});
// Rank r receives root's send[r*count ..] (send is read on root only).
Work Scatter(const Group& g, const void* send, void* recv, size_t count, DType dtype, int root,
             const CollectiveOptions& opts = {});
// recv = block `rank` (count elements) of the reduction of every rank's send
// (size*count elements). In place: recv == send + rank*count.
Work ReduceScatter(const Group& g, const void* send, void* recv, size_t count, DType dtype,
                   ReduceOp op, const CollectiveOptions& opts = {});
// As ReduceScatter with counts[r] elements for rank r, blocks packed in rank
// order in send. In place: recv == send + sum(counts[0..rank)).
Work ReduceScatterV(const Group& g, const void* send, void* recv, std::span<const size_t> counts,
                    DType dtype, ReduceOp op, const CollectiveOptions& opts = {});
// recv[s*count ..] on rank r = rank s's send[r*count ..].
Work AllToAll(const Group& g, const void* send, void* recv, size_t count, DType dtype,
              const CollectiveOptions& opts = {});
// General all-to-all: rank r sends send_counts[p] elements from
// send[send_displs[p]] to each p, and receives recv_counts[p] elements into
// recv[recv_displs[p]] from each p. Counts must agree pairwise (checked).
Work AllToAllV(const Group& g, const void* send, std::span<const size_t> send_counts,
               std::span<const size_t> send_displs, void* recv,
               std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
               DType dtype, const CollectiveOptions& opts = {});
// Completes on a rank once every rank of the group has entered it.
Work Barrier(const Group& g, const CollectiveOptions& opts = {});

}  // namespace mc2

#endif  // MC2_COLLECTIVES_H_
