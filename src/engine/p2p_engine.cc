#include "engine/p2p_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/enforce.h"
#include "engine/access.h"
#include "engine/group_impl.h"
#include "trace/recorder.h"

namespace mc2::internal {
namespace {

constexpr size_t kChunkHeader = 64;
constexpr size_t kChunkPayload = 256 * 1024;
constexpr size_t kSlotBytes = kChunkHeader + kChunkPayload;
// Slots per channel: how many chunks may be in flight towards a peer. With
// two, each chunk past the second waited for the receiver to wake, copy out
// and acknowledge, and the sender to wake again; on a host whose cores are
// busy computing those wake-ups take up to milliseconds, so a large message
// moved at a fraction of the (emulated) link rate. Eight keep the link busy
// through such gaps, for 2 MiB of heap per peer that a rank sends to.
constexpr uint64_t kSlots = 8;
struct ChunkHeader {
  int64_t tag;
  uint64_t total;
  uint64_t index;
};
// Words of a rank's p2p line for a peer (in the group's control area).
constexpr uint64_t kSentWord = 0;  // chunks written towards the peer
constexpr uint64_t kChanWord = 8;  // heap offset of the channel buffer
constexpr uint64_t kAckWord = 16;  // chunks consumed from the peer

size_t Chunks(size_t bytes) { return std::max<size_t>(1, (bytes + kChunkPayload - 1) / kChunkPayload); }

}  // namespace

P2PEngine::P2PEngine(World* world) : world_(world) {
  thread_ = std::thread([this] { Loop(); });
}

P2PEngine::~P2PEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  world_->transport->Wake(world_->transport->rank());
  thread_.join();
}

Work P2PEngine::Post(std::shared_ptr<GroupImpl> group, bool send, char* data, size_t bytes,
                     int peer, int64_t tag) {
  auto work = std::make_shared<WorkState>(0, send ? "send" : "recv");
  Op op{std::move(group), send, data, bytes, peer, tag, 0, Chunks(bytes),
        std::chrono::steady_clock::now() + world_->timeout, work};
  {
    std::lock_guard<std::mutex> lock(mu_);
    op.seq = posted_++;
    incoming_.push_back(std::move(op));
  }
  cv_.notify_one();
  world_->transport->Wake(world_->transport->rank());
  return Access::MakeWork(work);
}

bool P2PEngine::CanSend(const Op& op) const {
  GroupImpl* g = op.group.get();
  uint64_t c = g->channels()[op.peer].sent_chunks;
  return c < kSlots || g->tx().Peek(g->world_rank(op.peer),
                                    g->Abs(op.peer, g->P2POff(g->rank()) + kAckWord)) >=
                           c - kSlots + 1;
}

bool P2PEngine::StepSend(Op& op) {
  GroupImpl* g = op.group.get();
  auto& ch = g->channels()[op.peer];
  const int me = g->rank();
  bool moved = false;
  while (op.next < op.chunks && CanSend(op)) {
    size_t off = op.next * kChunkPayload;
    size_t n = std::min(kChunkPayload, op.bytes - std::min(op.bytes, off));
    if (ch.chan_off == kPrivate) {
      auto o = g->world().heap->Allocate(kSlots * kSlotBytes);
      if (!o)
        throw Error(ErrorCode::kShmExhausted,
                    fmt::format("Send: no room in the symmetric heap for a {}-byte channel to "
                                "rank {}; raise MC2_HEAP_BYTES",
                                kSlots * kSlotBytes, op.peer),
                    me, "send");
      ch.chan_off = *o;
      *reinterpret_cast<uint64_t*>(g->Ptr(me, g->P2POff(op.peer) + kChanWord)) = *o;
    }
    uint64_t c = ch.sent_chunks;
    char* slot = g->HeapPtr(me, ch.chan_off + (c % kSlots) * kSlotBytes);
    auto* h = reinterpret_cast<ChunkHeader*>(slot);
    h->tag = op.tag;
    h->total = op.bytes;
    h->index = op.next;
    if (n) std::memcpy(slot + kChunkHeader, op.data + off, n);
    g->Publish(g->P2POff(op.peer) + kSentWord, c + 1, n);
    ch.sent_chunks = c + 1;
    g->tx().Wake(g->world_rank(op.peer));
    ++op.next;
    moved = true;
  }
  return moved;
}

bool P2PEngine::CanReceive(const Inbound& in) const {
  GroupImpl* g = in.group.get();
  const int peer = in.peer;
  return g->tx().Peek(g->world_rank(peer), g->Abs(peer, g->P2POff(g->rank()) + kSentWord)) >=
         g->channels()[peer].recv_chunks + 1;
}

void P2PEngine::Finish(Op& op, const char* src, size_t total, int64_t tag) {
  if (total != op.bytes)
    throw Error(ErrorCode::kMismatch,
                fmt::format("Recv(bytes={}, tag={}) from rank {} matched a message of {} bytes "
                            "with tag {}: sizes must be equal",
                            op.bytes, op.tag, op.peer, total, tag),
                op.group->rank(), "recv");
  if (src && total) std::memcpy(op.data, src, total);
  op.work->Complete();
  op.group.reset();
}

void P2PEngine::PostRecv(Op op) {
  Key key{op.group.get(), op.peer};
  Inbound& in = inbound_[key];
  if (!in.group) {
    in.group = op.group;
    in.peer = op.peer;
  }
  for (auto it = in.unexpected.begin(); it != in.unexpected.end(); ++it) {
    if (it->tag != op.tag || it->claimer) continue;
    if (it->complete) {
      Finish(op, it->data.data(), it->data.size(), it->tag);
      in.unexpected.erase(it);
    } else {
      it->claimer = std::move(op);
    }
    return;
  }
  in.posted.push_back(std::move(op));
}

bool P2PEngine::StepInbound(Inbound& in) {
  GroupImpl* g = in.group.get();
  const int me = g->rank();
  bool moved = false;
  const int peer = in.peer;
  while (CanReceive(in)) {
    auto& ch = g->channels()[peer];
    uint64_t c = ch.recv_chunks;
    uint64_t chan = *reinterpret_cast<volatile uint64_t*>(g->Ptr(peer, g->P2POff(me) + kChanWord));
    const char* slot = g->HeapPtr(peer, chan + (c % kSlots) * kSlotBytes);
    const auto* h = reinterpret_cast<const ChunkHeader*>(slot);
    if (!in.current && !in.current_unexpected) {
      // A new message: the earliest Recv with its tag takes it.
      MC2_ENFORCE(h->index == 0, "message from rank {} starts at chunk {}", peer, h->index);
      in.next = 0;
      in.chunks = Chunks(h->total);
      auto match = std::find_if(in.posted.begin(), in.posted.end(),
                                [&](const Op& op) { return op.tag == h->tag; });
      if (match != in.posted.end()) {
        if (match->bytes != h->total) Finish(*match, nullptr, h->total, h->tag);  // throws
        in.current = std::move(*match);
        in.posted.erase(match);
      } else {
        in.unexpected.push_back(Unexpected{h->tag, std::vector<char>(h->total), false, {}});
        in.current_unexpected = &in.unexpected.back();
      }
    }
    MC2_ENFORCE(h->index == in.next, "chunk {} from rank {} arrived as {}", in.next, peer,
                h->index);
    size_t off = in.next * kChunkPayload;
    size_t n = std::min(kChunkPayload, h->total - std::min<uint64_t>(h->total, off));
    char* dst = in.current ? in.current->data : in.current_unexpected->data.data();
    if (n) std::memcpy(dst + off, slot + kChunkHeader, n);
    g->Publish(g->P2POff(peer) + kAckWord, c + 1);
    ch.recv_chunks = c + 1;
    g->tx().Wake(g->world_rank(peer));
    moved = true;
    if (++in.next < in.chunks) continue;
    if (in.current) {
      Finish(*in.current, nullptr, in.current->bytes, in.current->tag);
      in.current.reset();
    } else {
      Unexpected* u = in.current_unexpected;
      in.current_unexpected = nullptr;
      u->complete = true;
      if (u->claimer) {
        Finish(*u->claimer, u->data.data(), u->data.size(), u->tag);
        in.unexpected.remove_if([u](const Unexpected& x) { return &x == u; });
      }
    }
  }
  return moved;
}

void P2PEngine::FailAll(const std::exception_ptr& e) {
  auto fail = [&](Op& op) {
    op.work->Fail(e);
    op.group.reset();
  };
  for (auto& [key, q] : sends_)
    for (auto& op : q) fail(op);
  for (auto& [key, in] : inbound_) {
    for (auto& op : in.posted) fail(op);
    if (in.current) fail(*in.current);
    for (auto& u : in.unexpected)
      if (u.claimer) fail(*u.claimer);
    in.group.reset();
  }
  sends_.clear();
  inbound_.clear();
}

void P2PEngine::Loop() {
  trace::SetThreadName("p2p");
  auto* tx = world_->transport.get();
  auto any_ready = [&] {
    for (auto& [key, q] : sends_)
      if (!q.empty() && CanSend(q.front())) return true;
    for (auto& [key, in] : inbound_)
      if (in.Active() && CanReceive(in)) return true;
    return false;
  };
  auto pending = [&] {
    if (!sends_.empty()) return true;
    for (auto& [key, in] : inbound_)
      if (in.Active()) return true;
    return false;
  };
  int idle_passes = 0;
  std::vector<decltype(sends_)::iterator> send_order;
  for (;;) {
    std::vector<Op> fresh;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!pending() && incoming_.empty())
        cv_.wait(lock, [&] { return stop_ || !incoming_.empty(); });
      fresh.swap(incoming_);
      if (stop_ && fresh.empty() && !pending()) return;
    }
    bool moved = false;
    try {
      for (auto& op : fresh) {
        if (op.send) sends_[Key{op.group.get(), op.peer}].push_back(std::move(op));
        else PostRecv(std::move(op));
        moved = true;
      }
      if (stop_) {
        FailAll(std::make_exception_ptr(
            Error(ErrorCode::kAborted, "the world was shut down with messages pending")));
        return;
      }
      // Peers' queues in the posting order of their first message.
      send_order.clear();
      for (auto it = sends_.begin(); it != sends_.end(); ++it) send_order.push_back(it);
      std::sort(send_order.begin(), send_order.end(), [](const auto& a, const auto& b) {
        return a->second.front().seq < b->second.front().seq;
      });
      for (auto it : send_order) {
        auto& q = it->second;
        while (!q.empty()) {
          moved |= StepSend(q.front());
          if (q.front().next < q.front().chunks) break;
          q.front().work->Complete();
          q.front().group.reset();
          q.pop_front();
          moved = true;
        }
        if (q.empty()) sends_.erase(it);
      }
      for (auto it = inbound_.begin(); it != inbound_.end();) {
        Inbound& in = it->second;
        if (in.Active()) moved |= StepInbound(in);
        if (!in.Active() && in.unexpected.empty()) {
          in.group.reset();
          it = inbound_.erase(it);
        } else {
          ++it;
        }
      }
      if (moved || !pending()) {
        idle_passes = 0;
        continue;
      }
      // Nothing can move: spin a little, then sleep until a peer wakes us.
      if (++idle_passes < 64) {
        std::this_thread::yield();
        continue;
      }
      tx->SleepUntil(any_ready, std::chrono::milliseconds(10));
      tx->CheckHealth(/*thorough=*/true);
      auto now = std::chrono::steady_clock::now();
      auto check = [&](const Op& op) {
        if (now > op.deadline)
          throw Error(ErrorCode::kTimeout,
                      fmt::format("{}({} bytes, tag {}) {} rank {} did not complete",
                                  op.send ? "Send" : "Recv", op.bytes, op.tag,
                                  op.send ? "to" : "from", op.peer),
                      op.group->rank(), op.send ? "send" : "recv");
      };
      for (auto& [key, q] : sends_) check(q.front());
      for (auto& [key, in] : inbound_) {
        for (auto& op : in.posted) check(op);
        if (in.current) check(*in.current);
        for (auto& u : in.unexpected)
          if (u.claimer) check(*u.claimer);
      }
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidArgument) tx->Abort(e);
      FailAll(std::current_exception());
    } catch (...) {
      tx->Abort(Error(ErrorCode::kInternal, "point-to-point progress failed"));
      FailAll(std::current_exception());
    }
  }
}

}  // namespace mc2::internal
