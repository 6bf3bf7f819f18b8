// MoeRoute and the routing's checks (include/mc2/moe.h, moe_common.h).
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/reduce.h"
#include "mc2/collectives.h"
#include "mc2/error.h"
#include "mc2/ops.h"
#include "ops/cost_model.h"
#include "ops/fused_common.h"
#include "ops/gemm.h"
#include "ops/moe_common.h"

namespace mc2 {

size_t MoeRouting::expert_rows(int local_expert) const {
  size_t rows = 0;
  const size_t E = static_cast<size_t>(num_experts);
  if (local_expert < 0 || local_expert >= experts_per_rank || counts.size() != ranks * E) return 0;
  for (int p = 0; p < ranks; ++p) {
    rows += counts[p * E + static_cast<size_t>(rank) * experts_per_rank + local_expert];
  }
  return rows;
}

size_t MoeRouting::num_received() const {
  size_t rows = 0;
  for (int le = 0; le < experts_per_rank; ++le) rows += expert_rows(le);
  return rows;
}

namespace moe {
namespace {

uint64_t Fnv1a(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 1099511628211ull;
  }
  return h;
}

struct RouteMsg {
  uint64_t num_experts;
  uint64_t topk;
  uint64_t num_tokens;
  uint64_t error;
};

}  // namespace

// A hash of what every rank's routing must agree on.
uint64_t RoutingFingerprint(int ranks, int num_experts, int topk,
                            const std::vector<size_t>& counts) {
  uint64_t h = 14695981039346656037ull;
  h = Fnv1a(h, uint64_t(ranks));
  h = Fnv1a(h, uint64_t(num_experts));
  h = Fnv1a(h, uint64_t(topk));
  for (size_t c : counts) h = Fnv1a(h, c);
  return h;
}

// Checks a routing against the group and itself; "" if usable.
std::string CheckRouting(const Group& g, const MoeRouting& r) {
  if (!g.valid()) return {};
  if (r.ranks != g.size() || r.rank != g.rank()) {
    return "the routing was made for rank " + std::to_string(r.rank) + " of " +
           std::to_string(r.ranks) + ", not rank " + std::to_string(g.rank()) + " of " +
           std::to_string(g.size()) + " (use MoeRoute on this group)";
  }
  const size_t E = static_cast<size_t>(std::max(r.num_experts, 0));
  if (r.num_experts < 1 || r.topk < 1 || r.experts_per_rank * r.ranks != r.num_experts ||
      r.counts.size() != r.ranks * E) {
    return "the routing is malformed (use MoeRoute)";
  }
  size_t sent = 0;
  for (size_t e = 0; e < E; ++e) sent += r.counts[r.rank * E + e];
  if (sent != r.send_slots.size()) {
    return "the routing is malformed: send_slots has " + Str(r.send_slots.size()) +
           " entries, its counts say " + Str(sent);
  }
  const size_t slots = r.num_tokens * r.topk;
  for (size_t s : r.send_slots) {
    if (s >= slots) return "the routing is malformed: slot " + Str(s) + " >= T x topk";
  }
  return {};
}

}  // namespace moe

using moe::kRouteName;
using moe::RouteMsg;
using moe::RoutingFingerprint;
using moe::Str;

MoeRouting MoeRoute(const Group& g, const int32_t* expert_ids, size_t num_tokens, int topk,
                    int num_experts, std::chrono::nanoseconds timeout) {
  std::string err;
  const int P = g.valid() ? g.size() : 1;
  if (num_experts < 1 || num_experts % P != 0) {
    err = "num_experts (" + std::to_string(num_experts) +
          ") must be a positive multiple of the group size (" + std::to_string(P) + ")";
  } else if (topk < 1) {
    err = "topk must be >= 1, not " + std::to_string(topk);
  } else if (std::string e =
                 fused::SizeChecks({{"expert_ids (num_tokens x topk)",
                                     {num_tokens, static_cast<size_t>(topk), sizeof(int32_t)}}});
             !e.empty()) {
    err = e;
  } else if (expert_ids == nullptr && num_tokens > 0) {
    err = "expert_ids is null but num_tokens is " + Str(num_tokens);
  }
  const size_t slots = err.empty() ? num_tokens * static_cast<size_t>(topk) : 0;
  std::vector<uint64_t> mine(err.empty() ? num_experts : 0, 0);
  for (size_t s = 0; s < slots; ++s) {
    int32_t e = expert_ids[s];
    if (e < -1 || e >= num_experts) {
      err = "expert_ids[" + Str(s) + "] = " + std::to_string(e) + " is outside [-1, " +
            std::to_string(num_experts) + ")";
      break;
    }
    if (e >= 0) mine[e]++;
  }
  RouteMsg msg{uint64_t(std::max(num_experts, 0)), uint64_t(std::max(topk, 0)), num_tokens, 0};
  std::vector<RouteMsg> all =
      fused::ExchangeArgs(g, kRouteName, msg, err, &RouteMsg::error, timeout);
  fused::RequireSame(all, kRouteName, g.rank(), "num_experts",
                     [](const RouteMsg& m) { return m.num_experts; });
  fused::RequireSame(all, kRouteName, g.rank(), "topk", [](const RouteMsg& m) { return m.topk; });

  MoeRouting r;
  r.rank = g.rank();
  r.ranks = P;
  r.num_experts = num_experts;
  r.experts_per_rank = num_experts / P;
  r.topk = topk;
  r.num_tokens = num_tokens;
  if (P == 1) {
    r.counts.assign(mine.begin(), mine.end());  // one rank: its counts are the matrix
  } else {
    std::vector<uint64_t> matrix(size_t(P) * num_experts);
    CollectiveOptions co;
    co.timeout = timeout;
    AllGather(g, mine.data(), matrix.data(), mine.size(), DType::kI64, co).Wait();
    r.counts.assign(matrix.begin(), matrix.end());
  }
  // Stable counting sort of the routed slots by expert.
  std::vector<size_t> next(num_experts + 1, 0);
  for (int e = 0; e < num_experts; ++e) next[e + 1] = next[e] + mine[e];
  r.send_slots.resize(next[num_experts]);
  for (size_t s = 0; s < slots; ++s) {
    if (expert_ids[s] >= 0) r.send_slots[next[expert_ids[s]]++] = s;
  }
  r.fingerprint = RoutingFingerprint(P, num_experts, topk, r.counts);
  return r;
}

}  // namespace mc2
