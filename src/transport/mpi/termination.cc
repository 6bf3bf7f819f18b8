#include "transport/mpi/termination.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "mc2/error.h"

namespace mc2::transport::mpi {
namespace {

int g_pipe[2] = {-1, -1};
// When SIGTERM arrived (steady clock, ns; 0: not yet).
std::atomic<int64_t> g_term_ns{0};

// Async-signal-safe: one byte into the pipe wakes the watcher.
void OnTerm(int) {
  const int saved = errno;
  char c = 1;
  [[maybe_unused]] ssize_t n = write(g_pipe[1], &c, 1);
  errno = saved;
}

void Watch(std::weak_ptr<MpiTransport> weak) {
  char c;
  while (read(g_pipe[0], &c, 1) < 0 && errno == EINTR) {
  }
  const auto start = std::chrono::steady_clock::now();
  g_term_ns.store(start.time_since_epoch().count(), std::memory_order_release);
  if (auto tx = weak.lock()) {
    while (!tx->failed() && std::chrono::steady_clock::now() - start < kGraceWait)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!tx->failed())
      tx->Abort(Error(ErrorCode::kAborted,
                      "terminated by the launcher (SIGTERM) before any rank reported a "
                      "failure: mpirun terminates every rank when one of them dies, "
                      "and its own message names that rank",
                      tx->rank()));
  }
  std::this_thread::sleep_until(start + kGraceExit);
  signal(SIGTERM, SIG_DFL);
  raise(SIGTERM);
}

// At exit during the grace: wait for its end before the MPI transport's exit
// handler runs, which after a failure calls MPI_Abort, and that makes
// mpirun kill at once the ranks still printing their error.
void WaitForGraceAtExit() {
  const int64_t t = g_term_ns.load(std::memory_order_acquire);
  if (t == 0) return;
  std::this_thread::sleep_until(std::chrono::steady_clock::time_point(
                                    std::chrono::steady_clock::duration(t)) +
                                kGraceExit);
}

}  // namespace

void InstallTerminationGrace(const std::shared_ptr<MpiTransport>& tx) {
  static std::once_flag once;
  std::call_once(once, [&] {
    struct sigaction old {};
    if (sigaction(SIGTERM, nullptr, &old) != 0 || old.sa_handler != SIG_DFL ||
        (old.sa_flags & SA_SIGINFO))
      return;
    if (pipe2(g_pipe, O_CLOEXEC) != 0) return;
    std::thread(Watch, std::weak_ptr<MpiTransport>(tx)).detach();
    std::atexit(WaitForGraceAtExit);  // runs before FinalizeAtExit's handler
    struct sigaction sa {};
    sa.sa_handler = OnTerm;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, nullptr);
  });
}

}  // namespace mc2::transport::mpi
