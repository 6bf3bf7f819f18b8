// Helper threads of a calling thread, for work split into blocks (the row
// blocks of a multi-threaded GEMM, gemm.cc).
//
// RunBlocks(n, fn) runs fn(0) ... fn(n - 1) at once, fn(0) on the calling
// thread and the others on that thread's own helpers (n - 1 of them, made
// at the first call that needs them and kept until the calling thread
// exits), and returns when all are done. The first exception any block
// threw is rethrown after every block finished.
//
// Why not an OpenMP parallel region: the helpers are plain std::threads
// synchronised with a mutex and condition variables, which ThreadSanitizer
// sees (libgomp's barriers it does not), and each calling thread (a rank
// thread of an in-process world) has a team of its own. The helpers start
// with the CPU affinity of the calling thread at their creation
// (core/placement.h binds it before any GEMM), and sleep between calls.
//
// Thread safety: any thread may call; calls from one thread run one at a
// time (a block must not call RunBlocks itself).
#ifndef MC2_OPS_HELPER_THREADS_H_
#define MC2_OPS_HELPER_THREADS_H_

#include <functional>

namespace mc2::ops {

void RunBlocks(int blocks, const std::function<void(int)>& fn);

}  // namespace mc2::ops

#endif  // MC2_OPS_HELPER_THREADS_H_
