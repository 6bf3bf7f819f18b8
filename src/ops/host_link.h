// The link between the hosts of a group that spans them, as the fused
// operators' cost model sees it.
//
// The cost model (ops/cost_model.h) predicts a pipeline's communication on
// a link as the bytes the pipeline puts on a rank's port over the port's
// rate. On one host that rate is the emulated link's (MC2_LINK); across
// hosts the links are real, and their rate is measured: an all_gather of
// kProbeBytes per rank runs twice after a warm-up, and the port rate is the
// all_gather's port bytes per rank, (N - 1) x kProbeBytes, over its time
// (the slower of the two runs, slowest rank). So the rate already counts
// what the ranks of a host share and what travels inside a host. The
// latency is half the time of an 8-byte all_gather (median of three).
// Every rank ends with the same values (maxima over the ranks), so the
// cost model chooses alike everywhere.
//
// The measurement runs once per group, in the first operator call on it
// (every member makes that call), and is kept in the group's channel for
// the group's life. At 100 Mbit/s between 2 hosts of 2 ranks it takes
// about a third of a second.
//
// Thread safety: called by the thread issuing the group's operations.
#ifndef MC2_OPS_HOST_LINK_H_
#define MC2_OPS_HOST_LINK_H_

#include <chrono>
#include <cstddef>

#include "engine/channel.h"
#include "mc2/group.h"

namespace mc2::fused {

inline constexpr size_t kProbeBytes = 256 << 10;

// The link between g's hosts: measured on the first call (collective over
// g), the kept value after. A group within one host: no link (zeros).
internal::LinkInfo HostLink(const Group& g, std::chrono::nanoseconds timeout);

}  // namespace mc2::fused

#endif  // MC2_OPS_HOST_LINK_H_
