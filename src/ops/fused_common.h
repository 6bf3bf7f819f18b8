// Pieces shared by the fused operators' source files (fused_ops.cc,
// batch_matmul_ops.cc, moe_ops.cc): argument checks, the agreement exchange
// every call starts with, the bookkeeping of outstanding communication and
// the completion every operator call ends with.
//
// Thread safety: stateless helpers; a Pending belongs to one operator call
// (one thread).
#ifndef MC2_OPS_FUSED_COMMON_H_
#define MC2_OPS_FUSED_COMMON_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/checked.h"
#include "core/scratch.h"
#include "engine/channel.h"
#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/fused_ops.h"
#include "ops/cost_model.h"
#include "ops/gemm.h"
#include "ops/host_link.h"
#include "trace/recorder.h"

namespace mc2::fused {

[[noreturn]] inline void Fail(ErrorCode code, const char* op, int rank, const std::string& msg) {
  throw Error(code, msg, rank, op);
}

inline std::string Str(uint64_t v) { return std::to_string(v); }

// Chunk j of s of a block of `rows` rows starts at row ChunkLo(rows, j, s);
// chunks differ by at most one row and may be empty.
inline size_t ChunkLo(size_t rows, int j, int s) { return rows * j / s; }

// x mod n in [0, n) for any int x: ring neighbours (rank + i, rank - i).
inline int Mod(int x, int n) { return ((x % n) + n) % n; }

// Trace labels "fused s=4" etc. (span strings outlive the call).
const char* PipelineLabel(Pipeline p, int splits);

// x * y * z into *out; true (and *out unspecified) if it overflows size_t.
inline bool MulOverflows(size_t x, size_t y, size_t z, size_t* out) {
  size_t xy;
  return __builtin_mul_overflow(x, y, &xy) || __builtin_mul_overflow(xy, z, out);
}

// The size of one operand: `what` names it and its shape ("A (m x k)"),
// its bytes are the product of `factors` (the element size last).
struct Extent {
  const char* what;
  std::initializer_list<size_t> factors;
};

// "" if every operand's byte size can be a buffer's (at most
// core::kMaxBufferBytes, the bound every public call checks), else the
// reason naming the first that cannot (reported as kInvalidArgument).
// Checked before any other use of the sizes, so no product below can wrap
// around.
inline std::string SizeChecks(std::initializer_list<Extent> extents) {
  for (const Extent& e : extents) {
    size_t bytes = 1;
    std::string dims;
    bool overflow = false;
    for (size_t f : e.factors) {
      overflow = overflow || __builtin_mul_overflow(bytes, f, &bytes);
      dims += (dims.empty() ? "" : " x ") + std::to_string(f);
    }
    if (overflow) {
      return std::string(e.what) + " is too large: " + dims + " bytes overflows size_t";
    }
    if (bytes > core::kMaxBufferBytes) {
      return std::string(e.what) + " is too large: " + dims + " bytes exceeds the largest " +
             "possible buffer (PTRDIFF_MAX bytes)";
    }
  }
  return {};
}

// A matrix pointer that must not be null: `bad` when it is null and the
// matrix is not empty; `what` names it ("args.a").
struct NullCheck {
  bool bad;
  const char* what;
};

// The checks every operator makes on its own arguments before the exchange:
// "" if fine, else the reason (reported as kInvalidArgument on every rank).
inline std::string LocalChecks(DType dtype, const FusedOptions& o,
                               std::initializer_list<NullCheck> nulls) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return std::string("args.dtype must be f32 or bf16, not ") + DTypeName(dtype);
  }
  if (o.splits < 1 || o.splits > 16) {
    return "splits must be in 1..16, not " + std::to_string(o.splits);
  }
  if (static_cast<unsigned>(o.pipeline) >= kNumPipelines) {
    return "invalid pipeline";
  }
  if (o.gemm_threads < 0) return "gemm_threads must be >= 0";
  for (const NullCheck& n : nulls) {
    if (n.bad) return std::string(n.what) + " is null but its matrix is not empty";
  }
  return {};
}

// All the checks of an operator's own arguments: LocalChecks, with the
// sizes (SizeChecks) checked before the null pointers, so that no size
// product in those can wrap around.
inline std::string ArgChecks(DType dtype, const FusedOptions& o,
                             std::initializer_list<Extent> extents,
                             std::initializer_list<NullCheck> nulls) {
  std::string err = LocalChecks(dtype, o, {});
  if (err.empty()) err = SizeChecks(extents);
  if (err.empty()) err = LocalChecks(dtype, o, nulls);
  return err;
}

// An operator's FLOP count for its trace span, saturated: the shapes of a
// call that does little (empty rows) may still multiply out beyond uint64.
inline uint64_t FlopCount(double flops) {
  return flops >= 18446744073709549568.0 ? UINT64_MAX : static_cast<uint64_t>(flops);
}

// pipeline << 32 | splits, the form the agreement messages carry.
inline uint64_t PackPipelineSplits(const FusedOptions& o) {
  return (uint64_t(static_cast<uint8_t>(o.pipeline)) << 32) |
         uint32_t(std::clamp(o.splits, 0, 1 << 20));
}

// The agreement exchange: all-gathers one fixed-size message per rank (a
// group of one rank exchanges nothing and runs no collective). If
// any rank's `local_error` is non-empty, every rank throws
// kInvalidArgument (the rank at fault with its own reason, the others
// naming it), so a bad argument on one rank never leaves the others hanging
// in the operator's collectives. The caller then checks the messages
// identically on every rank. `Msg` must be trivially copyable, without
// padding (it is compared and hashed as bytes).
template <typename Msg>
std::vector<Msg> ExchangeArgs(const Group& g, const char* op, const Msg& mine,
                              const std::string& local_error, uint64_t Msg::*error_flag,
                              std::chrono::nanoseconds timeout) {
  if (!g.valid()) throw Error(ErrorCode::kInvalidArgument, "invalid group", -1, op);
  Msg m = mine;
  m.*error_flag = local_error.empty() ? 0 : 1;
  if (!local_error.empty() && g.size() == 1) {
    Fail(ErrorCode::kInvalidArgument, op, g.rank(), local_error);
  }
  // A group of one rank has nobody to agree with: no collective at all.
  if (g.size() == 1) return {m};
  std::vector<Msg> all(g.size());
  CollectiveOptions co;
  co.timeout = timeout;
  AllGather(g, &m, all.data(), sizeof(Msg), DType::kU8, co).Wait();
  if (!local_error.empty()) Fail(ErrorCode::kInvalidArgument, op, g.rank(), local_error);
  for (int r = 0; r < g.size(); ++r) {
    if (all[r].*error_flag) {
      Fail(ErrorCode::kInvalidArgument, op, g.rank(),
           "rank " + std::to_string(r) + " passed invalid arguments (see its error)");
    }
  }
  return all;
}

// Throws kMismatch "<what> differs across ranks: rank 0 has a, rank r has
// b" when some rank's value differs from rank 0's (same text everywhere).
template <typename Msg, typename Get>
void RequireSame(const std::vector<Msg>& all, const char* op, int me, const char* what, Get get) {
  for (size_t r = 1; r < all.size(); ++r) {
    if (get(all[r]) != get(all[0])) {
      Fail(ErrorCode::kMismatch, op, me,
           std::string(what) + " differs across ranks: rank 0 has " + Str(get(all[0])) + ", rank " +
               std::to_string(r) + " has " + Str(get(all[r])));
    }
  }
}

// What every operator's plan holds besides its shapes: who runs it, the
// element type, the pipeline that runs and how its GEMMs and collectives
// are made. Identical on every rank except `rank`.
struct PlanBase {
  int rank = 0, size = 1;
  DType dtype = DType::kF32;
  size_t esize = 4;
  Pipeline pipeline = Pipeline::kSerial;
  int splits = 1;
  GemmOptions gemm;
  // Runs the call's GEMMs (on the calling thread), each B packed at its
  // first product (ops::PackedGemmB): chunks of a few rows run at the
  // full-size rate, and all pipelines and split counts run the same
  // kernels.
  mutable ops::PackedGemmBSet gemms;
  CollectiveOptions coll;
  std::chrono::nanoseconds timeout{};
};

// Checks that every rank asked for the same pipeline and splits and runs
// with the same cost model inputs (`Msg` has the fields pipeline_splits
// and model_hash, ModelHash), so that `auto` decides alike everywhere.
template <typename Msg>
void RequireSameSettings(const std::vector<Msg>& all, const char* op, int me) {
  RequireSame(all, op, me, "pipeline", [](const Msg& m) { return m.pipeline_splits >> 32; });
  RequireSame(all, op, me, "splits", [](const Msg& m) { return m.pipeline_splits & 0xffffffff; });
  RequireSame(all, op, me,
              "cost model inputs (MC2_OPS_TUNING_FILE, MC2_LINK or heap size: `auto` could "
              "choose differently)",
              [](const Msg& m) { return m.model_hash; });
}

inline GemmOptions OperatorGemmOptions(const Group& g, DType dtype, const FusedOptions& o);
inline CollectiveOptions OperatorCollectiveOptions(const Group& g, const FusedOptions& o);

// Completes a plan once its pipeline and splits are chosen (kAuto
// resolved): one split for serial, the GEMM and collective options.
inline void FinishPlan(const Group& g, const FusedOptions& o, PlanBase& p) {
  if (p.pipeline == Pipeline::kSerial) p.splits = 1;
  p.gemm = OperatorGemmOptions(g, p.dtype, o);
  p.gemms = ops::PackedGemmBSet(p.dtype, p.gemm);
  p.coll = OperatorCollectiveOptions(g, o);
  p.timeout = o.timeout.count() > 0 ? o.timeout : g.timeout();
}

// GEMM options of an operator's GEMMs: deterministic mode pins f32 to
// kOneDNN, whose kernels (oneDNN's brgemm, or mc2's tiled one where oneDNN
// has none that is, tiled_gemm.h) give row blocks bitwise the rows of the
// full product.
inline GemmOptions OperatorGemmOptions(const Group& g, DType dtype, const FusedOptions& o) {
  GemmOptions gemm;
  gemm.threads = o.gemm_threads;
  if (g.deterministic() && dtype == DType::kF32) gemm.backend = GemmBackend::kOneDNN;
  return gemm;
}

// Collective options of an operator's collectives: they must run beside the
// GEMMs, however small, so never inline on the caller. Under link emulation
// the direct algorithms declare no payload (they would move data for free,
// docs/link-emulation.md), so the ring, which charges each rank's port with
// what it sends, is used instead: baselines then pay for their bytes like
// the overlapped pipelines.
inline CollectiveOptions OperatorCollectiveOptions(const Group& g, const FusedOptions& o) {
  CollectiveOptions co;
  co.timeout = o.timeout;
  co.may_run_inline = false;
  if (internal::Channel::Of(g).link().emulated()) co.algorithm = Algorithm::kRing;
  return co;
}

// The cost model's view of this group: its link (emulated on one host,
// measured between hosts: ops/host_link.h) and heap size. Its hash goes
// into every agreement message, so that ranks with different settings fail
// with kMismatch instead of choosing different pipelines. Collective on a
// group that spans hosts (its first call measures the link).
inline ops::Environment ModelEnvironment(const Group& g, std::chrono::nanoseconds timeout) {
  const internal::Channel& ch = internal::Channel::Of(g);
  const internal::LinkInfo link = ch.HostOf().empty() ? ch.link() : HostLink(g, timeout);
  ops::Environment env;
  env.link_bytes_per_second = link.bytes_per_second;
  env.link_latency_s = link.latency_seconds;
  env.heap_bytes = ch.heap_bytes();
  return env;
}

// The hash of everything `auto` depends on besides the shapes: the cost
// model's parameters and its environment.
inline uint64_t ModelHash(const ops::Environment& env) {
  return ops::LoadedCostParams().Hash() ^ (env.Hash() * 0x9e3779b97f4a7c15ull);
}

// A call's scratch buffer, not zeroed (every byte an operator reads from
// it is written first), from the thread's block cache (core/scratch.h).
template <typename T>
using Scratch = core::Scratch<T>;

// Outstanding works of a call: on failure every one is waited for (errors
// ignored) before the buffers they use go away.
class Pending {
 public:
  void Add(Work w) { works_.push_back(std::move(w)); }
  Work& operator[](size_t i) { return works_[i]; }
  size_t size() const { return works_.size(); }
  void WaitAll() {
    for (auto& w : works_) w.Wait();
  }
  void Drain() noexcept {
    for (auto& w : works_) {
      try {
        w.Wait();
      } catch (...) {
      }
    }
  }

 private:
  std::vector<Work> works_;
};

// A call's FusedOptions::overlap_work, run at most once: by the pipeline
// where it would first block on a transfer (so the work runs under it, as
// fused_ops.cc's RunOverlapWork does), else by CompleteOp after the body
// (serial, or nothing ever blocked). Belongs to one call (one thread); the
// function it refers to must outlive it.
class OverlapWork {
 public:
  explicit OverlapWork(const std::function<void()>& work) : work_(work) {}
  void Run() {
    if (done_ || !work_) return;
    done_ = true;
    work_();
  }
  // Runs the work unless `w` already completed: a wait that would not
  // block has nothing to hide it under.
  void RunBefore(Work& w) {
    if (!done_ && work_ && !w.Test()) Run();
  }

 private:
  const std::function<void()>& work_;
  bool done_ = false;
};

// Called with the exception of a call that failed: unless every rank
// raises it alike before any data moves (bad arguments, mismatches, a
// workspace that does not fit the heap), aborts the world, so that the
// peers waiting for this rank's transfers fail now, not at their timeout
// (an exception from an activation or FusedOptions::overlap_work, a GEMM
// that throws, a transfer that failed).
inline void AbortUnlessAgreed(const Group& g, std::exception_ptr failure) {
  if (!g.valid()) return;
  const internal::Channel& ch = internal::Channel::Of(g);
  try {
    std::rethrow_exception(failure);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidArgument && e.code() != ErrorCode::kMismatch &&
        e.code() != ErrorCode::kShmExhausted)
      ch.Abort(e);
  } catch (const std::exception& e) {
    ch.Abort(Error(ErrorCode::kInternal, std::string("fused operator failed: ") + e.what()));
  } catch (...) {
    ch.Abort(Error(ErrorCode::kInternal, "fused operator failed"));
  }
}

// Runs `body(pending)`, then the caller's FusedOptions::overlap_work if the
// body did not run it (`overlap.Run()` where it first blocked), and returns
// what ran; a failure is rethrown once every outstanding communication
// finished (the world aborted as AbortUnlessAgreed says).
// The call is traced as one kHost span named `op` with its `flops`.
template <typename Body>
FusedReport CompleteOp(const Group& g, const char* op, Pipeline pipeline, int splits,
                       uint64_t flops, OverlapWork& overlap, Body&& body) {
  trace::ScopedSpan span(trace::Category::kHost);
  if (span.on()) {
    span.span().name = op;
    span.span().pipeline = PipelineLabel(pipeline, splits);
    span.span().flops = flops;
  }
  Pending pend;
  try {
    body(pend);
    overlap.Run();
  } catch (...) {
    std::exception_ptr failure = std::current_exception();
    AbortUnlessAgreed(g, failure);
    pend.Drain();
    std::rethrow_exception(failure);
  }
  return FusedReport{pipeline, splits};
}

// A span of an operator's own work on the calling thread (GEMMs: kCompute
// with their flops; packing: kHost; waiting for a transfer: kWait), tagged
// with the pipeline that runs, as the tracing docs promise for operators.
class OpSpan {
 public:
  OpSpan(const char* name, trace::Category cat, Pipeline p, uint64_t flops = 0,
         uint64_t bytes = 0) noexcept
      : s_(cat) {
    if (s_.on()) [[unlikely]] {
      s_.span().name = name;
      s_.span().pipeline = PipelineName(p);
      s_.span().flops = flops;
      s_.span().bytes = bytes;
    }
  }

 private:
  trace::ScopedSpan s_;
};

}  // namespace mc2::fused

#endif  // MC2_OPS_FUSED_COMMON_H_
