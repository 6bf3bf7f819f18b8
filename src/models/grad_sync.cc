#include "models/grad_sync.h"

#include <chrono>

#include "mc2/collectives.h"
#include "mc2/trace.h"

namespace mc2::models {

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

void GradSync::Issue(int bucket) {
  Bucket& b = buckets_[bucket];
  const Group& g = b.sync == Sync::kWorld ? grid_.world
                   : b.sync == Sync::kDp  ? grid_.dp
                                          : grid_.edp;
  if (g.size() == 1 || b.g.empty()) return;
  // In the background even if small: it is meant to run under the wgrads.
  CollectiveOptions o;
  o.may_run_inline = false;
  Work w = AllReduce(g, b.g.data(), b.g.data(), b.g.size(), DType::kF32, ReduceOp::kSum, o);
  if (b.sync == Sync::kWorld)
    world_ = w;
  else
    works_.push_back(w);
}

void GradSync::IssuePendingThen(int next) {
  if (pending_ >= 0) Issue(pending_);
  pending_ = next;
}

double GradSync::Wait() {
  auto t0 = Clock::now();
  trace::Scope span("grad_sync.wait", trace::Category::kWait);
  for (auto& w : works_) w.Wait();
  works_.clear();
  if (!defer_world) {
    world_.Wait();
    world_ = Work();
  }
  return Since(t0);
}

double GradSync::WaitWorld() {
  auto t0 = Clock::now();
  trace::Scope wait("grad_sync.wait", trace::Category::kWait);
  world_.Wait();
  world_ = Work();
  return Since(t0);
}

void GradSync::WaitAllQuietly() {
  works_.push_back(world_);
  for (auto& w : works_) {
    try {
      w.Wait();
    } catch (...) {
    }
  }
  works_.clear();
  world_ = Work();
}

}  // namespace mc2::models
