// The one place that names concrete transports.
#include "core/env.h"
#include "transport/shm/shm_transport.h"
#include "transport/transport.h"

#include <time.h>

namespace mc2::transport {

Clock::time_point CoarseNow() {
  // CLOCK_MONOTONIC_COARSE shares CLOCK_MONOTONIC's epoch (steady_clock's).
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

bool LaunchedByMc2() { return core::GetEnv("MC2_SHM_FDS").has_value(); }

std::unique_ptr<Transport> CreateTransportFromEnv() { return shm::CreateProcessTransport(); }

std::vector<std::unique_ptr<Transport>> CreateInProcessTransports(int size, size_t heap_bytes) {
  return shm::CreateThreadTransports(size, heap_bytes);
}

}  // namespace mc2::transport
