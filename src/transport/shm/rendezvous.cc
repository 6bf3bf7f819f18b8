#include "transport/shm/rendezvous.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/enforce.h"
#include "transport/shm/job.h"
#include "transport/shm/shm_transport.h"

namespace mc2::shm {
namespace {

// What identifies a machine: the kernel's boot id (network and UTS
// namespaces share it, so the ranks of a "host" of the cluster in a box are
// on one machine, as they are).
std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!(in >> id)) return "unknown";
  return id;
}

// One rank's message: "SIZE BOOT_ID" then, from rank 0, either
// "ok PID HEAP_BYTES CTL_FD HEAP_FD..." or "error CODE MESSAGE...".
struct Hello {
  int size = 0;
  std::string boot;
  bool created = false;
  ErrorCode code = ErrorCode::kInternal;
  std::string error;
  long pid = 0;
  size_t heap_bytes = 0;
  std::vector<int> fds;
};

Hello ParseHello(const std::string& text, int from, int rank) {
  std::istringstream in(text);
  Hello h;
  if (!(in >> h.size >> h.boot))
    throw Error(ErrorCode::kInternal,
                fmt::format("shared-memory rendezvous: rank {} sent an unreadable message '{}'",
                            from, text),
                rank, "init");
  std::string status;
  if (!(in >> status)) return h;
  if (status == "error") {
    int code = 0;
    in >> code;
    std::getline(in >> std::ws, h.error);
    h.code = static_cast<ErrorCode>(code);
    return h;
  }
  h.created = status == "ok";
  in >> h.pid >> h.heap_bytes;
  for (int fd; in >> fd;) h.fds.push_back(fd);
  return h;
}

// Opens rank 0's descriptor `fd` through /proc: the same open file, hence
// the same memory.
int OpenPeerFd(long pid, int fd, int rank) {
  const std::string path = fmt::format("/proc/{}/fd/{}", pid, fd);
  int out;
  do {
    out = open(path.c_str(), O_RDWR | O_CLOEXEC);
  } while (out < 0 && errno == EINTR);
  if (out < 0) {
    const int err = errno;
    throw Error(ErrorCode::kSystem,
                fmt::format("cannot open rank 0's shared-memory segment {} ({}): the ranks of a "
                            "host must run on one machine as one user",
                            path, std::strerror(err)),
                rank, "init");
  }
  return out;
}

}  // namespace

std::unique_ptr<transport::Transport> CreateRendezvousTransport(int rank, int size,
                                                                size_t heap_bytes,
                                                                const std::string& dir,
                                                                const AllGatherStrings& all_gather) {
  MC2_CHECK_ARG(size >= 1 && size <= kMaxRanks, "world size {} is out of range 1..{}", size,
                kMaxRanks);
  MC2_CHECK_ARG(rank >= 0 && rank < size, "rank {} is out of range 0..{}", rank, size - 1);
  const std::string boot = BootId();
  std::string mine = fmt::format("{} {}", size, boot);
  JobSegments segments;  // rank 0's
  struct Closer {
    JobSegments* s;
    ~Closer() { CloseJobSegments(*s); }
  } closer{&segments};
  if (rank == 0) {
    try {
      segments = CreateJobSegments(size, heap_bytes, dir);
      mine += fmt::format(" ok {} {} {}", getpid(), segments.heap_bytes, segments.control_fd);
      for (int fd : segments.heap_fds) mine += fmt::format(" {}", fd);
    } catch (const Error& e) {
      // The others learn why there is no world instead of waiting for one.
      mine += fmt::format(" error {} {}", static_cast<int>(e.code()), e.message());
    }
  }

  const std::vector<std::string> all = all_gather(mine);
  std::vector<Hello> hellos;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    hellos.push_back(ParseHello(all[r], r, rank));
    if (hellos.back().size != size)
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("the ranks disagree on the world size: rank {} expects a world of "
                              "{} ranks, rank {} a world of {}",
                              r, hellos.back().size, rank, size),
                  rank, "init");
  }
  if (static_cast<int>(all.size()) != size)
    throw Error(ErrorCode::kInternal,
                fmt::format("shared-memory rendezvous: the all-gather returned {} strings for a "
                            "world of {} ranks",
                            all.size(), size),
                rank, "init");
  const Hello& root = hellos[0];
  for (int r = 0; r < size; ++r) {
    const Hello& h = hellos[r];
    if (h.boot != boot)
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("rank {} runs on another machine than rank {} (boot id {} vs {}): "
                              "a shared-memory world needs its ranks on one host",
                              r, rank, h.boot, boot),
                  rank, "init");
  }
  if (!root.created)
    throw Error(root.error.empty() ? ErrorCode::kInternal : root.code,
                fmt::format("rank 0 could not create the shared-memory segments: {}",
                            root.error.empty() ? all[0] : root.error),
                rank, "init");
  if (static_cast<int>(root.fds.size()) != size + 1)
    throw Error(ErrorCode::kInternal,
                fmt::format("shared-memory rendezvous: rank 0 sent {} descriptors for {} ranks",
                            root.fds.size(), size),
                rank, "init");

  std::vector<int> fds;
  fds.reserve(root.fds.size());
  std::string opened = "ok";
  try {
    for (int fd : root.fds) {
      if (rank == 0) {
        int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (copy < 0) core::ThrowSystem("duplicating a shared-memory descriptor", errno);
        fds.push_back(copy);
      } else {
        fds.push_back(OpenPeerFd(root.pid, fd, rank));
      }
    }
  } catch (const Error& e) {
    opened = e.message();
  }
  // Every rank learns whether every rank holds the segments, so that none
  // waits for a peer that cannot start.
  const std::vector<std::string> outcome = all_gather(opened);
  for (int r = 0; r < static_cast<int>(outcome.size()); ++r) {
    if (outcome[r] == "ok") continue;
    for (int fd : fds) close(fd);
    throw Error(r == rank ? ErrorCode::kSystem : ErrorCode::kAborted,
                r == rank ? outcome[r] : fmt::format("rank {} could not join: {}", r, outcome[r]),
                rank, "init");
  }
  // MapJobTransport closes `fds`; rank 0's originals close with `closer`,
  // after every rank has mapped the segments (its start-up waits for that).
  return MapJobTransport(rank, size, root.heap_bytes, fds, "the shared-memory rendezvous");
}

}  // namespace mc2::shm
