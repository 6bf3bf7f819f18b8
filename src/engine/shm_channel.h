// The channel of a group within one host (engine/channel.h, over the
// world's shared-memory transport).
//
// Works as follows: the window and the counters are symmetric allocations
// of the group, and every member learns every other's heap offsets once
// (a collective step when they are made or grown). A notification is a
// RemoteAdd of one on the consumer's counter (phase, producer), declaring
// the chunk's bytes, so link emulation delivers it at the modeled
// completion of the transfer. A wait is a WaitGE on this rank's counter; a
// view is the producer's window mapped in place: no copy.
//
// Thread safety: as Channel's (channel.h).
#ifndef MC2_ENGINE_SHM_CHANNEL_H_
#define MC2_ENGINE_SHM_CHANNEL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/channel.h"
#include "mc2/group.h"

namespace mc2::internal {

class ShmChannel final : public ChannelBackend {
 public:
  // `group` is within one host and owns the channel that owns this.
  ShmChannel(GroupImpl* group, int phases) : g_(group), phases_(phases) {}

  void Begin(size_t window_bytes, const ChannelCall& call) override;
  char* Window() const override { return window_.as<char>(); }
  const char* View(int src, size_t offset, size_t bytes) const override;
  int64_t Notify(int dst, int phase, size_t offset, size_t bytes) const override;
  bool Landed(int src, int phase, uint64_t total) const override;
  void Wait(int src, int phase, uint64_t total, const ChannelCall& call,
            const std::function<std::string()>& describe_missing) const override;
  Work Async(std::function<void()> body) const override;
  Work SendRecv(bool send, char* data, size_t bytes, int peer, InternalTag tag) const override;
  LinkInfo link() const override;
  void Abort(const Error& error) const override;

 private:
  uint64_t CounterOff(int owner, int phase, int src) const;
  void Grow(size_t bytes);

  GroupImpl* const g_;
  const int phases_;
  SymmetricBuffer counters_, window_;
  std::vector<uint64_t> counter_off_, window_off_;  // every member's heap offsets
};

}  // namespace mc2::internal

#endif  // MC2_ENGINE_SHM_CHANNEL_H_
