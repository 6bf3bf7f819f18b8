// `mc2 run`: see launcher.h.
//
// Structure: one single-threaded event loop around poll(). SIGCHLD, SIGINT,
// SIGTERM and SIGHUP are blocked and read from a signalfd, so signals arrive
// as ordinary events next to the ranks' output pipes and nothing happens in
// signal-handler context. The loop sleeps in poll() with no timeout unless a
// deadline (the SIGKILL after the grace period, the end of the output drain)
// is armed, so the launcher uses no CPU while the job runs.
#include "launcher.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <utility>

#include "core/env.h"
#include "launch_support.h"
#include "mc2/error.h"
#include "transport/shm/job.h"

extern char** environ;

namespace mc2::tools {
namespace {

using Clock = std::chrono::steady_clock;

// Once every rank has exited, their output pipes normally reach EOF at once.
// A process that escaped the rank's process group could hold a pipe open
// forever, so stop waiting for EOF once the pipes stayed idle this long.
constexpr auto kDrainTime = std::chrono::milliseconds(500);
// A line longer than this is emitted in pieces, each with its own prefix,
// rather than buffered without bound.
constexpr size_t kMaxLineBytes = 64 * 1024;

// Writes all of `data` to `fd`, waiting if the descriptor is non-blocking and
// full. Returns false if the descriptor is broken (e.g. EPIPE: the reader of
// our stdout went away); the caller then stops writing to it.
bool WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd p = {fd, POLLOUT, 0};
      poll(&p, 1, -1);
    } else {
      return false;
    }
  }
  return true;
}

template <typename... Args>
void Say(fmt::format_string<Args...> format, Args&&... args) {
  std::string line = "mc2 run: ";
  fmt::format_to(std::back_inserter(line), format, std::forward<Args>(args)...);
  line += '\n';
  WriteAll(STDERR_FILENO, line);
}

const char* NonEmptyEnv(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

// The ranks inherit descriptors by number, so 0, 1 and 2 must be taken
// before the segments are created: otherwise a launcher started with a
// closed stdin would hand out fd 0 as a segment and then clobber it.
void EnsureStandardDescriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      open("/dev/null", O_RDWR);  // takes the lowest free number: `fd`
    }
  }
}

struct RankProcess {
  pid_t pid = -1;
  bool started = false;
  bool running = false;
  bool exited = false;  // true: WIFEXITED; false: killed by a signal
  int value = 0;        // exit status or signal number
  int signal_sent = 0;  // last signal the launcher sent to it, 0 if none

  bool Failed() const { return started && !running && (!exited || value); }
};

struct OutputStream {
  int fd = -1;  // read end of the rank's pipe; -1 once closed
  int rank = 0;
  int target = STDOUT_FILENO;
  std::string prefix;
  std::string pending;  // incomplete last line (prefix mode only)
  ImportFailureScan imports;  // stderr only: a failed `import torch` or `import mc2`
};

// Everything the child needs between fork and exec, prepared beforehand so
// that the child only makes system calls.
struct ChildSetup {
  pid_t launcher_pid;
  int out_fd;
  int err_fd;
  bool stdin_from_null;
  char* const* argv;
  char* const* envp;
  const sigset_t* mask;
  const struct sigaction* sigpipe_action;
};

[[noreturn]] void ExecRank(const ChildSetup& c) {
  // Own process group: a terminal's Ctrl-C reaches only the launcher, which
  // then terminates the ranks in order, and the launcher can kill a rank
  // together with any processes it started.
  setpgid(0, 0);
  // Die with the launcher, even if it is SIGKILLed. If it died before the
  // prctl took effect, getppid() no longer names it: give up now.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != c.launcher_pid) {
    _exit(kExitLaunchFailed);
  }
  // A no-op for a rank that writes to our stdout and stderr.
  if (dup2(c.out_fd, STDOUT_FILENO) < 0 || dup2(c.err_fd, STDERR_FILENO) < 0) {
    _exit(kExitLaunchFailed);
  }
  if (c.stdin_from_null) {
    const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
  }
  // Undo the launcher's signal setup: an ignored SIGPIPE and a blocked mask
  // would both survive exec.
  sigaction(SIGPIPE, c.sigpipe_action, nullptr);
  sigprocmask(SIG_SETMASK, c.mask, nullptr);
  execvpe(c.argv[0], c.argv, c.envp);
  const int err = errno;
  char message[1024];
  const int n = std::snprintf(message, sizeof(message), "mc2 run: cannot execute '%s': %s\n",
                              c.argv[0], std::strerror(err));
  if (n > 0) {
    [[maybe_unused]] ssize_t ignored =
        write(STDERR_FILENO, message, std::min<size_t>(n, sizeof(message) - 1));
  }
  _exit(kExitCannotExecute);
}

// "0-3,5,7-8"
std::string FormatRanks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

// Whether ranks may write to our stdout and stderr directly: not if either
// is a terminal that stops background process groups writing to it
// (TOSTOP), since every rank runs in a process group of its own.
bool DirectOutputIsSafe() {
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    termios t{};
    if (isatty(fd) && (tcgetattr(fd, &t) != 0 || (t.c_lflag & TOSTOP) != 0)) return false;
  }
  return true;
}

class Launcher {
 public:
  Launcher(const LaunchOptions& options, size_t heap_bytes, std::string dir)
      : options_(options), heap_bytes_(heap_bytes), dir_(std::move(dir)) {}
  ~Launcher();

  int Run();

 private:
  bool SetUpSignals();
  void StartRanks();
  void Loop();
  void HandleSignals();
  void Reap();
  void OnRankFailure(int rank);
  void OnInterrupt(int sig);
  void SignalRunning(int sig);
  void ArmKillDeadline();
  void ReadStream(OutputStream& stream);
  void Emit(OutputStream& stream, const char* data, size_t size);
  void CloseStream(OutputStream& stream);
  void Output(int target, std::string_view data);
  void PrintSummary();
  void PrintImportHint();
  std::string Describe(const RankProcess& rank) const;
  bool AnyRunning() const;
  std::vector<std::string> ChildEnvironment(int rank) const;
  bool OpenOutputPipes(int rank, int out[2], int err[2]);

  const LaunchOptions& options_;
  // options_.direct_output, unless a terminal forbids it.
  const bool direct_output_ = options_.direct_output && DirectOutputIsSafe();
  const size_t heap_bytes_;
  const std::string dir_;
  std::string job_id_;
  int master_port_ = -1;  // MASTER_PORT of the ranks
  shm::JobSegments segments_;
  std::vector<RankProcess> ranks_;
  std::vector<OutputStream> streams_;
  bool output_broken_[3] = {false, false, false};

  int signal_fd_ = -1;
  bool signals_set_up_ = false;
  sigset_t old_mask_;
  struct sigaction old_sigpipe_;

  std::optional<int> exit_code_;  // decided by the first abnormal event
  int first_failed_rank_ = -1;
  int interrupt_signal_ = 0;
  bool launch_error_ = false;
  std::optional<Clock::time_point> kill_deadline_;
  std::optional<Clock::time_point> drain_deadline_;
};

Launcher::~Launcher() {
  for (auto& stream : streams_) {
    if (stream.fd >= 0) close(stream.fd);
  }
  shm::CloseJobSegments(segments_);
  if (signal_fd_ >= 0) close(signal_fd_);
  if (signals_set_up_) {
    sigaction(SIGPIPE, &old_sigpipe_, nullptr);
    sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
  }
}

int Launcher::Run() {
  try {
    segments_ = shm::CreateJobSegments(options_.nranks, heap_bytes_, dir_);
  } catch (const Error& e) {
    Say("{}", e.what());
    return e.code() == ErrorCode::kInvalidArgument ? kExitUsage : kExitLaunchFailed;
  }
  std::random_device device;
  job_id_ = fmt::format("{}-{:08x}", getpid(), device());
  std::string port_error;
  master_port_ = FreeLoopbackPort(&port_error);
  if (master_port_ < 0) {
    Say("cannot pick a free port for MASTER_PORT: {}", port_error);
    return kExitLaunchFailed;
  }
  if (!SetUpSignals()) return kExitLaunchFailed;
  StartRanks();
  Loop();
  if (first_failed_rank_ >= 0 || interrupt_signal_ != 0 || launch_error_) {
    PrintSummary();
  }
  if (exit_code_.value_or(0) != 0) PrintImportHint();
  return exit_code_.value_or(0);
}

bool Launcher::SetUpSignals() {
  // Blocked before the first fork, so no SIGCHLD can be lost; the signalfd
  // then reports them (and SIGINT/SIGTERM/SIGHUP) as readable events.
  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled, sig);
  if (sigprocmask(SIG_BLOCK, &handled, &old_mask_) != 0) {
    Say("cannot block signals: {}", std::strerror(errno));
    return false;
  }
  // A closed stdout must not kill the launcher (and with it, the job): the
  // job runs on and its output is dropped.
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &old_sigpipe_);
  signals_set_up_ = true;
  signal_fd_ = signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0) {
    Say("cannot create a signalfd: {}", std::strerror(errno));
    return false;
  }
  return true;
}

// Close-on-exec, so that no rank holds another rank's pipe (which would
// delay that pipe's EOF until every rank has exited).
bool Launcher::OpenOutputPipes(int rank, int out[2], int err[2]) {
  if (pipe2(out, O_CLOEXEC) != 0) {
    Say("cannot create a pipe for rank {}: {}", rank, std::strerror(errno));
    return false;
  }
  if (pipe2(err, O_CLOEXEC) != 0) {
    Say("cannot create a pipe for rank {}: {}", rank, std::strerror(errno));
    close(out[0]);
    close(out[1]);
    return false;
  }
  return true;
}

std::vector<std::string> Launcher::ChildEnvironment(int rank) const {
  static constexpr std::string_view kOwned[] = {
      "MC2_RANK=",   "MC2_WORLD_SIZE=", "MC2_LOCAL_RANK=",  "MC2_LOCAL_SIZE=",
      "MC2_JOB_ID=", "MC2_SHM_FDS=",    "MC2_HEAP_BYTES=",  "RANK=",
      "WORLD_SIZE=", "LOCAL_RANK=",     "LOCAL_WORLD_SIZE=", "MASTER_ADDR=",
      "MASTER_PORT="};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const bool owned = std::any_of(std::begin(kOwned), std::end(kOwned),
                                   [&](std::string_view key) { return entry.starts_with(key); });
    const bool overridden = !options_.bind.empty() && entry.starts_with("MC2_BIND=");
    if (!owned && !overridden) env.emplace_back(entry);
  }
  std::string fds = fmt::format("{}", segments_.control_fd);
  for (int fd : segments_.heap_fds) fds += fmt::format(",{}", fd);
  env.push_back(fmt::format("MC2_RANK={}", rank));
  env.push_back(fmt::format("MC2_WORLD_SIZE={}", options_.nranks));
  env.push_back(fmt::format("MC2_LOCAL_RANK={}", rank));
  env.push_back(fmt::format("MC2_LOCAL_SIZE={}", options_.nranks));
  env.push_back(fmt::format("MC2_JOB_ID={}", job_id_));
  env.push_back(fmt::format("MC2_SHM_FDS={}", fds));
  env.push_back(fmt::format("MC2_HEAP_BYTES={}", segments_.heap_bytes));
  // Each rank binds its own threads (core/placement.h), as under mpirun.
  if (!options_.bind.empty()) env.push_back(fmt::format("MC2_BIND={}", options_.bind));
  // torchrun's names, so that programs written for it run unchanged.
  env.push_back(fmt::format("RANK={}", rank));
  env.push_back(fmt::format("WORLD_SIZE={}", options_.nranks));
  env.push_back(fmt::format("LOCAL_RANK={}", rank));
  env.push_back(fmt::format("LOCAL_WORLD_SIZE={}", options_.nranks));
  // torch.distributed's env:// rendezvous (init_process_group's default):
  // rank 0 opens its store on this port.
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back(fmt::format("MASTER_PORT={}", master_port_));
  return env;
}

void Launcher::StartRanks() {
  std::vector<char*> argv;
  for (const auto& arg : options_.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  const pid_t launcher_pid = getpid();
  // Rank 0 may read a piped stdin; a terminal is never handed to the ranks,
  // which run in background process groups (reading it would stop them).
  const bool stdin_is_tty = isatty(STDIN_FILENO);

  ranks_.resize(options_.nranks);
  for (int r = 0; r < options_.nranks; ++r) {
    const std::vector<std::string> env = ChildEnvironment(r);
    std::vector<char*> envp;
    for (const auto& entry : env) envp.push_back(const_cast<char*>(entry.c_str()));
    envp.push_back(nullptr);

    // The rank's stdout and stderr: ours, or pipes we relay.
    int out[2] = {-1, STDOUT_FILENO}, err[2] = {-1, STDERR_FILENO};
    const bool relay = !direct_output_;
    if (relay && !OpenOutputPipes(r, out, err)) {
      launch_error_ = true;
      break;
    }
    const ChildSetup setup{launcher_pid, out[1],      err[1],     r != 0 || stdin_is_tty,
                           argv.data(),  envp.data(), &old_mask_, &old_sigpipe_};
    const pid_t pid = fork();
    if (pid == 0) ExecRank(setup);
    const int fork_errno = errno;
    if (relay) {
      close(out[1]);
      close(err[1]);
    }
    if (pid < 0) {
      if (relay) {
        close(out[0]);
        close(err[0]);
      }
      Say("cannot start rank {}: fork failed: {}", r, std::strerror(fork_errno));
      launch_error_ = true;
      break;
    }
    // Also set the group from this side, so that it exists before the first
    // kill(-pid) whichever process runs first. EACCES (the child already
    // exec'd, having set it itself) is fine.
    setpgid(pid, pid);
    ranks_[r].pid = pid;
    ranks_[r].started = true;
    ranks_[r].running = true;
    // The ranks store their pid too; storing it here as well lets a rank
    // watch a peer that died before it got that far.
    segments_.control->pids[r].store(pid, std::memory_order_release);
    if (!relay) continue;
    for (auto [fd, target] : {std::pair{out[0], STDOUT_FILENO}, std::pair{err[0], STDERR_FILENO}}) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
      OutputStream stream;
      stream.fd = fd;
      stream.rank = r;
      stream.target = target;
      stream.prefix = fmt::format("[{}] ", r);
      streams_.push_back(std::move(stream));
    }
  }
  if (launch_error_) {
    exit_code_ = kExitLaunchFailed;
    shm::RecordFailure(segments_.control, -1, shm::FailureKind::kLauncher, 0,
                       "mc2 run could not start every rank");
    SignalRunning(SIGKILL);
  }
}

bool Launcher::AnyRunning() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const RankProcess& r) { return r.running; });
}

void Launcher::Loop() {
  std::vector<struct pollfd> fds;
  std::vector<OutputStream*> polled;
  while (true) {
    const bool running = AnyRunning();
    const bool open = std::any_of(streams_.begin(), streams_.end(),
                                  [](const OutputStream& s) { return s.fd >= 0; });
    if (!running && !open) break;
    const Clock::time_point now = Clock::now();
    if (!running && !drain_deadline_) drain_deadline_ = now + kDrainTime;

    int timeout_ms = -1;  // sleep until something happens
    for (const auto& deadline : {kill_deadline_, drain_deadline_}) {
      if (!deadline) continue;
      // Rounded up: waking a little late is fine, spinning on 0 ms is not.
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - now);
      const int ms = static_cast<int>(std::max<int64_t>(left.count(), 0));
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    }

    fds.clear();
    polled.clear();
    fds.push_back({signal_fd_, POLLIN, 0});
    for (auto& stream : streams_) {
      if (stream.fd < 0) continue;
      fds.push_back({stream.fd, POLLIN, 0});
      polled.push_back(&stream);
    }
    const int ready = poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) {
      // Cannot happen with valid descriptors; never leave the job behind.
      Say("poll failed: {}; killing the ranks", std::strerror(errno));
      SignalRunning(SIGKILL);
      for (auto& rank : ranks_) {
        if (rank.running) waitpid(rank.pid, nullptr, 0);
        rank.running = false;
      }
      if (!exit_code_) exit_code_ = kExitLaunchFailed;
      return;
    }
    if (ready > 0) {
      if (fds[0].revents != 0) HandleSignals();
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents != 0) ReadStream(*polled[i - 1]);
      }
    }
    const Clock::time_point after = Clock::now();
    if (kill_deadline_ && after >= *kill_deadline_) {
      kill_deadline_.reset();
      SignalRunning(SIGKILL);
    }
    if (drain_deadline_ && after >= *drain_deadline_) {
      for (auto& stream : streams_) {
        if (stream.fd >= 0) CloseStream(stream);
      }
    }
  }
}

void Launcher::HandleSignals() {
  struct signalfd_siginfo info;
  while (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
    if (info.ssi_signo != SIGCHLD) OnInterrupt(static_cast<int>(info.ssi_signo));
  }
  // SIGCHLDs coalesce, so reap whatever has exited, not one per signal.
  Reap();
}

void Launcher::Reap() {
  // Rank by rank rather than waitpid(-1): the calling process (e.g. `mc2
  // bench`) may have children of its own whose status is not ours to take.
  for (auto it = ranks_.begin(); it != ranks_.end(); ++it) {
    if (!it->running) continue;
    int status;
    const pid_t pid = waitpid(it->pid, &status, WNOHANG);
    if (pid != it->pid) continue;
    if (WIFEXITED(status)) {
      it->exited = true;
      it->value = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      it->exited = false;
      it->value = WTERMSIG(status);
    } else {
      continue;
    }
    it->running = false;
    // Kill whatever the rank left in its process group (e.g. the children of
    // a shell): it would outlive the job and hold the output pipes open. The
    // group id cannot have been reused: a pid is not recycled while its
    // process group has members.
    kill(-pid, SIGKILL);
    if (it->Failed() && first_failed_rank_ < 0 && interrupt_signal_ == 0 && !launch_error_) {
      OnRankFailure(static_cast<int>(it - ranks_.begin()));
    }
  }
}

// The state of a rank for the summary, e.g. "exited with status 3".
std::string Launcher::Describe(const RankProcess& rank) const {
  if (!rank.started) return "not started";
  if (rank.running) return "still running";
  if (rank.exited) return fmt::format("exited with status {}", rank.value);
  if (rank.signal_sent == rank.value) {
    return fmt::format("terminated by mc2 run ({})", SignalName(rank.value));
  }
  return fmt::format("killed by signal {} ({})", rank.value, strsignal(rank.value));
}

void Launcher::OnRankFailure(int r) {
  const RankProcess& rank = ranks_[r];
  first_failed_rank_ = r;
  exit_code_ = rank.exited ? rank.value : 128 + rank.value;
  const std::string what =
      fmt::format("rank {} (pid {}) {}{}", r, rank.pid, rank.exited ? "" : "was ", Describe(rank));
  // Ranks blocked in mc2 waits see `aborted` and raise mc2::Error.
  shm::RecordFailure(segments_.control, r,
                     rank.exited ? shm::FailureKind::kExit : shm::FailureKind::kSignal, rank.value,
                     what);
  if (AnyRunning()) {
    Say("{}; terminating the other ranks", what);
    ArmKillDeadline();
  } else {
    Say("{}", what);
  }
}

void Launcher::OnInterrupt(int sig) {
  if (interrupt_signal_ != 0) {
    // A second Ctrl-C: the user does not want to wait for the grace period.
    Say("received {} again; killing the ranks", SignalName(sig));
    kill_deadline_.reset();
    SignalRunning(SIGKILL);
    return;
  }
  interrupt_signal_ = sig;
  if (!exit_code_) exit_code_ = 128 + sig;
  shm::RecordFailure(segments_.control, -1, shm::FailureKind::kLauncher, sig,
                     fmt::format("mc2 run received {}", SignalName(sig)));
  if (!AnyRunning()) return;
  Say("received {}; terminating the ranks", SignalName(sig));
  SignalRunning(SIGTERM);
  ArmKillDeadline();
}

void Launcher::ArmKillDeadline() {
  const auto grace = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.grace_seconds));
  const Clock::time_point deadline = Clock::now() + grace;
  if (!kill_deadline_ || deadline < *kill_deadline_) kill_deadline_ = deadline;
}

void Launcher::SignalRunning(int sig) {
  for (auto& rank : ranks_) {
    if (!rank.running) continue;
    // The whole group, so a rank's own children go too; the pid alone in
    // case the rank moved itself to another group.
    kill(-rank.pid, sig);
    kill(rank.pid, sig);
    rank.signal_sent = sig;
  }
}

void Launcher::Output(int target, std::string_view data) {
  if (output_broken_[target] || data.empty()) return;
  if (!WriteAll(target, data)) output_broken_[target] = true;
}

void Launcher::ReadStream(OutputStream& stream) {
  char buffer[64 * 1024];
  const ssize_t n = read(stream.fd, buffer, sizeof(buffer));
  if (n > 0) {
    Emit(stream, buffer, static_cast<size_t>(n));
    // Still flowing after the ranks exited (we were slow to read, or a
    // descendant escaped their process groups): keep draining.
    if (drain_deadline_) drain_deadline_ = Clock::now() + kDrainTime;
  } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
    CloseStream(stream);
  }
}

void Launcher::Emit(OutputStream& stream, const char* data, size_t size) {
  if (stream.target == STDERR_FILENO) stream.imports.Feed(std::string_view(data, size));
  if (!options_.prefix_output) {
    Output(stream.target, std::string_view(data, size));
    return;
  }
  stream.pending.append(data, size);
  // Complete lines only, in one write, so that lines of different ranks
  // never interleave mid-line.
  std::string out;
  size_t start = 0;
  for (size_t nl; (nl = stream.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    out += stream.prefix;
    out.append(stream.pending, start, nl + 1 - start);
  }
  stream.pending.erase(0, start);
  if (stream.pending.size() >= kMaxLineBytes) {
    out += stream.prefix;
    out += stream.pending;
    out += '\n';
    stream.pending.clear();
  }
  Output(stream.target, out);
}

void Launcher::CloseStream(OutputStream& stream) {
  if (!stream.pending.empty()) {
    // A last line without its newline: flush it, terminated, so that the
    // next prefix starts on a line of its own.
    Output(stream.target, stream.prefix + stream.pending + "\n");
    stream.pending.clear();
  }
  close(stream.fd);
  stream.fd = -1;
}

void Launcher::PrintSummary() {
  const shm::JobControl* ctl = segments_.control;
  if (ctl != nullptr && ctl->aborted.load(std::memory_order_acquire) == 1 &&
      ctl->failure_kind.load(std::memory_order_relaxed) ==
          static_cast<int32_t>(shm::FailureKind::kAbort)) {
    Say("rank {} aborted the job: {}", ctl->failed_rank.load(std::memory_order_relaxed),
        ctl->reason);
  }
  // Ranks in the same state are listed together: the summary stays short for
  // large jobs.
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
    std::string state = Describe(ranks_[r]);
    if (r == first_failed_rank_) state += " (first failure)";
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == state; });
    if (it == groups.end()) {
      groups.emplace_back(std::move(state), std::vector<int>{r});
    } else {
      it->second.push_back(r);
    }
  }
  Say("summary of the {} ranks:", ranks_.size());
  for (const auto& [state, members] : groups) {
    Say("  {} {}: {}", members.size() == 1 ? "rank" : "ranks", FormatRanks(members), state);
  }
}

// A Python program that could not import torch or mc2 most often ran
// another interpreter than the one mc2 is built for (the first python3 on
// PATH): say which one ran.
void Launcher::PrintImportHint() {
  for (const auto& stream : streams_) {
    if (!stream.imports.module()) continue;
    Say("{}", ImportFailureHint(stream.rank, *stream.imports.module(), options_.argv[0],
                                options_.nranks));
    return;
  }
}

}  // namespace

int RunLaunch(const LaunchOptions& options) {
  if (options.nranks < 1 || options.nranks > shm::kMaxRanks) {
    Say("invalid number of ranks {}: expected 1 to {}", options.nranks, shm::kMaxRanks);
    return kExitUsage;
  }
  if (options.argv.empty() || options.argv[0].empty()) {
    Say("missing PROGRAM: usage: mc2 run -n N [--] PROGRAM [ARGS...]");
    return kExitUsage;
  }
  if (!(options.grace_seconds >= 0.0) || !std::isfinite(options.grace_seconds)) {
    Say("invalid grace period {} s: expected a non-negative number", options.grace_seconds);
    return kExitUsage;
  }

  // Every MC2_* variable the ranks read, checked once here rather than
  // reported by each rank after the job has started.
  try {
    core::ValidateEnvironment();
  } catch (const Error& e) {
    Say("{}", e.message());
    return kExitUsage;
  }

  // MC2_HEAP_BYTES has passed the ranks' own parser above; 0 is valid for
  // the library (no heap) but not for a job.
  const size_t heap_bytes = options.heap_bytes != 0
                                ? options.heap_bytes
                                : core::EnvBytes("MC2_HEAP_BYTES", kDefaultHeapBytes);
  if (heap_bytes == 0) {
    Say("MC2_HEAP_BYTES='{}' is invalid: expected a positive byte count per rank such as "
        "268435456, 64K, 256M or 2G",
        NonEmptyEnv("MC2_HEAP_BYTES"));
    return kExitUsage;
  }

  std::string dir = options.shm_dir;
  std::string dir_source = "the shared-memory directory";
  if (dir.empty()) {
    if (const char* value = NonEmptyEnv("MC2_SHM_DIR")) {
      dir = value;
      dir_source = "MC2_SHM_DIR";
    } else {
      dir = kDefaultShmDir;
    }
  }
  struct stat st;
  const char* dir_problem = nullptr;
  if (stat(dir.c_str(), &st) != 0) {
    dir_problem = std::strerror(errno);
  } else if (!S_ISDIR(st.st_mode)) {
    dir_problem = "not a directory";
  }
  if (dir_problem != nullptr) {
    Say("invalid {}='{}': {}; expected an existing directory, ideally on a "
        "tmpfs such as /dev/shm",
        dir_source, dir, dir_problem);
    return kExitUsage;
  }

  if (int err = 0; ResolveProgram(options.argv[0], &err).empty()) {
    Say("cannot execute '{}': {}", options.argv[0], std::strerror(err));
    return kExitCannotExecute;
  }

  EnsureStandardDescriptors();
  Launcher launcher(options, heap_bytes, std::move(dir));
  return launcher.Run();
}

std::string SelfExe() {
  char buf[PATH_MAX];
  const ssize_t len = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (len <= 0) return "/proc/self/exe";
  return std::string(buf, static_cast<size_t>(len));
}

}  // namespace mc2::tools
