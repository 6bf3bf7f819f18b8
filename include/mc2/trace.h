// mc2/trace.h: timeline tracing of compute and communication.
//
// When tracing is on, every collective records a "comm" span (operation,
// algorithm, bytes) and user code adds its own spans with trace::Scope
// (compute, wait or host work). Spans go to per-thread buffers, lock-free;
// Flush() writes one Chrome Trace Event file per rank,
// DIR/rank-<r>.trace.json, which Perfetto and chrome://tracing load, and
// which `mc2 trace merge|report|plot DIR` analyse (docs/tracing.md).
//
// Tracing is turned on by MC2_TRACE=DIR (read when the first world of the
// process is created) or by Enable(dir). Off, a span costs one relaxed
// atomic load and a branch. The files are written by Flush(), when a world
// is destroyed (that rank's file) and at process exit.
//
// Thread safety: every function may be called from any thread.
#ifndef MC2_TRACE_H_
#define MC2_TRACE_H_

#include <atomic>
#include <cstdint>
#include <string>

namespace mc2::trace {

// What a span's time was spent on. The analysis splits each rank's time
// into compute, communication, their overlap, uncovered communication and
// free time (neither compute nor communication); wait and host spans are
// shown on the timeline but count as free time.
enum class Category : uint8_t {
  kCompute = 0,  // work the communication should hide behind (GEMMs, ...)
  kComm = 1,     // a collective or transfer in progress
  kWait = 2,     // a thread blocked waiting for an operation
  kHost = 3,     // host-side bookkeeping (issuing work, packing, ...)
};
// "compute", "comm", "wait", "host".
const char* CategoryName(Category c);

// Starts recording into `dir` (created if missing). Spans recorded before
// (in an earlier Enable) are dropped from the files. Throws
// mc2::Error(kInvalidArgument) if `dir` cannot be created or written.
void Enable(const std::string& dir);
// Stops recording; what was recorded stays until the next Enable and is
// still written by Flush().
void Disable();
// Whether spans are being recorded now.
bool Enabled();
// Writes DIR/rank-<r>.trace.json for every rank this process has recorded
// (each file holds everything recorded since Enable, so flushing twice is
// harmless). A no-op when tracing was never enabled. Throws
// mc2::Error(kSystem) if a file cannot be written.
void Flush();

// Marks the start of training/inference step `step` on the calling
// thread's rank (and the end of the previous one). `mc2 trace report`
// then breaks the time down per step and judges only the marked steps.
void MarkStep(int64_t step);
// Ends the current step without starting another (otherwise the last step
// ends with the rank's last span).
void EndStep();

// Names the calling thread in the trace ("main", "progress" and "p2p" are
// the library's own). `name` must outlive the process (a literal), or use
// the std::string overload, which copies it once.
void SetThreadName(const char* name);
void SetThreadName(const std::string& name);

namespace internal {
// Read on every span: the single cost of tracing when it is off.
extern std::atomic<bool> g_enabled;
int64_t NowNs();  // steady_clock (CLOCK_MONOTONIC) in nanoseconds
const char* Intern(const std::string& name);
void RecordScope(const char* name, Category cat, int64_t start_ns, uint64_t flops, uint64_t bytes);
}  // namespace internal

// A user span: from construction to destruction, on the calling thread and
// its rank. `name` must outlive the process (a literal or a static string):
// the std::string overload interns it, which takes a lock, so prefer
// literals in hot loops. `flops` and `bytes` are shown in the span's args.
//
//   { mc2::trace::Scope s("matmul", mc2::trace::Category::kCompute, 2 * m * n * k);
//     Gemm(...); }
class Scope {
 public:
  explicit Scope(const char* name, Category cat = Category::kCompute, uint64_t flops = 0,
                 uint64_t bytes = 0) noexcept
      : on_(internal::g_enabled.load(std::memory_order_relaxed)) {
    if (on_) [[unlikely]] {
      name_ = name;
      cat_ = cat;
      flops_ = flops;
      bytes_ = bytes;
      start_ns_ = internal::NowNs();
    }
  }
  Scope(const std::string& name, Category cat = Category::kCompute, uint64_t flops = 0,
        uint64_t bytes = 0)
      : on_(internal::g_enabled.load(std::memory_order_relaxed)) {
    if (on_) [[unlikely]] {
      name_ = internal::Intern(name);
      cat_ = cat;
      flops_ = flops;
      bytes_ = bytes;
      start_ns_ = internal::NowNs();
    }
  }
  ~Scope() {
    if (on_) [[unlikely]]
      internal::RecordScope(name_, cat_, start_ns_, flops_, bytes_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

  void set_flops(uint64_t flops) { flops_ = flops; }
  void set_bytes(uint64_t bytes) { bytes_ = bytes; }

 private:
  bool on_;
  Category cat_ = Category::kCompute;
  const char* name_ = nullptr;
  int64_t start_ns_ = 0;
  uint64_t flops_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace mc2::trace

#endif  // MC2_TRACE_H_
