// Link emulation: makes shared memory behave, in time, like a network link.
//
// This host has no accelerator interconnect, and its cores do both compute
// and copies, so raw shared memory cannot show what overlapping compute with
// communication does on a cluster whose DMA engines move the data. With
// MC2_LINK="bw=10GB/s,lat=5us" (or WorldOptions::link) every rank gets an
// emulated egress port, and the flag that announces a payload becomes
// visible to the other ranks only when the payload would have arrived.
//
// Model (docs/link-emulation.md has the full story and its limits): a
// transfer of S bytes posted at time t on a rank's egress port starts at
// max(t, busy_until), occupies the port for S / bw, and completes lat later:
//
//   start = max(t, busy_until);  busy_until = start + S / bw;
//   completion = busy_until + lat.
//
// Latency overlaps (pipelined link): back-to-back transfers serialize on
// their bandwidth only, and completions come in posting order. One port per
// rank, for everything the rank sends (no per-destination ports, no ingress
// contention). Data is still copied at memory speed before the Publish; the
// model adds the link's time on top, counted from the Publish.
#ifndef MC2_TRANSPORT_LINK_EMULATION_H_
#define MC2_TRANSPORT_LINK_EMULATION_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/link_config.h"
#include "transport/transport.h"

namespace mc2::transport {

// One rank's emulated egress port: the arithmetic of the model.
//
// Thread safety: all methods may be called from any thread (a mutex guards
// the port state). Invariant: busy_until only grows.
class LinkModel {
 public:
  explicit LinkModel(const core::LinkConfig& config);

  const core::LinkConfig& config() const { return config_; }
  // "emulated link: bw=10 GB/s, lat=5 us": the label of every figure
  // obtained under emulation.
  std::string Label() const;

  // Time the port is occupied by `bytes` (S / bw), and the modeled duration
  // of an isolated transfer (lat + S / bw).
  Clock::duration SerializationTime(size_t bytes) const;
  Clock::duration TransferTime(size_t bytes) const;

  // Posts a transfer of `bytes` at `now` on the port and returns its
  // completion time (model above). bytes == 0 completes at max(now,
  // busy_until) + lat without occupying the port.
  Clock::time_point Post(size_t bytes, Clock::time_point now = Clock::now());

  // When the port next becomes free (may be in the past).
  Clock::time_point busy_until() const;
  // Totals since creation: transfers posted and their bytes.
  uint64_t transfers() const;
  uint64_t bytes_posted() const;

  // Sleeps until `t` without spinning (clock_nanosleep on CLOCK_MONOTONIC,
  // steady_clock's clock). For operators that wait for a modeled completion.
  static void SleepUntil(Clock::time_point t);

 private:
  const core::LinkConfig config_;
  const double ns_per_byte_;
  mutable std::mutex mu_;
  Clock::time_point busy_until_{};
  uint64_t transfers_ = 0;
  uint64_t bytes_ = 0;
};

// A Transport decorator that delays the visibility of payload-carrying
// Publish / RemoteAdd calls by their modeled transfer time on this rank's
// LinkModel.
//
// Works as follows. Publish(off, v, S) with S > 0 posts S bytes on the port
// and queues "store v at off" for the completion time; a delivery thread
// sleeps (a timerfd armed for the earliest due entry, no spinning) and
// performs the real Publish then, which also rings the doorbell. Posting
// re-arms the timer rather than waking the thread, so a rank's hand-off
// never gives its CPU away. The data
// itself was already copied by the caller. Publish with S == 0 goes through
// at once unless a delayed publish of the same flag word is still queued: it
// is then queued behind it, so a flag's values appear in the order they were
// published and never go backwards. RemoteAdd is treated the same way, per
// target word. Wake(peer) for another rank is queued behind everything
// pending, so a peer woken to look at a flag finds it. Reads and waits
// (WaitGE, Peek, SleepUntil, CheckHealth) go straight to the wrapped
// transport: emulation costs nothing on the receiving side.
//
// Cost: with nothing queued, a Publish is one atomic load more than the
// wrapped transport's; a queued one takes a mutex and a heap push.
//
// Thread safety: as Transport; the delivery thread is internal. Invariants:
// every queued entry is delivered exactly once, in (due time, posting order)
// order; words_[w] counts the queued entries for word w and holds the due
// time of the last; pending_ is the number of queued entries, decremented
// only after the entry was delivered.
class LinkEmulationTransport final : public Transport {
 public:
  LinkEmulationTransport(std::unique_ptr<Transport> inner, const core::LinkConfig& config);
  // Delivers whatever is still queued at once, then stops the thread.
  ~LinkEmulationTransport() override;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* name() const override { return name_.c_str(); }
  char* HeapBase(int r) override { return inner_->HeapBase(r); }
  size_t HeapBytes() const override { return inner_->HeapBytes(); }
  void Publish(uint64_t off, uint64_t value, size_t payload_bytes) override;
  void WaitGE(int owner, uint64_t off, uint64_t value, const WaitContext& ctx) override {
    inner_->WaitGE(owner, off, value, ctx);
  }
  void RemoteAdd(int owner, uint64_t off, uint64_t value, size_t payload_bytes) override;
  void Wake(int peer) override;
  void SleepUntil(const std::function<bool()>& ready, Clock::duration max) override {
    inner_->SleepUntil(ready, max);
  }
  uint64_t Peek(int owner, uint64_t off) override { return inner_->Peek(owner, off); }
  void CheckHealth(bool thorough = true) override { inner_->CheckHealth(thorough); }
  void Abort(const Error& error) override { inner_->Abort(error); }
  LinkModel* link() override { return &model_; }
  bool ranks_are_threads() const override { return inner_->ranks_are_threads(); }
  // Waits (sleeping) until everything queued is delivered; if the world has
  // failed meanwhile, delivers the rest at once.
  void Drain() override;

  // Entries queued and not yet delivered (for tests).
  size_t pending() const { return pending_.load(std::memory_order_acquire); }

 private:
  enum class Kind : uint8_t { kPublish, kAdd, kWake };
  struct Entry {
    Clock::time_point due;
    uint64_t order;  // posting order, breaks ties
    Kind kind;
    int owner;
    uint64_t off;
    uint64_t value;
  };
  struct Later {
    bool operator()(const Entry& a, const Entry& b) const {
      return a.due != b.due ? a.due > b.due : a.order > b.order;
    }
  };
  struct WordState {
    uint32_t queued = 0;
    Clock::time_point last_due{};
  };
  using Word = std::pair<int, uint64_t>;  // (owner rank, heap offset)

  // Queues (or, when nothing of `word` is queued and payload == 0, performs
  // at once) one update.
  void Submit(Kind kind, int owner, uint64_t off, uint64_t value, size_t payload);
  // Sets the delivery thread's timer to `due` (mu_ held).
  void ArmLocked(Clock::time_point due);
  // Wakes the delivery thread at once (stop, flush).
  void Kick();
  void Deliver(const Entry& e);
  void Loop();

  const std::unique_ptr<Transport> inner_;
  const std::string name_;
  LinkModel model_;

  std::mutex mu_;
  int timer_fd_ = -1;  // the delivery thread sleeps until it fires...
  int event_fd_ = -1;  // ...or this is written (stop, flush)
  std::condition_variable drained_;  // Drain() waits here
  std::priority_queue<Entry, std::vector<Entry>, Later> queue_;
  std::map<Word, WordState> words_;
  Clock::time_point last_due_{};  // latest due time ever queued
  uint64_t next_order_ = 0;
  bool stop_ = false;
  bool flush_ = false;  // deliver without waiting (stop, or a failed world)
  std::atomic<uint64_t> pending_{0};
  std::thread thread_;  // last: started once everything above exists
};

// Wraps `inner` in a LinkEmulationTransport when `config.enabled`, else
// returns it unchanged.
std::unique_ptr<Transport> WrapWithLinkEmulation(std::unique_ptr<Transport> inner,
                                                 const core::LinkConfig& config);

}  // namespace mc2::transport

#endif  // MC2_TRANSPORT_LINK_EMULATION_H_
