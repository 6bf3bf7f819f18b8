// Invariant checks (tier 2 of the error policy in docs/errors.md) and helpers
// that turn system-call failures into mc2::Error at the boundary (tier 3).
#ifndef MC2_CORE_ENFORCE_H_
#define MC2_CORE_ENFORCE_H_

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "mc2/error.h"

namespace mc2::core {

[[noreturn]] void ThrowEnforce(const char* file, int line, const char* cond,
                               const std::string& msg);
[[noreturn]] void ThrowSystem(const std::string& what, int err);

}  // namespace mc2::core

// MC2_ENFORCE(cond, fmt, args...): throws mc2::Error(kInternal) naming the
// condition and file:line when cond is false. For argument checks use
// MC2_CHECK_ARG, which throws kInvalidArgument.
#define MC2_ENFORCE(cond, ...)                                                 \
  do {                                                                         \
    if (!(cond)) [[unlikely]]                                                  \
      ::mc2::core::ThrowEnforce(__FILE__, __LINE__, #cond,                     \
                                ::fmt::format("" __VA_ARGS__));                \
  } while (0)

#define MC2_ENFORCE_EQ(a, b, ...)                                              \
  do {                                                                         \
    const auto& mc2_a_ = (a);                                                  \
    const auto& mc2_b_ = (b);                                                  \
    if (!(mc2_a_ == mc2_b_)) [[unlikely]]                                      \
      ::mc2::core::ThrowEnforce(                                               \
          __FILE__, __LINE__, #a " == " #b,                                    \
          ::fmt::format("{} vs {}. ", mc2_a_, mc2_b_) +                        \
              ::fmt::format("" __VA_ARGS__));                                  \
  } while (0)

#define MC2_CHECK_ARG(cond, ...)                                               \
  do {                                                                         \
    if (!(cond)) [[unlikely]]                                                  \
      throw ::mc2::Error(::mc2::ErrorCode::kInvalidArgument,                   \
                         ::fmt::format(__VA_ARGS__));                          \
  } while (0)

// Wraps a system call returning -1 on failure: MC2_SYSCALL(fd = open(...), "open {}", path)
#define MC2_SYSCALL(expr, ...)                                                 \
  do {                                                                         \
    if ((expr) == -1) [[unlikely]]                                             \
      ::mc2::core::ThrowSystem(::fmt::format(__VA_ARGS__), errno);             \
  } while (0)

#endif  // MC2_CORE_ENFORCE_H_
