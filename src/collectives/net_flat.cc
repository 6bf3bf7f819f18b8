// Flat collectives on groups that span hosts: every rank exchanges with
// every other rank over MPI, whatever the layout of ranks on hosts.
//
// Works as follows (N ranks, B bytes per rank's block):
// - all_gather(v): each rank sends its block to every other rank and
//   receives theirs in place in its output: N-1 messages each way, B each.
// - gather / scatter: the root receives / sends one block per rank.
// - broadcast: the root sends the buffer to every other rank ((N-1) B out
//   of the root's host, less what stays on it: Open MPI's shared memory).
// - all_to_all(v): rank r sends block p of its input to p.
// - reduce_scatter(v): rank r receives block r of every rank's input (raw
//   contributions) and reduces them in the canonical order (ReduceTree):
//   bitwise the result of one host. (N-1) B each way.
// - reduce: every rank sends its input to the root, which reduces them
//   in the canonical order.
// - all_reduce: a reduce_scatter into N shards of the vector, then an
//   all_gather of the reduced shards: 2 (N-1)/N of the vector each way.
// - barrier: an empty message from every rank to every other.
// One step each, all messages of a step in flight together (the net transport
// cuts large ones into pieces).
#include <cstring>

#include "collectives/net_algorithms.h"

namespace mc2::collectives {

namespace {

int Size(const NetGroup& s) { return static_cast<int>(s.members.size()); }

}  // namespace

void FlatAllGatherV(NetGroup& s, const CollArgs& a, Deadline deadline) {
  const int n = Size(s), me = s.rank;
  const size_t e = a.esize;
  char* mine = a.recv + a.displs[me] * e;
  const size_t mine_bytes = a.counts[me] * e;
  NetXfer x(s, deadline, "all_gather");
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    x.Recv(p, kTagGather, a.recv + a.displs[p] * e, a.counts[p] * e);
    x.Send(p, kTagGather, a.in_place ? mine : a.send, mine_bytes);
  }
  if (!a.in_place && mine_bytes) std::memcpy(mine, a.send, mine_bytes);
  x.WaitAll();
}

void FlatGather(NetGroup& s, const CollArgs& a, Deadline deadline) {
  const int n = Size(s), me = s.rank;
  const size_t e = a.esize;
  NetXfer x(s, deadline, "gather");
  if (me != a.root) {
    x.Send(a.root, kTagGather, a.send, a.counts[me] * e);
  } else {
    for (int p = 0; p < n; ++p)
      if (p != me) x.Recv(p, kTagGather, a.recv + a.displs[p] * e, a.counts[p] * e);
    if (!a.in_place && a.counts[me])
      std::memcpy(a.recv + a.displs[me] * e, a.send, a.counts[me] * e);
  }
  x.WaitAll();
}

void FlatScatter(NetGroup& s, const CollArgs& a, Deadline deadline) {
  const int n = Size(s), me = s.rank;
  const size_t b = a.count * a.esize;
  NetXfer x(s, deadline, "scatter");
  if (me != a.root) {
    x.Recv(a.root, kTagScatter, a.recv, b);
  } else {
    for (int p = 0; p < n; ++p)
      if (p != me) x.Send(p, kTagScatter, a.send + p * b, b);
    if (!a.in_place && b) std::memcpy(a.recv, a.send + me * b, b);
  }
  x.WaitAll();
}

void FlatBroadcast(NetGroup& s, const CollArgs& a, Deadline deadline) {
  const int n = Size(s), me = s.rank;
  const size_t bytes = a.count * a.esize;
  NetXfer x(s, deadline, "broadcast");
  if (me != a.root) {
    x.Recv(a.root, kTagBroadcast, a.recv, bytes);
  } else {
    for (int p = 0; p < n; ++p)
      if (p != me) x.Send(p, kTagBroadcast, a.send, bytes);
    if (!a.in_place && bytes) std::memcpy(a.recv, a.send, bytes);
  }
  x.WaitAll();
}

void FlatAllToAllV(NetGroup& s, const CollArgs& a, Deadline deadline) {
  const int n = Size(s), me = s.rank;
  const size_t e = a.esize;
  NetXfer x(s, deadline, "all_to_all");
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    x.Recv(p, kTagAllToAll, a.recv + a.recv_displs[p] * e, a.recv_counts[p] * e);
    x.Send(p, kTagAllToAll, a.send + a.send_displs[p] * e, a.send_counts[p] * e);
  }
  if (a.send_counts[me])
    std::memmove(a.recv + a.recv_displs[me] * e, a.send + a.send_displs[me] * e,
                 a.send_counts[me] * e);
  x.WaitAll();
}

void FlatReduceScatterV(NetGroup& s, const CollArgs& a, Deadline deadline) {
  const int n = Size(s), me = s.rank;
  const size_t e = a.esize, mine = a.counts[me] * e;
  // Every peer's block `me`, in rank order; this rank's own from its input.
  std::vector<char> in(static_cast<size_t>(n) * mine);
  std::vector<const void*> srcs(n);
  NetXfer x(s, deadline, "reduce_scatter");
  for (int p = 0; p < n; ++p) {
    if (p == me) {
      srcs[p] = a.send + a.displs[me] * e;
      continue;
    }
    srcs[p] = in.data() + p * mine;
    x.Recv(p, kTagReduceScatter, in.data() + p * mine, mine);
    x.Send(p, kTagReduceScatter, a.send + a.displs[p] * e, a.counts[p] * e);
  }
  x.WaitAll();
  NetReduceBlocks(a, n, a.recv, srcs, a.counts[me]);
}

void FlatReduce(NetGroup& s, const CollArgs& a, Deadline deadline) {
  const int n = Size(s), me = s.rank;
  const size_t bytes = a.count * a.esize;
  NetXfer x(s, deadline, "reduce");
  if (me != a.root) {
    x.Send(a.root, kTagReduce, a.send, bytes);
    x.WaitAll();
    return;
  }
  std::vector<char> in(static_cast<size_t>(n) * bytes);
  std::vector<const void*> srcs(n);
  for (int p = 0; p < n; ++p) {
    srcs[p] = p == me ? static_cast<const void*>(a.send) : in.data() + p * bytes;
    if (p != me) x.Recv(p, kTagReduce, in.data() + p * bytes, bytes);
  }
  x.WaitAll();
  NetReduceBlocks(a, n, a.recv, srcs, a.count);
}

void FlatAllReduce(NetGroup& s, const CollArgs& a, Deadline deadline) {
  const int n = Size(s), me = s.rank;
  const size_t e = a.esize;
  size_t off, len;
  Share(a.count, n, me, &off, &len);
  std::vector<char> in(static_cast<size_t>(n) * len * e);
  std::vector<const void*> srcs(n);
  NetXfer x(s, deadline, "all_reduce");
  for (int p = 0; p < n; ++p) {
    if (p == me) {
      srcs[p] = a.send + off * e;
      continue;
    }
    size_t poff, plen;
    Share(a.count, n, p, &poff, &plen);
    srcs[p] = in.data() + p * len * e;
    x.Recv(p, kTagReduceScatter, in.data() + p * len * e, len * e);
    x.Send(p, kTagReduceScatter, a.send + poff * e, plen * e);
  }
  // In place, this rank's shard of the output is written only after every
  // shard of the input left (the sends above completed).
  x.WaitAll();
  NetReduceBlocks(a, n, a.recv + off * e, srcs, len);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    size_t poff, plen;
    Share(a.count, n, p, &poff, &plen);
    x.Recv(p, kTagAllGather, a.recv + poff * e, plen * e);
    x.Send(p, kTagAllGather, a.recv + off * e, len * e);
  }
  x.WaitAll();
}

void FlatBarrier(NetGroup& s, const CollArgs&, Deadline deadline) {
  const int n = Size(s), me = s.rank;
  NetXfer x(s, deadline, "barrier");
  char dummy = 0;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    x.Recv(p, kTagBarrier, &dummy, 0);
    x.Send(p, kTagBarrier, &dummy, 0);
  }
  x.WaitAll();
}

}  // namespace mc2::collectives
