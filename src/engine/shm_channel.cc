// The channel of a group within one host (see shm_channel.h).
#include "engine/shm_channel.h"

#include <algorithm>
#include <cstring>

#include "core/enforce.h"
#include "engine/access.h"
#include "engine/group_impl.h"
#include "engine/p2p_engine.h"
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

void ShmChannel::Begin(size_t window_bytes, const ChannelCall&) {
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
    SymmetricBuffer counters = g.AllocSymmetric(phases_ * g_->size() * kLine);
    std::memset(counters.data(), 0, counters.size());
    // Our counters are zero before anyone can learn where they are.
    counter_off_ = ExchangeOffsets(g_, counters);
    counters_ = std::move(counters);
  }
  if (window_.size() < window_bytes) Grow(window_bytes);
}

void ShmChannel::Grow(size_t bytes) {
  Group g = Access::MakeGroup(g_->shared_from_this());
  // Grow geometrically (fewer collective re-allocations), within the heap.
  const size_t heap = g_->tx().HeapBytes();
  size_t want = std::max(bytes, std::min(window_.size() * 2, heap / 4));
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

const char* ShmChannel::View(int src, size_t offset, size_t bytes) const {
  MC2_ENFORCE(offset + bytes <= window_.size(), "view [{}, {}) of a {}-byte window", offset,
              offset + bytes, window_.size());
  if (src == g_->rank()) return Window() + offset;
  return g_->HeapPtr(src, window_off_[src]) + offset;
}

uint64_t ShmChannel::CounterOff(int owner, int phase, int src) const {
  return counter_off_[owner] + (static_cast<uint64_t>(phase) * g_->size() + src) * kLine;
}

int64_t ShmChannel::Notify(int dst, int phase, size_t offset, size_t bytes) const {
  MC2_ENFORCE(offset + bytes <= window_.size(), "notify [{}, {}) of a {}-byte window", offset,
              offset + bytes, window_.size());
  transport::Transport& tx = g_->tx();
  tx.RemoteAdd(g_->world_rank(dst), CounterOff(dst, phase, g_->rank()), 1, bytes);
  // The transfer as modeled ends when our port is done with it (the
  // port's state right after our post); without emulation the
  // notification is the transfer.
  transport::LinkModel* port = tx.link();
  if (!port || bytes == 0) return 0;
  const auto done = port->busy_until() + port->config().latency;
  return std::chrono::duration_cast<std::chrono::nanoseconds>(done.time_since_epoch()).count();
}

bool ShmChannel::Landed(int src, int phase, uint64_t total) const {
  const int me = g_->rank();
  return g_->tx().Peek(g_->world_rank(me), CounterOff(me, phase, src)) >= total;
}

void ShmChannel::Wait(int src, int phase, uint64_t total, const ChannelCall& call,
                      const std::function<std::string()>& describe_missing) const {
  const int me = g_->rank();
  transport::Clock::time_point deadline{};
  transport::WaitContext wc;
  wc.op = call.op;
  wc.deadline = &deadline;
  wc.timeout = call.timeout;
  wc.describe_missing = describe_missing;
  g_->tx().WaitGE(g_->world_rank(me), CounterOff(me, phase, src), total, wc);
}

Work ShmChannel::Async(std::function<void()> body) const {
  return g_->Submit(
      "channel_async", false, [b = std::move(body)](OpContext&) { b(); },
      /*collective=*/false);
}

Work ShmChannel::SendRecv(bool send, char* data, size_t bytes, int peer, InternalTag tag) const {
  return g_->world().P2P().Post(g_->shared_from_this(), send, data, bytes, peer,
                                static_cast<int64_t>(tag));
}

LinkInfo ShmChannel::link() const {
  LinkInfo info;
  if (transport::LinkModel* port = g_->tx().link()) {
    info.bytes_per_second = port->config().bytes_per_second;
    info.latency_seconds = std::chrono::duration<double>(port->config().latency).count();
  }
  return info;
}

void ShmChannel::Abort(const Error& error) const { g_->tx().Abort(error); }

}  // namespace mc2::internal
