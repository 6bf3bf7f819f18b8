#include "core/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mc2::core {

// prefetchw: every x86-64 processor executes it (older Intel ones as a
// no-op); without the target GCC would emit a read prefetch.
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("prfchw")))
#endif
void PrefetchForWrite(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 1, 3);
}

namespace {

#if defined(__x86_64__)
__attribute__((target("avx512f"))) void StreamCopy(char* dst, const char* src, size_t n) {
  // Align the destination to a cache line with an ordinary copy.
  size_t head = (64 - (reinterpret_cast<uintptr_t>(dst) & 63)) & 63;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  size_t lines = n / 64;
  for (size_t i = 0; i < lines; ++i) {
    __m512i v = _mm512_loadu_si512(src + i * 64);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i * 64), v);
  }
  std::memcpy(dst + lines * 64, src + lines * 64, n - lines * 64);
  _mm_sfence();
}

const bool kHaveAvx512 = __builtin_cpu_supports("avx512f");
#endif

// memcpy, with non-temporal stores from `stream_from` bytes on (>= 64, for
// StreamCopy's alignment head) when the CPU has AVX-512.
void Copy(void* dst, const void* src, size_t n, size_t stream_from) {
#if defined(__x86_64__)
  if (n >= stream_from && kHaveAvx512) {
    StreamCopy(static_cast<char*>(dst), static_cast<const char*>(src), n);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace

void StreamBytes(void* dst, const void* src, size_t n) { Copy(dst, src, n, 4096); }

void CopyBytes(void* dst, const void* src, size_t n) { Copy(dst, src, n, kStreamCopyBytes); }

}  // namespace mc2::core
