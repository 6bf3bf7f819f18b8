// Hierarchical all-reduce on a group that spans hosts.
//
// Works as follows (N ranks on H hosts, L = N / H per host, a vector of
// B bytes; used when every host holds a contiguous power-of-two block of
// ranks, NetGroup::aligned):
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
//
// With one rank per host the node steps vanish, and so do the copies: the
// reduce-scatter sends straight from the input, the reduction writes the
// output, and the all-gather receives into it. Scratch buffers are never
// zeroed: every byte is written before it is read.
#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "collectives/net_algorithms.h"
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
  // This rank's share of the chunk, reduced over its host (then over every
  // host): its own storage, or with one rank per host the output itself.
  char* part = nullptr;
  // Where the host's partial of the share is read from: `part`, or with one
  // rank per host the input.
  const char* own = nullptr;
  char* in = nullptr;  // the other hosts' partials of this rank's piece
  std::unique_ptr<char[]> part_store, in_store;
  Work node;             // the node step in flight (reduce-scatter, then all-gather)
  std::optional<NetXfer> rs, ag;  // the exchanges across hosts
};

// Waits for every chunk's node step, also when the algorithm fails half
// way: they write into the chunks' buffers. Errors are the caller's. (A
// failed exchange across hosts fails the whole job, whose receives the MPI
// engine cancels.)
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

void HierarchicalAllReduce(NetGroup& s, const CollArgs& a, Deadline deadline) {
  const int n = static_cast<int>(s.members.size());
  const int hosts = static_cast<int>(s.hosts.size());
  const int local = static_cast<int>(s.hosts[s.my_host].size());
  const int j = s.local_of[s.rank];
  const size_t e = a.esize;
  Group node = internal::Access::MakeGroup(s.node);
  const ReduceOp node_op = a.op == ReduceOp::kAvg ? ReduceOp::kSum : a.op;
  // A node step overlapped with transfers runs on the node's progress
  // thread; one the caller waits for at once (the first chunk's
  // reduce-scatter, the last chunk's all-gather) may run on the caller.
  CollectiveOptions background, at_once;
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
    if (local > 1) {
      k.part_store.reset(new char[k.counts[j] * e]);
      k.part = k.part_store.get();
      k.own = k.part;
    } else {
      k.part = static_cast<char*>(a.recv) + k.off * e;
      k.own = static_cast<const char*>(a.send) + k.off * e;
    }
  }
  NodeSteps wait_all{chunks};
  // 1. The host's partial result of shard j of a chunk.
  auto reduce_in_node = [&](Chunk& k) {
    const char* send = static_cast<const char*>(a.send) + k.off * e;
    if (local > 1) {
      k.node = ReduceScatterV(node, send, k.part, k.counts, a.dtype, node_op,
                              &k == &chunks[0] ? at_once : background);
    }
  };
  // 2. Across hosts, among the ranks of local index j: the reduce-scatter
  // exchange of a chunk is posted while the previous chunk's all-gather
  // exchange is in flight, so the link does not drain between them.
  const int me = s.my_host;
  auto shard = [&](const Chunk& k, int h, size_t* off, size_t* len) {
    Share(k.counts[j], hosts, h, off, len);
  };
  auto post_reduce_scatter = [&](Chunk& k) {
    size_t soff, slen;
    shard(k, me, &soff, &slen);
    k.in_store.reset(new char[static_cast<size_t>(hosts) * slen * e]);
    k.in = k.in_store.get();
    for (int h = 0; h < hosts; ++h) {
      if (h == me) continue;
      size_t poff, plen;
      shard(k, h, &poff, &plen);
      k.rs->Recv(s.hosts[h][j], kTagReduceScatter, k.in + h * slen * e, slen * e);
      k.rs->Send(s.hosts[h][j], kTagReduceScatter, k.own + poff * e, plen * e);
    }
  };
  auto reduce_and_post_all_gather = [&](Chunk& k) {
    size_t soff, slen;
    shard(k, me, &soff, &slen);
    char* mine = k.part + soff * e;
    std::vector<const void*> srcs(hosts);
    for (int h = 0; h < hosts; ++h) srcs[h] = h == me ? k.own + soff * e : k.in + h * slen * e;
    NetReduceBlocks(a, n, mine, srcs, slen);
    for (int h = 0; h < hosts; ++h) {
      if (h == me) continue;
      size_t poff, plen;
      shard(k, h, &poff, &plen);
      k.ag->Recv(s.hosts[h][j], kTagAllGather, k.part + poff * e, plen * e);
      k.ag->Send(s.hosts[h][j], kTagAllGather, mine, slen * e);
    }
  };
  for (Chunk& k : chunks) {
    k.rs.emplace(s, deadline, "all_reduce");
    k.ag.emplace(s, deadline, "all_reduce");
  }
  reduce_in_node(chunks[0]);
  chunks[0].node.Wait();
  post_reduce_scatter(chunks[0]);
  if (chunks.size() > 1) reduce_in_node(chunks[1]);
  for (size_t c = 0; c < chunks.size(); ++c) {
    Chunk& k = chunks[c];
    k.rs->WaitAll();
    reduce_and_post_all_gather(k);
    if (c + 1 < chunks.size()) {
      chunks[c + 1].node.Wait();
      post_reduce_scatter(chunks[c + 1]);
      if (c + 2 < chunks.size()) reduce_in_node(chunks[c + 2]);
    }
    k.ag->WaitAll();
    // 3. Every shard of the chunk to every rank of the host.
    char* recv = static_cast<char*>(a.recv) + k.off * e;
    if (local > 1) {
      k.node = AllGatherV(node, k.part, recv, k.counts, k.displs, a.dtype,
                          c + 1 == chunks.size() ? at_once : background);
    }
  }
  for (Chunk& k : chunks) k.node.Wait();
}

}  // namespace mc2::collectives
