// The one place that names concrete transports.
#include "core/env.h"
#include "transport/shm/shm_transport.h"
#include "transport/transport.h"

namespace mc2::transport {

bool LaunchedByMc2() { return core::GetEnv("MC2_SHM_FDS").has_value(); }

std::unique_ptr<Transport> CreateTransportFromEnv() { return shm::CreateProcessTransport(); }

std::vector<std::unique_ptr<Transport>> CreateInProcessTransports(int size, size_t heap_bytes) {
  return shm::CreateThreadTransports(size, heap_bytes);
}

}  // namespace mc2::transport
