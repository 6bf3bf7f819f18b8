// The channel of a group that spans hosts: see net_channel.h.
#include "engine/net_channel.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "core/enforce.h"
#include "engine/group_impl.h"
#include "engine/net.h"
#include "engine/world.h"
#include "transport/transport.h"

namespace mc2::internal {

using transport::Completion;
using transport::NetTransport;
using SteadyClock = std::chrono::steady_clock;

namespace {

// Tags on the channel's communicator: notifications, then the internal
// Send / Recv tags from kSendRecvTag on.
constexpr int kHeaderTag = 1;
constexpr int kDataTag = 2;
constexpr int kSendRecvTag = 16;

struct Header {
  uint64_t phase;
  uint64_t offset;
  uint64_t bytes;
  uint64_t window;  // the call's window size (every chunk of a call: the same)
};

// 64-byte aligned private memory.
struct Buffer {
  std::unique_ptr<char[], void (*)(char*)> data{nullptr, [](char* p) { std::free(p); }};
  size_t bytes = 0;
  void Resize(size_t n) {
    n = (std::max<size_t>(n, 64) + 63) & ~size_t{63};
    char* p = static_cast<char*>(std::aligned_alloc(64, n));
    // kSystem, not an agreed error: the call fails on this rank alone, so
    // the operator aborts the job and the peers fail at once.
    if (!p)
      throw Error(ErrorCode::kSystem,
                  fmt::format("the fused operator's channel cannot allocate {} bytes: {}", n,
                              std::strerror(ENOMEM)));
    data.reset(p);
    bytes = n;
  }
};

}  // namespace

struct NetChannel::State {
  NetTransport* tx;  // the callbacks run on its thread, which it outlives
  transport::CommId comm;
  int n, me, phases;
  Buffer window;
  std::vector<Buffer> mirror;                      // per source; transport's thread writes
  std::vector<Header> header_in;                   // per source
  std::unique_ptr<std::atomic<uint64_t>[]> count;  // [phase * n + src]
  // Per source, the phases of the notifications whose bytes are still on
  // their way, in order, and whether each landed (transport's thread only).
  struct InFlight {
    int phase;
    bool landed;
  };
  std::vector<std::deque<InFlight>> inflight;
  std::vector<uint64_t> inflight_base;  // sequence number of inflight.front()

  std::mutex send_mu;             // orders header + data pairs
  std::atomic<int64_t> sends{0};  // Isends not completed yet
  std::mutex wait_mu;             // waiters sleep on wait_cv
  std::condition_variable wait_cv;
  std::mutex standing_mu;  // guards closing and standing
  bool closing = false;
  std::vector<std::shared_ptr<Completion>> standing;  // per source

  void Wake() {
    { std::lock_guard<std::mutex> lock(wait_mu); }
    wait_cv.notify_all();
  }

  // A notification from `src` landed (all its bytes): counts every landed
  // one at the front of src's queue.
  void Landed(int src, uint64_t seq) {
    auto& q = inflight[src];
    q[seq - inflight_base[src]].landed = true;
    bool bumped = false;
    while (!q.empty() && q.front().landed) {
      count[q.front().phase * n + src].fetch_add(1, std::memory_order_release);
      q.pop_front();
      ++inflight_base[src];
      bumped = true;
    }
    if (bumped) Wake();
  }

  // Posts the standing header receive from `src` (unless the channel closes).
  static void PostHeader(const std::shared_ptr<State>& st, int src) {
    std::lock_guard<std::mutex> lock(st->standing_mu);
    if (st->closing) return;
    try {
      // The callback holds the state (the receive writes into it); the
      // cycle through `standing` ends when the receive completes or the
      // destructor takes `standing`.
      st->standing[src] = st->tx->IrecvStanding(st->comm, src, kHeaderTag, &st->header_in[src],
                                                sizeof(Header), [st, src](std::exception_ptr ep) {
                                                  // Cancelled (closing, engine stopping) or
                                                  // failed: the engine has recorded any failure,
                                                  // which every waiter checks.
                                                  if (!ep) OnHeader(st, src);
                                                });
    } catch (const Error&) {
      // The transport stopped (process exit): nothing more will arrive.
    }
  }

  // transport's thread: a header from `src` landed.
  static void OnHeader(const std::shared_ptr<State>& st, int src) {
    const Header h = st->header_in[src];
    State& s = *st;
    Buffer& m = s.mirror[src];
    const bool fits = h.phase < static_cast<uint64_t>(s.phases) && h.offset <= h.window &&
                      h.bytes <= h.window - h.offset;
    if (!fits) {
      s.tx->Abort(Error(ErrorCode::kInternal,
                        fmt::format("channel: malformed notification from rank {}: phase {}, "
                                    "[{}, +{}) of a {}-byte window",
                                    src, h.phase, h.offset, h.bytes, h.window)));
      return;
    }
    if (m.bytes < h.window) {
      // The first chunk of a call with a larger window: nothing of src's
      // mirror is being read (net_channel.h, reuse safety).
      try {
        m.Resize(std::max<size_t>(h.window, m.bytes * 2));
      } catch (const Error& e) {
        s.tx->Abort(e);
        return;
      }
    }
    const uint64_t seq = s.inflight_base[src] + s.inflight[src].size();
    s.inflight[src].push_back({static_cast<int>(h.phase), false});
    if (h.bytes == 0) {
      s.Landed(src, seq);
    } else {
      try {
        s.tx->Irecv(
            s.comm, src, kDataTag, m.data.get() + h.offset, h.bytes,
            [st, src, seq](std::exception_ptr ep) {
              if (!ep) st->Landed(src, seq);
            },
            NetTransport::kNoDeadline);
      } catch (const Error&) {
        return;
      }
    }
    PostHeader(st, src);
  }
};

NetChannel::NetChannel(GroupImpl* group, int phases) : g_(group) {
  NetGroup& s = *g_->net_group;
  auto st = std::make_shared<State>();
  st->tx = s.net->transport.get();
  st->comm = s.chan;
  st->n = g_->size();
  st->me = g_->rank();
  st->phases = phases;
  st->mirror.resize(st->n);
  st->header_in.resize(st->n);
  st->count = std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(phases) * st->n);
  for (int i = 0; i < phases * st->n; ++i) st->count[i].store(0, std::memory_order_relaxed);
  st->inflight.resize(st->n);
  st->inflight_base.assign(st->n, 0);
  st->standing.resize(st->n);
  st_ = std::move(st);
  for (int src = 0; src < st_->n; ++src)
    if (src != st_->me) State::PostHeader(st_, src);
}

NetChannel::~NetChannel() {
  std::vector<std::shared_ptr<Completion>> standing;
  {
    std::lock_guard<std::mutex> lock(st_->standing_mu);
    st_->closing = true;
    standing.swap(st_->standing);
  }
  for (auto& c : standing)
    if (c) st_->tx->Cancel(c);
  // The window, the mirrors and the counters stay with the callbacks that
  // still hold the state (sends in flight).
}

void NetChannel::Begin(size_t window_bytes, const ChannelCall& call) {
  State& s = *st_;
  const auto timeout = call.timeout;
  const char* op = call.op;
  if (s.sends.load(std::memory_order_acquire) > 0) {
    // Normally done long ago: the consumers received every chunk.
    const auto deadline = SteadyClock::now() + timeout;
    while (s.sends.load(std::memory_order_acquire) > 0) {
      g_->net_group->net->transport->CheckHealth();
      g_->net_group->node->tx().CheckHealth(/*thorough=*/false);
      if (SteadyClock::now() > deadline)
        throw Error(ErrorCode::kTimeout,
                    fmt::format("the previous call's transfers to other hosts did not complete "
                                "within the timeout ({} sends pending)",
                                s.sends.load()),
                    g_->rank(), op);
      std::unique_lock<std::mutex> lock(s.wait_mu);
      s.wait_cv.wait_for(lock, std::chrono::milliseconds(1));
    }
  }
  // At least a page, as over shared memory: every window and mirror has an
  // address even in a call that moves nothing.
  window_bytes = std::max<size_t>(window_bytes, 4096);
  if (s.window.bytes < window_bytes)
    s.window.Resize(std::max(window_bytes, std::min(s.window.bytes * 2, window_bytes * 2)));
}

char* NetChannel::Window() const { return st_->window.data.get(); }

const char* NetChannel::View(int src, size_t offset, size_t bytes) const {
  const Buffer& b = src == st_->me ? st_->window : st_->mirror[src];
  // An empty view of a peer that sent nothing yet: any address will do.
  if (bytes == 0 && !b.data) return st_->window.data.get();
  MC2_ENFORCE(offset + bytes <= b.bytes, "view [{}, {}) of rank {}'s {}-byte window", offset,
              offset + bytes, src, b.bytes);
  return b.data.get() + offset;
}

int64_t NetChannel::Notify(int dst, int phase, size_t offset, size_t bytes) const {
  State& s = *st_;
  MC2_ENFORCE(offset + bytes <= s.window.bytes, "notify [{}, {}) of a {}-byte window", offset,
              offset + bytes, s.window.bytes);
  auto h =
      std::make_shared<Header>(Header{static_cast<uint64_t>(phase), offset, bytes, s.window.bytes});
  // The callbacks keep the state (the window) until the send completed.
  auto done = [st = st_](std::exception_ptr) {
    st->sends.fetch_sub(1, std::memory_order_acq_rel);
    st->Wake();
  };
  std::lock_guard<std::mutex> lock(s.send_mu);
  s.sends.fetch_add(bytes ? 2 : 1, std::memory_order_acq_rel);
  s.tx->Isend(
      s.comm, dst, kHeaderTag, h.get(), sizeof(Header),
      [h, done](std::exception_ptr ep) { done(ep); }, NetTransport::kNoDeadline);
  if (bytes)
    s.tx->Isend(s.comm, dst, kDataTag, s.window.data.get() + offset, bytes, done,
                NetTransport::kNoDeadline);
  return 0;
}

bool NetChannel::Landed(int src, int phase, uint64_t total) const {
  return st_->count[phase * st_->n + src].load(std::memory_order_acquire) >= total;
}

void NetChannel::Wait(int src, int phase, uint64_t total, const ChannelCall& call,
                      const std::function<std::string()>& describe_missing) const {
  const auto timeout = call.timeout;
  const char* op = call.op;
  if (Landed(src, phase, total)) return;
  const auto spin_until = SteadyClock::now() + std::chrono::microseconds(50);
  while (SteadyClock::now() < spin_until) {
    if (Landed(src, phase, total)) return;
    sched_yield();
  }
  NetGroup& sg = *g_->net_group;
  const auto deadline = SteadyClock::now() + timeout;
  while (!Landed(src, phase, total)) {
    {
      std::unique_lock<std::mutex> lock(st_->wait_mu);
      st_->wait_cv.wait_for(lock, std::chrono::milliseconds(2),
                            [&] { return Landed(src, phase, total); });
    }
    if (Landed(src, phase, total)) return;
    sg.net->transport->CheckHealth();
    sg.node->tx().CheckHealth(/*thorough=*/false);
    if (SteadyClock::now() > deadline)
      throw Error(ErrorCode::kTimeout,
                  fmt::format("timed out waiting for {} (global rank {}, across hosts)",
                              describe_missing ? describe_missing() : std::string("a chunk"),
                              sg.members[src]),
                  g_->rank(), op);
  }
}

Work NetChannel::Async(std::function<void()> body) const {
  return NetSubmit(*g_, "channel_async", {},
                   [b = std::move(body)](NetGroup&, SteadyClock::time_point) { b(); });
}

Work NetChannel::SendRecv(bool send, char* data, size_t bytes, int peer, InternalTag tag) const {
  const int index = static_cast<int>(static_cast<int64_t>(tag) - kInternalTagBase);
  return NetSendRecv(*g_, send, data, bytes, peer, kSendRecvTag + index, /*internal=*/true);
}

void NetChannel::Abort(const Error& error) const {
  NetAbort(g_->net_group->net, &g_->world(), error);
}

}  // namespace mc2::internal
