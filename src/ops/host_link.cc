// The measured link between a group's hosts (see host_link.h).
#include "ops/host_link.h"

#include <algorithm>
#include <vector>

#include "mc2/collectives.h"

namespace mc2::fused {

namespace {

using Clock = std::chrono::steady_clock;

double TimedAllGather(const Group& g, const std::vector<char>& send, std::vector<char>& recv,
                      const CollectiveOptions& opts) {
  const auto t0 = Clock::now();
  AllGather(g, send.data(), recv.data(), send.size(), DType::kU8, opts).Wait();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

internal::LinkInfo HostLink(const Group& g, std::chrono::nanoseconds timeout) {
  internal::Channel& ch = internal::Channel::Of(g);
  if (ch.HostOf().empty()) return {};
  if (auto kept = ch.host_link()) return *kept;
  CollectiveOptions opts;
  opts.timeout = timeout;
  const size_t n = static_cast<size_t>(g.size());
  std::vector<char> small(8, 0), small_out(8 * n);
  std::vector<char> big(kProbeBytes, 0), big_out(kProbeBytes * n);
  // The first exchange also opens the connections between the hosts.
  TimedAllGather(g, big, big_out, opts);
  double t[2];
  t[0] = std::max(TimedAllGather(g, big, big_out, opts), TimedAllGather(g, big, big_out, opts));
  double lat[3];
  for (double& l : lat) l = TimedAllGather(g, small, small_out, opts);
  std::sort(lat, lat + 3);
  t[1] = lat[1] / 2;
  AllReduce(g, t, t, 2, DType::kF64, ReduceOp::kMax, opts).Wait();
  internal::LinkInfo link;
  link.bytes_per_second = static_cast<double>((n - 1) * kProbeBytes) / std::max(t[0], 1e-9);
  link.latency_seconds = t[1];
  ch.set_host_link(link);
  return link;
}

}  // namespace mc2::fused
