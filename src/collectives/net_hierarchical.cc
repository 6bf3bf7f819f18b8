// Hierarchical all_gather(v) and reduce_scatter(v) on a group that spans
// hosts: what crosses a host's link crosses it once, not once per rank of
// the receiving host.
//
// all_gather(v) (any layout; H hosts, host h with L_h ranks):
// 1. between hosts: every rank sends its block once to each other host,
//    to that host's rank of local index (its own local index mod L_h), its
//    "holder" there. A rank thus holds its own block and the blocks of the
//    other hosts' ranks whose local index maps onto it, packed in rank
//    order;
// 2. inside each host: an all-gather over shared memory of what every
//    local rank holds, then each block to its place in the output.
// A host's link carries each of its blocks once to every other host
// ((H-1) x the host's bytes out) and every other host's blocks once in;
// the flat all-gather carries each block L times into a host of L ranks.
//
// reduce_scatter(v) (NetGroup::aligned: every host a contiguous block of
// L ranks, L a power of two; the dispatch runs the flat one otherwise):
// 1. inside each host: a reduce-scatter over shared memory of the input
//    rearranged so that local rank j's shard is the blocks of the ranks of
//    local index j on every host (host order). Local rank j then holds its
//    host's partial result of those blocks: with the aligned layout, the
//    subtree of the canonical order T(0, N) (core/reduce.h) over the host's
//    ranks, as in the hierarchical all-reduce;
// 2. between hosts: local rank j sends to the rank of local index j on each
//    other host the partial of that rank's block and receives theirs of its
//    own block, then reduces the H partials in host order, which completes
//    T(0, N): bitwise the flat / one-host result. A host's link carries
//    (H-1)/H x B out and in for an input of B bytes per rank with equal
//    blocks; the flat reduce-scatter L times that.
// kAvg sums inside the host and divides once, at the end, by N.
#include <cstring>

#include "collectives/net_algorithms.h"
#include "engine/access.h"

namespace mc2::collectives {

void HierarchicalAllGatherV(NetGroup& s, const CollArgs& a, Deadline deadline) {
  const int n = static_cast<int>(s.members.size());
  const int hosts = static_cast<int>(s.hosts.size());
  const std::vector<int>& here = s.hosts[s.my_host];
  const int local = static_cast<int>(here.size());
  const int me = s.rank, j = s.local_of[me];
  const size_t e = a.esize;
  // What each local rank holds: its own block, then the foreign blocks of
  // local index = it (mod local), in rank order.
  std::vector<std::vector<int>> held(local);
  for (int q = 0; q < local; ++q) held[q].push_back(here[q]);
  for (int p = 0; p < n; ++p)
    if (s.host_of[p] != s.my_host) held[s.local_of[p] % local].push_back(p);
  std::vector<size_t> hcount(local, 0), hdispl(local, 0);
  size_t total = 0;
  for (int q = 0; q < local; ++q) {
    hdispl[q] = total;
    for (int p : held[q]) hcount[q] += a.counts[p];
    total += hcount[q];
  }
  std::vector<char> stage(total * e);
  char* mine = stage.data() + hdispl[j] * e;
  const size_t my_bytes = a.counts[me] * e;
  if (my_bytes)
    std::memcpy(mine, a.in_place ? a.recv + a.displs[me] * e : a.send, my_bytes);
  // 1. Between hosts (empty blocks are known empty on both sides: skipped).
  NetXfer x(s, deadline, "all_gather");
  size_t at = a.counts[me];
  for (size_t k = 1; k < held[j].size(); ++k) {
    const int p = held[j][k];
    if (a.counts[p]) x.Recv(p, kTagGather, mine + at * e, a.counts[p] * e);
    at += a.counts[p];
  }
  if (my_bytes)
    for (int h = 0; h < hosts; ++h) {
      if (h == s.my_host) continue;
      const std::vector<int>& there = s.hosts[h];
      x.Send(there[j % static_cast<int>(there.size())], kTagGather, mine, my_bytes);
    }
  x.WaitAll();
  // 2. Inside the host, in place in the staging buffer; then unpacked.
  if (local > 1)
    AllGatherV(internal::Access::MakeGroup(s.node), mine, stage.data(), hcount, hdispl, a.dtype)
        .Wait();
  for (int q = 0; q < local; ++q) {
    const char* from = stage.data() + hdispl[q] * e;
    for (int p : held[q]) {
      const size_t b = a.counts[p] * e;
      if (b && !(a.in_place && p == me)) std::memcpy(a.recv + a.displs[p] * e, from, b);
      from += b;
    }
  }
}

void HierarchicalReduceScatterV(NetGroup& s, const CollArgs& a, Deadline deadline) {
  const int n = static_cast<int>(s.members.size());
  const int hosts = static_cast<int>(s.hosts.size());
  const int local = static_cast<int>(s.hosts[s.my_host].size());
  const int me = s.rank, j = s.local_of[me];
  const size_t e = a.esize;
  // The input rearranged: local rank t's shard is the blocks of the ranks
  // of local index t, host by host.
  std::vector<size_t> ncount(local, 0);
  size_t total = 0;
  for (int t = 0; t < local; ++t)
    for (int h = 0; h < hosts; ++h) ncount[t] += a.counts[s.hosts[h][t]];
  for (size_t c : ncount) total += c;
  std::vector<char> packed(total * e);
  size_t at = 0, shard_at = 0;
  for (int t = 0; t < local; ++t) {
    if (t == j) shard_at = at;
    for (int h = 0; h < hosts; ++h) {
      const int p = s.hosts[h][t];
      if (a.counts[p])
        std::memcpy(packed.data() + at * e, a.send + a.displs[p] * e, a.counts[p] * e);
      at += a.counts[p];
    }
  }
  // 1. The host's partials of shard j.
  std::vector<char> reduced;
  const char* part = packed.data() + shard_at * e;
  if (local > 1) {
    reduced.resize(ncount[j] * e);
    const ReduceOp node_op = a.op == ReduceOp::kAvg ? ReduceOp::kSum : a.op;
    ReduceScatterV(internal::Access::MakeGroup(s.node), packed.data(), reduced.data(), ncount,
                   a.dtype, node_op)
        .Wait();
    part = reduced.data();
  }
  // 2. Between the ranks of local index j: every host's partial of my block.
  const size_t mine = a.counts[me] * e;
  std::vector<char> in(static_cast<size_t>(hosts) * mine);
  std::vector<const void*> srcs(hosts);
  NetXfer x(s, deadline, "reduce_scatter");
  size_t off = 0;
  for (int h = 0; h < hosts; ++h) {
    const int peer = s.hosts[h][j];
    const size_t b = a.counts[peer] * e;
    if (h == s.my_host) {
      srcs[h] = part + off;
    } else {
      srcs[h] = in.data() + h * mine;
      if (mine) x.Recv(peer, kTagReduceScatter, in.data() + h * mine, mine);
      if (b) x.Send(peer, kTagReduceScatter, part + off, b);
    }
    off += b;
  }
  x.WaitAll();
  NetReduceBlocks(a, n, a.recv, srcs, a.counts[me]);
}

}  // namespace mc2::collectives
