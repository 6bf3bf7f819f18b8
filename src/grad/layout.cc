#include "grad/layout.h"

#include <algorithm>
#include <map>
#include <utility>

namespace mc2::grad {

std::vector<BucketPlan> PlanBuckets(std::span<const ParamInfo> params, std::span<const int> order,
                                    size_t first_cap, size_t cap) {
  std::vector<BucketPlan> out;
  // (group, dtype) -> index in `out` of its open bucket, and whether that
  // key has closed a bucket already.
  std::map<std::pair<int, int>, std::pair<size_t, bool>> open;
  for (int pi : order) {
    const ParamInfo& p = params[pi];
    const size_t esz = DTypeSize(p.dtype);
    const auto key = std::make_pair(p.group, static_cast<int>(p.dtype));
    auto it = open.find(key);
    if (it != open.end()) {
      BucketPlan& b = out[it->second.first];
      const size_t limit = it->second.second ? cap : first_cap;
      if (b.count > 0 && (b.count + p.count) * esz > limit) {
        open.erase(it);
        it = open.end();
      }
    }
    if (it == open.end()) {
      const bool later = std::any_of(out.begin(), out.end(), [&](const BucketPlan& b) {
        return b.group == p.group && b.dtype == p.dtype;
      });
      BucketPlan b;
      b.group = p.group;
      b.dtype = p.dtype;
      out.push_back(std::move(b));
      it = open.emplace(key, std::make_pair(out.size() - 1, later)).first;
    }
    BucketPlan& b = out[it->second.first];
    b.params.push_back(pi);
    b.offsets.push_back(b.count);
    b.count += p.count;
  }
  return out;
}

}  // namespace mc2::grad
