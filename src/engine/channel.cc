// Channel (see channel.h): what every backend shares -- the call's
// information, the per-call counts, the trace spans of transfers and waits,
// the measured host link -- and the choice of backend: shared memory for a
// group within one host (shm_channel.h), the net transport for a net group
// (net_channel.h).
#include "engine/channel.h"

#include <algorithm>

#include "core/enforce.h"
#include "engine/access.h"
#include "engine/group_impl.h"
#include "engine/net.h"
#include "engine/net_channel.h"
#include "engine/shm_channel.h"
#include "trace/recorder.h"

namespace mc2::internal {

Channel& Channel::Of(const Group& g) {
  MC2_CHECK_ARG(g.valid(), "channel of an invalid (empty) group");
  GroupImpl* gi = Access::Impl(g);
  if (!gi->channel) gi->channel = std::make_unique<Channel>(gi);
  return *gi->channel;
}

Channel::Channel(GroupImpl* group) : g_(group) {
  for (auto& c : consumed_) c.assign(g_->size(), 0);
  if (g_->net_group) {
    backend_ = std::make_unique<NetChannel>(g_, kPhases);
  } else {
    backend_ = std::make_unique<ShmChannel>(g_, kPhases);
  }
}

Channel::~Channel() = default;

void Channel::Begin(size_t window_bytes, const CallInfo& info) {
  call_ = info;
  if (call_.timeout.count() <= 0) call_.timeout = g_->world().timeout;
  backend_->Begin(window_bytes, call_);
}

char* Channel::Window() const { return backend_->Window(); }

const char* Channel::View(int src, size_t offset, size_t bytes) const {
  return backend_->View(src, offset, bytes);
}

void Channel::Notify(int dst, int phase, size_t offset, size_t bytes) const {
  const bool on = trace::On();
  const int64_t start = on ? trace::NowNs() : 0;
  const int64_t modeled_end = backend_->Notify(dst, phase, offset, bytes);
  if (on) [[unlikely]] {
    // The transfer as the backend knows it: to its modeled end under link
    // emulation, else the post (a net transport moves the bytes on its
    // own thread afterwards).
    trace::Span sp{};
    sp.start_ns = start;
    sp.end_ns = std::max(trace::NowNs(), modeled_end);
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
  return backend_->Landed(src, phase, consumed_[phase][src] + count);
}

void Channel::Wait(int src, int phase, uint64_t count,
                   const std::function<std::string()>& describe_missing) const {
  if (Landed(src, phase, count)) return;
  trace::ScopedSpan span(trace::Category::kWait);
  if (span.on()) span.span().name = "fused_wait";
  backend_->Wait(src, phase, consumed_[phase][src] + count, call_, describe_missing);
}

void Channel::Consumed(int phase, uint64_t chunks) {
  for (int r = 0; r < g_->size(); ++r)
    if (r != g_->rank()) consumed_[phase][r] += chunks;
}

Work Channel::Async(std::function<void()> body) const { return backend_->Async(std::move(body)); }

Work Channel::Send(const void* data, size_t bytes, int peer, InternalTag tag) const {
  return backend_->SendRecv(true, static_cast<char*>(const_cast<void*>(data)), bytes, peer, tag);
}

Work Channel::Recv(void* data, size_t bytes, int peer, InternalTag tag) const {
  return backend_->SendRecv(false, static_cast<char*>(data), bytes, peer, tag);
}

LinkInfo Channel::link() const { return backend_->link(); }

size_t Channel::heap_bytes() const { return g_->tx().HeapBytes(); }

const std::vector<int>& Channel::HostOf() const {
  static const std::vector<int> kOneHost;
  return g_->net_group ? g_->net_group->host_of : kOneHost;
}

std::optional<LinkInfo> Channel::host_link() const {
  std::lock_guard<std::mutex> lock(host_link_mu_);
  return host_link_;
}

void Channel::set_host_link(const LinkInfo& link) {
  std::lock_guard<std::mutex> lock(host_link_mu_);
  host_link_ = link;
}

void Channel::Abort(const Error& error) const { backend_->Abort(error); }

}  // namespace mc2::internal
