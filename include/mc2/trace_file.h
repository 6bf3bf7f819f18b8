// Trace files: the in-memory form of a trace (spans, step markers, per-rank
// metadata) and its Chrome Trace Event JSON encoding.
//
// File format (one per rank, DIR/rank-<r>.trace.json, or one merged file):
//
//   {"displayTimeUnit": "ns",
//    "otherData": {"mc2": {"version": 1, "ranks": [{"rank": 0, "world_size": 2,
//                  "clock_offset_ns": 0, "dropped": 0}, ...]}},
//    "traceEvents": [
//      {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "rank 0"}},
//      {"ph": "M", "name": "thread_name", "pid": 0, "tid": 123, "args": {"name": "main"}},
//      {"ph": "X", "name": "all_reduce", "cat": "comm", "pid": 0, "tid": 124,
//       "ts": 1234.567, "dur": 8.25, "args": {"algorithm": "direct", "bytes": 4096}},
//      {"ph": "i", "name": "step 3", "cat": "step", "s": "p", "pid": 0, "tid": 123,
//       "ts": 1300.0, "args": {"step": 3}}, ...]}
//
// pid is the world rank, tid the OS thread id, ts/dur microseconds of
// CLOCK_MONOTONIC with nanosecond decimals. clock_offset_ns is the rank's
// clock minus rank 0's: Align() subtracts it, so merged traces share rank
// 0's time base.
//
// The library writes these files when tracing is on (<mc2/trace.h>); the
// functions here let programs read, merge and write them. They keep no
// state: any thread may call them. Errors are mc2::Error exceptions.
#ifndef MC2_TRACE_FILE_H_
#define MC2_TRACE_FILE_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "mc2/trace.h"

namespace mc2::trace {

struct SpanRecord {
  int rank = 0;
  int64_t tid = 0;
  Category cat = Category::kCompute;
  std::string name;
  std::string algorithm;  // empty if none
  std::string pipeline;   // empty if none
  uint64_t bytes = 0;
  uint64_t flops = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t step = -1;
};

struct StepMark {
  int rank = 0;
  int64_t tid = 0;
  int64_t t_ns = 0;
  int64_t step = -1;  // the step that begins; -1 for an end marker
  bool end = false;
};

struct RankInfo {
  int world_size = 0;
  int64_t clock_offset_ns = 0;
  uint64_t dropped = 0;
  std::map<int64_t, std::string> threads;  // tid -> name
};

struct TraceData {
  std::vector<SpanRecord> spans;
  std::vector<StepMark> marks;
  std::map<int, RankInfo> ranks;
};

// "rank-<r>.trace.json"
std::string RankFileName(int rank);

// The JSON text of `t` (events sorted by rank, then time).
std::string ToChromeJson(const TraceData& t);
// Writes ToChromeJson(t) to `path` atomically (a temporary file renamed).
// Throws mc2::Error(kSystem) on failure.
void WriteChromeTrace(const std::string& path, const TraceData& t);

// Parses one Chrome trace file (ours or any producer's: unknown events are
// skipped, events need not be sorted). Throws mc2::Error(kInvalidArgument)
// naming the file when it is not a valid trace.
TraceData ReadChromeTrace(const std::string& path);
// The same from the text of a trace; `source` names it in errors.
TraceData ParseChromeTrace(std::string_view text, const std::string& source);
// A directory: every rank-*.trace.json in it, combined; a file: that file.
// Clocks are aligned (Align) unless `align` is false. Throws
// kInvalidArgument when nothing can be read.
TraceData LoadTrace(const std::string& path, bool align = true);
// Moves every rank's events into rank 0's time base and zeroes the offsets.
void Align(TraceData& t);

}  // namespace mc2::trace

#endif  // MC2_TRACE_FILE_H_
