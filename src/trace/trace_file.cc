#include "mc2/trace_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "core/enforce.h"
#include "mc2/error.h"

namespace mc2::trace {
namespace {

using Json = nlohmann::json;
using Sink = std::function<void(std::string_view)>;

void AppendEscaped(fmt::memory_buffer& out, std::string_view s) {
  out.push_back('"');
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        fmt::format_to(std::back_inserter(out), "\\\"");
        break;
      case '\\':
        fmt::format_to(std::back_inserter(out), "\\\\");
        break;
      case '\n':
        fmt::format_to(std::back_inserter(out), "\\n");
        break;
      case '\t':
        fmt::format_to(std::back_inserter(out), "\\t");
        break;
      case '\r':
        fmt::format_to(std::back_inserter(out), "\\r");
        break;
      default:
        if (c < 0x20)
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", c);
        else
          out.push_back(ch);
    }
  }
  out.push_back('"');
}

// Nanoseconds as microseconds with exactly three decimals: no rounding.
void AppendUs(fmt::memory_buffer& out, int64_t ns) {
  uint64_t a = ns < 0 ? static_cast<uint64_t>(-(ns + 1)) + 1 : static_cast<uint64_t>(ns);
  fmt::format_to(std::back_inserter(out), "{}{}.{:03}", ns < 0 ? "-" : "", a / 1000, a % 1000);
}

// Streams the JSON of `t` into `sink` in pieces of about 1 MiB.
void Emit(const TraceData& t, const Sink& sink) {
  fmt::memory_buffer out;
  auto put = [&]<typename... T>(fmt::format_string<T...> f, T&&... args) {
    fmt::format_to(std::back_inserter(out), f, std::forward<T>(args)...);
  };
  auto drain = [&](bool force) {
    if (force || out.size() > (1 << 20)) {
      sink(std::string_view(out.data(), out.size()));
      out.clear();
    }
  };
  put("{{\"displayTimeUnit\": \"ns\",\n \"otherData\": {{\"mc2\": {{\"version\": 1, \"ranks\": [");
  bool first = true;
  for (const auto& [rank, info] : t.ranks) {
    put("{}{{\"rank\": {}, \"world_size\": {}, \"clock_offset_ns\": {}, \"dropped\": {}}}",
        first ? "" : ", ", rank, info.world_size, info.clock_offset_ns, info.dropped);
    first = false;
  }
  put("]}}}},\n \"traceEvents\": [\n");
  first = true;
  auto sep = [&] {
    if (!first) put(",\n");
    first = false;
  };
  for (const auto& [rank, info] : t.ranks) {
    sep();
    put("{{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": {}, \"tid\": 0, \"args\": "
        "{{\"name\": \"rank {}\"}}}}",
        rank, rank);
    sep();
    put("{{\"ph\": \"M\", \"name\": \"process_sort_index\", \"pid\": {}, \"tid\": 0, \"args\": "
        "{{\"sort_index\": {}}}}}",
        rank, rank);
    int order = 0;
    for (const auto& [tid, name] : info.threads) {
      sep();
      put("{{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": {}, \"tid\": {}, \"args\": "
          "{{\"name\": ",
          rank, tid);
      AppendEscaped(out, name);
      put("}}}}");
      // Keep "main" on top, then the library's threads, then the rest.
      int sort = name == "main" ? 0 : name == "progress" ? 1 : name == "p2p" ? 2 : 3 + order++;
      sep();
      put("{{\"ph\": \"M\", \"name\": \"thread_sort_index\", \"pid\": {}, \"tid\": {}, "
          "\"args\": {{\"sort_index\": {}}}}}",
          rank, tid, sort);
    }
  }
  std::vector<const SpanRecord*> spans;
  spans.reserve(t.spans.size());
  for (const auto& s : t.spans) spans.push_back(&s);
  std::stable_sort(spans.begin(), spans.end(), [](const SpanRecord* a, const SpanRecord* b) {
    return std::tie(a->rank, a->start_ns) < std::tie(b->rank, b->start_ns);
  });
  for (const SpanRecord* s : spans) {
    sep();
    put("{{\"ph\": \"X\", \"name\": ");
    AppendEscaped(out, s->name);
    put(", \"cat\": \"{}\", \"pid\": {}, \"tid\": {}, \"ts\": ", CategoryName(s->cat), s->rank,
        s->tid);
    AppendUs(out, s->start_ns);
    put(", \"dur\": ");
    AppendUs(out, std::max<int64_t>(0, s->end_ns - s->start_ns));
    put(", \"args\": {{");
    bool a = false;
    auto comma = [&] {
      if (a) put(", ");
      a = true;
    };
    if (!s->algorithm.empty()) {
      comma();
      put("\"algorithm\": ");
      AppendEscaped(out, s->algorithm);
    }
    if (!s->pipeline.empty()) {
      comma();
      put("\"pipeline\": ");
      AppendEscaped(out, s->pipeline);
    }
    if (s->bytes || s->cat == Category::kComm) {
      comma();
      put("\"bytes\": {}", s->bytes);
    }
    if (s->flops) {
      comma();
      put("\"flops\": {}", s->flops);
    }
    if (s->step >= 0) {
      comma();
      put("\"step\": {}", s->step);
    }
    put("}}}}");
    drain(false);
  }
  std::vector<const StepMark*> marks;
  for (const auto& m : t.marks) marks.push_back(&m);
  std::stable_sort(marks.begin(), marks.end(), [](const StepMark* a, const StepMark* b) {
    return std::tie(a->rank, a->t_ns) < std::tie(b->rank, b->t_ns);
  });
  for (const StepMark* m : marks) {
    sep();
    if (m->end)
      put("{{\"ph\": \"i\", \"name\": \"step end\", \"cat\": \"step\", \"s\": \"p\", "
          "\"pid\": {}, \"tid\": {}, \"ts\": ",
          m->rank, m->tid);
    else
      put("{{\"ph\": \"i\", \"name\": \"step {}\", \"cat\": \"step\", \"s\": \"p\", "
          "\"pid\": {}, \"tid\": {}, \"ts\": ",
          m->step, m->rank, m->tid);
    AppendUs(out, m->t_ns);
    if (m->end)
      put(", \"args\": {{}}}}");
    else
      put(", \"args\": {{\"step\": {}}}}}", m->step);
  }
  put("\n]}}\n");
  drain(true);
}

[[noreturn]] void Malformed(const std::string& path, const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("{} is not a valid Chrome trace: {}", path, why));
}

// Times (ts, dur, clock offsets) are kept within +-2^53 ns (about 104
// days, far beyond any CLOCK_MONOTONIC reading), so that everything done
// with them later -- end = ts + dur, aligning clocks, summing intervals in
// the analysis -- stays far from int64 overflow, whatever a file says.
constexpr double kMaxAbsNs = 9007199254740992.0;  // 2^53

int64_t Ns(const Json& v, const std::string& path, size_t i, const char* field) {
  if (!v.is_number()) Malformed(path, fmt::format("event {}: \"{}\" is not a number", i, field));
  const double ns = v.get<double>() * 1000.0;
  if (!(std::fabs(ns) < kMaxAbsNs))
    Malformed(path, fmt::format("event {}: \"{}\" is out of range (at most 2^53 ns in magnitude)",
                                i, field));
  return static_cast<int64_t>(std::llround(ns));
}

// An optional integer field of the per-rank metadata: `dflt` when absent,
// an error naming it when it is not an integer in [lo, hi].
int64_t RankField(const Json& r, const char* key, int64_t dflt, int64_t lo, int64_t hi,
                  const std::string& path) {
  auto it = r.find(key);
  if (it == r.end()) return dflt;
  if (it->is_number_unsigned() && it->get<uint64_t>() <= static_cast<uint64_t>(hi))
    return static_cast<int64_t>(it->get<uint64_t>());
  if (it->is_number_integer() && !it->is_number_unsigned() && it->get<int64_t>() >= lo &&
      it->get<int64_t>() <= hi)
    return it->get<int64_t>();
  Malformed(path, fmt::format("otherData.mc2.ranks: \"{}\" is {}, expected an integer in [{}, {}]",
                              key, it->dump(), lo, hi));
}

Category ParseCategory(const std::string& cat) {
  if (cat == "compute") return Category::kCompute;
  if (cat == "comm") return Category::kComm;
  if (cat == "wait") return Category::kWait;
  return Category::kHost;
}

uint64_t U64(const Json& args, const char* key) {
  auto it = args.find(key);
  if (it == args.end() || !it->is_number()) return 0;
  if (it->is_number_unsigned()) return it->get<uint64_t>();
  if (it->is_number_integer())
    return static_cast<uint64_t>(std::max<int64_t>(0, it->get<int64_t>()));
  // A double outside [0, 2^64) (or NaN) has no uint64 value: converting it
  // is undefined behaviour (found by the trace file fuzzer with 4e96).
  const double d = it->get<double>();
  if (!(d > 0)) return 0;
  if (d >= 18446744073709551616.0) return UINT64_MAX;
  return static_cast<uint64_t>(d);
}

std::string Text(const Json& args, const char* key) {
  auto it = args.find(key);
  return it != args.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

std::string RankFileName(int rank) { return fmt::format("rank-{}.trace.json", rank); }

std::string ToChromeJson(const TraceData& t) {
  std::string s;
  Emit(t, [&](std::string_view piece) { s.append(piece); });
  return s;
}

void WriteChromeTrace(const std::string& path, const TraceData& t) {
  std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) core::ThrowSystem(fmt::format("cannot create trace file {}", tmp), errno);
  bool ok = true;
  Emit(t, [&](std::string_view piece) {
    ok = ok && std::fwrite(piece.data(), 1, piece.size(), f) == piece.size();
  });
  int err = errno;
  if (std::fclose(f) != 0) ok = false;
  if (!ok) {
    std::remove(tmp.c_str());
    core::ThrowSystem(fmt::format("cannot write trace file {}", tmp), err ? err : EIO);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    std::remove(tmp.c_str());
    core::ThrowSystem(fmt::format("cannot rename {} to {}", tmp, path), err);
  }
}

TraceData ReadChromeTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::kInvalidArgument, fmt::format("cannot open trace file {}", path));
  std::stringstream text;
  text << in.rdbuf();
  return ParseChromeTrace(text.str(), path);
}

TraceData ParseChromeTrace(std::string_view text, const std::string& path) {
  Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) Malformed(path, "not JSON");
  const Json* events = nullptr;
  if (doc.is_array())
    events = &doc;  // the "JSON array" form of the format
  else if (doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array())
    events = &doc["traceEvents"];
  else
    Malformed(path, "expected an object with a \"traceEvents\" array, or an array");

  TraceData t;
  if (doc.is_object()) {
    const Json& other = doc.value("otherData", Json::object());
    if (other.is_object() && other.contains("mc2") && other["mc2"].is_object()) {
      for (const Json& r : other["mc2"].value("ranks", Json::array())) {
        if (!r.is_object() || !r.contains("rank") || !r["rank"].is_number_integer()) continue;
        RankInfo& info = t.ranks[r["rank"].get<int>()];
        // Checked, not r.value(...): a field of another type would throw a
        // JSON type_error (not an mc2::Error) out of `mc2 trace`.
        constexpr int64_t kMaxAbs = int64_t{1} << 53;
        info.world_size = static_cast<int>(RankField(r, "world_size", 0, 0, 1 << 20, path));
        info.clock_offset_ns = RankField(r, "clock_offset_ns", 0, -kMaxAbs, kMaxAbs, path);
        info.dropped = static_cast<uint64_t>(
            RankField(r, "dropped", 0, 0, std::numeric_limits<int64_t>::max(), path));
      }
    }
  }
  for (size_t i = 0; i < events->size(); ++i) {
    const Json& e = (*events)[i];
    if (!e.is_object()) Malformed(path, fmt::format("event {} is not an object", i));
    if (!e.contains("ph") || !e["ph"].is_string())
      Malformed(path, fmt::format("event {} has no \"ph\" string", i));
    std::string ph = e["ph"].get<std::string>();
    if (ph != "X" && ph != "i" && ph != "I" && ph != "M") continue;  // not ours: skipped
    if (!e.contains("pid") || !e["pid"].is_number_integer())
      Malformed(path, fmt::format("event {} has no integer \"pid\"", i));
    int pid = e["pid"].get<int>();
    int64_t tid = e.contains("tid") && e["tid"].is_number_integer() ? e["tid"].get<int64_t>() : 0;
    const Json& args = e.contains("args") && e["args"].is_object() ? e["args"] : Json::object();
    if (!e.contains("name") || !e["name"].is_string())
      Malformed(path, fmt::format("event {} has no \"name\" string", i));
    std::string name = e["name"].get<std::string>();
    if (ph == "M") {
      if (name == "thread_name")
        t.ranks[pid].threads[tid] = Text(args, "name");
      else
        t.ranks[pid];
      continue;
    }
    if (!e.contains("ts")) Malformed(path, fmt::format("event {} has no \"ts\"", i));
    int64_t ts = Ns(e["ts"], path, i, "ts");
    std::string cat = e.contains("cat") && e["cat"].is_string() ? e["cat"].get<std::string>() : "";
    if (ph == "X") {
      if (!e.contains("dur")) Malformed(path, fmt::format("event {} (X) has no \"dur\"", i));
      int64_t dur = Ns(e["dur"], path, i, "dur");
      if (dur < 0) Malformed(path, fmt::format("event {} has a negative \"dur\"", i));
      SpanRecord s;
      s.rank = pid;
      s.tid = tid;
      s.cat = ParseCategory(cat);
      s.name = std::move(name);
      s.algorithm = Text(args, "algorithm");
      s.pipeline = Text(args, "pipeline");
      s.bytes = U64(args, "bytes");
      s.flops = U64(args, "flops");
      s.start_ns = ts;
      s.end_ns = ts + dur;
      s.step = args.contains("step") && args["step"].is_number_integer()
                   ? args["step"].get<int64_t>()
                   : -1;
      t.ranks[pid];
      t.spans.push_back(std::move(s));
    } else if (cat == "step") {
      StepMark m;
      m.rank = pid;
      m.tid = tid;
      m.t_ns = ts;
      m.end = !(args.contains("step") && args["step"].is_number_integer());
      m.step = m.end ? -1 : args["step"].get<int64_t>();
      t.ranks[pid];
      t.marks.push_back(m);
    }
  }
  return t;
}

void Align(TraceData& t) {
  for (auto& s : t.spans) {
    int64_t off = t.ranks[s.rank].clock_offset_ns;
    s.start_ns -= off;
    s.end_ns -= off;
  }
  for (auto& m : t.marks) m.t_ns -= t.ranks[m.rank].clock_offset_ns;
  for (auto& [rank, info] : t.ranks) info.clock_offset_ns = 0;
}

TraceData LoadTrace(const std::string& path, bool align) {
  namespace fs = std::filesystem;
  std::error_code ec;
  TraceData all;
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      std::string name = entry.path().filename().string();
      if (name.rfind("rank-", 0) == 0 && name.size() > 16 &&
          name.compare(name.size() - 11, 11, ".trace.json") == 0)
        files.push_back(entry.path());
    }
    if (files.empty())
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("no rank-<r>.trace.json files in {} (was the program run with "
                              "MC2_TRACE={}?)",
                              path, path));
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      TraceData t = ReadChromeTrace(f.string());
      for (auto& [rank, info] : t.ranks) {
        RankInfo& dst = all.ranks[rank];
        if (info.world_size) dst.world_size = info.world_size;
        if (info.clock_offset_ns) dst.clock_offset_ns = info.clock_offset_ns;
        dst.dropped += info.dropped;
        dst.threads.insert(info.threads.begin(), info.threads.end());
      }
      std::move(t.spans.begin(), t.spans.end(), std::back_inserter(all.spans));
      std::move(t.marks.begin(), t.marks.end(), std::back_inserter(all.marks));
    }
  } else {
    all = ReadChromeTrace(path);
  }
  if (align) Align(all);
  return all;
}

}  // namespace mc2::trace
