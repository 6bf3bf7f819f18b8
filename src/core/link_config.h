// The emulated-link configuration: MC2_LINK / WorldOptions::link.
//
// Text form: "none" (or "off"), or comma-separated key=value pairs
//
//   bw=RATE     required; bytes per second of one rank's egress port
//   lat=TIME    optional, default 0; one-way latency added to every transfer
//
// e.g. "bw=10GB/s,lat=5us". RATE is a positive number with a unit: B/s,
// KB/s, MB/s, GB/s, TB/s (decimal: 1 GB/s = 1e9 bytes/s), KiB/s, MiB/s,
// GiB/s, TiB/s (binary), or bits: Kb/s, Mb/s, Gb/s, Tb/s (1 Gb/s = 1.25e8
// bytes/s); "ps" may replace "/s" (10Gbps). TIME is a non-negative number
// with a unit: ns, us, ms or s ("0" needs none). The case of the b/B matters
// (bits vs bytes). See docs/link-emulation.md for the model.
#ifndef MC2_CORE_LINK_CONFIG_H_
#define MC2_CORE_LINK_CONFIG_H_

#include <chrono>
#include <string>
#include <string_view>

namespace mc2::core {

struct LinkConfig {
  bool enabled = false;
  double bytes_per_second = 0;          // > 0 when enabled
  std::chrono::nanoseconds latency{0};  // >= 0
  // "bw=10 GB/s, lat=5 us" (or "none"), for logs and benchmark labels.
  std::string Describe() const;
};

// Parses the text form above. Throws mc2::Error(kInvalidArgument) naming
// `what` (e.g. "MC2_LINK"), the text, what is wrong and the accepted form.
LinkConfig ParseLinkConfig(std::string_view text, std::string_view what);

// MC2_LINK parsed; disabled when unset or empty.
LinkConfig LinkConfigFromEnv();

}  // namespace mc2::core

#endif  // MC2_CORE_LINK_CONFIG_H_
