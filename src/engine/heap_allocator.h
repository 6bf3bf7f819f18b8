// First-fit allocator over this rank's part of the symmetric heap.
//
// Invariants: free_ holds disjoint, non-adjacent ranges sorted by offset;
// every offset handed out is kAlignment-aligned. Thread-safe (one mutex).
#ifndef MC2_ENGINE_HEAP_ALLOCATOR_H_
#define MC2_ENGINE_HEAP_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

namespace mc2::engine {

class HeapAllocator {
 public:
  static constexpr size_t kAlignment = 4096;  // page: keeps big buffers off shared lines
  HeapAllocator(uint64_t begin, uint64_t end);

  // An offset of `bytes` (rounded up) or nullopt when no range is big enough.
  std::optional<uint64_t> Allocate(size_t bytes);
  void Free(uint64_t offset);
  size_t free_bytes() const;
  size_t largest_free() const;

 private:
  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> free_;  // offset -> size
  std::map<uint64_t, uint64_t> used_;  // offset -> size
};

}  // namespace mc2::engine

#endif  // MC2_ENGINE_HEAP_ALLOCATOR_H_
