#include "mc2/error.h"

#include <fmt/format.h>

namespace mc2 {

const char* ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kPeerDied: return "peer_died";
    case ErrorCode::kAborted: return "aborted";
    case ErrorCode::kShmExhausted: return "shm_exhausted";
    case ErrorCode::kMismatch: return "mismatch";
    case ErrorCode::kSystem: return "system";
    case ErrorCode::kMpi: return "mpi";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

namespace {
std::string FormatWhat(ErrorCode code, const std::string& message, int rank,
                       const std::string& op, uint64_t seq) {
  std::string where;
  if (rank >= 0) where += fmt::format("rank {}", rank);
  if (!op.empty()) {
    if (!where.empty()) where += ", ";
    where += seq ? fmt::format("{} #{}", op, seq) : op;
  }
  if (where.empty()) return fmt::format("mc2 error [{}]: {}", ErrorCodeName(code), message);
  return fmt::format("mc2 error [{}] {}: {}", ErrorCodeName(code), where, message);
}
}  // namespace

Error::Error(ErrorCode code, std::string message, int rank, std::string op, uint64_t seq)
    : std::runtime_error(FormatWhat(code, message, rank, op, seq)),
      code_(code),
      rank_(rank),
      op_(std::move(op)),
      seq_(seq),
      message_(std::move(message)) {}

}  // namespace mc2
