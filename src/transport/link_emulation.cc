#include "transport/link_emulation.h"

#include <fmt/format.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "mc2/error.h"

namespace mc2::transport {

// ---------------------------------------------------------------------------
// LinkModel

LinkModel::LinkModel(const core::LinkConfig& config)
    : config_(config), ns_per_byte_(config.enabled ? 1e9 / config.bytes_per_second : 0) {}

std::string LinkModel::Label() const { return "emulated link: " + config_.Describe(); }

Clock::duration LinkModel::SerializationTime(size_t bytes) const {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(
      static_cast<int64_t>(static_cast<double>(bytes) * ns_per_byte_ + 0.5)));
}

Clock::duration LinkModel::TransferTime(size_t bytes) const {
  return config_.latency + SerializationTime(bytes);
}

Clock::time_point LinkModel::Post(size_t bytes, Clock::time_point now) {
  const Clock::duration busy = SerializationTime(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  Clock::time_point start = std::max(now, busy_until_);
  busy_until_ = start + busy;
  ++transfers_;
  bytes_ += bytes;
  return busy_until_ + config_.latency;
}

Clock::time_point LinkModel::busy_until() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_until_;
}

uint64_t LinkModel::transfers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return transfers_;
}

uint64_t LinkModel::bytes_posted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void LinkModel::SleepUntil(Clock::time_point t) {
  // steady_clock is CLOCK_MONOTONIC on Linux (libstdc++).
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  if (ns <= 0) return;
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

// ---------------------------------------------------------------------------
// LinkEmulationTransport

LinkEmulationTransport::LinkEmulationTransport(std::unique_ptr<Transport> inner,
                                               const core::LinkConfig& config)
    : inner_(std::move(inner)), name_(fmt::format("{}+link", inner_->name())), model_(config) {
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  event_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (timer_fd_ < 0 || event_fd_ < 0) {
    const int err = errno;
    if (timer_fd_ >= 0) close(timer_fd_);
    if (event_fd_ >= 0) close(event_fd_);
    throw Error(ErrorCode::kInternal,
                fmt::format("link emulation: cannot create its timer: {}", std::strerror(err)));
  }
  thread_ = std::thread([this] { Loop(); });
  MC2_LOG(kInfo, "link emulation on: {}", model_.Label());
}

LinkEmulationTransport::~LinkEmulationTransport() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  Kick();
  thread_.join();
  close(timer_fd_);
  close(event_fd_);
}

void LinkEmulationTransport::ArmLocked(Clock::time_point due) {
  // Absolute CLOCK_MONOTONIC (steady_clock's clock); a time in the past
  // fires at once, and zero would disarm, hence at least 1 ns. A timerfd
  // fires as late with the default timer slack as with the smallest, so the
  // thread needs no PR_SET_TIMERSLACK.
  const int64_t ns = std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::nanoseconds>(due.time_since_epoch()).count());
  itimerspec t{};
  t.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
  t.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
  timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &t, nullptr);
}

void LinkEmulationTransport::Kick() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(event_fd_, &one, sizeof(one));
}

void LinkEmulationTransport::Publish(uint64_t off, uint64_t value, size_t payload_bytes) {
  // Fast path: nothing queued, nothing to delay. Reading pending_ == 0
  // (acquire) means every earlier delayed store was delivered before ours.
  if (payload_bytes == 0 && pending_.load(std::memory_order_acquire) == 0)
    return inner_->Publish(off, value, 0);
  Submit(Kind::kPublish, inner_->rank(), off, value, payload_bytes);
}

void LinkEmulationTransport::RemoteAdd(int owner, uint64_t off, uint64_t value,
                                       size_t payload_bytes) {
  if (payload_bytes == 0 && pending_.load(std::memory_order_acquire) == 0)
    return inner_->RemoteAdd(owner, off, value, 0);
  Submit(Kind::kAdd, owner, off, value, payload_bytes);
}

void LinkEmulationTransport::Wake(int peer) {
  // Waking ourselves (our own progress threads) is local: never delayed.
  if (peer == inner_->rank() || pending_.load(std::memory_order_acquire) == 0)
    return inner_->Wake(peer);
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (pending_.load(std::memory_order_relaxed) != 0) {
      // Behind everything queued so far: the peer is woken to look at
      // something we published, and it must find it.
      Entry e{std::max(last_due_, Clock::now()), next_order_++, Kind::kWake, peer, 0, 0};
      bool first = queue_.empty() || Later()(queue_.top(), e);
      queue_.push(e);
      pending_.fetch_add(1, std::memory_order_relaxed);
      if (first) ArmLocked(e.due);
      return;
    }
  }
  inner_->Wake(peer);
}

void LinkEmulationTransport::Submit(Kind kind, int owner, uint64_t off, uint64_t value,
                                    size_t payload) {
  std::unique_lock<std::mutex> lock(mu_);
  const Clock::time_point now = Clock::now();
  auto it = words_.find(Word{owner, off});
  if (payload == 0 && it == words_.end()) {
    // Nothing of this word is in flight: no reason to wait.
    lock.unlock();
    if (kind == Kind::kPublish)
      inner_->Publish(off, value, 0);
    else
      inner_->RemoteAdd(owner, off, value, 0);
    return;
  }
  Clock::time_point due = payload ? model_.Post(payload, now) : now;
  if (it == words_.end()) it = words_.emplace(Word{owner, off}, WordState{}).first;
  // A word's updates are delivered in the order they were made.
  due = std::max(due, it->second.last_due);
  it->second.last_due = due;
  ++it->second.queued;
  last_due_ = std::max(last_due_, due);
  Entry e{due, next_order_++, kind, owner, off, value};
  bool first = queue_.empty() || Later()(queue_.top(), e);
  queue_.push(e);
  pending_.fetch_add(1, std::memory_order_relaxed);
  // Re-arms the delivery thread's timer instead of waking it: a wake-up
  // here would run that thread on this rank's CPU at once, and on a core
  // shared with another rank the caller would then wait out the other
  // rank's time slice. With a core per rank it saves a context switch pair
  // per transfer.
  if (first) ArmLocked(e.due);
}

void LinkEmulationTransport::Deliver(const Entry& e) {
  switch (e.kind) {
    case Kind::kPublish:
      inner_->Publish(e.off, e.value, 0);
      break;
    case Kind::kAdd:
      inner_->RemoteAdd(e.owner, e.off, e.value, 0);
      break;
    case Kind::kWake:
      inner_->Wake(e.owner);
      break;
  }
}

void LinkEmulationTransport::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!drained_.wait_for(lock, std::chrono::milliseconds(10),
                            [&] { return pending_.load(std::memory_order_relaxed) == 0; })) {
    // A failed world has no use for the model's timing: deliver at once
    // rather than make its teardown wait for a slow link.
    if (flush_) continue;
    lock.unlock();
    bool failed = false;
    try {
      inner_->CheckHealth(/*thorough=*/false);
    } catch (const Error&) {
      failed = true;
    }
    lock.lock();
    if (failed) {
      flush_ = true;
      Kick();
    }
  }
}

void LinkEmulationTransport::Loop() {
  pthread_setname_np(pthread_self(), "mc2-link");
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (queue_.empty()) {
      if (stop_) return;
    } else {
      const Entry top = queue_.top();
      if (stop_ || flush_ || top.due <= Clock::now()) {
        queue_.pop();
        lock.unlock();
        Deliver(top);
        lock.lock();
        if (top.kind != Kind::kWake) {
          auto it = words_.find(Word{top.owner, top.off});
          if (--it->second.queued == 0) words_.erase(it);
        }
        if (pending_.fetch_sub(1, std::memory_order_release) == 1) drained_.notify_all();
        continue;
      }
      ArmLocked(top.due);
    }
    // Sleeps in the kernel until the earliest due time (the timer, which
    // Submit re-arms for an earlier entry) or a stop / flush (the event).
    lock.unlock();
    pollfd fds[2] = {{timer_fd_, POLLIN, 0}, {event_fd_, POLLIN, 0}};
    while (poll(fds, 2, -1) < 0 && errno == EINTR) {
    }
    uint64_t drain;
    [[maybe_unused]] ssize_t n = read(timer_fd_, &drain, sizeof(drain));
    n = read(event_fd_, &drain, sizeof(drain));
    lock.lock();
  }
}

std::unique_ptr<Transport> WrapWithLinkEmulation(std::unique_ptr<Transport> inner,
                                                 const core::LinkConfig& config) {
  if (!config.enabled) return inner;
  return std::make_unique<LinkEmulationTransport>(std::move(inner), config);
}

}  // namespace mc2::transport
