// Pieces shared by the fused operators' source files (fused_ops.cc,
// batch_matmul_ops.cc, moe_ops.cc): argument checks, the agreement exchange
// every call starts with, the bookkeeping of outstanding communication and
// the completed Work an operator returns.
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

#include "core/env.h"
#include "core/scratch.h"
#include "engine/group_impl.h"
#include "engine/work_state.h"
#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/ops.h"
#include "trace/recorder.h"
#include "transport/link_emulation.h"

namespace mc2::fused {

[[noreturn]] inline void Fail(ErrorCode code, const char* op, int rank, const std::string& msg) {
  throw Error(code, msg, rank, op);
}

inline std::string Str(uint64_t v) { return std::to_string(v); }

// Chunk j of s of a block of `rows` rows starts at row ChunkLo(rows, j, s);
// chunks differ by at most one row and may be empty.
inline size_t ChunkLo(size_t rows, int j, int s) { return rows * j / s; }

// The checks every operator makes on its own arguments before the exchange:
// "" if fine, else the reason (reported as kInvalidArgument on every rank).
inline std::string LocalChecks(DType dtype, const FusedOptions& o,
                               std::initializer_list<bool> nulls) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return std::string("dtype must be f32 or bf16, not ") + DTypeName(dtype);
  }
  if (o.splits < 1 || o.splits > 16) {
    return "splits must be in 1..16, not " + std::to_string(o.splits);
  }
  if (static_cast<unsigned>(o.pipeline) >= kNumPipelines) {
    return "invalid pipeline";
  }
  if (o.gemm_threads < 0) return "gemm_threads must be >= 0";
  for (bool bad : nulls) {
    if (bad) return "a null pointer was passed for a non-empty matrix";
  }
  return {};
}

// pipeline << 32 | splits, the form the agreement messages carry.
inline uint64_t PackPipelineSplits(const FusedOptions& o) {
  return (uint64_t(static_cast<uint8_t>(o.pipeline)) << 32) |
         uint32_t(std::clamp(o.splits, 0, 1 << 20));
}

// The agreement exchange: all-gathers one fixed-size message per rank. If
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

// GEMM options of an operator's GEMMs: deterministic mode pins f32 to
// oneDNN, whose row blocks are bitwise the rows of the full product.
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
// what it sends, is used instead (as fused_ops.cc does): baselines then pay
// for their bytes like the overlapped pipelines.
inline CollectiveOptions OperatorCollectiveOptions(const Group& g, const FusedOptions& o) {
  CollectiveOptions co;
  co.timeout = o.timeout;
  co.may_run_inline = false;
  if (g.impl()->tx().link() != nullptr) co.algorithm = Algorithm::kRing;
  return co;
}

// The emulated link's bandwidth in bytes/s, 0 without emulation. Operators
// that decide `auto` from it put it in their agreement message, so that
// ranks with different settings fail with kMismatch instead of choosing
// different pipelines.
inline uint64_t LinkBytesPerSecond(const Group& g) {
  transport::LinkModel* port = g.impl()->tx().link();
  return port ? static_cast<uint64_t>(port->config().bytes_per_second) : 0;
}

// `auto` for the operators the measured cost model (cost_model.h) does not
// cover yet: whether a 4-chunk pipeline (AllGatherBatchMatmul: chunked;
// MoE: fused) is expected to beat serial. It
// hides at most 3/4 of the smaller of compute (flops at ~100 GF/s f32,
// ~200 GF/s bf16 per core, shared when ranks outnumber cores) and
// communication (the busiest port's bytes at the link's bandwidth, or
// ~4 GB/s of shared-memory copies), and costs ~5% GEMM efficiency (more,
// smaller GEMMs) and ~30 us per chunk and peer. The same inputs on every
// rank give the same answer everywhere.
inline bool OverlapPays(double flops_per_rank, DType dtype, double port_bytes, uint64_t link_bw,
                        int ranks) {
  if (ranks <= 1) return false;
  const double cores = core::HostCpus();
  const double rate = (dtype == DType::kBF16 ? 2e11 : 1e11) * std::min(1.0, cores / ranks);
  const double tc = flops_per_rank / rate;
  const double tm = port_bytes / (link_bw > 0 ? double(link_bw) : 4e9);
  const double saving = 0.75 * std::min(tc, tm);
  const double cost = 0.05 * tc + 4 * (ranks - 1) * 30e-6;
  return saving > cost;
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
  try {
    std::rethrow_exception(failure);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidArgument && e.code() != ErrorCode::kMismatch &&
        e.code() != ErrorCode::kShmExhausted)
      g.impl()->tx().Abort(e);
  } catch (const std::exception& e) {
    g.impl()->tx().Abort(
        Error(ErrorCode::kInternal, std::string("fused operator failed: ") + e.what()));
  } catch (...) {
    g.impl()->tx().Abort(Error(ErrorCode::kInternal, "fused operator failed"));
  }
}

// Runs `body(pending)`, then the caller's FusedOptions::overlap_work if the
// body did not run it (`overlap.Run()` where it first blocked), and returns
// a completed Work carrying the pipeline name, or the failure (the world
// aborted as AbortUnlessAgreed says, after every outstanding communication
// finished).
template <typename Body>
Work CompleteOp(const Group& g, const char* op, Pipeline pipeline, int splits,
                FusedReport* report, OverlapWork& overlap, Body&& body) {
  if (report) {
    report->pipeline = pipeline;
    report->splits = splits;
  }
  auto state = std::make_shared<internal::WorkState>(0, op);
  state->SetAlgorithm(PipelineName(pipeline));
  Pending pend;
  try {
    body(pend);
    overlap.Run();
    state->Complete();
  } catch (...) {
    AbortUnlessAgreed(g, std::current_exception());
    pend.Drain();
    state->Fail(std::current_exception());
  }
  return Work(state);
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
