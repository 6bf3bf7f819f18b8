#include "collectives/selector.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <sstream>

#include "core/enforce.h"
#include "core/env.h"
#include "core/log.h"

namespace mc2 {

const char* AlgorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kRing: return "ring";
    case Algorithm::kRecursiveDoubling: return "recursive_doubling";
    case Algorithm::kRabenseifner: return "rabenseifner";
    case Algorithm::kBinomialTree: return "tree";
    case Algorithm::kDirect: return "direct";
    case Algorithm::kHierarchical: return "hierarchical";
  }
  return "?";
}

std::optional<Algorithm> ParseAlgorithm(std::string_view name) {
  for (int i = 0; i < kNumAlgorithms; ++i)
    if (name == AlgorithmName(static_cast<Algorithm>(i))) return static_cast<Algorithm>(i);
  if (name == "rd") return Algorithm::kRecursiveDoubling;
  if (name == "binomial_tree" || name == "binomial") return Algorithm::kBinomialTree;
  if (name == "one_shot" || name == "flat") return Algorithm::kDirect;
  return std::nullopt;
}

std::string TuningFilePath() {
  if (auto v = core::GetEnv("MC2_TUNING_FILE")) return *v;
  if (auto home = core::GetEnv("HOME")) return *home + "/.cache/mc2/tuning.json";
  return "";
}

TuningTable TuningTable::Parse(const std::string& json_text, const std::string& source) {
  TuningTable t;
  auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kInvalidArgument,
                 fmt::format("tuning table {} is invalid: {}; expected {{\"all_reduce\": "
                             "{{\"2\": [[65536, \"direct\"], [1e18, \"rabenseifner\"]]}}}}",
                             source, why));
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const std::exception& e) {
    throw bad(e.what());
  }
  if (!j.is_object()) throw bad("top level is not an object");
  for (auto& [kind, per_ranks] : j.items()) {
    if (kind == "_meta") continue;
    if (!per_ranks.is_object()) throw bad(fmt::format("'{}' is not an object", kind));
    for (auto& [ranks_text, entries] : per_ranks.items()) {
      int ranks = static_cast<int>(core::ParseInt(ranks_text, source + " rank count", 1, 1 << 20));
      if (!entries.is_array()) throw bad(fmt::format("'{}.{}' is not an array", kind, ranks_text));
      std::vector<Entry> list;
      for (auto& e : entries) {
        if (!e.is_array() || e.size() != 2 || !e[0].is_number() || !e[1].is_string())
          throw bad(fmt::format("entry {} of '{}.{}' is not [bytes, \"algorithm\"]", e.dump(),
                                kind, ranks_text));
        auto a = ParseAlgorithm(e[1].get<std::string>());
        if (!a) throw bad(fmt::format("unknown algorithm {}", e[1].dump()));
        double mb = e[0].get<double>();
        if (!(mb >= 0)) throw bad(fmt::format("negative size in {}", e.dump()));
        list.push_back({mb >= 1.8e19 ? ~size_t{0} : static_cast<size_t>(mb), *a});
      }
      std::sort(list.begin(), list.end(),
                [](const Entry& x, const Entry& y) { return x.max_bytes < y.max_bytes; });
      t.rules[kind][ranks] = std::move(list);
    }
  }
  return t;
}

std::string TuningTable::ToJson() const {
  nlohmann::json j = nlohmann::json::object();
  for (auto& [kind, per] : rules)
    for (auto& [ranks, list] : per) {
      auto arr = nlohmann::json::array();
      for (auto& e : list)
        arr.push_back({e.max_bytes == ~size_t{0} ? 1.8e19 : static_cast<double>(e.max_bytes),
                       AlgorithmName(e.algorithm)});
      j[kind][std::to_string(ranks)] = arr;
    }
  return j.dump(1);
}

Algorithm TuningTable::Lookup(const std::string& kind, int ranks, size_t bytes) const {
  auto it = rules.find(kind);
  if (it == rules.end() || it->second.empty()) return Algorithm::kAuto;
  auto r = it->second.upper_bound(ranks);
  if (r == it->second.begin()) return Algorithm::kAuto;
  --r;
  for (auto& e : r->second)
    if (bytes <= e.max_bytes) return e.algorithm;
  return Algorithm::kAuto;
}

namespace collectives {
namespace {

constexpr const char* kAlgoForm =
    "an algorithm name (auto, ring, recursive_doubling, rabenseifner, tree, direct, "
    "hierarchical, flat) or a list such as all_reduce=ring,all_gather=direct";

}  // namespace

// Parsed MC2_ALGO: "" key = every collective.
std::map<std::string, Algorithm> ParseAlgoEnv(const std::string& text) {
  std::map<std::string, Algorithm> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::string key, val = item;
    if (auto eq = item.find('='); eq != std::string::npos) {
      key = item.substr(0, eq);
      val = item.substr(eq + 1);
    }
    static const char* const kKinds[] = {"all_reduce", "reduce", "broadcast", "all_gather",
                                         "all_gatherv", "gather", "scatter", "reduce_scatter",
                                         "reduce_scatterv", "all_to_all", "all_to_allv",
                                         "barrier"};
    if (!key.empty() && std::find(std::begin(kKinds), std::end(kKinds), key) == std::end(kKinds))
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("MC2_ALGO='{}' is invalid: unknown collective '{}'; expected {}",
                              text, key, kAlgoForm));
    // all_to_all runs as all_to_allv (and so do the gather/scatter V forms).
    if (key == "all_to_all") key = "all_to_allv";
    auto a = ParseAlgorithm(val);
    if (!a)
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("MC2_ALGO='{}' is invalid: unknown algorithm '{}'; expected {}",
                              text, val, kAlgoForm));
    out[key] = *a;
  }
  return out;
}

namespace {

const std::map<std::string, Algorithm>& AlgoEnv() {
  static const std::map<std::string, Algorithm> env = [] {
    auto v = core::GetEnv("MC2_ALGO");
    return v ? ParseAlgoEnv(*v) : std::map<std::string, Algorithm>{};
  }();
  return env;
}

const TuningTable& Table() {
  static const TuningTable table = [] {
    std::string path = TuningFilePath();
    if (path.empty()) return TuningTable{};
    std::ifstream in(path);
    if (!in) {
      if (core::GetEnv("MC2_TUNING_FILE"))
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("MC2_TUNING_FILE='{}' cannot be read", path));
      return TuningTable{};
    }
    std::stringstream buf;
    buf << in.rdbuf();
    MC2_LOG(kInfo, "using tuning table {}", path);
    return TuningTable::Parse(buf.str(), path);
  }();
  return table;
}

Algorithm Default(OpKind kind, size_t bytes) {
  switch (kind) {
    case OpKind::kAllReduce:
      return bytes <= 64 * 1024 ? Algorithm::kDirect : Algorithm::kRabenseifner;
    default:
      return Algorithm::kDirect;
  }
}

}  // namespace

bool Implements(Algorithm algo, OpKind kind) {
  int k = static_cast<int>(kind);
  return k < 16 && Algorithms().fn[static_cast<int>(algo)][k] != nullptr;
}

Algorithm SelectAlgorithm(OpKind kind, Algorithm requested, int ranks, size_t bytes) {
  // The common case -- no request, no MC2_ALGO, no tuning table -- is decided
  // by the built-in defaults alone. It sits on the latency path of every
  // small collective, so it skips the name and map look-ups below (both
  // sources are read once per process, so the answer cannot change).
  if (requested == Algorithm::kAuto) {
    static const bool defaults_only = AlgoEnv().empty() && Table().rules.empty();
    // Every default implements its kind (Launch enforces it).
    if (defaults_only) return Default(kind, bytes);
  }
  const char* name = internal::OpKindName(kind);
  Algorithm a = requested;
  const char* source = "options";
  if (a == Algorithm::kAuto && !AlgoEnv().empty()) {
    auto& env = AlgoEnv();
    if (auto it = env.find(name); it != env.end()) a = it->second, source = "MC2_ALGO";
    else if (auto all = env.find(""); all != env.end()) a = all->second, source = "MC2_ALGO";
  }
  // MC2_ALGO's `hierarchical` names the level across hosts only.
  if (a == Algorithm::kHierarchical && std::string(source) == "MC2_ALGO") a = Algorithm::kAuto;
  if (a != Algorithm::kAuto) {
    if (!Implements(a, kind)) {
      // A blanket MC2_ALGO=ring applies where ring exists; others fall back.
      if (std::string(source) == "MC2_ALGO" && AlgoEnv().count(name) == 0) {
        a = Algorithm::kAuto;
      } else {
        std::string avail;
        for (int i = 1; i < kNumAlgorithms; ++i)
          if (Implements(static_cast<Algorithm>(i), kind))
            avail += fmt::format("{}{}", avail.empty() ? "" : ", ", AlgorithmName(static_cast<Algorithm>(i)));
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("{} (from {}) does not implement {}; available: {}",
                                AlgorithmName(a), source, name, avail));
      }
    }
    if (a != Algorithm::kAuto) return a;
  }
  if (!Table().rules.empty()) {
    a = Table().Lookup(name, ranks, bytes);
    if (a != Algorithm::kAuto && Implements(a, kind)) return a;
  }
  a = Default(kind, bytes);
  return Implements(a, kind) ? a : Algorithm::kDirect;
}

namespace {

// A collective and its V form share MC2_ALGO's and the table's entries
// across hosts (the table is measured on the plain forms).
OpKind BaseKind(OpKind kind) {
  switch (kind) {
    case OpKind::kAllGatherV: return OpKind::kAllGather;
    case OpKind::kReduceScatterV: return OpKind::kReduceScatter;
    case OpKind::kAllToAllV: return OpKind::kAllToAll;
    default: return kind;
  }
}

bool IsNetChoice(Algorithm a) { return a == Algorithm::kDirect || a == Algorithm::kHierarchical; }

}  // namespace

std::string NetTableKind(OpKind kind, int per_host) {
  return fmt::format("{}@{}", internal::OpKindName(BaseKind(kind)), per_host);
}

Algorithm SelectNetAlgorithm(OpKind kind, Algorithm requested, int hosts, int per_host,
                             size_t bytes, bool use_table) {
  if (IsNetChoice(requested)) return requested;
  if (auto& env = AlgoEnv(); !env.empty()) {
    // MC2_ALGO keys: the collective's name or its V form's ("all_to_all"
    // is stored as "all_to_allv"), else the blanket entry.
    const OpKind base = BaseKind(kind);
    const OpKind v = base == OpKind::kAllGather       ? OpKind::kAllGatherV
                     : base == OpKind::kReduceScatter ? OpKind::kReduceScatterV
                     : base == OpKind::kAllToAll      ? OpKind::kAllToAllV
                                                      : base;
    for (const char* key : {internal::OpKindName(kind), internal::OpKindName(base),
                            internal::OpKindName(v), ""})
      if (auto it = env.find(key); it != env.end()) {
        if (IsNetChoice(it->second)) return it->second;
        break;
      }
  }
  if (use_table && !Table().rules.empty()) {
    Algorithm a = Table().Lookup(NetTableKind(kind, per_host), hosts, bytes);
    if (IsNetChoice(a)) return a;
  }
  return Algorithm::kAuto;
}

}  // namespace collectives
}  // namespace mc2
