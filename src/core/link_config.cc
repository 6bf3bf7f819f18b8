#include "core/link_config.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/env.h"
#include "mc2/error.h"

namespace mc2::core {
namespace {

constexpr std::string_view kForm =
    "none, or bw=RATE[,lat=TIME] such as bw=10GB/s,lat=5us (RATE in B/s, KB/s, MB/s, GB/s, "
    "TB/s, KiB/s, MiB/s, GiB/s, TiB/s, Kb/s, Mb/s, Gb/s or Tb/s; TIME in ns, us, ms or s)";

[[noreturn]] void Bad(std::string_view what, std::string_view text, std::string_view problem) {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("{}='{}' is invalid: {}; expected {}", what, text, problem, kForm));
}


// Bytes per second of one unit, or 0 if `unit` is not a rate unit.
double RateUnit(std::string_view unit) {
  std::string u(unit);
  if (u.size() > 2 && u.compare(u.size() - 2, 2, "ps") == 0) u.replace(u.size() - 2, 2, "/s");
  if (u.size() < 3 || u.compare(u.size() - 2, 2, "/s") != 0) return 0;
  u.resize(u.size() - 2);  // e.g. "GB", "GiB", "Gb"
  if (u.empty()) return 0;
  const char last = u.back();
  if (last != 'B' && last != 'b') return 0;
  const double per = last == 'B' ? 1.0 : 0.125;  // bytes or bits
  u.pop_back();
  bool binary = false;
  if (!u.empty() && u.back() == 'i') {
    binary = true;
    u.pop_back();
    if (last != 'B' || u.empty()) return 0;  // "GiB/s" only, not "Gib/s" or "iB/s"
  }
  if (u.size() > 1) return 0;
  double scale = 1;
  if (!u.empty()) {
    const double k = binary ? 1024.0 : 1000.0;
    switch (u[0]) {
      case 'k':
      case 'K':
        scale = k;
        break;
      case 'M':
        scale = k * k;
        break;
      case 'G':
        scale = k * k * k;
        break;
      case 'T':
        scale = k * k * k * k;
        break;
      default:
        return 0;
    }
  }
  return per * scale;
}

}  // namespace

std::string LinkConfig::Describe() const {
  if (!enabled) return "none";
  double bw = bytes_per_second;
  std::string rate = bw >= 1e9   ? fmt::format("{:g} GB/s", bw / 1e9)
                     : bw >= 1e6 ? fmt::format("{:g} MB/s", bw / 1e6)
                     : bw >= 1e3 ? fmt::format("{:g} KB/s", bw / 1e3)
                                 : fmt::format("{:g} B/s", bw);
  int64_t ns = latency.count();
  std::string lat = ns == 0             ? "0"
                    : ns % 1000000 == 0 ? fmt::format("{} ms", ns / 1000000)
                    : ns % 1000 == 0    ? fmt::format("{} us", ns / 1000)
                                        : fmt::format("{} ns", ns);
  return fmt::format("bw={}, lat={}", rate, lat);
}

LinkConfig ParseLinkConfig(std::string_view text, std::string_view what) {
  std::string_view t = TrimSpace(text);
  LinkConfig cfg;
  if (t == "none" || t == "off") return cfg;
  if (t.empty()) Bad(what, text, "it is empty");
  bool have_bw = false, have_lat = false;
  size_t pos = 0;
  while (pos <= t.size()) {
    size_t comma = t.find(',', pos);
    if (comma == std::string_view::npos) comma = t.size();
    std::string_view item = TrimSpace(t.substr(pos, comma - pos));
    pos = comma + 1;
    size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      Bad(what, text, fmt::format("'{}' is not a key=value pair", item));
    std::string_view key = TrimSpace(item.substr(0, eq));
    std::string_view value = TrimSpace(item.substr(eq + 1));
    double v;
    std::string_view unit;
    if (key == "bw") {
      if (have_bw) Bad(what, text, "bw is given twice");
      have_bw = true;
      if (!SplitNumber(value, &v, &unit))
        Bad(what, text, fmt::format("bandwidth '{}' is not a number with a unit", value));
      if (unit.empty()) Bad(what, text, fmt::format("bandwidth '{}' has no unit", value));
      double per = RateUnit(unit);
      if (per == 0) Bad(what, text, fmt::format("'{}' is not a rate unit", unit));
      cfg.bytes_per_second = v * per;
      if (!(cfg.bytes_per_second > 0) || !std::isfinite(cfg.bytes_per_second))
        Bad(what, text, "the bandwidth must be positive");
    } else if (key == "lat") {
      if (have_lat) Bad(what, text, "lat is given twice");
      have_lat = true;
      if (!SplitNumber(value, &v, &unit))
        Bad(what, text, fmt::format("latency '{}' is not a number with a unit", value));
      double ns;
      if (unit == "ns")
        ns = v;
      else if (unit == "us")
        ns = v * 1e3;
      else if (unit == "ms")
        ns = v * 1e6;
      else if (unit == "s")
        ns = v * 1e9;
      else if (unit.empty() && v == 0)
        ns = 0;
      else if (unit.empty())
        Bad(what, text, fmt::format("latency '{}' has no unit", value));
      else
        Bad(what, text, fmt::format("'{}' is not a time unit", unit));
      if (ns > 1e12) Bad(what, text, "the latency must be below 1000 s");
      cfg.latency = std::chrono::nanoseconds(static_cast<int64_t>(std::llround(ns)));
    } else {
      Bad(what, text, fmt::format("unknown key '{}'", key));
    }
  }
  if (!have_bw) Bad(what, text, "bw is missing");
  cfg.enabled = true;
  return cfg;
}

LinkConfig LinkConfigFromEnv() {
  auto v = GetEnv("MC2_LINK");
  return v ? ParseLinkConfig(*v, "MC2_LINK") : LinkConfig{};
}

}  // namespace mc2::core
