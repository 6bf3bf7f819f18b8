#include "engine/p2p_engine.h"

#include <fmt/format.h>

#include <cstring>

#include "core/enforce.h"
#include "engine/group_impl.h"

namespace mc2::internal {
namespace {

constexpr size_t kChunkHeader = 64;
constexpr size_t kChunkPayload = 256 * 1024;
constexpr size_t kSlotBytes = kChunkHeader + kChunkPayload;
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
                     int peer, int tag) {
  auto work = std::make_shared<WorkState>(0, send ? "send" : "recv");
  Op op{std::move(group), send, data, bytes, peer, tag, 0, Chunks(bytes),
        std::chrono::steady_clock::now() + world_->timeout, work};
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming_.push_back(std::move(op));
  }
  cv_.notify_one();
  world_->transport->Wake(world_->transport->rank());
  return Work(work);
}

bool P2PEngine::CanStep(const Op& op) const {
  GroupImpl* g = op.group.get();
  auto& ch = g->channels()[op.peer];
  int me = g->rank();
  if (op.send) {
    uint64_t c = ch.sent_chunks;
    return c < 2 || g->tx().Peek(g->world_rank(op.peer), g->Abs(op.peer, g->P2POff(me) + kAckWord)) >= c - 1;
  }
  return g->tx().Peek(g->world_rank(op.peer), g->Abs(op.peer, g->P2POff(me) + kSentWord)) >=
         ch.recv_chunks + 1;
}

bool P2PEngine::Step(Op& op) {
  GroupImpl* g = op.group.get();
  auto& ch = g->channels()[op.peer];
  const int me = g->rank();
  bool moved = false;
  while (op.next < op.chunks && CanStep(op)) {
    size_t off = op.next * kChunkPayload;
    size_t n = std::min(kChunkPayload, op.bytes - std::min(op.bytes, off));
    if (op.send) {
      if (ch.chan_off == kPrivate) {
        auto o = g->world().heap->Allocate(2 * kSlotBytes);
        if (!o)
          throw Error(ErrorCode::kShmExhausted,
                      fmt::format("Send: no room in the symmetric heap for a {}-byte channel to "
                                  "rank {}; raise MC2_HEAP_BYTES",
                                  2 * kSlotBytes, op.peer),
                      me, "send");
        ch.chan_off = *o;
        *reinterpret_cast<uint64_t*>(g->Ptr(me, g->P2POff(op.peer) + kChanWord)) = *o;
      }
      uint64_t c = ch.sent_chunks;
      char* slot = g->HeapPtr(me, ch.chan_off + (c % 2) * kSlotBytes);
      auto* h = reinterpret_cast<ChunkHeader*>(slot);
      h->tag = op.tag;
      h->total = op.bytes;
      h->index = op.next;
      if (n) std::memcpy(slot + kChunkHeader, op.data + off, n);
      g->Publish(g->P2POff(op.peer) + kSentWord, c + 1, n);
      ch.sent_chunks = c + 1;
    } else {
      uint64_t c = ch.recv_chunks;
      uint64_t chan = *reinterpret_cast<volatile uint64_t*>(g->Ptr(op.peer, g->P2POff(me) + kChanWord));
      const char* slot = g->HeapPtr(op.peer, chan + (c % 2) * kSlotBytes);
      const auto* h = reinterpret_cast<const ChunkHeader*>(slot);
      if (h->tag != op.tag || h->total != op.bytes || h->index != op.next)
        throw Error(ErrorCode::kMismatch,
                    fmt::format("Recv(bytes={}, tag={}) from rank {} met a Send(bytes={}, "
                                "tag={}) from that rank; messages between two ranks are "
                                "delivered in order and must match",
                                op.bytes, op.tag, op.peer, h->total, h->tag),
                    me, "recv");
      if (n) std::memcpy(op.data + off, slot + kChunkHeader, n);
      g->Publish(g->P2POff(op.peer) + kAckWord, c + 1);
      ch.recv_chunks = c + 1;
    }
    g->tx().Wake(g->world_rank(op.peer));
    ++op.next;
    moved = true;
  }
  return moved;
}

void P2PEngine::Release(std::shared_ptr<GroupImpl> group) {
  // If the caller let go of every handle of the group, ours is the last:
  // release it on a thread of its own, which may then join this one.
  if (group.use_count() == 1) std::thread([g = std::move(group)] {}).detach();
}

void P2PEngine::FailAll(const std::exception_ptr& e) {
  for (auto& [key, q] : queues_)
    for (auto& op : q) {
      op.work->Fail(e);
      Release(std::move(op.group));
    }
  queues_.clear();
}

void P2PEngine::Loop() {
  auto* tx = world_->transport.get();
  auto any_ready = [&] {
    for (auto& [key, q] : queues_)
      if (!q.empty() && CanStep(q.front())) return true;
    return false;
  };
  int idle_passes = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (queues_.empty() && incoming_.empty())
        cv_.wait(lock, [&] { return stop_ || !incoming_.empty(); });
      if (stop_ && incoming_.empty() && queues_.empty()) return;
      for (auto& op : incoming_) {
        Key key{op.group.get(), op.peer, op.send};
        queues_[key].push_back(std::move(op));
      }
      incoming_.clear();
      if (stop_) {
        FailAll(std::make_exception_ptr(
            Error(ErrorCode::kAborted, "the world was shut down with messages pending")));
        return;
      }
    }
    bool moved = false;
    try {
      for (auto it = queues_.begin(); it != queues_.end();) {
        auto& q = it->second;
        while (!q.empty()) {
          moved |= Step(q.front());
          if (q.front().next < q.front().chunks) break;
          q.front().work->Complete();
          Release(std::move(q.front().group));
          q.pop_front();
          moved = true;
        }
        it = q.empty() ? queues_.erase(it) : std::next(it);
      }
      if (moved || queues_.empty()) {
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
      for (auto& [key, q] : queues_) {
        const Op& op = q.front();
        if (now > op.deadline)
          throw Error(ErrorCode::kTimeout,
                      fmt::format("{}({} bytes, tag {}) {} rank {} did not complete",
                                  op.send ? "Send" : "Recv", op.bytes, op.tag,
                                  op.send ? "to" : "from", op.peer),
                      op.group->rank(), op.send ? "send" : "recv");
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
