// Point-to-point progress: tagged Send/Recv between two ranks of a group.
//
// Works as follows. The sender owns a channel buffer of two slots in its
// heap for each peer; a message is cut into slot-sized chunks, each with a
// small header (tag, total size, index). Per peer the sender publishes how
// many chunks it wrote and the receiver how many it consumed; the sender
// reuses slot c % 2 once chunk c - 2 is consumed, and each side wakes the
// other after publishing. Messages between two ranks are delivered in order;
// the tag and size of each are checked against the Recv (kMismatch if they
// differ). A Send completes once its last chunk is in the channel.
//
// Progress never blocks on one message: a dedicated thread (started with
// the first message) advances every pending operation as far as it can and
// sleeps on the rank's doorbell when none can move, so any pattern in which
// every Send has a matching Recv completes (exchanges included), as with
// MPI's non-blocking operations. Operations on the same (group, peer,
// direction) run in the order they were posted.
//
// Thread safety: Post may be called from any thread.
#ifndef MC2_ENGINE_P2P_ENGINE_H_
#define MC2_ENGINE_P2P_ENGINE_H_

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/work_state.h"
#include "mc2/work.h"

namespace mc2::internal {

class GroupImpl;
struct World;

class P2PEngine {
 public:
  explicit P2PEngine(World* world);
  ~P2PEngine();

  Work Post(std::shared_ptr<GroupImpl> group, bool send, char* data, size_t bytes, int peer,
            int tag);

 private:
  struct Op {
    std::shared_ptr<GroupImpl> group;
    bool send;
    char* data;
    size_t bytes;
    int peer;
    int tag;
    size_t next = 0;  // next chunk of this message
    size_t chunks;
    std::chrono::steady_clock::time_point deadline;
    std::shared_ptr<WorkState> work;
  };
  using Key = std::tuple<GroupImpl*, int, bool>;

  void Loop();
  // Advances `op` as far as possible; returns whether it moved.
  bool Step(Op& op);
  bool CanStep(const Op& op) const;
  void FailAll(const std::exception_ptr& e);
  static void Release(std::shared_ptr<GroupImpl> group);

  World* world_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Op> incoming_;  // guarded by mu_
  bool stop_ = false;         // guarded by mu_
  std::map<Key, std::deque<Op>> queues_;  // progress thread only
  std::thread thread_;
};

}  // namespace mc2::internal

#endif  // MC2_ENGINE_P2P_ENGINE_H_
