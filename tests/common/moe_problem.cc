#include "common/moe_problem.h"

#include <random>

namespace mc2::test {

MoeTokens RandomMoeTokens(const MoeTokenSpec& spec) {
  MoeTokens t;
  std::mt19937_64 rng(spec.seed);
  const int E = spec.experts;
  const size_t topk = static_cast<size_t>(spec.topk);
  for (int p = 0; p < spec.ranks; ++p) {
    const size_t T = (spec.empty_rank && p == spec.ranks - 1)
                         ? 0
                         : spec.min_tokens + rng() % (spec.max_tokens - spec.min_tokens + 1);
    t.T.push_back(T);
    std::vector<int32_t> ids(T * topk);
    std::vector<float> probs(T * topk);
    for (size_t s = 0; s < T * topk; ++s) {
      int e;
      if (spec.skew == 2)
        e = E - 1;
      else if (spec.skew == 1 && rng() % 10 < 7)
        e = 0;
      else
        e = static_cast<int>(rng() % E);
      if (rng() % 10 == 0) e = -1;
      ids[s] = e;
      probs[s] = static_cast<float>(rng() % 1000) / 997.0f;
    }
    if (spec.drop_edges && p == 0 && T > 1) {
      for (size_t j = 0; j < topk; ++j) ids[j] = -1;
      ids.back() = -1;
    }
    t.ids.push_back(ids);
    t.probs.push_back(probs);
    t.x.push_back(Random(T * spec.d, spec.dtype, spec.seed * 31 + p));
  }
  return t;
}

std::vector<std::pair<int, size_t>> ExpertGroupedSlots(
    const std::vector<std::vector<int32_t>>& ids, int local_experts, int me) {
  std::vector<std::pair<int, size_t>> rows;
  for (int le = 0; le < local_experts; ++le) {
    for (size_t p = 0; p < ids.size(); ++p) {
      for (size_t s = 0; s < ids[p].size(); ++s) {
        if (ids[p][s] == me * local_experts + le) rows.push_back({static_cast<int>(p), s});
      }
    }
  }
  return rows;
}

}  // namespace mc2::test
