// Hierarchical all-reduce on a group that spans hosts.
//
// Works as follows (N ranks on H hosts, L = N / H per host, a vector of
// B bytes; used when every host holds a contiguous power-of-two block of
// ranks, SpanGroup::aligned):
// 1. inside each node, a reduce-scatter over shared memory: local rank j
//    holds shard j (B / L bytes) reduced over its host's ranks. With the
//    aligned layout that partial result is the subtree of the canonical
//    order T(0, N) (core/reduce.h) over the host's block;
// 2. between hosts, the ranks of local index j (one per host) all-reduce
//    their shards: a reduce-scatter (each takes 1/H of the shard and
//    receives the other hosts' partials of it, reducing the H partials in
//    the canonical order over hosts, which completes T(0, N) because the
//    blocks are aligned powers of two) and an all-gather. Each rank sends
//    and receives 2 (H-1)/H x B / L bytes over the network, so a host's
//    link carries 2 (H-1)/H x B each way: the bound of any all-reduce
//    between H hosts;
// 3. inside each node, an all-gather of the shards over shared memory.
// The node phases use the node group's own algorithms (chosen by its
// selector); the network phase keeps every message of a step in flight.
// kAvg sums at the node level and divides once, at the end of step 2, by N.
#include <cstring>

#include "collectives/span_algorithms.h"
#include "engine/access.h"

namespace mc2::collectives {

void HierarchicalAllReduce(SpanGroup& s, const CollArgs& a, Deadline deadline) {
  const int n = static_cast<int>(s.members.size());
  const int hosts = static_cast<int>(s.hosts.size());
  const int local = static_cast<int>(s.hosts[s.my_host].size());
  const int j = s.local_of[s.rank];
  const size_t e = a.esize;
  Group node = internal::Access::MakeGroup(s.node);

  std::vector<size_t> counts(local), displs(local);
  for (int i = 0; i < local; ++i) Share(a.count, local, i, &displs[i], &counts[i]);
  const size_t len = counts[j];
  std::vector<char> part(len * e);
  // 1. The host's partial result of shard j.
  const ReduceOp node_op = a.op == ReduceOp::kAvg ? ReduceOp::kSum : a.op;
  if (local > 1) {
    ReduceScatterV(node, a.send, part.data(), counts, a.dtype, node_op).Wait();
  } else if (len) {
    std::memcpy(part.data(), a.send, len * e);
  }
  // 2. Across hosts, among the ranks of local index j.
  size_t soff, slen;
  Share(len, hosts, s.my_host, &soff, &slen);
  std::vector<char> in(static_cast<size_t>(hosts) * slen * e);
  std::vector<const void*> srcs(hosts);
  SpanXfer x(s, deadline, "all_reduce");
  for (int h = 0; h < hosts; ++h) {
    if (h == s.my_host) {
      srcs[h] = part.data() + soff * e;
      continue;
    }
    const int peer = s.hosts[h][j];
    size_t poff, plen;
    Share(len, hosts, h, &poff, &plen);
    srcs[h] = in.data() + h * slen * e;
    x.Recv(peer, kTagReduceScatter, in.data() + h * slen * e, slen * e);
    x.Send(peer, kTagReduceScatter, part.data() + poff * e, plen * e);
  }
  x.WaitAll();
  SpanReduceBlocks(a, n, part.data() + soff * e, srcs, slen);
  for (int h = 0; h < hosts; ++h) {
    if (h == s.my_host) continue;
    const int peer = s.hosts[h][j];
    size_t poff, plen;
    Share(len, hosts, h, &poff, &plen);
    x.Recv(peer, kTagAllGather, part.data() + poff * e, plen * e);
    x.Send(peer, kTagAllGather, part.data() + soff * e, slen * e);
  }
  x.WaitAll();
  // 3. Every shard to every rank of the host.
  if (local > 1) {
    AllGatherV(node, part.data(), a.recv, counts, displs, a.dtype).Wait();
  } else if (len) {
    std::memcpy(a.recv, part.data(), len * e);
  }
}

}  // namespace mc2::collectives
