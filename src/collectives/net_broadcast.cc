// Hierarchical broadcast on a group that spans hosts.
//
// Works as follows (H hosts, B bytes): the root sends the buffer to one
// rank of every other host (its first member), then every host broadcasts
// it inside the node over shared memory from that rank (on the root's
// host, from the root). The root's link carries (H-1) B; every other
// host's link B once, whatever its number of ranks.
#include <cstring>

#include "collectives/net_algorithms.h"
#include "engine/access.h"

namespace mc2::collectives {

void HierarchicalBroadcast(NetGroup& s, const CollArgs& a, Deadline deadline) {
  const int hosts = static_cast<int>(s.hosts.size());
  const int root_host = s.host_of[a.root];
  const size_t bytes = a.count * a.esize;
  auto leader = [&](int h) { return h == root_host ? a.root : s.hosts[h][0]; };
  const bool is_root = s.rank == a.root;
  NetXfer x(s, deadline, "broadcast");
  if (is_root) {
    for (int h = 0; h < hosts; ++h)
      if (h != root_host) x.Send(leader(h), kTagBroadcast, a.send, bytes);
  } else if (s.rank == leader(s.my_host)) {
    x.Recv(a.root, kTagBroadcast, a.recv, bytes);
  }
  x.WaitAll();
  const int local_root = s.local_of[leader(s.my_host)];
  if (s.hosts[s.my_host].size() > 1) {
    const void* src = is_root ? static_cast<const void*>(a.send) : a.recv;
    Broadcast(internal::Access::MakeGroup(s.node), src, a.recv, a.count, a.dtype, local_root)
        .Wait();
  } else if (is_root && !a.in_place && bytes) {
    std::memcpy(a.recv, a.send, bytes);
  }
}

}  // namespace mc2::collectives
