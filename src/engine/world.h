// World: one rank's view of a set of ranks (its transport, heap allocator,
// progress and point-to-point engines and settings), shared by every group
// of that world.
//
// Thread safety: the fields are set when the world is made and read-only
// after; the engines are thread-safe; P2P() starts its engine once.
#ifndef MC2_ENGINE_WORLD_H_
#define MC2_ENGINE_WORLD_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>

#include "engine/heap_allocator.h"
#include "engine/p2p_engine.h"
#include "engine/progress_engine.h"
#include "transport/transport.h"

namespace mc2::internal {

struct World {
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<engine::HeapAllocator> heap;
  std::chrono::nanoseconds timeout{};
  bool deterministic = true;
  // MC2_CHECK=1: strict mismatch checking (see GroupImpl::strict_check).
  bool strict_check = false;
  // More ranks than the host has CPUs, so ranks share cores: waits poll
  // less before they yield, and eager ranks run further ahead.
  bool oversubscribed = false;
  // Operation slots every group of this world cycles through (<=
  // GroupImpl::kSlots; see there). Every rank must use the same (init).
  uint64_t slots = 0;
  // Point-to-point progress, started by the first message.
  P2PEngine& P2P();
  std::once_flag p2p_once;
  std::unique_ptr<P2PEngine> p2p;
  // Last so that it is destroyed first: its thread may still use the rest.
  std::unique_ptr<engine::ProgressEngine> engine;
  ~World();
};

// The deleter of every World's shared_ptr. The last reference may go on the
// world's own progress or point-to-point thread: a task or message that
// outlived the caller's last handle of its group.
void DestroyWorld(World* world);
// Waits until every world DestroyWorld handed to a thread of its own is
// gone. Runs at exit once there was one.
void WaitForDeferredWorlds();

}  // namespace mc2::internal

#endif  // MC2_ENGINE_WORLD_H_
