// Point-to-point progress: tagged Send/Recv between two ranks of a group.
//
// Works as follows. The sender owns a channel buffer of kSlots (8) slots in
// its heap for each peer; a message is cut into slot-sized chunks, each with
// a small header (tag, total size, index). Per peer the sender publishes how
// many chunks it wrote and the receiver how many it consumed; the sender
// reuses slot c % kSlots once chunk c - kSlots is consumed, and each side
// wakes the other after publishing. A Send completes once its last chunk is
// in the channel.
//
// Matching, as in MPI: a message from rank p with tag t goes to the earliest
// posted Recv(p, t) still unmatched; messages with the same (source, tag)
// never overtake each other. A message that arrives (while some Recv from
// its source is posted) before its own Recv is copied into an unexpected-
// message buffer and delivered when that Recv is posted. A size difference
// between a message and its Recv is kMismatch.
//
// Progress never blocks on one message: a dedicated thread (started with
// the first message) advances every pending operation as far as it can and
// sleeps on the rank's doorbell when none can move, so any pattern in which
// every Send has a matching Recv completes (exchanges included), as with
// MPI's non-blocking operations. Operations on the same (group, peer,
// direction) run in the order they were posted, and sends to different
// peers are advanced in the order they were posted: a sender's earlier
// message takes the slots (and, under link emulation, the egress port)
// first, as far as its receiver's acknowledgements allow, so a caller can
// rank its messages by urgency (the MoE dispatch sends the busiest
// receiver's block first).
//
// Thread safety: Post may be called from any thread.
#ifndef MC2_ENGINE_P2P_ENGINE_H_
#define MC2_ENGINE_P2P_ENGINE_H_

#include <condition_variable>
#include <algorithm>
#include <deque>
#include <list>
#include <optional>
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

  // `tag`: a user tag (an int >= 0) or an internal one (channel.h's
  // InternalTag, above every int).
  Work Post(std::shared_ptr<GroupImpl> group, bool send, char* data, size_t bytes, int peer,
            int64_t tag);

  std::thread::id thread_id() const { return thread_.get_id(); }

 private:
  struct Op {
    std::shared_ptr<GroupImpl> group;
    bool send;
    char* data;
    size_t bytes;
    int peer;
    int64_t tag;
    size_t next = 0;  // next chunk of this message
    size_t chunks;
    std::chrono::steady_clock::time_point deadline;
    std::shared_ptr<WorkState> work;
    uint64_t seq = 0;  // posting order, across peers
  };
  using Key = std::pair<GroupImpl*, int>;  // (group, peer)

  // A message that arrived before its Recv was posted.
  struct Unexpected {
    int64_t tag;
    std::vector<char> data;
    bool complete = false;
    std::optional<Op> claimer;  // a Recv posted while it was still arriving
  };
  // What arrives from one peer of one group.
  struct Inbound {
    std::shared_ptr<GroupImpl> group;
    int peer = -1;
    std::deque<Op> posted;              // unmatched Recvs, in post order
    std::list<Unexpected> unexpected;   // in arrival order
    // The message arriving now: into `current` (a matched Recv) or into
    // `*current_unexpected`.
    std::optional<Op> current;
    Unexpected* current_unexpected = nullptr;
    size_t next = 0, chunks = 0;
    bool Active() const {
      return current || current_unexpected || !posted.empty() ||
             std::any_of(unexpected.begin(), unexpected.end(),
                         [](const Unexpected& u) { return u.claimer.has_value(); });
    }
  };

  void Loop();
  // Advances a Send as far as possible; returns whether it moved.
  bool StepSend(Op& op);
  bool CanSend(const Op& op) const;
  // Drains what `in`'s peer has sent, matching messages to Recvs.
  bool StepInbound(Inbound& in);
  bool CanReceive(const Inbound& in) const;
  // Matches a newly posted Recv against the unexpected messages.
  void PostRecv(Op op);
  void Finish(Op& op, const char* src, size_t total, int64_t tag);
  void FailAll(const std::exception_ptr& e);

  World* world_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Op> incoming_;  // guarded by mu_
  uint64_t posted_ = 0;       // guarded by mu_
  bool stop_ = false;         // guarded by mu_
  std::map<Key, std::deque<Op>> sends_;   // progress thread only
  std::map<Key, Inbound> inbound_;        // progress thread only
  std::thread thread_;
};

}  // namespace mc2::internal

#endif  // MC2_ENGINE_P2P_ENGINE_H_
