// Bulk copies for the collectives' data movement.
#ifndef MC2_CORE_COPY_H_
#define MC2_CORE_COPY_H_

#include <cstddef>

namespace mc2::core {

// memcpy(dst, src, n) for non-overlapping buffers. From kStreamCopyBytes on,
// with AVX-512, the destination is written with non-temporal stores: a
// collective's output is read next by other cores or much later, so
// fetching its lines into this core's cache first (the read-for-ownership
// of ordinary stores) only doubles the write traffic of a memory-bound copy.
// Ends with a store fence, so the copy is visible before a later flag.
void CopyBytes(void* dst, const void* src, size_t n);

inline constexpr size_t kStreamCopyBytes = size_t{1} << 20;

}  // namespace mc2::core

#endif  // MC2_CORE_COPY_H_
