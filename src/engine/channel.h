// Channel: the engine's one-sided communication for the fused operators.
//
// A fused pipeline hands chunks of data from a producer rank to consumer
// ranks while both keep computing. The channel gives it what that needs and
// nothing of the transport under it: a window of memory per rank, a way to
// tell a peer that bytes in the window are ready, a way to wait for that
// news from a peer (with a description of what is missing when it does not
// come), and two-sided messages in a tag space the user cannot reach.
//
// Backends (ChannelBackend below). Over shared memory (a group within one
// host, engine/shm_channel.h) the window is a symmetric allocation read in
// place; over the net transport (a net group, engine/net_channel.h) the
// bytes travel with the notification into a mirror of the producer's
// window. The operators see no difference. Channel itself keeps what every
// backend shares: the call's information, the per-call counts (consumed_),
// the trace spans of transfers and waits, and the measured host link.
//
// Ownership. Every group owns at most one channel (created on first use by
// Channel::Of, released with the group). The channel owns its window: a
// symmetric allocation of the group, grown collectively by Begin when a
// call needs more, never shrunk.
//
// Works as follows (rank p produces, rank c consumes, one phase):
//   1. Every member calls Begin(bytes) with the same size (the size follows
//      from the operator's agreed plan); if the window is smaller, every
//      member re-allocates it at once (a collective step: the old window
//      is free, as every member has finished the previous call).
//   2. p writes the chunk into its own window (Window() + offset), then
//      calls Notify(c, phase, offset, bytes). The notification bumps the
//      counter (phase, p) of c by one. Under link emulation the bump is
//      delivered at the modeled completion of a transfer of `bytes` on p's
//      egress port (the port is charged), and the span of the transfer as
//      modeled is recorded ("fused_transfer").
//   3. c calls Wait(p, phase, count): it returns once p's count-th
//      notification of this call in that phase arrived. It spins briefly,
//      then sleeps; it checks the world's health, and raises kTimeout,
//      kPeerDied or kAborted naming the missing chunk (describe_missing).
//      Landed() is the same test without blocking.
//   4. c reads the bytes through View(p, offset, bytes). Over shared memory
//      that is p's window mapped in place: no copy. A transport without
//      shared memory delivers the bytes into a local mirror before the
//      notification counts, and View returns the mirror.
//   5. At the end of the call every member calls Consumed(phase, count)
//      with the number of chunks it received from each peer in that phase.
//
// Invariants. Counters are monotonic over the life of the group and never
// reset: counter (phase, src) on rank c equals the number of notifications
// src sent c in that phase, and consumed_[phase][src] is what c has
// accounted for in earlier calls, so count k of this call is the absolute
// value consumed_ + k. The counters were zeroed before any peer learnt
// where they are.
//
// Reuse safety. A producer writes a window region only once per call, and
// rewrites it only in a later call. Every operator call starts with an
// agreement step that no rank passes before every rank has entered the
// call, i.e. returned from the previous one, having read everything it was
// handed; so no region is rewritten while a consumer still reads it. (A
// group of one rank has no consumers, and takes no notifications.) A call
// that fails after data moved aborts the world (Abort): the counters are
// then out of step and the group unusable, as after any failed collective.
//
// Thread safety. Begin, Consumed, Wait, Landed and View are called by the
// thread issuing the group's operations. Notify and Window may also be
// called from a body run by Async (the progress thread) while that thread
// waits. Send/Recv, the link queries and Abort may be called from any
// thread.
#ifndef MC2_ENGINE_CHANNEL_H_
#define MC2_ENGINE_CHANNEL_H_

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "mc2/error.h"
#include "mc2/group.h"
#include "mc2/work.h"

namespace mc2::internal {

class GroupImpl;

// Tags of the engine's internal two-sided messages. User tags are ints >= 0
// (Group::Send/Recv reject negative ones); internal tags lie above every
// int, so no user message can ever match an internal receive.
inline constexpr int64_t kInternalTagBase = int64_t{1} << 32;
enum class InternalTag : int64_t {
  kBatchGather = kInternalTagBase + 1,  // AllGatherBatchMatmul's fused ring
  kMoeDispatch,                         // MoE token dispatch
  kMoeCombine,                          // MoE expert-output combine
  kHostLinkProbe,                       // the operators' measurement of a host link
};

// The emulated link of a rank's egress port (all zero without emulation).
struct LinkInfo {
  double bytes_per_second = 0;
  double latency_seconds = 0;
  bool emulated() const { return bytes_per_second > 0; }
};

// What a call tells the channel once: the operator's name (errors), the
// label of its transfer spans (must outlive the process's trace files) and
// its timeout (zero: the group's).
struct ChannelCall {
  const char* op = "";
  const char* trace_label = "";
  std::chrono::nanoseconds timeout{0};
};

// What a channel needs from the way its group's ranks reach each other.
// Counts are absolute (over the life of the group); Channel turns the
// per-call counts of its contract into them. Thread safety as Channel's.
class ChannelBackend {
 public:
  virtual ~ChannelBackend() = default;
  // Makes the window at least `window_bytes` (see Channel::Begin).
  // `call.timeout` is set.
  virtual void Begin(size_t window_bytes, const ChannelCall& call) = 0;
  virtual char* Window() const = 0;
  virtual const char* View(int src, size_t offset, size_t bytes) const = 0;
  // Returns when the transfer ends as modeled (steady clock, ns) where the
  // backend knows it (link emulation), else 0.
  virtual int64_t Notify(int dst, int phase, size_t offset, size_t bytes) const = 0;
  virtual bool Landed(int src, int phase, uint64_t total) const = 0;
  virtual void Wait(int src, int phase, uint64_t total, const ChannelCall& call,
                    const std::function<std::string()>& describe_missing) const = 0;
  virtual Work Async(std::function<void()> body) const = 0;
  virtual Work SendRecv(bool send, char* data, size_t bytes, int peer, InternalTag tag) const = 0;
  virtual LinkInfo link() const = 0;
  virtual void Abort(const Error& error) const = 0;
};

class Channel {
 public:
  // Phases: independent sets of counters, for pipelines whose consumers
  // wait for two kinds of chunk in one call (reduce-scatter, then
  // all-gather).
  static constexpr int kPhases = 2;

  using CallInfo = ChannelCall;

  // The channel of `g` (valid), created empty on first use. Not collective.
  static Channel& Of(const Group& g);

  explicit Channel(GroupImpl* group);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Starts a call that uses `window_bytes` of window per rank. Collective
  // on the group's first call (the counters are allocated) and when the
  // window must grow (every member passes the same size and has the same
  // history, so every member grows alike; a group of one rank grows alone);
  // throws kShmExhausted on every rank when the heap cannot hold it.
  void Begin(size_t window_bytes, const CallInfo& info);

  // This rank's window (at least the bytes passed to Begin).
  char* Window() const;
  // `bytes` at `offset` of member `src`'s window, readable once the
  // notification that covers them was waited for.
  const char* View(int src, size_t offset, size_t bytes) const;

  // Tells member `dst` that one more chunk of `phase`, `bytes` at `offset`
  // of this rank's window, is ready (see "Works as follows").
  void Notify(int dst, int phase, size_t offset, size_t bytes) const;
  // Whether `count` chunks of `phase` from `src` arrived in this call.
  bool Landed(int src, int phase, uint64_t count) const;
  // Blocks until Landed(src, phase, count). Throws kTimeout, kPeerDied or
  // kAborted; the message then names what `describe_missing` returns.
  void Wait(int src, int phase, uint64_t count,
            const std::function<std::string()>& describe_missing) const;
  // The call consumed `chunks` chunks of `phase` from every peer.
  void Consumed(int phase, uint64_t chunks);

  // Runs `body` on the rank's progress thread (e.g. filling the window
  // while the caller computes); the Work completes when it returns.
  Work Async(std::function<void()> body) const;

  // Two-sided messages in the internal tag space (Group::Send/Recv
  // semantics otherwise: matched per (peer, tag) in posting order).
  Work Send(const void* data, size_t bytes, int peer, InternalTag tag) const;
  Work Recv(void* data, size_t bytes, int peer, InternalTag tag) const;

  // The emulated link of this rank's port, and the bytes of symmetric heap
  // per rank (the cost model's environment). Across hosts the links are
  // real: no emulated link (the node's heap size still counts).
  LinkInfo link() const;
  size_t heap_bytes() const;
  // Each member's host (hosts numbered in order of their first member)
  // when the group spans hosts; empty for a group within one host.
  const std::vector<int>& HostOf() const;
  // The link between the group's hosts as the operators measured it
  // (ops/host_link.h), kept for the group's life: nullopt until set.
  std::optional<LinkInfo> host_link() const;
  void set_host_link(const LinkInfo& link);
  // Records `error` as the world's failure, so that every rank's waits
  // fail promptly (for a call that failed after data moved).
  void Abort(const Error& error) const;

 private:
  GroupImpl* const g_;  // owns this channel
  std::unique_ptr<ChannelBackend> backend_;
  CallInfo call_;
  std::array<std::vector<uint64_t>, kPhases> consumed_;
  mutable std::mutex host_link_mu_;
  std::optional<LinkInfo> host_link_;  // guarded by host_link_mu_
};

}  // namespace mc2::internal

#endif  // MC2_ENGINE_CHANNEL_H_
