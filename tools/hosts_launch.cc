// `mc2 run --hosts` (hosts_launch.h).
#include "hosts_launch.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "launcher.h"
#include "mc2/error.h"

extern char** environ;

namespace mc2::tools {

namespace {

constexpr int kTorchDefaultPort = 29500;  // torch.distributed's MASTER_PORT default

// Sets the rank variables of `mc2 run` from Open MPI's, and torch's env://
// rendezvous on the first host at torch's default port, then runs the
// program: "$0" is PROGRAM, "$@" its arguments.
std::string RankVariables(const std::string& first_host) {
  return fmt::format(
      "RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE "
      "LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK LOCAL_WORLD_SIZE=$OMPI_COMM_WORLD_LOCAL_SIZE "
      "MASTER_ADDR={} MASTER_PORT={} exec \"$0\" \"$@\"",
      first_host, kTorchDefaultPort);
}

int CountRanks(const std::string& hosts) {
  int total = 0;
  std::stringstream ss(hosts);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t colon = item.rfind(':');
    const std::string name = colon == std::string::npos ? item : item.substr(0, colon);
    if (name.empty())
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("--hosts '{}': an entry has no host name (expected "
                              "HOST:RANKS,HOST:RANKS,...)",
                              hosts));
    int slots = 1;
    if (colon != std::string::npos) {
      const std::string n = item.substr(colon + 1);
      char* end = nullptr;
      errno = 0;
      long v = std::strtol(n.c_str(), &end, 10);
      if (n.empty() || *end != '\0' || errno != 0 || v < 1 || v > 256)
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("--hosts '{}': '{}' is not a rank count from 1 to 256 (in "
                                "'{}')",
                                hosts, n, item));
      slots = static_cast<int>(v);
    }
    total += slots;
  }
  if (total == 0)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("--hosts '{}': no host given (expected HOST:RANKS,...)", hosts));
  return total;
}

}  // namespace

std::vector<std::string> MpirunLine(const HostsLaunch& h) {
  const int n = CountRanks(h.hosts);
  if (h.nranks != 0 && h.nranks != n)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("-n {} does not match --hosts '{}', which has {} ranks", h.nranks,
                            h.hosts, n));
  std::vector<std::string> line = {"mpirun",   "-np",          std::to_string(n), "-H",
                                   h.hosts,    "--map-by",     "slot",            "--bind-to",
                                   "none"};
  // The MC2_* settings of this environment reach every rank.
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    if (!entry.starts_with("MC2_")) continue;
    std::string name(entry.substr(0, entry.find('=')));
    if (h.heap_bytes && name == "MC2_HEAP_BYTES") continue;
    line.insert(line.end(), {"-x", name});
  }
  if (h.heap_bytes) line.insert(line.end(), {"-x", fmt::format("MC2_HEAP_BYTES={}", h.heap_bytes)});
  std::stringstream extra(h.mpirun_args);
  for (std::string word; extra >> word;) line.push_back(word);
  const std::string first_host = h.hosts.substr(0, h.hosts.find_first_of(":,"));
  line.insert(line.end(), {"sh", "-c", RankVariables(first_host)});
  line.insert(line.end(), h.argv.begin(), h.argv.end());
  return line;
}

int RunOnHosts(const HostsLaunch& h) {
  std::vector<std::string> line;
  try {
    line = MpirunLine(h);
  } catch (const Error& e) {
    fmt::print(stderr, "mc2 run: {}\n", e.message());
    return kExitUsage;
  }
  if (h.dry_run) {
    std::string text;
    for (const auto& w : line)
      text += (text.empty() ? "" : " ") +
              (w.find_first_of(" \"$'") == std::string::npos ? w : fmt::format("'{}'", w));
    fmt::print("{}\n", text);
    return 0;
  }
  std::vector<char*> args;
  for (auto& w : line) args.push_back(w.data());
  args.push_back(nullptr);
  std::fflush(stdout);
  execvp(args[0], args.data());
  fmt::print(stderr, "mc2 run: cannot execute mpirun: {} (Debian package openmpi-bin)\n",
             std::strerror(errno));
  return kExitCannotExecute;
}

}  // namespace mc2::tools
