// Scratch memory for temporaries that live for one call (an operator's
// packed inputs, partial products, a collective's staging), taken from a
// per-thread cache of blocks instead of the allocator.
//
// Why: on a VM whose guest memory is backed lazily (free pages handed back
// to the host), the first touch of a page is expensive, so a large buffer
// that the allocator returns to the kernel and maps again on every call can
// cost as much in page faults as the GEMM it feeds. Keeping the blocks makes
// the second call and every later one touch pages that are already mapped.
#ifndef MC2_CORE_SCRATCH_H_
#define MC2_CORE_SCRATCH_H_

#include <cstddef>
#include <type_traits>

namespace mc2::core {

// At most this many bytes stay cached per thread between calls; a block that
// would exceed it is freed (the largest blocks go first).
inline constexpr size_t kScratchCacheBytes = size_t{1} << 30;

// A block of at least `bytes` bytes, not zeroed, 64-byte aligned, returned
// to the calling thread's cache on destruction. Moves but does not copy.
// When memory cannot hold it (after the thread's cached blocks were freed),
// throws kSystem naming the size.
class ScratchBlock {
 public:
  ScratchBlock() = default;
  explicit ScratchBlock(size_t bytes);
  ScratchBlock(ScratchBlock&& o) noexcept;
  ScratchBlock& operator=(ScratchBlock&& o) noexcept;
  ~ScratchBlock();
  void* data() const { return data_; }
  size_t capacity() const { return cap_; }

 private:
  void Release() noexcept;
  void* data_ = nullptr;
  size_t cap_ = 0;
};

// A block for `count` T (raw bytes, so T must be trivially copyable).
template <typename T>
class Scratch {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  explicit Scratch(size_t count = 0) { Resize(count); }
  // Discards the contents: the buffer is for `count` T afterwards.
  void Resize(size_t count) { block_ = count ? ScratchBlock(count * sizeof(T)) : ScratchBlock(); }
  T* data() const { return static_cast<T*>(block_.data()); }

 private:
  ScratchBlock block_;
};

// Bytes the calling thread's cache holds now (for tests).
size_t ScratchCachedBytes();
// Frees the calling thread's cached blocks.
void ScratchTrim();

}  // namespace mc2::core

#endif  // MC2_CORE_SCRATCH_H_
