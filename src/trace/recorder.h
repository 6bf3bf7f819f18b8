// The span recorder: what the library's layers use to record spans, on top
// of the public mc2/trace.h.
//
// Works as follows. Each thread that records owns a ThreadBuffer, made on
// its first span and registered once (under a mutex) in a process-wide
// list; after that, recording is lock-free: the span is written into the
// buffer's current chunk and the buffer's count is published with a release
// store. Cost when on: two clock reads, the append and, amortised, mapping
// the chunks' pages. Chunks are never moved or freed, so Flush() can read
// every buffer's first `count` spans (acquire) while their owners keep
// appending. Buffers outlive their threads (the progress thread ends before
// its world flushes).
//
// Each buffer holds at most kMaxSpansPerThread spans; later ones are
// counted as dropped and the count is written to the file's metadata.
//
// Invariants: a buffer is appended to only by its owner thread; spans at
// index < count are immutable; `base` (the first span of the current
// session) changes only under the registry mutex, in Enable().
#ifndef MC2_TRACE_RECORDER_H_
#define MC2_TRACE_RECORDER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mc2/trace.h"

namespace mc2::trace {

// Internal span kinds beyond the public categories: step markers.
inline constexpr uint8_t kStepBegin = 16;
inline constexpr uint8_t kStepEnd = 17;

// One recorded span. Strings are static or interned (never freed).
struct Span {
  int64_t start_ns;
  int64_t end_ns;
  const char* name;
  const char* algorithm;  // collective algorithm, or null
  const char* pipeline;   // fused-operator pipeline, or null
  uint64_t bytes;
  uint64_t flops;
  int64_t step;  // the rank's current step when the span ended (-1: none)
  int32_t rank;  // world rank; -1 = the recording thread's rank
  uint8_t kind;  // a Category, or kStepBegin / kStepEnd
};

// Chunk k of a buffer holds kFirstChunkSpans << k spans (72 KiB, 144 KiB,
// ...): a thread that records little costs little memory, one that records
// much allocates rarely.
inline constexpr size_t kFirstChunkSpans = 1024;
inline constexpr int kMaxChunks = 10;
inline constexpr size_t kMaxSpansPerThread = kFirstChunkSpans * ((size_t{1} << kMaxChunks) - 1);
// The chunk holding span `n` of a buffer, and its index in that chunk.
inline void ChunkOf(size_t n, size_t* chunk, size_t* index) {
  size_t q = n / kFirstChunkSpans + 1;
  *chunk = 63 - static_cast<size_t>(__builtin_clzll(q));
  *index = n - kFirstChunkSpans * ((size_t{1} << *chunk) - 1);
}

// The one check on the hot path.
inline bool On() { return internal::g_enabled.load(std::memory_order_relaxed); }
inline int64_t NowNs() { return internal::NowNs(); }

// Appends `s` to the calling thread's buffer (even when tracing is off: the
// caller checked On() when the span began). A negative rank is replaced by
// the thread's rank, and the step by the rank's current step.
void Record(Span s);

// A library span: records [construction, destruction) when tracing was on
// at construction. Fill the fields through span() only if on().
//
//   trace::ScopedSpan s(trace::Category::kComm);
//   if (s.on()) s.span().name = ...;
class ScopedSpan {
 public:
  explicit ScopedSpan(Category cat) noexcept : on_(On()) {
    if (on_) [[unlikely]] {
      s_.start_ns = NowNs();
      s_.name = "";
      s_.algorithm = nullptr;
      s_.pipeline = nullptr;
      s_.bytes = 0;
      s_.flops = 0;
      s_.step = -1;
      s_.rank = -1;
      s_.kind = static_cast<uint8_t>(cat);
    }
  }
  ~ScopedSpan() {
    if (on_) [[unlikely]] {
      s_.end_ns = NowNs();
      Record(s_);
    }
  }
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;

  bool on() const { return on_; }
  Span& span() { return s_; }

 private:
  bool on_;
  Span s_;
};

// The rank spans of this thread belong to (set when the thread creates a
// world; threads that never did use the process's last world rank).
void SetThreadRank(int rank);
int ThreadRank();

// Called by the engine when this thread creates the world of `rank` out of
// `size`: enables tracing from MC2_TRACE (once per process), names the
// thread "main" unless named, and records the rank's clock offset relative
// to rank 0 (0 on one host: every rank reads the same CLOCK_MONOTONIC).
void OnWorldStart(int rank, int size);
// Called by the engine when the world of `rank` is destroyed (after its
// threads stopped): writes that rank's file if tracing was enabled. Never
// throws (a failure is logged).
void OnWorldEnd(int rank);
// Called by the engine when this process's world spans hosts: its ranks
// are numbered per host (`node_rank` here), the job's are global. From
// then on this process's spans of `node_rank` are recorded as
// `global_rank`'s (of `global_size`), and its file is rank-<global_rank>,
// so that the ranks of different hosts do not write the same file.
void OnNetWorldStart(int node_rank, int global_rank, int global_size);
// Records the clock offset of `rank` (its clock minus rank 0's), for
// engines whose ranks do not share a clock; merge subtracts it.
void SetClockOffset(int rank, int64_t offset_ns);
// The bound of MC2_TRACE_CLOCK_SKEW_NS (a day).
inline constexpr long kMaxClockSkewNs = 86'400'000'000'000L;

// Writes the file of one rank (see Flush()).
void FlushRank(int rank);
// Spans of `rank` refused because its threads' buffers were full.
uint64_t DroppedSpans(int rank);
// The directory of the current or last session ("" if never enabled).
std::string TraceDir();
// Spans recorded since Enable (all ranks if rank < 0), step markers
// included, for tests; tid is filled with each span's thread id.
struct SpanWithThread {
  Span span;
  int64_t tid;
};
std::vector<SpanWithThread> Snapshot(int rank = -1);

}  // namespace mc2::trace

#endif  // MC2_TRACE_RECORDER_H_
