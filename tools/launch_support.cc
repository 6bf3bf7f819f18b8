// `mc2 run`'s helpers: see launch_support.h.
#include "launch_support.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace mc2::tools {
namespace {

// A line longer than this is not a Python exception line worth keeping.
constexpr size_t kMaxScanLine = 4096;

}  // namespace

int FreeLoopbackPort(std::string* error) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = fmt::format("cannot create a socket: {}", std::strerror(errno));
    return -1;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    *error = fmt::format("cannot bind a socket to 127.0.0.1: {}", std::strerror(errno));
  } else {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::string ResolveProgram(const std::string& program, int* err) {
  auto usable = [](const std::string& path, int* e) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      if (errno == EACCES) *e = EACCES;
      return false;
    }
    if (!S_ISREG(st.st_mode) || access(path.c_str(), X_OK) != 0) {
      *e = EACCES;
      return false;
    }
    return true;
  };
  *err = ENOENT;
  if (program.empty()) return "";
  if (program.find('/') != std::string::npos) {
    if (!usable(program, err)) return "";
    *err = 0;
    return program;
  }
  const char* path_env = std::getenv("PATH");
  const std::string_view path = path_env != nullptr ? path_env : "/bin:/usr/bin";
  size_t start = 0;
  while (true) {
    const size_t end = std::min(path.find(':', start), path.size());
    const std::string_view dir = path.substr(start, end - start);
    std::string candidate(dir.empty() ? std::string_view(".") : dir);
    candidate += '/';
    candidate += program;
    if (usable(candidate, err)) {
      *err = 0;
      return candidate;
    }
    if (end == path.size()) return "";
    start = end + 1;
  }
}

void ImportFailureScan::Feed(std::string_view data) {
  if (module_) return;
  while (!data.empty()) {
    const size_t nl = data.find('\n');
    if (nl == std::string_view::npos) {
      if (pending_.size() + data.size() <= kMaxScanLine) pending_.append(data);
      return;
    }
    if (pending_.size() + nl <= kMaxScanLine) {
      pending_.append(data.substr(0, nl));
      ScanLine(pending_);
    }
    pending_.clear();
    data.remove_prefix(nl + 1);
    if (module_) return;
  }
}

void ImportFailureScan::ScanLine(std::string_view line) {
  if (!line.starts_with("ModuleNotFoundError:") && !line.starts_with("ImportError:")) return;
  // "No module named 'torch'", "... named 'torch.distributed'", "cannot
  // import name 'x' from 'mc2' (...)", "libtorch_cpu.so: cannot open ...".
  for (const char* module : {"torch", "mc2"}) {
    for (const std::string& form :
         {fmt::format("'{}'", module), fmt::format("'{}.", module), fmt::format("lib{}", module)}) {
      if (line.find(form) != std::string_view::npos) {
        module_ = module;
        return;
      }
    }
  }
}

std::string ImportFailureHint(int rank, const std::string& module, const std::string& program,
                              int nranks) {
  int err = 0;
  std::string resolved = ResolveProgram(program, &err);
  if (resolved.empty()) resolved = program;
  char real[PATH_MAX];
  std::string ran = resolved;
  if (realpath(resolved.c_str(), real) != nullptr && resolved != real) {
    ran = fmt::format("{} (-> {})", resolved, real);
  }
  return fmt::format(
      "rank {} could not import {}; it ran '{}', which is {}.\n"
      "mc2 run: mc2's Python package and torch are built for /usr/bin/python3: run "
      "`mc2 run -n {} /usr/bin/python3 ...`, with PYTHONPATH=<build>/python unless mc2 is "
      "installed (docs/python.md)",
      rank, module, program, ran, nranks);
}

}  // namespace mc2::tools
