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
//
// Pipelined: a vector above kChunkBytes is cut into chunks (at most
// kMaxChunks) that go through the three steps in turn, and while chunk c
// crosses the network, chunk c + 1 is reduce-scattered and chunk c - 1
// all-gathered inside the node (on the node group's progress thread), so
// the node steps hide behind the transfers. Each element goes through the
// same reductions as without chunks: the result is the same bits.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/span_algorithms.h"
#include "engine/access.h"

namespace mc2::collectives {

namespace {

constexpr size_t kChunkBytes = 4u << 20;
constexpr size_t kMaxChunks = 16;

// One chunk of the vector: its elements [off, off + len), each local
// rank's share of them, and this rank's partial result of its share.
struct Chunk {
  size_t off = 0, len = 0;
  std::vector<size_t> counts, displs;
  std::vector<char> part;
  Work node;  // the node step in flight (reduce-scatter, then all-gather)
};

// Waits for every chunk's node step, also when the algorithm fails half
// way: they write into the chunks' buffers. Errors are the caller's.
struct NodeSteps {
  std::vector<Chunk>& chunks;
  ~NodeSteps() {
    for (Chunk& c : chunks) {
      try {
        c.node.Wait();
      } catch (...) {
      }
    }
  }
};

}  // namespace

void HierarchicalAllReduce(SpanGroup& s, const CollArgs& a, Deadline deadline) {
  const int n = static_cast<int>(s.members.size());
  const int hosts = static_cast<int>(s.hosts.size());
  const int local = static_cast<int>(s.hosts[s.my_host].size());
  const int j = s.local_of[s.rank];
  const size_t e = a.esize;
  Group node = internal::Access::MakeGroup(s.node);
  const ReduceOp node_op = a.op == ReduceOp::kAvg ? ReduceOp::kSum : a.op;
  CollectiveOptions background;
  background.may_run_inline = false;

  const size_t nchunks =
      std::clamp<size_t>((a.count * e + kChunkBytes - 1) / kChunkBytes, 1, kMaxChunks);
  std::vector<Chunk> chunks(std::min(nchunks, std::max<size_t>(a.count, 1)));
  for (size_t c = 0; c < chunks.size(); ++c) {
    Chunk& k = chunks[c];
    Share(a.count, static_cast<int>(chunks.size()), static_cast<int>(c), &k.off, &k.len);
    k.counts.resize(local);
    k.displs.resize(local);
    for (int i = 0; i < local; ++i) Share(k.len, local, i, &k.displs[i], &k.counts[i]);
    k.part.resize(k.counts[j] * e);
  }
  NodeSteps wait_all{chunks};
  // 1. The host's partial result of shard j of a chunk.
  auto reduce_in_node = [&](Chunk& k) {
    const char* send = static_cast<const char*>(a.send) + k.off * e;
    if (local > 1) {
      k.node = ReduceScatterV(node, send, k.part.data(), k.counts, a.dtype, node_op, background);
    } else if (!k.part.empty()) {
      std::memcpy(k.part.data(), send, k.part.size());
    }
  };
  reduce_in_node(chunks[0]);
  SpanXfer x(s, deadline, "all_reduce");
  for (size_t c = 0; c < chunks.size(); ++c) {
    Chunk& k = chunks[c];
    k.node.Wait();
    if (c + 1 < chunks.size()) reduce_in_node(chunks[c + 1]);
    // 2. Across hosts, among the ranks of local index j.
    const size_t len = k.counts[j];
    char* part = k.part.data();
    size_t soff, slen;
    Share(len, hosts, s.my_host, &soff, &slen);
    std::vector<char> in(static_cast<size_t>(hosts) * slen * e);
    std::vector<const void*> srcs(hosts);
    for (int h = 0; h < hosts; ++h) {
      if (h == s.my_host) {
        srcs[h] = part + soff * e;
        continue;
      }
      const int peer = s.hosts[h][j];
      size_t poff, plen;
      Share(len, hosts, h, &poff, &plen);
      srcs[h] = in.data() + h * slen * e;
      x.Recv(peer, kTagReduceScatter, in.data() + h * slen * e, slen * e);
      x.Send(peer, kTagReduceScatter, part + poff * e, plen * e);
    }
    x.WaitAll();
    SpanReduceBlocks(a, n, part + soff * e, srcs, slen);
    for (int h = 0; h < hosts; ++h) {
      if (h == s.my_host) continue;
      const int peer = s.hosts[h][j];
      size_t poff, plen;
      Share(len, hosts, h, &poff, &plen);
      x.Recv(peer, kTagAllGather, part + poff * e, plen * e);
      x.Send(peer, kTagAllGather, part + soff * e, slen * e);
    }
    x.WaitAll();
    // 3. Every shard of the chunk to every rank of the host.
    char* recv = static_cast<char*>(a.recv) + k.off * e;
    if (local > 1) {
      k.node = AllGatherV(node, part, recv, k.counts, k.displs, a.dtype, background);
    } else if (len) {
      std::memcpy(recv, part, len * e);
    }
  }
  for (Chunk& k : chunks) k.node.Wait();
}

}  // namespace mc2::collectives
