// The token side of the MoE operator tests: every rank's tokens, routing
// and gate weights, generated identically on every rank from a seed, and
// the expert-grouped order the references use.
#ifndef MC2_TESTS_COMMON_MOE_PROBLEM_H_
#define MC2_TESTS_COMMON_MOE_PROBLEM_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "common/operands.h"
#include "mc2/mc2.h"

namespace mc2::test {

struct MoeTokenSpec {
  int ranks = 1, experts = 1, topk = 1;
  size_t d = 1;
  DType dtype = DType::kF32;
  uint64_t seed = 1;
  // 0 uniform; 1 most slots to expert 0; 2 every slot to the last expert
  // (all but one expert, and all but one rank, receive nothing).
  int skew = 0;
  bool empty_rank = false;  // the last rank has no tokens
  size_t min_tokens = 0, max_tokens = 24;  // per rank, uniform
  // Rank 0's first token is dropped entirely (it must combine to zeros),
  // and its last slot too. About one slot in 10 is dropped regardless.
  bool drop_edges = false;
};

struct MoeTokens {
  std::vector<size_t> T;                  // tokens per rank
  std::vector<std::vector<int32_t>> ids;  // [T x topk] per rank; -1: dropped
  std::vector<std::vector<float>> probs;  // [T x topk] per rank
  std::vector<Mat> x;                     // [T x d] per rank
};

MoeTokens RandomMoeTokens(const MoeTokenSpec& spec);

// The rows rank `me` (with `local_experts` experts) receives, in
// expert-grouped order, computed from the ids alone: (source rank, slot).
std::vector<std::pair<int, size_t>> ExpertGroupedSlots(
    const std::vector<std::vector<int32_t>>& ids, int local_experts, int me);

}  // namespace mc2::test

#endif  // MC2_TESTS_COMMON_MOE_PROBLEM_H_
