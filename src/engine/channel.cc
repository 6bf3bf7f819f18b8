// Channel over the world's transport (see channel.h): the window and the
// counters are symmetric allocations of the group; a notification is a
// RemoteAdd on the consumer's counter declaring the chunk's bytes, so link
// emulation delivers it at the modeled completion of the transfer. A group
// that spans hosts hands every call to its MPI backend (span_channel.h).
#include "engine/channel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/enforce.h"
#include "engine/access.h"
#include "engine/group_impl.h"
#include "engine/p2p_engine.h"
#include "engine/span.h"
#include "engine/span_channel.h"
#include "trace/recorder.h"
#include "transport/link_emulation.h"

namespace mc2::internal {
namespace {

// One counter per 64-byte line: producers bump them from different ranks.
constexpr size_t kLine = 64;

// Every member's heap offset of this rank's part of `buf`.
std::vector<uint64_t> ExchangeOffsets(GroupImpl* g, const SymmetricBuffer& buf) {
  uint64_t mine = g->HeapOffset(buf.data(), buf.size());
  std::vector<uint64_t> all(g->size());
  g->RunSync("channel_setup", [&](OpContext& ctx) {
    Fingerprint fp;
    fp.kind = static_cast<uint16_t>(OpKind::kExchange);
    fp.aux = 0x6368616e;  // "chan": distinct from the other exchanges
    fp.count = buf.size();
    g->Arrive(ctx, fp, nullptr, 0, nullptr, 0);
    g->ExchangeInline(ctx, &mine, sizeof(mine), all.data());
  });
  return all;
}

}  // namespace

Channel& Channel::Of(const Group& g) {
  MC2_CHECK_ARG(g.valid(), "channel of an invalid (empty) group");
  GroupImpl* gi = Access::Impl(g);
  if (!gi->channel) gi->channel = std::make_unique<Channel>(gi);
  return *gi->channel;
}

Channel::Channel(GroupImpl* group) : g_(group) {
  for (auto& c : consumed_) c.assign(g_->size(), 0);
  if (g_->span) span_ = std::make_unique<SpanChannel>(g_, kPhases);
}

Channel::~Channel() = default;

void Channel::Begin(size_t window_bytes, const CallInfo& info) {
  call_ = info;
  if (call_.timeout.count() <= 0) call_.timeout = g_->world().timeout;
  if (span_) {
    span_->Begin(window_bytes, call_.timeout, call_.op);
    return;
  }
  if (g_->size() == 1) {
    // Nobody to hand data to: a private window, no collective step.
    if (window_.size() < window_bytes) {
      window_ = SymmetricBuffer();
      window_ = Access::MakeGroup(g_->shared_from_this()).AllocSymmetric(window_bytes);
    }
    return;
  }
  // At least a page, so that every member's window has an address even in
  // a call that moves nothing (its views are still formed).
  window_bytes = std::max<size_t>(window_bytes, 4096);
  if (counters_.size() == 0) {
    Group g = Access::MakeGroup(g_->shared_from_this());
    SymmetricBuffer counters = g.AllocSymmetric(kPhases * g_->size() * kLine);
    std::memset(counters.data(), 0, counters.size());
    // Our counters are zero before anyone can learn where they are.
    counter_off_ = ExchangeOffsets(g_, counters);
    counters_ = std::move(counters);
  }
  if (window_.size() < window_bytes) Grow(window_bytes);
}

void Channel::Grow(size_t bytes) {
  Group g = Access::MakeGroup(g_->shared_from_this());
  // Grow geometrically (fewer collective re-allocations), within the heap.
  size_t want = std::max(bytes, std::min(window_.size() * 2, heap_bytes() / 4));
  want = (want + 4095) & ~size_t{4095};
  window_ = SymmetricBuffer();  // every member is past its last call: free
  try {
    window_ = g.AllocSymmetric(want);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kShmExhausted || want == bytes) throw;
    window_ = g.AllocSymmetric(bytes);
  }
  window_off_ = ExchangeOffsets(g_, window_);
}

char* Channel::Window() const { return span_ ? span_->Window() : window_.as<char>(); }

const char* Channel::View(int src, size_t offset, size_t bytes) const {
  if (span_) return span_->View(src, offset, bytes);
  MC2_ENFORCE(offset + bytes <= window_.size(), "view [{}, {}) of a {}-byte window", offset,
              offset + bytes, window_.size());
  if (src == g_->rank()) return Window() + offset;
  return g_->HeapPtr(src, window_off_[src]) + offset;
}

uint64_t Channel::CounterOff(int owner, int phase, int src) const {
  return counter_off_[owner] + (static_cast<uint64_t>(phase) * g_->size() + src) * kLine;
}

void Channel::Notify(int dst, int phase, size_t offset, size_t bytes) const {
  if (span_) {
    const bool on = trace::On();
    const int64_t start = on ? trace::NowNs() : 0;
    span_->Notify(dst, phase, offset, bytes);
    if (on) [[unlikely]] {
      // Only the post: the transfer itself runs on the MPI thread.
      trace::Span sp{};
      sp.start_ns = start;
      sp.end_ns = trace::NowNs();
      sp.name = "fused_transfer";
      sp.pipeline = call_.trace_label;
      sp.bytes = bytes;
      sp.step = -1;
      sp.rank = -1;
      sp.kind = static_cast<uint8_t>(trace::Category::kComm);
      trace::Record(sp);
    }
    return;
  }
  MC2_ENFORCE(offset + bytes <= window_.size(), "notify [{}, {}) of a {}-byte window", offset,
              offset + bytes, window_.size());
  transport::Transport& tx = g_->tx();
  const bool on = trace::On();
  const int64_t start = on ? trace::NowNs() : 0;
  tx.RemoteAdd(g_->world_rank(dst), CounterOff(dst, phase, g_->rank()), 1, bytes);
  if (on) [[unlikely]] {
    // The span covers the transfer as modeled: from the post to its
    // completion on our port (the port's state right after our post;
    // without emulation the notification is the transfer).
    trace::Span sp{};
    sp.start_ns = start;
    sp.end_ns = trace::NowNs();
    if (transport::LinkModel* port = tx.link(); port && bytes > 0) {
      const auto done = port->busy_until() + port->config().latency;
      sp.end_ns = std::max<int64_t>(
          sp.end_ns,
          std::chrono::duration_cast<std::chrono::nanoseconds>(done.time_since_epoch()).count());
    }
    sp.name = "fused_transfer";
    sp.pipeline = call_.trace_label;
    sp.bytes = bytes;
    sp.step = -1;
    sp.rank = -1;
    sp.kind = static_cast<uint8_t>(trace::Category::kComm);
    trace::Record(sp);
  }
}

bool Channel::Landed(int src, int phase, uint64_t count) const {
  if (span_) return span_->Landed(src, phase, consumed_[phase][src] + count);
  const int me = g_->rank();
  return g_->tx().Peek(g_->world_rank(me), CounterOff(me, phase, src)) >=
         consumed_[phase][src] + count;
}

void Channel::Wait(int src, int phase, uint64_t count,
                   const std::function<std::string()>& describe_missing) const {
  if (Landed(src, phase, count)) return;
  trace::ScopedSpan span(trace::Category::kWait);
  if (span.on()) span.span().name = "fused_wait";
  if (span_) {
    span_->Wait(src, phase, consumed_[phase][src] + count, call_.op, call_.timeout,
                describe_missing);
    return;
  }
  const int me = g_->rank();
  transport::Clock::time_point deadline{};
  transport::WaitContext wc;
  wc.op = call_.op;
  wc.deadline = &deadline;
  wc.timeout = call_.timeout;
  wc.describe_missing = describe_missing;
  g_->tx().WaitGE(g_->world_rank(me), CounterOff(me, phase, src), consumed_[phase][src] + count,
                  wc);
}

void Channel::Consumed(int phase, uint64_t chunks) {
  for (int r = 0; r < g_->size(); ++r)
    if (r != g_->rank()) consumed_[phase][r] += chunks;
}

Work Channel::Async(std::function<void()> body) const {
  if (span_) return span_->Async(std::move(body));
  return g_->Submit(
      "channel_async", false, [b = std::move(body)](OpContext&) { b(); },
      /*collective=*/false);
}

Work Channel::Send(const void* data, size_t bytes, int peer, InternalTag tag) const {
  if (span_)
    return span_->SendRecv(true, static_cast<char*>(const_cast<void*>(data)), bytes, peer,
                           static_cast<int>(static_cast<int64_t>(tag) - kInternalTagBase));
  return g_->world().P2P().Post(g_->shared_from_this(), true,
                                static_cast<char*>(const_cast<void*>(data)), bytes, peer,
                                static_cast<int64_t>(tag));
}

Work Channel::Recv(void* data, size_t bytes, int peer, InternalTag tag) const {
  if (span_)
    return span_->SendRecv(false, static_cast<char*>(data), bytes, peer,
                           static_cast<int>(static_cast<int64_t>(tag) - kInternalTagBase));
  return g_->world().P2P().Post(g_->shared_from_this(), false, static_cast<char*>(data), bytes,
                                peer, static_cast<int64_t>(tag));
}

LinkInfo Channel::link() const {
  LinkInfo info;
  if (span_) return info;  // real links between hosts
  if (transport::LinkModel* port = g_->tx().link()) {
    info.bytes_per_second = port->config().bytes_per_second;
    info.latency_seconds = std::chrono::duration<double>(port->config().latency).count();
  }
  return info;
}

size_t Channel::heap_bytes() const { return g_->tx().HeapBytes(); }

const std::vector<int>& Channel::HostOf() const {
  static const std::vector<int> kOneHost;
  return g_->span ? g_->span->host_of : kOneHost;
}

std::optional<LinkInfo> Channel::host_link() const {
  std::lock_guard<std::mutex> lock(host_link_mu_);
  return host_link_;
}

void Channel::set_host_link(const LinkInfo& link) {
  std::lock_guard<std::mutex> lock(host_link_mu_);
  host_link_ = link;
}

void Channel::Abort(const Error& error) const {
  if (span_) {
    span_->Abort(error);
    return;
  }
  g_->tx().Abort(error);
}

}  // namespace mc2::internal
