// mc2/error.h: the one exception type mc2 throws.
//
// Policy (docs/errors.md has the full table): every runtime failure a caller
// can meet -- a dead or stalled peer, a timeout, exhausted shared memory, a
// mismatched call across ranks, an invalid argument or environment variable --
// is reported as an mc2::Error carrying a code, the rank that raised it, the
// operation and its sequence number. After kPeerDied, kTimeout, kAborted or
// kMismatch the group that raised it is broken: every later operation on it
// (and on groups split from the same world) fails at once with the same
// cause, and the caller must tear the process down or build a new world.
// kInvalidArgument leaves the group usable: nothing was sent.
#ifndef MC2_ERROR_H_
#define MC2_ERROR_H_

#include <cstdint>
#include <stdexcept>
#include <string>

namespace mc2 {

enum class ErrorCode : int {
  kInvalidArgument = 1,  // bad argument, shape, dtype or env var; group usable
  kTimeout,              // an operation did not complete within its timeout
  kPeerDied,             // a peer process exited or was killed
  kAborted,              // another rank or the launcher aborted the world
  kShmExhausted,         // shared memory (/dev/shm, symmetric heap) too small
  kMismatch,             // ranks issued different operations or arguments
  kSystem,               // a system call failed (errno is in the message)
  kMpi,                  // an MPI call failed
  kInternal,             // a bug in mc2: please report it
};

// Short stable name of a code, e.g. "peer_died".
const char* ErrorCodeName(ErrorCode code);

class Error : public std::runtime_error {
 public:
  // `what()` is "mc2 error [code] rank R, OP #SEQ: message" with the parts
  // that are known; rank is -1 and seq is 0 when not applicable.
  Error(ErrorCode code, std::string message, int rank = -1,
        std::string op = {}, uint64_t seq = 0);

  ErrorCode code() const noexcept { return code_; }
  int rank() const noexcept { return rank_; }
  const std::string& op() const noexcept { return op_; }
  uint64_t seq() const noexcept { return seq_; }
  // The message without the prefix.
  const std::string& message() const noexcept { return message_; }

 private:
  ErrorCode code_;
  int rank_;
  std::string op_;
  uint64_t seq_;
  std::string message_;
};

}  // namespace mc2

#endif  // MC2_ERROR_H_
