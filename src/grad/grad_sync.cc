// GradSync (include/mc2/grad.h): registration, the agreement check, the
// bucket storage, the step's marks and the rebuild. The exchanges are
// exchange.h's, the layout layout.h's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/log.h"
#include "grad/auto_compression.h"
#include "grad/autotune.h"
#include "grad/exchange.h"
#include "grad/fuse.h"
#include "grad/layout.h"
#include "grad/levels.h"
#include "mc2/batch.h"
#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/grad.h"
#include "mc2/trace.h"

namespace mc2 {

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Invalid(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "GradSync: " + what);
}

// FNV-1a, 64-bit: fingerprints of the registrations compared across ranks.
struct Hash {
  uint64_t h = 1469598103934665603ull;
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 1099511628211ull;
    }
  }
  template <typename T>
  void Add(const T& v) {
    Bytes(&v, sizeof(v));
  }
  void Add(const std::string& s) {
    Add(s.size());
    Bytes(s.data(), s.size());
  }
};

constexpr size_t kAlign = 64;

// A group's bucket memory: symmetric, so that the all-reduces read it in
// place; private when the group has one rank (nothing to exchange).
struct Storage {
  SymmetricBuffer sym;
  std::vector<char> own;
  char* data = nullptr;
  size_t bytes = 0;
};
size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

// Invariants: before Finalize only params_/groups_ exist. After it, every
// parameter is in exactly one bucket (where_), every bucket's storage lies
// in storage_[its group] at byte offset bucket_off_, and exchanges are
// started in bucket order: buckets [0, next_start_) started this step, the
// others not. A started exchange is completed (or waited quietly) before
// the step ends.
class GradSync::Impl {
 public:
  Impl(const Group& g, const GradSyncOptions& o) : opt_(o), given_(o) {
    if (!g.valid()) Invalid("the group is invalid");
    groups_.push_back(g);
    if (o.compression.scheme == Compression::kAuto) MakeAuto(o.compression);
    const CompressionOptions& c = opt_.compression;
    if (o.bucket_cap_bytes == 0 || o.first_bucket_cap_bytes == 0) {
      Invalid("bucket caps must be > 0 bytes");
    }
    if (c.scheme == Compression::kThreshold && !(c.threshold >= 0 && std::isfinite(c.threshold))) {
      Invalid("the compression threshold must be finite and >= 0, got " +
              std::to_string(c.threshold));
    }
    if (c.warmup_steps < 0)
      Invalid("warmup_steps must be >= 0, got " + std::to_string(c.warmup_steps));
    if (c.scheme == Compression::kTopK && !(c.topk_ratio > 0 && c.topk_ratio <= 1)) {
      Invalid("topk_ratio must be in (0, 1], got " + std::to_string(c.topk_ratio));
    }
    if (c.scheme == Compression::kPowerSgd && c.powersgd_rank < 1)
      Invalid("powersgd_rank must be >= 1, got " + std::to_string(c.powersgd_rank));
    if (static_cast<int>(c.scheme) > static_cast<int>(Compression::kPowerSgd))
      Invalid("compression scheme " + std::to_string(static_cast<int>(c.scheme)) +
              " is not a Compression");
    if (o.fuse_buckets && o.fuse_bucket_bytes == 0)
      Invalid("fuse_bucket_bytes must be > 0 (turn fusion off with fuse_buckets = false)");
    if (static_cast<int>(o.bucket_algorithm) > static_cast<int>(BucketAlgorithm::kFlat))
      Invalid("bucket_algorithm " + std::to_string(static_cast<int>(o.bucket_algorithm)) +
              " is not one of kAuto, kHierarchical, kFlat");
    if (o.autotune.enabled) MakeTuner(o.autotune);
  }

  ~Impl() {
    for (auto& e : ex_) e->WaitQuietly();
  }

  int AddGroup(const Group& g) {
    if (finalized_) Invalid("AddGroup after Finalize");
    if (!g.valid()) Invalid("AddGroup: the group is invalid (this rank is not in it)");
    groups_.push_back(g);
    return static_cast<int>(groups_.size()) - 1;
  }

  int RegisterMatrix(std::string name, size_t rows, size_t cols, DType dtype, int group) {
    if (cols != 0 && rows > SIZE_MAX / cols)
      Invalid("parameter \"" + name + "\": " + std::to_string(rows) + " x " + std::to_string(cols) +
              " elements overflow");
    const int id = Register(std::move(name), rows * cols, dtype, group);
    params_[id].rows = rows;
    params_[id].cols = cols;
    return id;
  }

  int Register(std::string name, size_t count, DType dtype, int group) {
    if (finalized_) Invalid("Register(\"" + name + "\") after Finalize");
    if (!IsFloat(dtype)) {
      Invalid("parameter \"" + name + "\": dtype " + DTypeName(dtype) + " is not a float type");
    }
    if (opt_.compression.scheme != Compression::kNone && dtype != DType::kF32) {
      Invalid("parameter \"" + name + "\": compression " +
              (auto_ ? std::string("auto (") + CompressionName(auto_->lossy()) + ")"
                     : std::string(CompressionName(opt_.compression.scheme))) +
              " takes f32 gradients, not " +
              DTypeName(dtype));
    }
    if (group < 0 || group >= static_cast<int>(groups_.size())) {
      Invalid("parameter \"" + name + "\": no group " + std::to_string(group));
    }
    if (count > static_cast<size_t>(PTRDIFF_MAX) / 8) {
      Invalid("parameter \"" + name + "\": " + std::to_string(count) + " elements is too large");
    }
    if (!names_.emplace(name, static_cast<int>(params_.size())).second) {
      Invalid("parameter \"" + name + "\" registered twice");
    }
    params_.push_back({std::move(name), count, dtype, group});
    return static_cast<int>(params_.size()) - 1;
  }

  void Finalize() {
    if (finalized_) Invalid("Finalize called twice");
    CheckAgreement();
    std::vector<int> order(params_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(order.size() - 1 - i);
    order_ = order;
    Install(grad::PlanBuckets(params_, order, opt_.first_bucket_cap_bytes, opt_.bucket_cap_bytes));
    marked_.assign(params_.size(), 0);
    ResetStep();
    finalized_ = true;
  }

  void* Grad(int p) {
    CheckParam(p, "Grad");
    return View(p);
  }

  void ZeroGrad() {
    if (!finalized_) Invalid("ZeroGrad before Finalize");
    for (auto& st : storage_) {
      if (st.bytes > 0) std::memset(st.data, 0, st.bytes);
    }
  }

  void MarkReady(int p, const void* grad, bool sync) {
    CheckParam(p, "MarkReady");
    if (marked_[p]) Invalid("parameter \"" + params_[p].name + "\" marked ready twice in one step");
    if (grad != nullptr) Accumulate(p, grad);
    marked_[p] = 1;
    ready_order_.push_back(p);
    if (!sync) return;
    --pending_[where_[p].first];
    while (next_start_ < ex_.size()) {
      const size_t end = set_end_[next_start_];
      for (size_t b = next_start_; b < end; ++b)
        if (pending_[b] != 0) return;
      StartSet(end);
    }
  }

  void Finish(bool sync) {
    if (!finalized_) Invalid("Finish before Finalize");
    // Sync turned off after buckets started: they must still complete
    // (the peers run them too), so the step is finished as a synchronised one.
    if (!sync && next_start_ == 0) {
      ResetStep();
      return;
    }
    const auto t0 = Clock::now();
    trace::Scope span("grad_sync.finish", trace::Category::kWait);
    stats_.scheme = Compress() ? opt_.compression.scheme : Compression::kNone;
    try {
      while (next_start_ < ex_.size()) StartSet(set_end_[next_start_]);
      for (auto& e : ex_) e->Advance();
      for (auto& e : ex_) e->Complete();
    } catch (...) {
      for (auto& e : ex_) e->WaitQuietly();
      ResetStep();
      throw;
    }
    stats_.finish_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    last_stats_ = stats_;
    ++synced_steps_;
    // kAuto's measurement comes first; the autotuner starts after it.
    const bool choosing = auto_ && auto_->deciding();
    const double end = tuner_ || choosing ? Now() : 0;
    if (opt_.rebuild_buckets && !rebuilt_) Rebuild();
    if (choosing)
      ChooseCompression(end);
    else if (tuner_)
      Tune(end);
    ResetStep();
  }

  std::span<const float> Residual(int p) const {
    if (!finalized_ || p < 0 || p >= static_cast<int>(params_.size())) {
      Invalid("Residual: no parameter " + std::to_string(p));
    }
    auto [b, slot] = where_[p];
    std::span<float> r = ex_[b]->residual();
    if (r.empty()) return {};
    return r.subspan(plan_[b].offsets[slot], params_[p].count);
  }

  std::vector<std::vector<int>> Buckets() const {
    std::vector<std::vector<int>> out;
    for (const auto& b : plan_) out.push_back(b.params);
    return out;
  }

  int layout_version() const { return layout_version_; }

  std::vector<BucketReduction> reductions() const { return reductions_; }
  GradSyncTuning tuning() const {
    GradSyncTuning t;
    t.compression = auto_ ? auto_->chosen() : opt_.compression.scheme;
    if (auto_) {
      t.compression_deciding = auto_->deciding();
      t.compression_decided = !auto_->deciding();
      t.dense_step_seconds = auto_->dense_seconds();
      t.lossy_step_seconds = auto_->lossy_seconds();
    }
    if (!tuner_) return t;
    t.tuning = tuner_->tuning();
    t.decided = !tuner_->tuning();
    t.bucket_cap_bytes = opt_.bucket_cap_bytes;
    t.threshold = opt_.compression.threshold;
    for (const grad::TuneCandidate& c : tuner_->candidates()) {
      t.candidate_caps.push_back(c.bucket_cap_bytes);
      t.candidate_thresholds.push_back(c.threshold);
    }
    t.median_seconds = tuner_->agreed();
    return t;
  }
  const GradSyncStats& stats() const { return last_stats_; }
  int num_params() const { return static_cast<int>(params_.size()); }

 private:
  void CheckParam(int p, const char* what) const {
    if (!finalized_) Invalid(std::string(what) + " before Finalize");
    if (p < 0 || p >= static_cast<int>(params_.size())) {
      Invalid(std::string(what) + ": parameter id " + std::to_string(p) + " is not registered (" +
              std::to_string(params_.size()) + " parameters)");
    }
  }

  void* View(int p) const {
    auto [b, slot] = where_[p];
    return storage_[plan_[b].group].data + bucket_off_[b] +
           plan_[b].offsets[slot] * DTypeSize(params_[p].dtype);
  }

  void Accumulate(int p, const void* grad) {
    const grad::ParamInfo& info = params_[p];
    void* v = View(p);
    switch (info.dtype) {
      case DType::kF32: {
        auto* d = static_cast<float*>(v);
        const auto* s = static_cast<const float*>(grad);
        for (size_t i = 0; i < info.count; ++i) d[i] += s[i];
        break;
      }
      case DType::kF64: {
        auto* d = static_cast<double*>(v);
        const auto* s = static_cast<const double*>(grad);
        for (size_t i = 0; i < info.count; ++i) d[i] += s[i];
        break;
      }
      default:
        // 16-bit: rounded after each addition, as any 16-bit accumulator.
        Invalid("MarkReady(\"" + info.name + "\", grad): adding into a " + DTypeName(info.dtype) +
                " gradient is not supported; write the view");
    }
  }

  // Every rank must have registered the same parameters with the same
  // options: the registrations' fingerprint is all-gathered over the main
  // group, and on a difference every rank (seeing the same data) finds the
  // first differing parameter with one more exchange and throws.
  void CheckAgreement() {
    const Group& g = groups_[0];
    const int N = g.size();
    std::vector<uint64_t> hashes;
    Hash all;
    for (const grad::ParamInfo& p : params_) {
      Hash h;
      h.Add(p.name);
      h.Add(p.count);
      h.Add(static_cast<int>(p.dtype));
      h.Add(groups_[p.group].size());
      h.Add(p.rows);
      h.Add(p.cols);
      hashes.push_back(h.h);
      all.Add(h.h);
    }
    Hash o;
    o.Add(opt_.bucket_cap_bytes);
    o.Add(opt_.first_bucket_cap_bytes);
    o.Add(opt_.average);
    o.Add(opt_.deterministic);
    o.Add(opt_.rebuild_buckets);
    o.Add(static_cast<int>(opt_.compression.scheme));
    o.Add(opt_.compression.threshold);
    o.Add(opt_.compression.topk_ratio);
    o.Add(opt_.compression.error_feedback);
    o.Add(opt_.compression.warmup_steps);
    o.Add(opt_.compression.powersgd_rank);
    o.Add(opt_.compression.powersgd_seed);
    o.Add(opt_.compression.powersgd_warm_start);
    o.Add(opt_.fuse_buckets);
    o.Add(opt_.fuse_bucket_bytes);
    o.Add(auto_ != nullptr);
    o.Add(static_cast<int>(given_.compression.auto_scheme));
    o.Add(given_.compression.auto_warmup_steps);
    o.Add(given_.compression.auto_steps);
    o.Add(given_.compression.auto_min_speedup);
    o.Add(opt_.autotune.enabled);
    o.Add(opt_.autotune.bucket_caps.size());
    o.Add(opt_.autotune.thresholds.size());
    for (size_t cap : opt_.autotune.bucket_caps) o.Add(cap);
    for (float t : opt_.autotune.thresholds) o.Add(t);
    o.Add(opt_.autotune.warmup_steps);
    o.Add(static_cast<int>(opt_.bucket_algorithm));
    o.Add(opt_.autotune.steps_per_candidate);
    int64_t mine[3] = {static_cast<int64_t>(params_.size()), static_cast<int64_t>(all.h),
                       static_cast<int64_t>(o.h)};
    std::vector<int64_t> every(3 * static_cast<size_t>(N));
    AllGather(g, mine, every.data(), 3, DType::kI64).Wait();
    int64_t min_n = mine[0];
    bool same = true;
    for (int r = 0; r < N; ++r) {
      min_n = std::min(min_n, every[3 * r]);
      for (int k = 0; k < 2; ++k) same = same && every[3 * r + k] == mine[k];
    }
    for (int r = 0; r < N; ++r) {
      if (every[3 * r + 2] != mine[2]) {
        throw Error(ErrorCode::kMismatch,
                    "GradSync: ranks " + std::to_string(g.rank()) + " and " + std::to_string(r) +
                        " were built with different options",
                    g.rank(), "GradSync::Finalize");
      }
    }
    if (same) return;
    // Find the first parameter index where some rank differs.
    const size_t m = static_cast<size_t>(min_n);
    std::vector<int64_t> first(m), gathered(m * static_cast<size_t>(N));
    for (size_t i = 0; i < m; ++i) first[i] = static_cast<int64_t>(hashes[i]);
    AllGather(g, first.data(), gathered.data(), m, DType::kI64).Wait();
    for (size_t i = 0; i < m; ++i) {
      for (int r = 0; r < N; ++r) {
        if (gathered[static_cast<size_t>(r) * m + i] != first[i]) {
          const grad::ParamInfo& p = params_[i];
          throw Error(ErrorCode::kMismatch,
                      "GradSync: parameter " + std::to_string(i) + " differs between ranks " +
                          std::to_string(g.rank()) + " and " + std::to_string(r) + " (here \"" +
                          p.name + "\", " + std::to_string(p.count) + " x " + DTypeName(p.dtype) +
                          " over a group of " + std::to_string(groups_[p.group].size()) + ")",
                      g.rank(), "GradSync::Finalize");
        }
      }
    }
    std::string counts;
    for (int r = 0; r < N; ++r) {
      counts += (r ? ", rank " : "rank ") + std::to_string(r) + ": " + std::to_string(every[3 * r]);
    }
    throw Error(ErrorCode::kMismatch,
                "GradSync: ranks registered different numbers of parameters (" + counts + ")",
                g.rank(), "GradSync::Finalize");
  }

  // Makes `plan` the layout: allocates each group's storage (collective on
  // that group, in group order), copies the gradients (and residuals) of an
  // earlier layout over, and builds the exchanges.
  void Install(std::vector<grad::BucketPlan> plan) {
    std::vector<size_t> off(plan.size());
    std::vector<size_t> group_bytes(groups_.size(), 0);
    for (size_t b = 0; b < plan.size(); ++b) {
      off[b] = group_bytes[plan[b].group];
      group_bytes[plan[b].group] += AlignUp(plan[b].count * DTypeSize(plan[b].dtype));
    }
    std::vector<Storage> storage(groups_.size());
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      Storage& st = storage[gi];
      st.bytes = group_bytes[gi];
      if (st.bytes == 0) continue;
      if (groups_[gi].size() == 1) {
        st.own.assign(st.bytes, 0);
        st.data = st.own.data();
      } else {
        st.sym = groups_[gi].AllocSymmetric(st.bytes);
        st.data = static_cast<char*>(st.sym.data());
      }
      std::memset(st.data, 0, st.bytes);
    }
    std::vector<std::unique_ptr<grad::BucketExchange>> ex;
    std::vector<std::pair<int, int>> where(params_.size());
    std::vector<BucketReduction> reductions;
    for (size_t b = 0; b < plan.size(); ++b) {
      void* data = storage[plan[b].group].data + off[b];
      const Group& g = groups_[plan[b].group];
      std::vector<grad::MatrixShape> shapes;
      for (int p : plan[b].params)
        shapes.push_back({params_[p].rows, params_[p].cols, static_cast<uint64_t>(p)});
      ex.push_back(std::make_unique<grad::BucketExchange>(g, data, plan[b].count, plan[b].dtype,
                                                          plan[b].offsets, opt_, std::move(shapes)));
      // On zeroed storage, before the values are carried over.
      reductions.push_back(grad::ChooseBucketReduction(g, data, plan[b].count, plan[b].dtype,
                                                       opt_.bucket_algorithm));
      const BucketReduction& r = reductions.back();
      if (r.algorithm == "flat") ex.back()->UseFlatAllReduce();
      if (r.measured)
        MC2_LOG(kInfo,
                "GradSync: bucket {} ({} bytes) over {} ranks spanning hosts: hierarchical "
                "all-reduce {:.3f} ms, flat {:.3f} ms (slowest rank): {}",
                b, r.bytes, g.size(), r.hierarchical_seconds * 1e3, r.flat_seconds * 1e3,
                r.algorithm);
      for (size_t s = 0; s < plan[b].params.size(); ++s) {
        where[plan[b].params[s]] = {static_cast<int>(b), static_cast<int>(s)};
      }
    }
    if (!plan_.empty()) {  // a rebuild: carry the values over
      for (size_t p = 0; p < params_.size(); ++p) {
        auto [ob, os] = where_[p];
        auto [nb, ns] = where[p];
        const size_t esz = DTypeSize(params_[p].dtype);
        if (params_[p].count == 0) continue;  // no storage to carry (maybe null)
        std::memcpy(static_cast<char*>(ex[nb]->data()) + plan[nb].offsets[ns] * esz,
                    static_cast<char*>(ex_[ob]->data()) + plan_[ob].offsets[os] * esz,
                    params_[p].count * esz);
        std::span<float> from = ex_[ob]->residual(), to = ex[nb]->residual();
        if (!from.empty() && !to.empty()) {
          std::memcpy(to.data() + plan[nb].offsets[ns], from.data() + plan_[ob].offsets[os],
                      params_[p].count * sizeof(float));
        }
        std::span<float> qa = ex_[ob]->low_rank_q(os), qb = ex[nb]->low_rank_q(ns);
        if (!qa.empty() && qa.size() == qb.size()) std::copy(qa.begin(), qa.end(), qb.begin());
      }
    }
    // Every exchange on the old storage has completed (and its readers
    // are done: mc2 completes an operation only after its peers' reads), so
    // it can go.
    plan_ = std::move(plan);
    bucket_off_ = std::move(off);
    storage_ = std::move(storage);
    ex_ = std::move(ex);
    where_ = std::move(where);
    reductions_ = std::move(reductions);
  }

  // After the first synchronised step: rank 0's ready order (then the
  // parameters it did not mark, in reverse registration order) becomes the
  // bucket order on every rank.
  void Rebuild() {
    rebuilt_ = true;
    std::vector<int32_t> order;
    std::vector<char> seen(params_.size(), 0);
    for (int p : ready_order_) {
      order.push_back(p);
      seen[p] = 1;
    }
    for (size_t i = params_.size(); i-- > 0;) {
      if (!seen[i]) order.push_back(static_cast<int32_t>(i));
    }
    Broadcast(groups_[0], order.data(), order.data(), order.size(), DType::kI32, 0).Wait();
    std::vector<int> ord(order.begin(), order.end());
    std::vector<char> check(params_.size(), 0);
    for (int p : ord) {
      if (p < 0 || p >= static_cast<int>(params_.size()) || check[p]++) {
        throw Error(ErrorCode::kInternal, "GradSync: rank 0's ready order is not a permutation");
      }
    }
    order_ = ord;
    auto plan = grad::PlanBuckets(params_, ord, opt_.first_bucket_cap_bytes, opt_.bucket_cap_bytes);
    bool same = plan.size() == plan_.size();
    for (size_t b = 0; same && b < plan.size(); ++b) same = plan[b].params == plan_[b].params;
    if (same) return;
    Install(std::move(plan));
    ++layout_version_;
  }

  // Checks the autotune options and starts the tuner on its first
  // candidate (the layout Finalize installs).
  void MakeTuner(const AutotuneOptions& a) {
    if (a.bucket_caps.empty()) Invalid("autotune.bucket_caps is empty");
    for (size_t cap : a.bucket_caps)
      if (cap == 0) Invalid("autotune.bucket_caps: a cap must be > 0 bytes");
    if (!a.thresholds.empty() && (auto_ || opt_.compression.scheme != Compression::kThreshold))
      Invalid("autotune.thresholds apply to threshold compression only");
    for (float t : a.thresholds)
      if (!(t >= 0 && std::isfinite(t)))
        Invalid("autotune.thresholds: a threshold must be finite and >= 0, got " +
                std::to_string(t));
    if (a.warmup_steps < 0)
      Invalid("autotune.warmup_steps must be >= 0, got " + std::to_string(a.warmup_steps));
    if (a.steps_per_candidate < 1)
      Invalid("autotune.steps_per_candidate must be >= 1, got " +
              std::to_string(a.steps_per_candidate));
    std::vector<float> ts = a.thresholds;
    if (ts.empty()) ts.push_back(opt_.compression.threshold);
    std::vector<grad::TuneCandidate> cands;
    for (size_t cap : a.bucket_caps)
      for (float t : ts) cands.push_back({cap, t});
    tuner_ = std::make_unique<grad::Autotuner>(std::move(cands), a.warmup_steps,
                                               a.steps_per_candidate);
    Apply(tuner_->candidates()[0]);
  }

  // kAuto: checks its options, and from now on the exchanges are built for
  // the lossy scheme (buffers, residuals); each step's Compress() says
  // whether it uses it.
  void MakeAuto(const CompressionOptions& c) {
    if (c.auto_scheme == Compression::kNone || c.auto_scheme == Compression::kAuto)
      Invalid(std::string("compression.auto_scheme must be a lossy scheme (f16, bf16, threshold, "
                          "topk, powersgd), got ") +
              CompressionName(c.auto_scheme));
    if (c.auto_warmup_steps < 0)
      Invalid("compression.auto_warmup_steps must be >= 0, got " +
              std::to_string(c.auto_warmup_steps));
    if (c.auto_steps < 1)
      Invalid("compression.auto_steps must be >= 1, got " + std::to_string(c.auto_steps));
    if (!(c.auto_min_speedup >= 1 && std::isfinite(c.auto_min_speedup)))
      Invalid("compression.auto_min_speedup must be finite and >= 1, got " +
              std::to_string(c.auto_min_speedup));
    auto_ = std::make_unique<grad::AutoCompression>(c.auto_scheme, c.auto_warmup_steps,
                                                     c.auto_steps, c.auto_min_speedup);
    opt_.compression.scheme = c.auto_scheme;
  }

  // Whether the step in progress exchanges compressed: not in the warm-up
  // steps, and with kAuto only when the lossy scheme is measured or kept.
  bool Compress() const {
    return synced_steps_ >= opt_.compression.warmup_steps && (!auto_ || auto_->lossy_now());
  }

  // kAuto, after synchronised step `synced_steps_`, which ended at `end`.
  // The first step (it rebuilds the buckets) and the warm-up steps are not
  // measured. When compression does not pay, the buckets are rebuilt
  // without the lossy scheme's buffers (collective: every rank decides at
  // the same step); a sparse scheme's residual left then is dropped.
  void ChooseCompression(double end) {
    const int64_t from = std::max<int64_t>(1, opt_.compression.warmup_steps);
    if (synced_steps_ > from &&
        auto_->OnStep(end - last_end_) == grad::Autotuner::Next::kDecide) {
      const std::vector<double>& mine = auto_->medians();
      std::vector<double> agreed(mine.size());
      AllReduce(groups_[0], mine.data(), agreed.data(), mine.size(), DType::kF64, ReduceOp::kMax)
          .Wait();
      if (auto_->Decide(agreed[0], agreed[1]) == Compression::kNone) {
        opt_.compression.scheme = Compression::kNone;
        Install(grad::PlanBuckets(params_, order_, opt_.first_bucket_cap_bytes,
                                  opt_.bucket_cap_bytes));
        ++layout_version_;
      }
      MC2_LOG(kInfo, "{}", auto_->Describe());
    }
    last_end_ = Now();
  }

  double Now() const {
    if (opt_.autotune.clock) return opt_.autotune.clock();
    return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  }

  void Apply(const grad::TuneCandidate& c) {
    opt_.bucket_cap_bytes = c.bucket_cap_bytes;
    if (opt_.compression.scheme == Compression::kThreshold)
      opt_.compression.threshold = c.threshold;
  }

  // Installs candidate `c` in the current bucket order (collective: every
  // rank switches at the same synchronised step).
  void Switch(const grad::TuneCandidate& c) {
    Apply(c);
    Install(grad::PlanBuckets(params_, order_, opt_.first_bucket_cap_bytes, opt_.bucket_cap_bytes));
    ++layout_version_;
  }

  // After synchronised step `synced_steps_`, which ended at `end`: the
  // tuner's step. The first step (which rebuilds the buckets) is not
  // timed; a switch of layout is not part of the next step's time.
  void Tune(double end) {
    if (!tuner_->tuning()) return;
    const double seconds = synced_steps_ >= 2 ? end - last_end_ : -1;
    if (synced_steps_ < 2) {
      last_end_ = Now();
      return;
    }
    switch (tuner_->OnStep(seconds)) {
      case grad::Autotuner::Next::kContinue:
        break;
      case grad::Autotuner::Next::kSwitch:
        Switch(tuner_->candidates()[tuner_->current()]);
        break;
      case grad::Autotuner::Next::kDecide: {
        const std::vector<double>& mine = tuner_->medians();
        std::vector<double> agreed(mine.size());
        AllReduce(groups_[0], mine.data(), agreed.data(), mine.size(), DType::kF64, ReduceOp::kMax)
            .Wait();
        const size_t last = tuner_->current();
        const size_t best = tuner_->Decide(agreed);
        const grad::TuneCandidate& c = tuner_->candidates()[best];
        if (best != last) Switch(c);
        std::string all;
        for (size_t i = 0; i < agreed.size(); ++i) {
          const grad::TuneCandidate& x = tuner_->candidates()[i];
          all += (i ? ", " : "") + std::to_string(x.bucket_cap_bytes) + " B";
          if (opt_.compression.scheme == Compression::kThreshold)
            all += " @ " + std::to_string(x.threshold);
          all += ": " + std::to_string(agreed[i] * 1e3) + " ms";
        }
        MC2_LOG(kInfo, "GradSync autotune: bucket cap {} bytes{} (median step time of each "
                "candidate, slowest rank: {})",
                c.bucket_cap_bytes,
                opt_.compression.scheme == Compression::kThreshold
                    ? ", threshold " + std::to_string(c.threshold)
                    : std::string(),
                all);
        break;
      }
    }
    last_end_ = Now();
  }

  // Starts buckets [next_start_, end): one exchange each, or one Batch of
  // their all-reduces when the set has several (grad/fuse.h).
  void StartSet(size_t end) {
    if (end - next_start_ == 1) {
      ex_[next_start_++]->Start(&stats_, Compress());
      return;
    }
    std::vector<BatchEntry> entries;
    const ReduceOp op = opt_.average ? ReduceOp::kAvg : ReduceOp::kSum;
    for (size_t b = next_start_; b < end; ++b) {
      void* d = ex_[b]->data();
      entries.push_back(BatchEntry::AllReduce(d, d, plan_[b].count, plan_[b].dtype, op));
    }
    CollectiveOptions co;
    co.may_run_inline = false;
    const Work w = Batch(groups_[plan_[next_start_].group], entries, co);
    ++stats_.fused_exchanges;
    for (; next_start_ < end; ++next_start_) ex_[next_start_]->StartJoined(&stats_, w);
  }

  void ResetStep() {
    std::vector<grad::FuseItem> items(plan_.size());
    for (size_t b = 0; opt_.fuse_buckets && b < plan_.size(); ++b) {
      const Group& g = groups_[plan_[b].group];
      items[b] = {ex_[b]->Dense(Compress()) && g.size() > 1 && plan_[b].count > 0 &&
                      !reductions_[b].spans_levels && (!opt_.deterministic || g.deterministic()),
                  plan_[b].group, ex_[b]->bytes()};
    }
    set_end_ = grad::PlanFusion(items, opt_.fuse_bucket_bytes);
    std::fill(marked_.begin(), marked_.end(), 0);
    ready_order_.clear();
    pending_.assign(plan_.size(), 0);
    for (size_t b = 0; b < plan_.size(); ++b)
      pending_[b] = static_cast<int>(plan_[b].params.size());
    next_start_ = 0;
    stats_ = GradSyncStats{};
  }

  GradSyncOptions opt_;    // in effect (kAuto: the scheme measured or chosen)
  GradSyncOptions given_;  // as constructed
  std::vector<Group> groups_;
  std::vector<grad::ParamInfo> params_;
  std::map<std::string, int> names_;
  bool finalized_ = false;

  std::vector<grad::BucketPlan> plan_;
  std::vector<size_t> bucket_off_;
  std::vector<Storage> storage_;  // by group
  std::vector<std::unique_ptr<grad::BucketExchange>> ex_;
  std::vector<BucketReduction> reductions_;  // per bucket of ex_
  std::vector<std::pair<int, int>> where_;  // param -> (bucket, slot)
  bool rebuilt_ = false;
  int layout_version_ = 0;
  int64_t synced_steps_ = 0;  // finished with sync on
  std::vector<int> order_;    // the parameter order of the current layout
  std::unique_ptr<grad::Autotuner> tuner_;  // null unless autotune is on
  std::unique_ptr<grad::AutoCompression> auto_;  // null unless kAuto
  double last_end_ = 0;                     // Now() after the last synchronised step

  std::vector<char> marked_;
  std::vector<int> ready_order_;
  std::vector<int> pending_;  // unmarked parameters per bucket
  size_t next_start_ = 0;
  std::vector<size_t> set_end_;  // per bucket: the end of its fused set
  GradSyncStats stats_, last_stats_;
};

GradSync::GradSync(const Group& group, const GradSyncOptions& options)
    : impl_(std::make_unique<Impl>(group, options)) {}
GradSync::~GradSync() = default;
int GradSync::AddGroup(const Group& g) { return impl_->AddGroup(g); }
int GradSync::Register(std::string name, size_t count, DType dtype, int group) {
  return impl_->Register(std::move(name), count, dtype, group);
}
int GradSync::Register(std::string name, size_t rows, size_t cols, DType dtype, int group) {
  return impl_->RegisterMatrix(std::move(name), rows, cols, dtype, group);
}
void GradSync::Finalize() { impl_->Finalize(); }
void* GradSync::Grad(int param) { return impl_->Grad(param); }
void GradSync::ZeroGrad() { impl_->ZeroGrad(); }
void GradSync::MarkReady(int param) { impl_->MarkReady(param, nullptr, sync_); }
void GradSync::MarkReady(int param, const void* grad) {
  if (grad == nullptr) Invalid("MarkReady: grad is null");
  impl_->MarkReady(param, grad, sync_);
}
void GradSync::Finish() { impl_->Finish(sync_); }
std::span<const float> GradSync::Residual(int param) const { return impl_->Residual(param); }
std::vector<std::vector<int>> GradSync::Buckets() const { return impl_->Buckets(); }
int GradSync::layout_version() const { return impl_->layout_version(); }
const GradSyncStats& GradSync::stats() const { return impl_->stats(); }
GradSyncTuning GradSync::tuning() const { return impl_->tuning(); }
std::vector<BucketReduction> GradSync::reductions() const { return impl_->reductions(); }
int GradSync::num_params() const { return impl_->num_params(); }

}  // namespace mc2
