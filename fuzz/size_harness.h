// Shared by the size fuzz targets (collective_sizes_fuzz, ops_sizes_fuzz):
// the input reader that decodes sizes biased toward the values that break
// size arithmetic, the buffer regimes, and an in-process world whose ranks
// run one input and are fully released before the next.
//
// Buffer regimes, decided from a call's byte extents computed in 128-bit
// arithmetic by the target:
//   - extents within kRealBytes: real buffers; the call may succeed;
//   - an extent above PTRDIFF_MAX (no buffer can be that large, or its size
//     wraps): small real buffers (kSmallBytes), and the call must throw: a
//     missing check would let the call overrun them, which ASan reports;
//   - in between: null buffers, and the call must throw.
#ifndef MC2_FUZZ_SIZE_HARNESS_H_
#define MC2_FUZZ_SIZE_HARNESS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/access.h"
#include "engine/group_impl.h"
#include "mc2/error.h"
#include "mc2/group.h"

namespace mc2::fuzz {

using u128 = unsigned __int128;

inline constexpr size_t kRealBytes = size_t{64} << 10;
inline constexpr u128 kMaxBuffer = static_cast<u128>(std::numeric_limits<ptrdiff_t>::max());
inline constexpr size_t kSmallBytes = 256;  // the "small real buffers"
inline constexpr int kMaxCalls = 4;

[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "contract broken: %s\n", what.c_str());
  std::abort();
}

class Reader {
 public:
  Reader(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  bool empty() const { return i_ >= n_; }
  uint8_t U8() { return i_ < n_ ? d_[i_++] : 0; }
  uint64_t U64() {
    uint64_t v = 0;
    for (int k = 0; k < 8; ++k) v = v << 8 | U8();
    return v;
  }
  // A size biased toward the values that break size arithmetic.
  size_t Size() {
    const uint8_t k = U8();
    const size_t delta = U8() % 5;
    switch (k % 8) {
      case 0:
        return k / 8;
      case 1:
        return U8();
      case 2:
        return SIZE_MAX - delta;
      case 3:
        return SIZE_MAX / (1 + U8() % 16) + delta - 2;
      case 4:
        return static_cast<size_t>(PTRDIFF_MAX) / (1 + U8() % 16) + delta - 2;
      case 5:
        return static_cast<size_t>(U64());
      case 6:
        return (size_t{1} << (U8() % 64)) + delta - 2;
      default:
        return U8() % 40;
    }
  }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t i_ = 0;
};

inline u128 Max(u128 a, u128 b) { return a > b ? a : b; }

// Runs `body` on every rank of an in-process world of `n` ranks (small
// heap, a short timeout so that a rank left waiting by its peer's error
// shows as kTimeout well before libFuzzer's per-input timeout, no link
// emulation), then releases the world on this thread: a finished message
// may still hold it for a moment on the world's own thread, and a world
// released there is destroyed on a thread of its own, after this input,
// too late for libFuzzer's leak check.
inline void RunWorld(int n, const std::function<void(Group&)>& body) {
  WorldOptions wo;
  wo.heap_bytes = size_t{8} << 20;
  wo.timeout = std::chrono::seconds(4);
  wo.link = "none";
  std::mutex mu;
  std::vector<std::shared_ptr<internal::World>> worlds;  // one per rank
  try {
    Group::RunInProcess(
        n,
        [&](Group& g) {
          {
            std::lock_guard<std::mutex> lock(mu);
            worlds.push_back(internal::Access::Impl(g)->world_ptr());
          }
          body(g);
        },
        wo);
  } catch (const std::exception& e) {
    Fail(std::string("the world failed: ") + e.what());
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (auto& w : worlds) {
    while (w.use_count() > 1) {
      if (std::chrono::steady_clock::now() > deadline) Fail("a world is still held after its run");
      std::this_thread::yield();
    }
    w.reset();
  }
}

// Runs every call of `calls` on every rank of a world of `n` ranks through
// `run(group, call)`; the only error a call may raise is kInvalidArgument
// (the contract of both targets); anything else is reported with
// `describe(call, n)`.
template <typename Call, typename Run, typename Describe>
void RunCalls(int n, const std::vector<Call>& calls, Run run, Describe describe) {
  RunWorld(n, [&](Group& g) {
    for (const Call& c : calls) {
      try {
        run(g, c);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kInvalidArgument)
          Fail(std::string("unexpected error ") + e.what() + " for " + describe(c, n));
      }
    }
  });
}

}  // namespace mc2::fuzz

#endif  // MC2_FUZZ_SIZE_HARNESS_H_
