// The transport: how the ranks of a world reach each other's memory.
//
// mc2's collectives are written against this interface only. A world is a
// fixed set of ranks; each rank owns a heap (its part of the symmetric heap)
// that every rank of the world can address. Ranks synchronise through 64-bit
// "flags": words in the owner's heap that only the owner writes (Publish),
// and that any rank may wait on (WaitGE). Data moves by loads and stores
// through HeapBase() pointers.
//
// Single writer per flag keeps the protocol free of read-modify-write across
// processes and makes every wait a monotonic "value >= target" test, so a
// late reader can never miss an update and flags never need resetting.
//
// The shared-memory transport (shm/) is the first implementation: heaps are
// shared-memory segments mapped by every process, or plain memory when the
// ranks are threads of one process. The link-emulation wrapper
// (link_emulation.h, MC2_LINK) delays the visibility of a Publish by the
// modeled transfer time of its payload.
//
// Thread safety: all methods may be called concurrently from any thread of
// the owning rank.
#ifndef MC2_TRANSPORT_TRANSPORT_H_
#define MC2_TRANSPORT_TRANSPORT_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mc2/error.h"

namespace mc2::transport {

using Clock = std::chrono::steady_clock;

class LinkModel;  // link_emulation.h

// Clock::now() to within a scheduler tick, at a fraction of the
// cost: used for operation deadlines, which need no more precision.
Clock::time_point CoarseNow();

// Bytes at the start of every heap reserved for the transport's own header
// (doorbell, pid). Allocations start after it.
inline constexpr size_t kHeapHeaderBytes = 4096;

// What a wait is for, so that a failure can be reported precisely.
struct WaitContext {
  const char* op = "";          // e.g. "all_reduce"
  uint64_t seq = 0;             // the operation's sequence number in its group
  // Throw kTimeout after *deadline. A default-constructed (zero) deadline
  // is set to now + timeout the first time the wait has to sleep: most
  // operations never block, and they need not read the clock at all.
  Clock::time_point* deadline = nullptr;
  Clock::duration timeout{};
  // Names the ranks the operation still waits for (called only on failure).
  std::function<std::string()> describe_missing;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "shm" (processes) or "threads" (in-process world).
  virtual const char* name() const = 0;

  // Rank `r`'s heap as mapped in this process; never null for shm.
  virtual char* HeapBase(int r) = 0;
  virtual size_t HeapBytes() const = 0;

  // Stores `value` (release) into this rank's flag at heap offset `off` and
  // wakes ranks blocked on it. `payload_bytes` is how much data the flag
  // publishes; link emulation delays the flag by that data's transfer time.
  virtual void Publish(uint64_t off, uint64_t value, size_t payload_bytes = 0) = 0;

  // Returns once rank `owner`'s flag at `off` is >= `value`. Spins briefly,
  // then blocks without burning CPU. Throws mc2::Error: kTimeout at the
  // deadline, kPeerDied when a rank of the world is gone, kAborted when
  // another rank aborted the world.
  virtual void WaitGE(int owner, uint64_t off, uint64_t value, const WaitContext& ctx) = 0;

  // Atomically adds `value` to rank `owner`'s counter at `off` (release,
  // after this rank's earlier stores) and wakes its waiters. The one
  // exception to single-writer flags: user signals, which any rank may bump.
  virtual void RemoteAdd(int owner, uint64_t off, uint64_t value, size_t payload_bytes = 0) = 0;

  // Wakes rank `peer`'s threads sleeping in SleepUntil (cheap when none is).
  virtual void Wake(int peer) = 0;
  // Sleeps until `ready()` holds, this rank is woken (Wake, or a Publish of
  // one of its own flags) or `max` passed, whichever comes first. For
  // threads that wait on many flags at once (point-to-point progress).
  virtual void SleepUntil(const std::function<bool()>& ready, Clock::duration max) = 0;

  // Reads rank `owner`'s flag (acquire) without waiting.
  virtual uint64_t Peek(int owner, uint64_t off) = 0;

  // Throws the world's failure, if one is recorded or (thorough) a peer is
  // found dead. The quick form reads one shared word, cheap enough for the
  // start of every operation; the thorough one polls the peers' processes.
  virtual void CheckHealth(bool thorough = true) = 0;

  // Records `error` as the world's failure (first one wins), so that every
  // rank's waits raise kAborted (or kPeerDied) promptly.
  virtual void Abort(const Error& error) = 0;

  // The emulated egress port of this rank when link emulation is on (see
  // link_emulation.h), else null. Operators use it to account for the
  // transfers they make.
  virtual LinkModel* link() { return nullptr; }
  // Returns once every Publish / RemoteAdd / Wake this rank issued is
  // visible to the other ranks (immediate without link emulation). Called
  // before this rank's flag memory is freed or reused.
  virtual void Drain() {}
  // True when the ranks are threads of one process (in-process worlds), so
  // that every rank's memory is already mapped in this process.
  virtual bool ranks_are_threads() const { return false; }
};

// The transports of the local process's world, chosen by the environment:
// under `mc2 run` the shm transport over the launcher's segments. Throws
// kInvalidArgument naming the missing variable when not launched by mc2.
// `link` (WorldOptions::link) selects link emulation: empty = MC2_LINK,
// "none" = off, else a link description (core/link_config.h); invalid text
// throws kInvalidArgument naming it.
std::unique_ptr<Transport> CreateTransportFromEnv(std::string_view link = {});

// An in-process world of `size` ranks (threads): element r is rank r's view.
// `link` as for CreateTransportFromEnv.
std::vector<std::unique_ptr<Transport>> CreateInProcessTransports(int size, size_t heap_bytes,
                                                                  std::string_view link = {});

// Whether the environment describes an mc2-launched rank (MC2_SHM_FDS set).
bool LaunchedByMc2();

// A job's heap per rank and shared-memory directory when neither an option
// nor MC2_HEAP_BYTES / MC2_SHM_DIR says otherwise.
inline constexpr size_t kDefaultJobHeapBytes = size_t{256} << 20;  // 256 MiB
inline constexpr char kDefaultShmDir[] = "/dev/shm";

// Gathers one short string from every rank of a world being made, in rank
// order (shm/rendezvous.h).
using AllGatherStrings = std::function<std::vector<std::string>(const std::string& mine)>;

// Rank `rank` of a world of `size` processes on one host that make it
// together, without `mc2 run` (shm/rendezvous.h): `heap_bytes` per rank (0 =
// MC2_HEAP_BYTES, else kDefaultJobHeapBytes), segments in MC2_SHM_DIR (else
// kDefaultShmDir). `link` as for CreateTransportFromEnv.
std::unique_ptr<Transport> CreateRendezvousTransport(int rank, int size, size_t heap_bytes,
                                                     const AllGatherStrings& all_gather,
                                                     std::string_view link = {});

}  // namespace mc2::transport

#endif  // MC2_TRANSPORT_TRANSPORT_H_
