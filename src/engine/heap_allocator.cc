#include "engine/heap_allocator.h"

#include "core/enforce.h"

namespace mc2::engine {

HeapAllocator::HeapAllocator(uint64_t begin, uint64_t end) {
  begin = (begin + kAlignment - 1) / kAlignment * kAlignment;
  if (end > begin) free_[begin] = end - begin;
}

std::optional<uint64_t> HeapAllocator::Allocate(size_t bytes) {
  size_t need = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    uint64_t off = it->first;
    uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest) free_[off + need] = rest;
    used_[off] = need;
    return off;
  }
  return std::nullopt;
}

void HeapAllocator::Free(uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  auto u = used_.find(offset);
  MC2_ENFORCE(u != used_.end(), "freeing heap offset {} that was not allocated", offset);
  uint64_t size = u->second;
  used_.erase(u);
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return;
    }
  }
  free_[offset] = size;
}

size_t HeapAllocator::free_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (auto& [o, s] : free_) n += s;
  return n;
}

size_t HeapAllocator::largest_free() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (auto& [o, s] : free_) n = std::max<size_t>(n, s);
  return n;
}

}  // namespace mc2::engine
