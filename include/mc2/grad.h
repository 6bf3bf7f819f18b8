// mc2/grad.h: data-parallel gradient synchronisation (GradSync): gradients
// packed into buckets that are all-reduced while backward still runs, with
// optional compression.
//
// Use:
//   GradSync sync(dp_group, {.bucket_cap_bytes = 4 << 20});
//   int w = sync.Register("w", n, DType::kF32);   // every parameter, once
//   sync.Finalize();                               // collective
//   each step:  sync.ZeroGrad();
//               backward writes sync.GradAs<float>(w), then sync.MarkReady(w)
//               sync.Finish();   // the averaged gradients are in the views
//
// Works as follows. Parameters are grouped into buckets of at most
// bucket_cap_bytes (the first bucket at most first_bucket_cap_bytes, so the
// first all-reduce starts early), one dtype and one group per bucket, first
// in reverse registration order (backward visits the parameters roughly in
// reverse). A bucket's storage is one buffer in the symmetric heap of its
// group and each gradient is a view into it, so the all-reduce reads and
// writes it in place, with no copy in or out. When every parameter of a
// bucket is marked ready and every earlier bucket has started, its
// all-reduce starts on the progress thread (asynchronous, never inline):
// buckets start in the same order on every rank, whatever order the
// gradients were marked in. Finish() starts what is left (a parameter not
// marked in a step contributes what its view holds, zero after ZeroGrad),
// waits for everything and leaves the sum or the mean in the views. After
// the first synchronised step the buckets are rebuilt in the order rank 0
// marked its gradients (when rebuild_buckets), so that later steps fill
// them in backward order.
//
// Deterministic mode (on by default): a gradient's result is bitwise the
// one an all-reduce of that tensor alone gives, whatever the bucket cap and
// the bucket it lands in: a reduction is elementwise, and mc2 reduces each
// element over the ranks in one canonical tree order (docs/architecture.md,
// "Deterministic reductions"), independent of its position in the buffer.
// On a group created with deterministic reductions off, GradSync then picks
// an algorithm that follows the canonical order anyway.
//
// Compression (f32 gradients only; docs/grad.md):
// - kF16 / kBF16: each rank rounds its bucket to 16 bits (nearest even);
//   an all-to-all hands rank r the r-th 1/N of every rank's 16-bit bucket,
//   rank r widens them to f32, sums them in f32 in the canonical order
//   (divides by N for the mean), rounds the result to 16 bits once, and an
//   all-gather of those 16-bit results completes the bucket, widened back to
//   f32 in the views. Two roundings per value, half the bytes of f32.
// - kThreshold: only the elements with |g| >= threshold travel, as (index,
//   value) pairs: every rank's pairs are all-gathered and merged in the
//   canonical order, never densified on the wire.
// - kTopK: the ceil(topk_ratio x n) elements of largest magnitude of each
//   parameter of n elements travel as pairs (ties broken by the lower
//   index).
// With error_feedback (kThreshold and kTopK), what a rank did not send is
// kept as its residual and added to its gradient of the next synchronised
// step; sent value + new residual == gradient + old residual, exactly.
// - kAuto: auto_scheme (bf16 by default) when a few measured steps show it
//   makes the step faster than the dense exchange (agreed over the ranks),
//   else no compression (CompressionOptions::auto_*).
//
// Invariants: every rank of the main group registers the same parameters
// (name, count, dtype, group size) in the same order; expert parameters are
// registered by every rank under the same names, each over its own
// expert-parallel group (AddGroup). Finalize checks this and throws
// kMismatch on every rank, naming the first parameter that differs.
// Thread safety: one thread at a time per GradSync, and that thread is the
// one that issues the calls on its groups.
#ifndef MC2_GRAD_H_
#define MC2_GRAD_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mc2/group.h"
#include "mc2/tensor.h"
#include "mc2/work.h"

namespace mc2 {

enum class Compression : uint8_t {
  kNone = 0,
  kF16,        // 16-bit IEEE half on the wire, reduced in f32
  kBF16,       // bfloat16 on the wire, reduced in f32
  kThreshold,  // sparse: |g| >= threshold
  kTopK,       // sparse: the largest topk_ratio of each bucket
  kAuto,       // auto_scheme when measured steps show it pays, else kNone
  kPowerSgd,   // low rank: P and Q of M ~ P Q^T (parameters registered as matrices)
};
// "none", "f16", "bf16", "threshold", "topk", "auto", "powersgd"; Parse is
// the inverse.
const char* CompressionName(Compression c);
std::optional<Compression> ParseCompression(std::string_view name);

struct CompressionOptions {
  Compression scheme = Compression::kNone;
  // kThreshold: elements with |g| < threshold (after error feedback) stay
  // home. The default is the one of the system whose interface this follows.
  float threshold = 1e-6f;
  // kTopK: the fraction of each parameter's elements sent, in (0, 1]; at
  // least one element per parameter.
  double topk_ratio = 0.01;
  // kPowerSgd: the rank r of the approximation M ~ P Q^T of each parameter
  // registered as a rows x cols matrix, >= 1 (the default is PyTorch's
  // PowerSGD hook's). A matrix is compressed at rank min(r, rows, cols) when
  // that moves fewer values than the matrix (r (rows + cols) < rows cols);
  // the other parameters (vectors, small or thin matrices) are all-reduced
  // exactly, in the same exchange.
  int powersgd_rank = 1;
  // kPowerSgd: Q starts from values drawn from this seed and the
  // parameter's id (the same on every rank), then each step starts from the
  // last step's Q (warm start) unless powersgd_warm_start is off.
  uint64_t powersgd_seed = 0;
  bool powersgd_warm_start = true;
  // kThreshold, kTopK and kPowerSgd: keep what was not sent and add it next
  // step.
  bool error_feedback = true;
  // The first warmup_steps synchronised steps are exchanged uncompressed
  // (as Deep Gradient Compression warms up): the early gradients, large and
  // changing fast, are the ones compression hurts most.
  int warmup_steps = 0;
  // kAuto: the lossy scheme measured against the dense all-reduce (kF16,
  // kBF16, kThreshold, kTopK or kPowerSgd, with the options above). After the first
  // synchronised step (and the warm-up steps above), the dense exchange
  // and then auto_scheme each run auto_warmup_steps untimed and auto_steps
  // timed steps (step time as the autotuner measures it, with its clock:
  // AutotuneOptions::clock); the ranks agree on the medians (max over
  // ranks) and keep auto_scheme only when the dense median exceeds
  // auto_min_speedup x its median, else compression is turned off.
  // GradSync::tuning() and a log line (info level) report the choice.
  Compression auto_scheme = Compression::kBF16;
  int auto_warmup_steps = 1;
  int auto_steps = 3;
  double auto_min_speedup = 1.05;
};

// Autotuning of the bucket cap (and, with kThreshold compression, of the
// threshold) from measured steps, as Horovod's autotune does. The
// candidates are every cap x every threshold, tried in that order from the
// second synchronised step on (the first one rebuilds the buckets): each
// for warmup_steps untimed steps, then steps_per_candidate timed ones. A
// step's time is that between the ends of two synchronised Finish calls, so
// it includes backward and the overlap the buckets allow. Then the ranks
// agree with one all-reduce (max: a step is as fast as its slowest rank) of
// each candidate's median step time, and every rank keeps the same, fastest
// candidate (the earlier one on a tie); GradSync::tuning() reports it and a
// log line (info level, MC2_LOG_LEVEL=info) names it. Each switch of the
// layout moves the views (layout_version changes: fetch Grad again); the
// gradients and residuals are carried over, and results stay exact (the
// deterministic guarantee holds for every cap).
struct AutotuneOptions {
  bool enabled = false;
  std::vector<size_t> bucket_caps = {size_t{1} << 20, size_t{4} << 20, size_t{16} << 20,
                                     size_t{25} << 20};
  // kThreshold compression only: thresholds to try (empty: only
  // compression.threshold).
  std::vector<float> thresholds = {};
  int warmup_steps = 1;
  int steps_per_candidate = 3;
  // The time in seconds, read at the end of each synchronised Finish
  // (empty: a steady clock). Tests inject a fake one.
  std::function<double()> clock = {};
};

// What the autotuner and `auto` compression did (GradSync::tuning()).
struct GradSyncTuning {
  bool tuning = false;          // still measuring candidates
  bool decided = false;         // a candidate was chosen (and is in use)
  size_t bucket_cap_bytes = 0;  // the cap in use
  float threshold = 0;          // the threshold in use (kThreshold)
  // Every candidate, and once decided the agreed (max over ranks) median
  // step time of each, in seconds.
  std::vector<size_t> candidate_caps;
  std::vector<float> candidate_thresholds;
  std::vector<double> median_seconds;
  // Compression (filled whether or not autotune is on): the scheme the
  // next step uses (kAuto: kNone while measuring and when compression was
  // turned off, auto_scheme once it was kept).
  Compression compression = Compression::kNone;
  // kAuto only: still measuring; a choice was made; the agreed (max over
  // ranks) median step time of the dense and of the lossy steps, seconds.
  bool compression_deciding = false;
  bool compression_decided = false;
  double dense_step_seconds = 0;
  double lossy_step_seconds = 0;
};

// How a bucket's uncompressed all-reduce runs on a group that spans levels
// (hosts, docs/multi-host.md): the hierarchical algorithm (a reduce-scatter
// inside each host, an all-reduce across hosts, an all-gather inside), the
// flat one (every rank with every other), or whichever is measured faster
// (kAuto: timed on each bucket when its layout is installed, agreed across
// the bucket's group; docs/grad.md). Results are bitwise the same either
// way. Groups on one host have one level: nothing to choose.
enum class BucketAlgorithm : uint8_t { kAuto = 0, kHierarchical, kFlat };

// What a bucket's all-reduce runs (GradSync::reductions()).
struct BucketReduction {
  size_t bytes = 0;
  // "hierarchical" or "flat" on a group that spans levels; otherwise what
  // the all-reduce runs there (e.g. "direct", "rabenseifner"), or "none"
  // for a group of one rank.
  std::string algorithm;
  bool spans_levels = false;
  bool measured = false;  // kAuto timed both (the agreed max over ranks):
  double hierarchical_seconds = 0;
  double flat_seconds = 0;
};

struct GradSyncOptions {
  // Bucket capacity in bytes (a parameter larger than the cap gets a bucket
  // of its own), and the smaller cap of each group's first bucket.
  size_t bucket_cap_bytes = size_t{25} << 20;
  size_t first_bucket_cap_bytes = size_t{1} << 20;
  // Finish leaves the mean over the bucket's group (else the sum).
  bool average = true;
  // Results bitwise equal to one all-reduce per tensor (see above).
  bool deterministic = true;
  // Rebuild the buckets from rank 0's ready order after the first
  // synchronised step (the views move then: fetch them again with Grad).
  bool rebuild_buckets = true;
  CompressionOptions compression = {};
  // Off by default: the caps above are used as given.
  AutotuneOptions autotune = {};
  BucketAlgorithm bucket_algorithm = BucketAlgorithm::kAuto;
  // Buckets of at most fuse_bucket_bytes that can start at the same time
  // (several become ready at one MarkReady, at the tail of backward, or in
  // Finish) and that are all-reduced uncompressed on the same group run as
  // one Batch exchange (mc2/batch.h): one synchronisation instead of one
  // per bucket. Results are those of the separate all-reduces (bitwise in
  // deterministic mode). Off: every bucket is its own all-reduce.
  bool fuse_buckets = true;
  size_t fuse_bucket_bytes = size_t{1} << 20;
};

// What the last synchronised step moved. Bytes are those one rank
// receives with the bandwidth-optimal schedule of each exchange: an
// all-reduce of B bytes over N ranks 2 (N-1)/N B, an all-to-all or an
// all-gather of B bytes per rank (N-1)/N B and (N-1) B.
struct GradSyncStats {
  int buckets = 0;            // exchanged (groups of one rank exchange nothing)
  int fused_exchanges = 0;    // Batch exchanges that ran several buckets' all-reduces
  size_t dense_bytes = 0;     // the uncompressed all-reduce of those buckets
  size_t wire_bytes = 0;      // what the chosen scheme moved instead
  size_t sent_elements = 0;   // elements this rank contributed (sparse: pairs)
  double finish_seconds = 0;  // spent in Finish (waiting and decoding)
  Compression scheme = Compression::kNone;  // what the step used (kNone in warm-up)
};

class GradSync {
 public:
  // `group` is the main group: the data-parallel ranks. Bad options throw
  // kInvalidArgument.
  explicit GradSync(const Group& group, const GradSyncOptions& options = {});
  // Waits for running exchanges (ignoring their failures) and frees the
  // buckets.
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // A further group parameters may be reduced over (e.g. an expert-parallel
  // group); returns its id. Id 0 is the main group. Before Finalize only.
  int AddGroup(const Group& g);
  // Registers a parameter of `count` elements of a float dtype (f32, f64,
  // f16, bf16; compression: f32 only) reduced over group `group`; returns
  // its id (0, 1, ...). Names must be unique. Before Finalize only.
  int Register(std::string name, size_t count, DType dtype, int group = 0);
  // As above, for a parameter that is a rows x cols matrix (row-major,
  // rows x cols elements): kPowerSgd compresses it (see powersgd_rank).
  // rows x cols overflowing throws kInvalidArgument.
  int Register(std::string name, size_t rows, size_t cols, DType dtype, int group = 0);
  // Collective over the main group (and, for the buckets' storage, each
  // added group): checks that every rank registered the same parameters
  // (kMismatch naming the first difference, on every rank), lays out the
  // buckets and allocates them (zeroed). kShmExhausted when the symmetric
  // heap cannot hold them.
  void Finalize();

  // The gradient of `param`: a view into its bucket, `count` elements of its
  // dtype. Stable except across the one rebuild (layout_version changes).
  void* Grad(int param);
  template <typename T>
  T* GradAs(int param) {
    return static_cast<T*>(Grad(param));
  }
  // Zeroes every gradient (between steps; accumulation keeps them).
  void ZeroGrad();

  // Gradient accumulation: while off, MarkReady and Finish communicate
  // nothing, and the views keep adding up micro-batches until a step with
  // sync on (the default) exchanges the total.
  void set_sync(bool on) { sync_ = on; }
  bool sync() const { return sync_; }

  // The gradient of `param` for this step is complete in its view. May
  // start bucket all-reduces. An unregistered id or a second mark in one
  // step throws kInvalidArgument (before Finalize: too).
  void MarkReady(int param);
  // As MarkReady, after adding `grad` (count elements of the dtype) into
  // the view.
  void MarkReady(int param, const void* grad);
  // Ends the step: starts the buckets not yet started (unmarked parameters
  // contribute their views as they are), waits for all, and leaves the
  // mean (or sum) in the views. Errors of the exchanges are rethrown. With
  // sync off it only ends the step (unless buckets started while sync was
  // on: then the step is finished as a synchronised one).
  void Finish();

  // The error-feedback residual of an f32 parameter (empty without error
  // feedback).
  std::span<const float> Residual(int param) const;
  // Bucket b's parameters, in their order in the bucket.
  std::vector<std::vector<int>> Buckets() const;
  int layout_version() const;
  const GradSyncStats& stats() const;
  // The autotuner's state and choice (zero when autotune is off), and the
  // compression in use with kAuto's measurement and choice.
  GradSyncTuning tuning() const;
  // What each bucket's uncompressed all-reduce runs, in bucket order (the
  // current layout's; see BucketAlgorithm).
  std::vector<BucketReduction> reductions() const;
  int num_params() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
  bool sync_ = true;
};

// One compressed all-reduce of an f32 buffer outside GradSync, e.g. per call
// (mc2.all_reduce(t, compression=...) and mc2.ddp.compressed_hook in
// Python): the schemes, exchanges and results of a GradSync bucket (above)
// for one buffer, with the error-feedback residual owned by the caller.
//
//   std::vector<float> residual(n);              // kept across calls
//   CompressedAllReduce op(g, data, n, {.scheme = Compression::kTopK,
//                                       .topk_ratio = 0.01},
//                          /*average=*/true, residual);
//   op.Start();   // issues the exchange
//   op.Finish();  // waits; the mean of the ranks' sparsified data in `data`
//
// `residual` (count floats, or empty: no error feedback; kThreshold and
// kTopK only) is added to the data before the selection and holds what was
// not sent when Start returns: sent + new residual == data + old residual,
// exactly. compression.error_feedback and warmup_steps are not used here:
// the residual's presence decides. `segments`: the first element of each
// part of the buffer (increasing, the first 0) from which kTopK selects
// separately, as GradSync does per parameter (empty: the whole buffer is
// one part). Every rank passes the same count, options and segments.
// Bad arguments throw kInvalidArgument from the constructor, before any
// communication; so do kPowerSgd (it needs the parameters' shapes and keeps
// each one's Q across steps) and kAuto (it measures whole steps): GradSync
// only. The constructor is collective over g for kF16 and kBF16
// (their exchange buffers are allocated in g's symmetric heap).
// Invariants: data and residual stay valid, and data untouched, from Start
// until Finish. Thread safety: one thread at a time, the one that issues
// the calls on g.
class CompressedAllReduce {
 public:
  CompressedAllReduce(const Group& g, float* data, size_t count,
                      const CompressionOptions& compression, bool average,
                      std::span<float> residual = {}, std::vector<size_t> segments = {});
  // Waits for a started exchange (ignoring its failure).
  ~CompressedAllReduce();
  CompressedAllReduce(const CompressedAllReduce&) = delete;
  CompressedAllReduce& operator=(const CompressedAllReduce&) = delete;

  // Issues the exchange. kTopK and kNone issue one collective and return at
  // once; kF16, kBF16 and kThreshold wait for their first collective (the
  // second needs its result) and issue the second. Once only.
  void Start();
  // The last collective Start issued (complete when there was none): a
  // caller may wait for it elsewhere, and must still call Finish.
  Work pending() const;
  // Waits and leaves the reduced (decoded) result in data; rethrows the
  // exchange's failure.
  void Finish();
  // What Start moved (one bucket's GradSyncStats).
  const GradSyncStats& stats() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mc2

#endif  // MC2_GRAD_H_
