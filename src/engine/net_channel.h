// The channel of a net group (engine/channel.h, over the net transport).
//
// Channel's contract, with the bytes carried by messages instead of read in
// place: the window is private memory of this rank, and every peer's chunks
// land in a local mirror of that peer's window, at the same offsets.
//
// Works as follows (producer p, consumer c, on the group's channel
// communicator NetGroup::chan, through the net transport):
//   1. Notify(c, phase, offset, bytes) on p posts two Isends to c: a header
//      (phase, offset, bytes, the call's window size) on kHeaderTag, then
//      the bytes at `offset` of p's window on kDataTag (none when empty).
//      Both are posted under one lock, so the headers and the data of
//      concurrent Notify calls (the caller and an Async body) go out in the
//      same order.
//   2. c's transport thread keeps a standing header receive posted per peer. When
//      p's header lands (its callback, on the transport's thread), it grows
//      mirror[p] to the call's window size if needed, posts the data
//      receive into mirror[p] + offset and re-posts the header receive.
//      The transport matches messages of one (communicator, peer, tag) in posting
//      order, so the k-th data receive takes the k-th chunk.
//   3. When a data receive completes, the counter (phase, p) is bumped --
//      in notification order: receives may complete out of order, so a
//      chunk counts only once every earlier chunk from p counted.
//      Waiters poll the counters (acquire), then sleep on a condition
//      variable the callbacks notify.
//   4. View(p, offset, bytes) is mirror[p] + offset.
// Cost per chunk: one 32-byte header message and one data message; a
// chunk's bytes are copied by the network stack into the mirror (no copy
// by mc2).
//
// Reuse safety. A mirror grows only at the first header of a call whose
// window is larger (all of a call's headers carry the same size): the
// consumer is then past the previous call (the producer is in the new call
// only after the call's agreement step, which needs the consumer) and has
// read nothing of the new one from p. Begin waits until every send of the
// previous call completed before the window may be rewritten or regrown.
//
// Lifetime. The window, the mirrors and the counters live in a State
// shared with the transport's callbacks (which hold no group). The destructor
// cancels the standing receives; a process that exits with the group alive
// has them cancelled when the net transport stops.
//
// Thread safety: as Channel (channel.h). Notify may run on the caller's
// thread and on an Async body's at once; the callbacks run on the transport's
// thread only, and they alone write the mirrors and the counters.
#ifndef MC2_ENGINE_NET_CHANNEL_H_
#define MC2_ENGINE_NET_CHANNEL_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/channel.h"
#include "mc2/error.h"
#include "mc2/work.h"

namespace mc2::internal {

class GroupImpl;

class NetChannel final : public ChannelBackend {
 public:
  // `group` spans hosts (GroupImpl::net_group is set) and owns the channel that
  // owns this. Posts the standing header receives.
  explicit NetChannel(GroupImpl* group, int phases);
  ~NetChannel() override;
  NetChannel(const NetChannel&) = delete;
  NetChannel& operator=(const NetChannel&) = delete;

  // Waits until every send of earlier calls completed (kTimeout after
  // `call.timeout`, or the job's failure), then makes the window at least
  // `window_bytes`. Local: no message.
  void Begin(size_t window_bytes, const ChannelCall& call) override;
  char* Window() const override;
  const char* View(int src, size_t offset, size_t bytes) const override;
  // Returns 0: the bytes travel on the transport's thread after the post.
  int64_t Notify(int dst, int phase, size_t offset, size_t bytes) const override;
  bool Landed(int src, int phase, uint64_t total) const override;
  void Wait(int src, int phase, uint64_t total, const ChannelCall& call,
            const std::function<std::string()>& describe_missing) const override;

  // On the net world's engine (the caller computes meanwhile).
  Work Async(std::function<void()> body) const override;
  // On the channel's communicator, where no user message travels.
  Work SendRecv(bool send, char* data, size_t bytes, int peer, InternalTag tag) const override;
  // Real links between hosts: none emulated.
  LinkInfo link() const override { return {}; }
  void Abort(const Error& error) const override;

  struct State;  // shared with the transport's callbacks, in net_channel.cc

 private:
  GroupImpl* const g_;
  std::shared_ptr<State> st_;
};

}  // namespace mc2::internal

#endif  // MC2_ENGINE_NET_CHANNEL_H_
