// Worlds and groups that span hosts (engine/net.h): the start-up of a rank
// launched by mpirun, the host layout, Split, point-to-point messages and
// the submission of net group operations.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <numeric>

#include "core/enforce.h"
#include "core/env.h"
#include "core/log.h"
#include "engine/access.h"
#include "engine/group_impl.h"
#include "engine/net.h"
#include "engine/world.h"
#include "trace/recorder.h"

namespace mc2::internal {

using transport::CommId;
using SteadyClock = std::chrono::steady_clock;

namespace {

std::string HostName() {
  if (auto v = core::GetEnv("MC2_HOSTNAME"); v && !v->empty()) return *v;
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0)
    throw Error(ErrorCode::kSystem, fmt::format("gethostname: {}", std::strerror(errno)));
  return buf;
}

// Fills `s`'s layout from its members (global ranks) and the net world's.
void Layout(NetGroup& s) {
  const NetWorld& net = *s.net;
  std::vector<int> dense(net.host_names.size(), -1);
  const int n = static_cast<int>(s.members.size());
  s.host_of.assign(n, 0);
  s.local_of.assign(n, 0);
  s.hosts.clear();
  for (int i = 0; i < n; ++i) {
    int h = net.host_of[s.members[i]];
    if (dense[h] < 0) {
      dense[h] = static_cast<int>(s.hosts.size());
      s.hosts.emplace_back();
    }
    s.host_of[i] = dense[h];
    s.local_of[i] = static_cast<int>(s.hosts[dense[h]].size());
    s.hosts[dense[h]].push_back(i);
  }
  s.my_host = s.host_of[s.rank];
  const size_t b = s.hosts[0].size();
  s.aligned = (b & (b - 1)) == 0;
  for (size_t h = 0; h < s.hosts.size() && s.aligned; ++h) {
    if (s.hosts[h].size() != b) s.aligned = false;
    for (size_t j = 0; j < s.hosts[h].size() && s.aligned; ++j)
      if (s.hosts[h][j] != static_cast<int>(h * b + j)) s.aligned = false;
  }
}

std::shared_ptr<GroupImpl> MakeNetGroupImpl(std::shared_ptr<World> node_world,
                                            std::shared_ptr<NetWorld> net, CommId comm, CommId p2p,
                                            CommId chan, std::vector<int> members, int rank,
                                            std::shared_ptr<GroupImpl> node) {
  auto s = std::make_shared<NetGroup>();
  s->net = std::move(net);
  s->comm = comm;
  s->p2p = p2p;
  s->chan = chan;
  s->members = members;
  s->rank = rank;
  s->node = std::move(node);
  Layout(*s);
  return std::make_shared<GroupImpl>(std::move(node_world), std::move(members), rank,
                                     std::move(s));
}

// This rank's trace clock minus job rank 0's, as the trace files store it
// (include/mc2/trace_file.h). Rank 0 answers each other rank's pings in
// turn, kClockRounds each, with its clock; a rank takes the reading of
// its round with the shortest round trip and assumes the answer was read
// halfway through it, so the error is at most half that round trip (tens
// of microseconds over TCP). Collective over the job.
int64_t MeasureClockOffset(transport::NetTransport& tx) {
  constexpr int kClockRounds = 8;
  constexpr int kClockTag = 1000;  // above the collectives' tags (net_algorithms.h)
  const auto none = transport::NetTransport::kNoDeadline;
  const auto wait = [&](const std::shared_ptr<transport::Completion>& c) {
    c->Wait(
        SteadyClock::now() + std::chrono::seconds(60), [&] { tx.CheckHealth(); },
        [] { return std::string("the clock offset measurement at start-up"); });
  };
  if (tx.rank() == 0) {
    for (int r = 1; r < tx.size(); ++r)
      for (int k = 0; k < kClockRounds; ++k) {
        int64_t ping = 0;
        wait(tx.Irecv(transport::kJobComm, r, kClockTag, &ping, sizeof(ping), {}, none));
        const int64_t now = trace::NowNs();
        wait(tx.Isend(transport::kJobComm, r, kClockTag, &now, sizeof(now), {}, none));
      }
    return 0;
  }
  int64_t best_rtt = INT64_MAX, offset = 0;
  for (int k = 0; k < kClockRounds; ++k) {
    int64_t ping = 0, theirs = 0;
    const int64_t t0 = trace::NowNs();
    auto recv = tx.Irecv(transport::kJobComm, 0, kClockTag, &theirs, sizeof(theirs), {}, none);
    wait(tx.Isend(transport::kJobComm, 0, kClockTag, &ping, sizeof(ping), {}, none));
    wait(recv);
    const int64_t t1 = trace::NowNs();
    if (t1 - t0 < best_rtt) {
      best_rtt = t1 - t0;
      offset = t0 + (t1 - t0) / 2 - theirs;
    }
  }
  return offset;
}

}  // namespace

NetGroup::~NetGroup() {
  net->transport->Free(chan);
  net->transport->Free(p2p);
  net->transport->Free(comm);
}

void NetAbort(const std::shared_ptr<NetWorld>& net, World* node_world, const Error& error) {
  net->transport->Abort(error);
  if (node_world) node_world->transport->Abort(error);
}

Group MakeNetWorldGroup(int64_t comm_f, const WorldOptions& options) {
  auto tx = transport::StartNetTransport({.mpi_comm_f = comm_f});
  auto net = std::make_shared<NetWorld>();
  net->transport = tx;
  net->rank = tx->rank();
  net->size = tx->size();
  const std::string me = HostName();
  std::vector<std::string> names = tx->AllGatherStrings(transport::kJobComm, me);
  net->host_of.assign(net->size, 0);
  net->local_of.assign(net->size, 0);
  for (int r = 0; r < net->size; ++r) {
    auto it = std::find(net->host_names.begin(), net->host_names.end(), names[r]);
    int h = static_cast<int>(it - net->host_names.begin());
    if (it == net->host_names.end()) {
      net->host_names.push_back(names[r]);
      net->host_ranks.emplace_back();
    }
    net->host_of[r] = h;
    net->local_of[r] = static_cast<int>(net->host_ranks[h].size());
    net->host_ranks[h].push_back(r);
  }
  const int host = net->host_of[net->rank];
  const int local_size = static_cast<int>(net->host_ranks[host].size());
  // The host's communicator, for the node world's rendezvous.
  std::optional<CommId> node_comm;
  if (local_size > 1)
    node_comm = tx->Split(transport::kJobComm, host, net->local_of[net->rank]);
  else
    tx->Split(transport::kJobComm, -1, 0);  // collective: every rank calls it
  auto allgather = [&](const std::string& mine) {
    if (!node_comm) return std::vector<std::string>{mine};
    return tx->AllGatherStrings(*node_comm, mine);
  };
  // The host's ranks make their shared-memory world among themselves, as
  // `mc2 run` would (heap: WorldOptions, else MC2_HEAP_BYTES, else its
  // default).
  auto node_tx = transport::CreateRendezvousTransport(net->local_of[net->rank], local_size,
                                                      options.heap_bytes, allgather, options.link);
  if (node_comm) tx->Free(*node_comm);
  std::shared_ptr<World> world = MakeWorld(std::move(node_tx), options);
  std::weak_ptr<World> weak_world = world;
  std::weak_ptr<NetWorld> weak_net = net;
  net->where =
      fmt::format("host {} (its ranks {} are global ranks {})", me,
                  local_size == 1 ? "0" : fmt::format("0..{}", local_size - 1),
                  fmt::join(net->host_ranks[host], ","));
  // A failure on this host (a local death, an aborted node world) is sent
  // to every host; one received from another host aborts the node world.
  tx->SetCallbacks(
      [weak_world](const Error& e) {
        if (auto w = weak_world.lock()) w->transport->Abort(e);
      },
      [weak_world, where = net->where, rank = net->rank] {
        auto w = weak_world.lock();
        if (!w) return;
        try {
          w->transport->CheckHealth(/*thorough=*/true);
        } catch (const Error& e) {
          throw Error(e.code(), fmt::format("on {}: {}", where, e.message()), rank, e.op(),
                      e.seq());
        }
      });
  net->engine = std::make_unique<engine::ProgressEngine>(
      [weak_net, weak_world](const std::exception_ptr& ep) {
        auto n = weak_net.lock();
        auto w = weak_world.lock();
        if (!n) return;
        try {
          std::rethrow_exception(ep);
        } catch (const Error& e) {
          NetAbort(n, w.get(), e);
        } catch (const std::exception& e) {
          NetAbort(n, w.get(), Error(ErrorCode::kInternal, e.what()));
        }
      });
  world->net = net;
  std::shared_ptr<GroupImpl> node = MakeWorldGroup(world);
  MC2_LOG(kInfo, "rank {} of {} on host {} ({} hosts, {} rank(s) here)", net->rank, net->size, me,
          net->host_names.size(), local_size);
  // One host: the world is the node world, pure shared memory.
  if (net->host_names.size() == 1) return Access::MakeGroup(std::move(node));
  trace::OnNetWorldStart(node->rank(), net->rank, net->size);
  trace::SetClockOffset(net->rank, MeasureClockOffset(*tx));
  std::vector<int> members(net->size);
  std::iota(members.begin(), members.end(), 0);
  // User messages go on a communicator of their own, so that no user tag
  // can match the collectives' traffic.
  std::optional<CommId> p2p = tx->Split(transport::kJobComm, 0, net->rank);
  std::optional<CommId> chan = tx->Split(transport::kJobComm, 0, net->rank);
  return Access::MakeGroup(MakeNetGroupImpl(world, net, transport::kJobComm, *p2p, *chan,
                                            std::move(members), net->rank, std::move(node)));
}

Work NetSubmit(GroupImpl& g, const char* name, std::chrono::nanoseconds timeout, NetBody body,
               const char* algorithm, bool may_run_inline) {
  auto work = std::make_shared<WorkState>(0, name);
  if (algorithm) work->SetAlgorithm(algorithm);
  std::chrono::nanoseconds to = timeout.count() > 0 ? timeout : g.world().timeout;
  auto task = [self = g.shared_from_this(), body = std::move(body), to, name,
               algorithm]() mutable {
    std::shared_ptr<GroupImpl> keep = std::move(self);
    NetGroup& s = *keep->net_group;
    // The operation in the trace, with the algorithm it ran (its node
    // phases record spans of their own).
    trace::ScopedSpan span(trace::Category::kComm);
    if (span.on()) {
      span.span().name = name;
      span.span().algorithm = algorithm;
      span.span().rank = s.net->rank;
    }
    try {
      s.net->transport->CheckHealth();
      keep->tx().CheckHealth(/*thorough=*/false);
      body(s, SteadyClock::now() + to);
    } catch (const Error& e) {
      // Node-level failures name node ranks: say which host's. A
      // failure from another host says so already.
      if (e.code() == ErrorCode::kInvalidArgument || e.message().find("on host ") !=
                                                         std::string::npos)
        throw;
      throw Error(e.code(), fmt::format("{} (on {})", e.message(), s.net->where),
                  s.net->rank, e.op(), e.seq());
    }
  };
  // Run here when nothing is queued: no hand-off to the engine's thread.
  engine::ProgressEngine& engine = *g.net_group->net->engine;
  if (!may_run_inline || !engine.TryRunInline(work, task)) engine.Submit(work, std::move(task));
  return Access::MakeWork(work);
}

void NetWait(NetGroup& s, const transport::Completion& c, SteadyClock::time_point deadline,
             const char* op) {
  if (c.done()) {
    c.Wait(deadline, nullptr, nullptr);  // rethrows a failure
    return;
  }
  c.Wait(
      deadline,
      [&] {
        s.node->tx().CheckHealth(/*thorough=*/false);
        s.net->transport->CheckHealth();
      },
      [&] {
        return fmt::format("{} on a group of {} ranks over {} hosts", op, s.members.size(),
                           s.hosts.size());
      });
}

Group NetSplit(GroupImpl& g, int color, int key) {
  Group result;
  NetSubmit(g, "split", {}, [&](NetGroup& s, SteadyClock::time_point) {
    const int n = static_cast<int>(s.members.size());
    std::string mine(8, '\0');
    std::memcpy(mine.data(), &color, 4);
    std::memcpy(mine.data() + 4, &key, 4);
    std::vector<std::string> all = s.net->transport->AllGatherStrings(s.comm, mine);
    std::vector<int> colors(n), keys(n);
    for (int r = 0; r < n; ++r) {
      std::memcpy(&colors[r], all[r].data(), 4);
      std::memcpy(&keys[r], all[r].data() + 4, 4);
    }
    std::vector<int> order;
    for (int r = 0; r < n; ++r)
      if (color >= 0 && colors[r] == color) order.push_back(r);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return keys[a] < keys[b]; });
    bool one_host = true;
    for (int r : order) one_host = one_host && s.host_of[r] == s.host_of[order[0]];
    // Every member of the node group calls its Split, and every member of
    // the group the transport's split: the node part of the new group, and its
    // communicator when it spans hosts.
    Group node_part = Access::MakeGroup(s.node).Split(color, key);
    std::optional<CommId> comm = s.net->transport->Split(s.comm, one_host ? -1 : color, key);
    if (color < 0) return;
    if (one_host) {
      result = std::move(node_part);
      return;
    }
    std::vector<int> members;
    int new_rank = -1;
    for (size_t i = 0; i < order.size(); ++i) {
      members.push_back(s.members[order[i]]);
      if (order[i] == s.rank) new_rank = static_cast<int>(i);
    }
    MC2_ENFORCE(comm.has_value(), "Split gave no communicator for color {}", color);
    std::optional<CommId> p2p = s.net->transport->Split(*comm, 0, new_rank);
    std::optional<CommId> chan = s.net->transport->Split(*comm, 0, new_rank);
    result = Access::MakeGroup(MakeNetGroupImpl(g.world_ptr(), s.net, *comm, *p2p, *chan,
                                                std::move(members), new_rank,
                                                Access::Impl(node_part)->shared_from_this()));
  }).Wait();
  return result;
}

Work NetSendRecv(GroupImpl& g, bool send, char* data, size_t bytes, int peer, int tag,
                 bool internal) {
  // Posted at once, not queued behind the group's collectives: a message
  // completes when its peer posts the match, whatever either side does
  // meanwhile (as on one host).
  NetGroup& s = *g.net_group;
  s.net->transport->CheckHealth();
  auto work = std::make_shared<WorkState>(0, send ? "send" : "recv");
  // The callback runs on the transport's thread: it holds no group, whose last
  // reference must not go there (freeing its communicator needs that thread).
  auto on_done = [work](std::exception_ptr ep) {
    if (ep) {
      work->Fail(ep);
    } else {
      work->Complete();
    }
  };
  auto& tx = *s.net->transport;
  const CommId comm = internal ? s.chan : s.p2p;
  // As on one host, a message that does not complete within the world's
  // timeout (a stalled peer) fails with kTimeout and breaks the world.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            g.world().timeout);
  if (send) {
    tx.Isend(comm, peer, tag, data, bytes, std::move(on_done), deadline);
  } else {
    tx.Irecv(comm, peer, tag, data, bytes, std::move(on_done), deadline);
  }
  return Access::MakeWork(work);
}

}  // namespace mc2::internal
