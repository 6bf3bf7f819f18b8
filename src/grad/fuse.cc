#include "grad/fuse.h"

namespace mc2::grad {

std::vector<size_t> PlanFusion(std::span<const FuseItem> items, size_t max_bytes) {
  const size_t n = items.size();
  std::vector<size_t> end(n);
  size_t b = 0;
  while (b < n) {
    size_t e = b + 1;
    if (items[b].eligible && items[b].bytes <= max_bytes) {
      size_t bytes = items[b].bytes;
      while (e < n && items[e].eligible && items[e].group == items[b].group &&
             items[e].bytes <= max_bytes - bytes) {
        bytes += items[e].bytes;
        ++e;
      }
    }
    for (size_t i = b; i < e; ++i) end[i] = e;
    b = e;
  }
  return end;
}

}  // namespace mc2::grad
