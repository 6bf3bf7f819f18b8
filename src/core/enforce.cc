#include "core/enforce.h"

namespace mc2::core {

void ThrowEnforce(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(ErrorCode::kInternal,
              fmt::format("check failed: {} ({}:{}) {}", cond, file, line, msg));
}

void ThrowSystem(const std::string& what, int err) {
  throw Error(ErrorCode::kSystem, fmt::format("{}: {}", what, std::strerror(err)));
}

}  // namespace mc2::core
