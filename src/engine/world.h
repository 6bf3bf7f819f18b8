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
#include "mc2/group.h"
#include "transport/transport.h"

namespace mc2::internal {

struct NetWorld;  // engine/net.h
class GroupImpl;

struct World {
  std::unique_ptr<transport::Transport> transport;
  // The rank this world's spans are recorded under (WorldOptions::trace_rank).
  int trace_rank = 0;
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
  // Scratch per half of every group of this world
  // (WorldOptions::scratch_bytes). Every rank must use the same (init).
  size_t scratch_bytes = 0;
  // Point-to-point progress, started by the first message.
  P2PEngine& P2P();
  std::once_flag p2p_once;
  std::unique_ptr<P2PEngine> p2p;
  // Last so that it is destroyed first: its thread may still use the rest.
  std::unique_ptr<engine::ProgressEngine> engine;
  // The net world (engine/net.h) of a rank whose job spans hosts; its
  // engine runs tasks that use this world's groups, so it goes first.
  std::shared_ptr<NetWorld> net;
  ~World();
};

// A world over `tx` with `options` (group.cc), and its world group (the
// first operation doubles as the start-up barrier).
std::shared_ptr<World> MakeWorld(std::unique_ptr<transport::Transport> tx,
                                 const WorldOptions& options);
std::shared_ptr<GroupImpl> MakeWorldGroup(std::shared_ptr<World> world);

// The deleter of every World's shared_ptr. The last reference may go on the
// world's own progress or point-to-point thread: a task or message that
// outlived the caller's last handle of its group.
void DestroyWorld(World* world);
// Waits until every world DestroyWorld handed to a thread of its own is
// gone. Runs at exit once there was one.
void WaitForDeferredWorlds();

}  // namespace mc2::internal

#endif  // MC2_ENGINE_WORLD_H_
