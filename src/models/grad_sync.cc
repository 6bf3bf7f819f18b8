#include "models/grad_sync.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "mc2/trace.h"

namespace mc2::models {

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

DpSync::DpSync(const ProcessGrid& grid, ParamStore& params, const TransformerConfig& cfg,
               bool tensor_buckets)
    : grid_(grid), params_(params), overlap_(cfg.grad_overlap) {
  members_.resize(params.buckets.size());
  std::vector<size_t> bucket_bytes(params.buckets.size(), 0);
  for (size_t pi = 0; pi < params.size(); ++pi) {
    const Param& p = params[static_cast<int>(pi)];
    members_[p.bucket].push_back(static_cast<int>(pi));
    bucket_bytes[p.bucket] += p.rows * p.cols * sizeof(float);
  }
  // The replicated tensors are marked at once, at the end: one bucket. The
  // others: a GradSync bucket about one sublayer's gradients, so that each
  // starts when its sublayer is marked, or one per tensor when they are
  // marked tensor by tensor (a cap of 1 byte: no two tensors share one).
  GradSyncOptions wo;
  wo.average = false;  // the loss is already scaled to the global mean
  wo.compression = cfg.grad_compression;
  wo.bucket_cap_bytes = wo.first_bucket_cap_bytes = std::max<size_t>(bucket_bytes[0], 1);
  GradSyncOptions so = wo;
  size_t sublayer = 1;
  for (size_t b = 1; b < bucket_bytes.size(); ++b) sublayer = std::max(sublayer, bucket_bytes[b]);
  so.bucket_cap_bytes = so.first_bucket_cap_bytes = tensor_buckets ? 1 : sublayer;
  if (cfg.grad_bucket_cap_bytes > 0) {
    wo.bucket_cap_bytes = wo.first_bucket_cap_bytes = cfg.grad_bucket_cap_bytes;
    so.bucket_cap_bytes = so.first_bucket_cap_bytes = cfg.grad_bucket_cap_bytes;
  }
  world_ = std::make_unique<GradSync>(grid.world, wo);
  dp_ = std::make_unique<GradSync>(grid.world, so);
  const int dp = dp_->AddGroup(grid.dp);
  bool experts = false;
  for (const Bucket& b : params.buckets) experts = experts || b.sync == Sync::kExpert;
  const int edp = experts ? dp_->AddGroup(grid.edp) : -1;
  id_.resize(params.size());
  for (size_t pi = 0; pi < params.size(); ++pi) {
    const Param& p = params[static_cast<int>(pi)];
    const Sync s = params.buckets[p.bucket].sync;
    if (s == Sync::kWorld) {
      id_[pi] = world_->Register(p.name, p.rows, p.cols, DType::kF32);
    } else {
      id_[pi] = dp_->Register(p.name, p.rows, p.cols, DType::kF32, s == Sync::kExpert ? edp : dp);
    }
  }
  world_->Finalize();
  dp_->Finalize();
  RefreshViews();
}

void DpSync::RefreshViews() {
  world_layout_ = world_->layout_version();
  dp_layout_ = dp_->layout_version();
  for (size_t pi = 0; pi < params_.size(); ++pi) {
    Param& p = params_[static_cast<int>(pi)];
    GradSync& s = params_.world_synced(static_cast<int>(pi)) ? *world_ : *dp_;
    p.g = s.GradAs<float>(id_[pi]);
  }
}

void DpSync::Restart() {
  world_->ZeroGrad();
  pending_ = -1;
  deferred_.clear();
}

void DpSync::Issue(int bucket) {
  if (hold) return;
  if (bucket != 0) {
    for (int pi : members_[bucket]) IssueTensor(pi);
    return;
  }
  if (!overlap_) {  // the end of backward: everything, in backward order
    for (int pi : deferred_) dp_->MarkReady(id_[pi]);
    deferred_.clear();
  }
  for (int pi : members_[0]) world_->MarkReady(id_[pi]);
  world_running_ = true;
}

void DpSync::IssueTensor(int p) {
  if (hold) return;
  if (overlap_) {
    dp_->MarkReady(id_[p]);
  } else {
    deferred_.push_back(p);
  }
}

void DpSync::IssuePendingThen(int next) {
  if (pending_ >= 0) Issue(pending_);
  pending_ = next;
}

double DpSync::Wait() {
  auto t0 = Clock::now();
  {
    trace::Scope span("grad_sync.wait", trace::Category::kWait);
    dp_->Finish();
  }
  double waited = Since(t0);
  if (dp_->layout_version() != dp_layout_) RefreshViews();
  if (!defer_world) waited += WaitWorld();
  return waited;
}

double DpSync::WaitWorld() {
  if (!world_running_) return 0;
  auto t0 = Clock::now();
  {
    trace::Scope wait("grad_sync.wait", trace::Category::kWait);
    world_running_ = false;
    world_->Finish();
  }
  const double waited = Since(t0);
  if (world_->layout_version() != world_layout_) RefreshViews();
  return waited;
}

}  // namespace mc2::models
