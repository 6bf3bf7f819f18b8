// The names of the compression schemes (mc2/grad.h), as options, logs and
// Python spell them.
#include <optional>
#include <string_view>

#include "mc2/grad.h"

namespace mc2 {

const char* CompressionName(Compression c) {
  switch (c) {
    case Compression::kNone:
      return "none";
    case Compression::kF16:
      return "f16";
    case Compression::kBF16:
      return "bf16";
    case Compression::kThreshold:
      return "threshold";
    case Compression::kTopK:
      return "topk";
    case Compression::kAuto:
      return "auto";
    case Compression::kPowerSgd:
      return "powersgd";
  }
  return "?";
}

std::optional<Compression> ParseCompression(std::string_view name) {
  for (Compression c : {Compression::kNone, Compression::kF16, Compression::kBF16,
                        Compression::kThreshold, Compression::kTopK, Compression::kAuto,
                        Compression::kPowerSgd}) {
    if (name == CompressionName(c)) return c;
  }
  if (name == "fp16") return Compression::kF16;
  if (name == "top-k" || name == "top_k") return Compression::kTopK;
  if (name == "power_sgd" || name == "power-sgd") return Compression::kPowerSgd;
  return std::nullopt;
}

}  // namespace mc2
