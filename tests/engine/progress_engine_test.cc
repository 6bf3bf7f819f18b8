// The progress engine (engine/progress_engine.h): tasks run one at a time
// in submission order, each Work completes when its task returned (or
// fails with its error), errors other than kInvalidArgument reach
// on_error, a task runs inline only when nothing is queued or running, a
// waiting caller runs the queue up to its task, and the destructor drains
// the queue.
#include "engine/progress_engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/work_state.h"
#include "mc2/error.h"

namespace mc2::engine {
namespace {

using internal::WorkState;

std::shared_ptr<WorkState> NewWork() { return std::make_shared<WorkState>(0, "test"); }

TEST(ProgressEngine, TasksRunOneAtATimeInSubmissionOrder) {
  ProgressEngine engine(nullptr);
  std::mutex mu;
  std::vector<int> order;
  std::atomic<int> running{0}, overlap{0};
  std::vector<std::shared_ptr<WorkState>> works;
  for (int i = 0; i < 200; ++i) {
    works.push_back(NewWork());
    engine.Submit(works.back(), [&, i] {
      if (running.fetch_add(1) != 0) overlap.fetch_add(1);
      if (i % 17 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(i);
      }
      running.fetch_sub(1);
    });
  }
  // Some waiters help run the queue (RunQueuedUntil), others wait.
  for (size_t i = 0; i < works.size(); i += 3) {
    engine.RunQueuedUntil(works[i].get());
    ASSERT_TRUE(works[i]->WaitDone(-1));
  }
  for (auto& w : works) ASSERT_TRUE(w->WaitDone(-1));
  EXPECT_EQ(overlap.load(), 0);
  ASSERT_EQ(order.size(), works.size());
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], static_cast<int>(i));
}

TEST(ProgressEngine, ErrorsFailTheirWorkAndAllButInvalidArgumentReachOnError) {
  std::atomic<int> aborts{0};
  ProgressEngine engine([&](const std::exception_ptr&) { aborts.fetch_add(1); });
  auto bad_arg = NewWork(), timeout = NewWork(), other = NewWork(), fine = NewWork();
  engine.Submit(bad_arg, [] { throw Error(ErrorCode::kInvalidArgument, "bad"); });
  engine.Submit(timeout, [] { throw Error(ErrorCode::kTimeout, "late"); });
  engine.Submit(other, [] { throw std::runtime_error("odd"); });
  engine.Submit(fine, [] {});
  for (auto& w : {bad_arg, timeout, other, fine}) ASSERT_TRUE(w->WaitDone(-1));
  EXPECT_TRUE(bad_arg->error() && timeout->error() && other->error());
  EXPECT_FALSE(fine->error());
  EXPECT_EQ(aborts.load(), 2);  // the timeout and the foreign exception
  try {
    std::rethrow_exception(timeout->error());
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
  }
}

TEST(ProgressEngine, TryRunInlineOnlyWhenNothingIsQueuedOrRunning) {
  ProgressEngine engine(nullptr);
  auto idle = NewWork();
  bool ran = false;
  ASSERT_TRUE(engine.Idle());
  EXPECT_TRUE(engine.TryRunInline(idle, [&] { ran = true; }));
  EXPECT_TRUE(ran && idle->done() && !idle->error());

  std::atomic<bool> release{false};
  auto blocker = NewWork();
  engine.Submit(blocker, [&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  });
  auto refused = NewWork();
  ran = false;
  EXPECT_FALSE(engine.TryRunInline(refused, [&] { ran = true; }));
  EXPECT_FALSE(ran || refused->done());
  release = true;
  ASSERT_TRUE(blocker->WaitDone(-1));

  auto throws = NewWork();
  while (!engine.Idle()) std::this_thread::yield();
  EXPECT_TRUE(engine.TryRunInline(throws, [] { throw Error(ErrorCode::kInvalidArgument, "x"); }));
  EXPECT_TRUE(throws->done() && throws->error());
}

TEST(ProgressEngine, TheDestructorRunsEveryQueuedTask) {
  std::atomic<int> ran{0};
  std::vector<std::shared_ptr<WorkState>> works;
  {
    ProgressEngine engine(nullptr);
    for (int i = 0; i < 50; ++i) {
      works.push_back(NewWork());
      engine.Submit(works.back(), [&] {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        ran.fetch_add(1);
      });
    }
  }
  EXPECT_EQ(ran.load(), 50);
  for (auto& w : works) EXPECT_TRUE(w->done() && !w->error());
}

}  // namespace
}  // namespace mc2::engine
