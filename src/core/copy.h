// Bulk copies for the collectives' data movement.
#ifndef MC2_CORE_COPY_H_
#define MC2_CORE_COPY_H_

#include <cstddef>
#include <cstdint>

namespace mc2::core {

// memcpy(dst, src, n) for non-overlapping buffers. From kStreamCopyBytes on,
// with AVX-512, the destination is written with non-temporal stores: a
// collective's output is read next by other cores or much later, so
// fetching its lines into this core's cache first (the read-for-ownership
// of ordinary stores) only doubles the write traffic of a memory-bound copy.
// Ends with a store fence, so the copy is visible before a later flag.
void CopyBytes(void* dst, const void* src, size_t n);

inline constexpr size_t kStreamCopyBytes = size_t{1} << 20;

// CopyBytes with non-temporal stores from 4 KiB on (with AVX-512), for
// staging that another core reads next: the peer then reads the lines
// from memory rather than out of this core's cache, which is faster than a
// cache-to-cache transfer of lines this core still owns.
void StreamBytes(void* dst, const void* src, size_t n);

// Cache hints for the latency path of small operations (GroupImpl's
// PrepareNextSlot and WaitArrival). Neither is a memory access in the
// language's sense, so both may touch memory another thread is writing.
//
// Asks for the lines of [p, p + bytes) in exclusive state, ahead of
// writing them.
void PrefetchForWrite(const void* p, size_t bytes);
// Loads one word of each line of [p, p + bytes) and drops it. A demand
// load, not a prefetch: a prefetch may be dropped or issued late, while a
// load's miss is sure to overlap the flag's when polled together. The
// loads are inline assembly.
inline void TouchForRead(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t off = 0; off < bytes; off += 64) {
#if defined(__x86_64__)
    uint64_t sink;
    asm volatile("movq (%1), %0" : "=r"(sink) : "r"(c + off));
#else
    __builtin_prefetch(c + off, 0, 3);
#endif
  }
}

// The pause of a spin-wait loop (spares the sibling hyperthread and the
// memory-order flush when the awaited line changes).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace mc2::core

#endif  // MC2_CORE_COPY_H_
