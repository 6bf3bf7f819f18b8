#include "trace/recorder.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "core/env.h"
#include "core/log.h"
#include "mc2/error.h"
#include "mc2/trace_file.h"

namespace mc2::trace {

namespace internal {
std::atomic<bool> g_enabled{false};
// MC2_TRACE_CLOCK_SKEW_NS, read at the first world's start: added to this
// process's trace clock, so that a test on one machine can give its ranks
// clocks as far apart as separate machines' and check that the traces are
// aligned all the same.
std::atomic<int64_t> g_clock_skew_ns{0};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
             .count() +
         g_clock_skew_ns.load(std::memory_order_relaxed);
}
}  // namespace internal

namespace {

struct ThreadBuffer {
  int64_t tid = 0;
  std::atomic<const char*> name{nullptr};
  std::atomic<int> last_rank{-1};
  std::atomic<size_t> count{0};      // spans written; release-published
  std::atomic<uint64_t> dropped{0};  // spans refused because the buffer is full
  size_t base = 0;                   // guarded by Registry::mu
  std::atomic<Span*> chunks[kMaxChunks] = {};
};

struct RankMeta {
  int world_size = 0;
  int64_t clock_offset_ns = 0;
};

// Process-wide state. Leaked on purpose: threads and atexit handlers may
// still use it while static objects are being destroyed.
struct Registry {
  std::mutex mu;
  std::vector<ThreadBuffer*> buffers;   // never freed
  std::string dir;                      // of the current or last session
  std::set<std::string> interned;       // node-based: c_str() stays valid
  std::map<int, RankMeta> ranks;        // ranks whose world started here
  std::map<int, uint64_t> flushed_gen;  // rank -> generation last written
  bool atexit_registered = false;
};

Registry& Reg() {
  static Registry* r = new Registry;
  return *r;
}

thread_local ThreadBuffer* t_buf = nullptr;
thread_local const char* t_name = nullptr;
thread_local int t_rank = -1;
std::atomic<int> g_process_rank{0};
// OnNetWorldStart: spans of rank g_remap_from are rank g_remap_to's
// (g_remap_from < 0: none).
std::atomic<int> g_remap_from{-1};
std::atomic<int> g_remap_to{-1};

int Remap(int rank) {
  const int from = g_remap_from.load(std::memory_order_acquire);
  return from >= 0 && rank == from ? g_remap_to.load(std::memory_order_relaxed) : rank;
}

// Current step per rank, stored as step + 1 so that zero means "none".
constexpr int kStepSlots = 1024;
std::atomic<int64_t> g_steps[kStepSlots];

int64_t CurrentStep(int rank) {
  if (rank < 0 || rank >= kStepSlots) return -1;
  return g_steps[rank].load(std::memory_order_relaxed) - 1;
}

// A chunk with its pages already mapped: one system call instead of a page
// fault every 57 spans, which would double the cost of a span.
Span* NewChunk(size_t spans) {
  void* p = ::mmap(nullptr, spans * sizeof(Span), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) return new Span[spans];
  return static_cast<Span*>(p);
}

ThreadBuffer* RegisterThread() {
  auto* b = new ThreadBuffer;
  b->tid = static_cast<int64_t>(::syscall(SYS_gettid));
  b->name.store(t_name, std::memory_order_relaxed);
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  r.buffers.push_back(b);
  t_buf = b;
  return b;
}

// Sum of every buffer's count: changes whenever anything is recorded.
uint64_t Generation(const Registry& r) {
  uint64_t g = 0;
  for (const ThreadBuffer* b : r.buffers)
    g += b->count.load(std::memory_order_acquire) + b->dropped.load(std::memory_order_relaxed);
  return g;
}

template <typename F>
void ForEachSpan(const Registry& r, F&& f) {
  for (const ThreadBuffer* b : r.buffers) {
    size_t n = b->count.load(std::memory_order_acquire);
    for (size_t i = b->base; i < n; ++i) {
      size_t k, j;
      ChunkOf(i, &k, &j);
      const Span* c = b->chunks[k].load(std::memory_order_acquire);
      f(*b, c[j]);
    }
  }
}

std::string Str(const char* s) { return s ? std::string(s) : std::string(); }

// Requires r.mu.
void FlushRankLocked(Registry& r, int rank) {
  if (r.dir.empty()) return;
  uint64_t gen = Generation(r);
  auto it = r.flushed_gen.find(rank);
  if (it != r.flushed_gen.end() && it->second == gen) return;
  TraceData t;
  RankInfo& info = t.ranks[rank];
  if (auto m = r.ranks.find(rank); m != r.ranks.end()) {
    info.world_size = m->second.world_size;
    info.clock_offset_ns = m->second.clock_offset_ns;
  }
  for (const ThreadBuffer* b : r.buffers)
    if (b->last_rank.load(std::memory_order_relaxed) == rank)
      info.dropped += b->dropped.load(std::memory_order_relaxed);
  // Remap: spans recorded before the world spanned hosts.
  ForEachSpan(r, [&](const ThreadBuffer& b, const Span& s) {
    if (Remap(s.rank) != rank) return;
    if (!info.threads.count(b.tid)) {
      const char* n = b.name.load(std::memory_order_relaxed);
      info.threads[b.tid] = n ? std::string(n) : fmt::format("thread {}", b.tid);
    }
    if (s.kind == kStepBegin || s.kind == kStepEnd) {
      t.marks.push_back(
          StepMark{rank, b.tid, s.start_ns, s.kind == kStepEnd ? -1 : s.step, s.kind == kStepEnd});
      return;
    }
    SpanRecord sr;
    sr.rank = rank;
    sr.tid = b.tid;
    sr.cat = static_cast<Category>(s.kind);
    sr.name = Str(s.name);
    sr.algorithm = Str(s.algorithm);
    sr.pipeline = Str(s.pipeline);
    sr.bytes = s.bytes;
    sr.flops = s.flops;
    sr.start_ns = s.start_ns;
    sr.end_ns = s.end_ns;
    sr.step = s.step;
    t.spans.push_back(std::move(sr));
  });
  WriteChromeTrace(r.dir + "/" + RankFileName(rank), t);
  r.flushed_gen[rank] = gen;
}

void FlushAtExit() {
  try {
    // A directory removed since (by a test, say) is no reason for noise.
    std::error_code ec;
    if (!std::filesystem::is_directory(TraceDir(), ec)) return;
    Flush();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[mc2] writing the trace at exit failed: %s\n", e.what());
  }
}

}  // namespace

const char* CategoryName(Category c) {
  switch (c) {
    case Category::kCompute:
      return "compute";
    case Category::kComm:
      return "comm";
    case Category::kWait:
      return "wait";
    case Category::kHost:
      return "host";
  }
  return "host";
}

void Record(Span s) {
  if (s.rank < 0) s.rank = ThreadRank();
  if (s.kind < kStepBegin) s.step = CurrentStep(s.rank);
  s.rank = Remap(s.rank);
  ThreadBuffer* b = t_buf ? t_buf : RegisterThread();
  if (b->last_rank.load(std::memory_order_relaxed) != s.rank)
    b->last_rank.store(s.rank, std::memory_order_relaxed);
  size_t n = b->count.load(std::memory_order_relaxed);
  if (n >= kMaxSpansPerThread) [[unlikely]] {
    b->dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  size_t k, i;
  ChunkOf(n, &k, &i);
  Span* c = b->chunks[k].load(std::memory_order_relaxed);
  if (c == nullptr) [[unlikely]] {
    c = NewChunk(kFirstChunkSpans << k);
    b->chunks[k].store(c, std::memory_order_release);
  }
  c[i] = s;
  b->count.store(n + 1, std::memory_order_release);
}

void Enable(const std::string& dir) {
  core::CheckWritableDirectory(dir, "trace::Enable");
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  r.dir = dir;
  for (ThreadBuffer* b : r.buffers) b->base = b->count.load(std::memory_order_acquire);
  r.flushed_gen.clear();
  if (!r.atexit_registered) {
    r.atexit_registered = true;
    std::atexit(FlushAtExit);
  }
  internal::g_enabled.store(true, std::memory_order_release);
}

void Disable() { internal::g_enabled.store(false, std::memory_order_release); }

bool Enabled() { return On(); }

void Flush() {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.dir.empty()) return;
  std::set<int> ranks;
  for (const auto& [rank, meta] : r.ranks) ranks.insert(rank);
  ForEachSpan(r, [&](const ThreadBuffer&, const Span& s) { ranks.insert(Remap(s.rank)); });
  for (int rank : ranks) FlushRankLocked(r, rank);
}

void FlushRank(int rank) {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  FlushRankLocked(r, rank);
}

uint64_t DroppedSpans(int rank) {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  uint64_t n = 0;
  for (const ThreadBuffer* b : r.buffers)
    if (b->last_rank.load(std::memory_order_relaxed) == rank)
      n += b->dropped.load(std::memory_order_relaxed);
  return n;
}

std::string TraceDir() {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.dir;
}

void MarkStep(int64_t step) {
  int rank = ThreadRank();
  if (rank >= 0 && rank < kStepSlots) g_steps[rank].store(step + 1, std::memory_order_relaxed);
  if (!On()) return;
  int64_t now = NowNs();
  Record(Span{now, now, "step", nullptr, nullptr, 0, 0, step, rank, kStepBegin});
}

void EndStep() {
  int rank = ThreadRank();
  if (rank >= 0 && rank < kStepSlots) g_steps[rank].store(0, std::memory_order_relaxed);
  if (!On()) return;
  int64_t now = NowNs();
  Record(Span{now, now, "step end", nullptr, nullptr, 0, 0, -1, rank, kStepEnd});
}

void SetThreadName(const char* name) {
  t_name = name;
  if (t_buf) t_buf->name.store(name, std::memory_order_relaxed);
}

void SetThreadName(const std::string& name) { SetThreadName(internal::Intern(name)); }

void SetThreadRank(int rank) { t_rank = rank; }

int ThreadRank() { return t_rank >= 0 ? t_rank : g_process_rank.load(std::memory_order_relaxed); }

void OnWorldStart(int rank, int size) {
  static std::once_flag env_once;
  std::call_once(env_once, [] {
    internal::g_clock_skew_ns.store(
        core::EnvInt("MC2_TRACE_CLOCK_SKEW_NS", 0, -kMaxClockSkewNs, kMaxClockSkewNs),
        std::memory_order_relaxed);
    if (auto dir = core::GetEnv("MC2_TRACE")) Enable(*dir);
  });
  SetThreadRank(rank);
  g_process_rank.store(rank, std::memory_order_relaxed);
  if (t_name == nullptr) SetThreadName("main");
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  // Every rank of a world on one host reads the same CLOCK_MONOTONIC, so the
  // offset to rank 0 is exactly zero; a world across hosts measures it and
  // calls SetClockOffset. It is stored in every file, and merge applies it.
  RankMeta& m = r.ranks[rank];
  m.world_size = size;
  m.clock_offset_ns = 0;
}

void OnNetWorldStart(int node_rank, int global_rank, int global_size) {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  g_remap_to.store(global_rank, std::memory_order_relaxed);
  g_remap_from.store(node_rank, std::memory_order_release);
  r.ranks.erase(node_rank);
  RankMeta& m = r.ranks[global_rank];
  m.world_size = global_size;
  m.clock_offset_ns = 0;
}

void SetClockOffset(int rank, int64_t offset_ns) {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  r.ranks[rank].clock_offset_ns = offset_ns;
  r.flushed_gen.erase(rank);
}

void OnWorldEnd(int rank) {
  try {
    if (!TraceDir().empty()) FlushRank(Remap(rank));
  } catch (const std::exception& e) {
    MC2_LOG(kWarn, "writing the trace of rank {} failed: {}", rank, e.what());
  }
}

std::vector<SpanWithThread> Snapshot(int rank) {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<SpanWithThread> out;
  ForEachSpan(r, [&](const ThreadBuffer& b, const Span& s) {
    if (rank < 0 || Remap(s.rank) == rank) out.push_back({s, b.tid});
  });
  return out;
}

namespace internal {

const char* Intern(const std::string& name) {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.interned.insert(name).first->c_str();
}

void RecordScope(const char* name, Category cat, int64_t start_ns, uint64_t flops, uint64_t bytes) {
  Record(Span{start_ns, NowNs(), name, nullptr, nullptr, bytes, flops, -1, -1,
              static_cast<uint8_t>(cat)});
}

}  // namespace internal
}  // namespace mc2::trace
