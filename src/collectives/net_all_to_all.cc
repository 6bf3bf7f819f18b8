// Node-aggregated all_to_all(v) on a group that spans hosts: few, large
// messages between hosts.
//
// Works as follows (any layout; H hosts, host h with L_h ranks):
// 1. between hosts: every rank packs, for each other host h, its blocks
//    for all of h's ranks into one message and sends it to one rank of h,
//    the rank of local index (its own local index mod L_h). A rank sends
//    H-1 messages instead of one per rank of the other hosts, and a
//    host pair exchanges L messages each way instead of L x L;
// 2. inside each host: an all-to-all over shared memory in which every
//    rank hands each local rank its own block for it and the blocks it
//    received for it, then each block goes to its place in the output.
// Every byte bound for another host crosses the links once, as in the flat
// all-to-all: the gain is in the number of messages (latency, per-message
// cost), paid for with two local copies of the data.
// In all_to_allv a rank knows only its own counts, so the ranks of a host
// first all-gather their receive counts: the holder of a foreign rank's
// message learns from them how it divides among the local ranks.
#include <cstring>

#include "collectives/net_algorithms.h"
#include "engine/access.h"

namespace mc2::collectives {

void HierarchicalAllToAllV(NetGroup& s, const CollArgs& a, Deadline deadline) {
  const int n = static_cast<int>(s.members.size());
  const int hosts = static_cast<int>(s.hosts.size());
  const std::vector<int>& here = s.hosts[s.my_host];
  const int local = static_cast<int>(here.size());
  const int me = s.rank, j = s.local_of[me];
  const size_t e = a.esize;
  Group node = internal::Access::MakeGroup(s.node);
  // rc[t * n + p]: elements local rank t receives from rank p.
  std::vector<int64_t> rc(static_cast<size_t>(local) * n);
  if (a.kind == OpKind::kAllToAllV && local > 1) {
    std::vector<int64_t> mine(a.recv_counts.begin(), a.recv_counts.end());
    AllGather(node, mine.data(), rc.data(), n, DType::kI64).Wait();
  } else {
    for (int t = 0; t < local; ++t)
      for (int p = 0; p < n; ++p) rc[static_cast<size_t>(t) * n + p] = a.recv_counts[p];
  }
  auto from = [&](int t, int p) { return static_cast<size_t>(rc[static_cast<size_t>(t) * n + p]); };
  // held[q]: the foreign ranks whose messages local rank q receives.
  std::vector<std::vector<int>> held(local);
  for (int p = 0; p < n; ++p)
    if (s.host_of[p] != s.my_host) held[s.local_of[p] % local].push_back(p);

  // 1. Between hosts: one packed message to each other host, one from
  // each foreign rank this rank holds for.
  std::vector<std::vector<char>> out(hosts);
  NetXfer x(s, deadline, "all_to_all");
  for (int h = 0; h < hosts; ++h) {
    if (h == s.my_host) continue;
    const std::vector<int>& there = s.hosts[h];
    size_t bytes = 0;
    for (int m : there) bytes += a.send_counts[m] * e;
    if (!bytes) continue;
    out[h].resize(bytes);
    char* at = out[h].data();
    for (int m : there) {
      const size_t b = a.send_counts[m] * e;
      if (b) std::memcpy(at, a.send + a.send_displs[m] * e, b);
      at += b;
    }
    x.Send(there[j % static_cast<int>(there.size())], kTagAllToAll, out[h].data(), bytes);
  }
  std::vector<size_t> inbox_off(held[j].size() + 1, 0);
  for (size_t k = 0; k < held[j].size(); ++k) {
    size_t b = 0;
    for (int t = 0; t < local; ++t) b += from(t, held[j][k]) * e;
    inbox_off[k + 1] = inbox_off[k] + b;
  }
  std::vector<char> inbox(inbox_off.back());
  for (size_t k = 0; k < held[j].size(); ++k)
    if (inbox_off[k + 1] > inbox_off[k])
      x.Recv(held[j][k], kTagAllToAll, inbox.data() + inbox_off[k],
             inbox_off[k + 1] - inbox_off[k]);
  x.WaitAll();

  // 2. Inside the host: to local rank t, this rank's own block for t, then
  // the block for t of every message held, in the order of held[j].
  std::vector<size_t> sc(local, 0), sd(local, 0), rcn(local, 0), rd(local, 0);
  size_t stotal = 0, rtotal = 0;
  for (int t = 0; t < local; ++t) {
    sd[t] = stotal;
    sc[t] = a.send_counts[here[t]];
    for (int p : held[j]) sc[t] += from(t, p);
    stotal += sc[t];
    rd[t] = rtotal;
    rcn[t] = a.recv_counts[here[t]];
    for (int p : held[t]) rcn[t] += a.recv_counts[p];
    rtotal += rcn[t];
  }
  std::vector<char> nsend(stotal * e);
  for (int t = 0; t < local; ++t) {
    char* at = nsend.data() + sd[t] * e;
    const size_t own = a.send_counts[here[t]] * e;
    if (own) std::memcpy(at, a.send + a.send_displs[here[t]] * e, own);
    at += own;
    for (size_t k = 0; k < held[j].size(); ++k) {
      const int p = held[j][k];
      size_t skip = 0;
      for (int u = 0; u < t; ++u) skip += from(u, p) * e;
      const size_t b = from(t, p) * e;
      if (b) std::memcpy(at, inbox.data() + inbox_off[k] + skip, b);
      at += b;
    }
  }
  std::vector<char> nrecv;
  const char* got = nsend.data();
  if (local > 1) {
    nrecv.resize(rtotal * e);
    AllToAllV(node, nsend.data(), sc, sd, nrecv.data(), rcn, rd, a.dtype).Wait();
    got = nrecv.data();
  }
  for (int q = 0; q < local; ++q) {
    const char* at = got + rd[q] * e;
    auto place = [&](int p) {
      const size_t b = a.recv_counts[p] * e;
      if (b) std::memcpy(a.recv + a.recv_displs[p] * e, at, b);
      at += b;
    };
    place(here[q]);
    for (int p : held[q]) place(p);
  }
}

}  // namespace mc2::collectives
