#include "core/scratch.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <new>
#include <utility>
#include <vector>

#include "mc2/error.h"

namespace mc2::core {
namespace {

constexpr std::align_val_t kAlign{64};

// Rounds up to 1/8 of the next power of two, so that calls whose sizes
// differ a little (uneven MoE loads, the last chunk) reuse the same block,
// wasting at most 1/8.
size_t RoundUp(size_t bytes) {
  if (bytes <= 4096) return 4096;
  if (bytes > (SIZE_MAX >> 2)) return bytes;  // no power of two above it: the allocation fails
  const size_t step = std::bit_ceil(bytes) / 8;
  return (bytes + step - 1) / step * step;
}

struct Block {
  size_t cap;
  void* data;
};

// Free blocks of this thread, sorted by capacity.
class Cache {
 public:
  ~Cache() { Trim(); }
  void* Take(size_t& cap) {
    auto it = FirstAtLeast(cap);
    if (it != free_.end() && it->cap <= 2 * cap) {
      void* p = it->data;
      cap = it->cap;
      bytes_ -= it->cap;
      free_.erase(it);
      return p;
    }
    try {
      return ::operator new(cap, kAlign);
    } catch (const std::bad_alloc&) {
      // The cached blocks may be what fills memory: give them back, once.
      Trim();
    }
    try {
      return ::operator new(cap, kAlign);
    } catch (const std::bad_alloc&) {
      throw Error(ErrorCode::kSystem,
                  fmt::format("cannot allocate {} bytes of scratch memory (out of memory)", cap));
    }
  }
  void Give(void* p, size_t cap) noexcept {
    if (cap > kScratchCacheBytes) {
      ::operator delete(p, kAlign);
      return;
    }
    while (bytes_ + cap > kScratchCacheBytes && !free_.empty()) {
      bytes_ -= free_.back().cap;
      ::operator delete(free_.back().data, kAlign);
      free_.pop_back();
    }
    try {
      free_.insert(FirstAtLeast(cap), Block{cap, p});
      bytes_ += cap;
    } catch (...) {  // no memory for the list entry: just free the block
      ::operator delete(p, kAlign);
    }
  }
  void Trim() noexcept {
    for (Block& b : free_) ::operator delete(b.data, kAlign);
    free_.clear();
    bytes_ = 0;
  }
  size_t bytes() const { return bytes_; }

 private:
  std::vector<Block>::iterator FirstAtLeast(size_t cap) {
    return std::lower_bound(free_.begin(), free_.end(), cap,
                            [](const Block& b, size_t c) { return b.cap < c; });
  }

  std::vector<Block> free_;
  size_t bytes_ = 0;
};

Cache& ThreadCache() {
  thread_local Cache cache;
  return cache;
}

}  // namespace

ScratchBlock::ScratchBlock(size_t bytes) : cap_(RoundUp(bytes)) {
  data_ = ThreadCache().Take(cap_);
}

ScratchBlock::ScratchBlock(ScratchBlock&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), cap_(std::exchange(o.cap_, 0)) {}

ScratchBlock& ScratchBlock::operator=(ScratchBlock&& o) noexcept {
  if (this != &o) {
    Release();
    data_ = std::exchange(o.data_, nullptr);
    cap_ = std::exchange(o.cap_, 0);
  }
  return *this;
}

ScratchBlock::~ScratchBlock() { Release(); }

// A block may be released on another thread than the one that took it (a
// Work's buffers freed by whoever drops it last); it then joins that
// thread's cache, which is as good.
void ScratchBlock::Release() noexcept {
  if (data_) ThreadCache().Give(data_, cap_);
  data_ = nullptr;
  cap_ = 0;
}

size_t ScratchCachedBytes() { return ThreadCache().bytes(); }
void ScratchTrim() { ThreadCache().Trim(); }

}  // namespace mc2::core
