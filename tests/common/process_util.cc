#include "common/process_util.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace mc2::testing {

const std::string kMc2 = MC2_BINARY_DIR "/tools/mc2";

std::string TestProgram(const std::string& name) {
  return MC2_BINARY_DIR "/tests/test_prog_" + name;
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Lines of `text` that start with `prefix`, in order.
std::vector<std::string> LinesWithPrefix(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  for (auto& line : Lines(text)) {
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
  }
  return out;
}

std::set<std::string> ShmEntries() {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("mc2-", 0) == 0) names.insert(name);
  }
  return names;
}

// True if `pid` has ended. A zombie counts as gone: it runs no code and
// holds no memory, and whether it is reaped depends on whoever is pid 1.
bool ProcessGone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content;
  if (!stat || !std::getline(stat, content)) return true;
  const size_t paren = content.rfind(')');
  return paren == std::string::npos || paren + 2 >= content.size() || content[paren + 2] == 'Z' ||
         content[paren + 2] == 'X';
}

bool WaitUntilGone(const std::vector<pid_t>& pids, double seconds) {
  const auto start = Clock::now();
  while (true) {
    if (std::all_of(pids.begin(), pids.end(), ProcessGone)) return true;
    if (SecondsSince(start) > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}




Launch Spawn(const std::vector<std::string>& args, EnvOverrides env) {
  return SpawnProgram(kMc2, args, std::move(env));
}

EnvOverrides MpiRankEnv(EnvOverrides env) {
  const char* asan = std::getenv("ASAN_OPTIONS");  // ignored by other builds
  env["ASAN_OPTIONS"] = (asan ? std::string(asan) + ":" : std::string()) + "detect_leaks=0";
  return env;
}

std::vector<std::string> MpirunOnThisHost(int ranks, std::vector<std::string> program) {
  std::vector<std::string> args = {"--allow-run-as-root", "--oversubscribe", "-np",
                                   std::to_string(ranks), "--mca", "btl", "self,tcp", "--mca",
                                   "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"};
  args.insert(args.end(), program.begin(), program.end());
  return args;
}

Launch SpawnProgram(const std::string& program, const std::vector<std::string>& args,
                    EnvOverrides env) {
  // Cheap jobs by default, and no MC2_* from the caller's environment.
  EnvOverrides all = {{"MC2_HEAP_BYTES", std::to_string(kTestHeapBytes)},
                      {"MC2_SHM_DIR", std::nullopt},
                      {kJobTagVariable, JobTag()}};
  for (auto& [key, value] : env) all[key] = value;
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string key = entry.substr(0, entry.find('='));
    if (all.count(key) == 0 && key.rfind("MC2_", 0) != 0) {
      env_strings.push_back(entry);
    }
  }
  for (auto& [key, value] : all) {
    if (value) env_strings.push_back(key + "=" + *value);
  }
  std::vector<std::string> argv_strings = {program};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
  Launch launch;
  launch.start = Clock::now();
  launch.pid = fork();
  if (launch.pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    // A test runner started in the background may ignore SIGINT, and that
    // would be inherited: give the launcher default dispositions.
    for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD}) signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(argv[0], argv.data(), envp.data());
    _exit(126);
  }
  close(out[1]);
  close(err[1]);
  launch.out_fd = out[0];
  launch.err_fd = err[0];
  return launch;
}

// Collects the output and the exit status; kills the launcher if it is still
// running after `timeout` seconds (then timed_out is set).
Result Wait(Launch& launch, double timeout) {
  Result result;
  const auto deadline = launch.start + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout));
  int* fds[] = {&launch.out_fd, &launch.err_fd};
  std::string* sinks[] = {&result.out, &result.err};
  while (launch.out_fd >= 0 || launch.err_fd >= 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      kill(launch.pid, SIGKILL);
      break;
    }
    struct pollfd p[2];
    int n = 0;
    int which[2];
    for (int i = 0; i < 2; ++i) {
      if (*fds[i] >= 0) {
        p[n] = {*fds[i], POLLIN, 0};
        which[n++] = i;
      }
    }
    if (poll(p, n, static_cast<int>(left.count()) + 1) <= 0) continue;
    for (int k = 0; k < n; ++k) {
      if (p[k].revents == 0) continue;
      char buffer[4096];
      const ssize_t got = read(p[k].fd, buffer, sizeof(buffer));
      if (got > 0) {
        sinks[which[k]]->append(buffer, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        close(*fds[which[k]]);
        *fds[which[k]] = -1;
      }
    }
  }
  for (int* fd : fds) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
  int status = 0;
  while (waitpid(launch.pid, &status, 0) < 0 && errno == EINTR) {
  }
  launch.pid = -1;
  result.seconds = SecondsSince(launch.start);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

Result RunMc2(const std::vector<std::string>& args, EnvOverrides env, double timeout) {
  Launch launch = Spawn(args, std::move(env));
  return Wait(launch, timeout);
}

const std::string& JobTag() {
  static const std::string tag = std::to_string(getpid());
  return tag;
}

std::vector<pid_t> TaggedProcesses() {
  const std::string entry = std::string(kJobTagVariable) + "=" + JobTag();
  std::vector<pid_t> out;
  for (const auto& dir : std::filesystem::directory_iterator("/proc")) {
    const std::string name = dir.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    pid_t pid = std::stoi(name);
    if (pid == getpid() || ProcessGone(pid)) continue;
    std::ifstream env(dir.path() / "environ");
    std::string all((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    for (size_t pos = 0; pos < all.size();) {
      size_t end = all.find('\0', pos);
      if (end == std::string::npos) end = all.size();
      if (all.compare(pos, end - pos, entry) == 0) {
        out.push_back(pid);
        break;
      }
      pos = end + 1;
    }
  }
  return out;
}

void LeakCheckedTest::SetUp() { shm_before_ = ShmEntries(); }

void LeakCheckedTest::TearDown() {
  // Names exist for microseconds while a concurrent test's launcher creates
  // a job; only a name that stays is a leak.
  std::set<std::string> leaked;
  for (const auto& name : ShmEntries())
    if (shm_before_.count(name) == 0) leaked.insert(name);
  if (!leaked.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const std::set<std::string> now = ShmEntries();
    std::erase_if(leaked, [&](const std::string& name) { return now.count(name) == 0; });
  }
  EXPECT_TRUE(leaked.empty()) << "files left in /dev/shm";
  auto left = TaggedProcesses();
  EXPECT_TRUE(left.empty()) << left.size() << " process(es) outlived the test's jobs";
  for (pid_t p : left) kill(p, SIGKILL);
}

}  // namespace mc2::testing
