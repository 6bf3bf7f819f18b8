// The one place that names concrete transports.
#include <time.h>

#include "core/enforce.h"
#include "core/env.h"
#include "core/link_config.h"
#include "transport/link_emulation.h"
#include "transport/mpi/mpi_transport.h"
#include "transport/net_transport.h"
#include "transport/shm/rendezvous.h"
#include "transport/shm/shm_transport.h"
#include "transport/transport.h"

namespace mc2::transport {
namespace {

// WorldOptions::link when given, else MC2_LINK.
core::LinkConfig LinkConfigFor(std::string_view link) {
  return link.empty() ? core::LinkConfigFromEnv()
                      : core::ParseLinkConfig(link, "WorldOptions::link");
}

}  // namespace

Clock::time_point CoarseNow() {
  // CLOCK_MONOTONIC_COARSE shares CLOCK_MONOTONIC's epoch (steady_clock's).
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

bool LaunchedByMc2() { return core::GetEnv("MC2_SHM_FDS").has_value(); }

bool LaunchedByMpi() {
  return core::GetEnv("OMPI_COMM_WORLD_SIZE") || core::GetEnv("PMIX_RANK") ||
         core::GetEnv("PMI_RANK");
}

std::shared_ptr<NetTransport> StartNetTransport(const NetTransportOptions& options) {
  return mpi::MpiTransport::Start(options.mpi_comm_f);
}

std::unique_ptr<Transport> CreateTransportFromEnv(std::string_view link) {
  core::LinkConfig config = LinkConfigFor(link);  // invalid text fails before any set-up
  return WrapWithLinkEmulation(shm::CreateProcessTransport(), config);
}

std::unique_ptr<Transport> CreateRendezvousTransport(int rank, int size, size_t heap_bytes,
                                                     const AllGatherStrings& all_gather,
                                                     std::string_view link) {
  core::LinkConfig config = LinkConfigFor(link);
  if (heap_bytes == 0) heap_bytes = core::EnvBytes("MC2_HEAP_BYTES", kDefaultJobHeapBytes);
  MC2_CHECK_ARG(heap_bytes > 0, "MC2_HEAP_BYTES must be a positive byte count");
  const auto env_dir = core::GetEnv("MC2_SHM_DIR");
  const std::string dir = env_dir && !env_dir->empty() ? *env_dir : kDefaultShmDir;
  return WrapWithLinkEmulation(
      shm::CreateRendezvousTransport(rank, size, heap_bytes, dir, all_gather), config);
}

std::vector<std::unique_ptr<Transport>> CreateInProcessTransports(int size, size_t heap_bytes,
                                                                  std::string_view link) {
  core::LinkConfig config = LinkConfigFor(link);
  auto txs = shm::CreateThreadTransports(size, heap_bytes);
  for (auto& tx : txs) tx = WrapWithLinkEmulation(std::move(tx), config);
  return txs;
}

}  // namespace mc2::transport
