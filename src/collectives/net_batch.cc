// A batch (include/mc2/batch.h) on a group that spans hosts: the entries
// fused into as few net collectives as their semantics allow, run one
// after another inside ONE operation of the span engine.
//
// The steps (in the order their first entry appears in the batch):
// - all_reduce entries of one (dtype, op): one all_reduce of their inputs
//   packed end to end, unpacked into each entry's output;
// - reduce_scatter entries of one (dtype, op): one reduce_scatter whose
//   block r is every entry's block r packed end to end, so that each rank
//   receives its block of every entry;
// - all_gather and broadcast entries, whatever their dtype and root: one
//   all_gatherv of bytes, rank r's block holding its contribution to every
//   all_gather entry and its input to every broadcast entry rooted at r
//   (every rank computes every block's layout from the entries alone).
// A step of one entry runs on that entry's own buffers, exactly as its
// collective would (no copy). Each step runs the algorithm the span
// dispatch selects for its kind, layout and size (net_dispatch.cc
// ChooseNet: hierarchical or flat, the tuning table, MC2_ALGO).
//
// Determinism: every span reduction realises the canonical order T(0, N)
// of core/reduce.h element by element, whatever the algorithm and the
// vector's length (net_algorithms.h). An element of a packed vector thus
// goes through the same reductions as in its entry's own collective, and
// a fused result is bitwise the separate one. Packing needs one dtype and
// one op per reduction, hence one step per (dtype, op).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "collectives/batch_plan.h"
#include "collectives/net_algorithms.h"
#include "engine/access.h"

namespace mc2::collectives {
namespace {

enum class StepKind : uint8_t { kAllReduce, kReduceScatter, kGather };

// One net collective of the batch. `items` index the plan's items;
// `at[k]` is where item k's part sits in the packed data: elements from
// the start of the vector (all_reduce) or of each rank's block
// (reduce_scatter), bytes from the start of each rank's block (all_gather)
// or of the root's block (broadcast).
struct NetStep {
  StepKind kind = StepKind::kAllReduce;
  std::vector<size_t> items;
  std::vector<size_t> at;
  size_t total = 0;     // all_reduce: elements; reduce_scatter: elements per block
  bool packed = false;  // false: one entry, run on its own buffers
  CollArgs args;        // buffers filled in when the step runs, if packed
  NetFn fn = nullptr;
};

// The arguments of item `it`'s own collective on `n` ranks, as
// collectives.cc builds them.
CollArgs OwnArgs(const BatchItem& it, int n) {
  CollArgs a;
  a.dtype = it.dtype;
  a.count = it.count;
  a.send = it.send;
  a.recv = it.recv;
  a.in_place = it.in_place;
  switch (it.kind) {
    case BatchKind::kAllReduce:
      a.kind = OpKind::kAllReduce;
      a.op = it.op;
      break;
    case BatchKind::kReduceScatter:
    case BatchKind::kAllGather:
      a.kind = it.kind == BatchKind::kAllGather ? OpKind::kAllGather : OpKind::kReduceScatter;
      a.op = it.op;
      a.counts.assign(n, it.count);
      a.displs.resize(n);
      for (int r = 0; r < n; ++r) a.displs[r] = r * it.count;
      break;
    case BatchKind::kBroadcast:
      a.kind = OpKind::kBroadcast;
      a.root = it.root;
      break;
  }
  return a;
}

// Groups the plan's items into steps and lays out each packed step.
std::vector<NetStep> MakeSteps(const BatchPlan& p, int n) {
  std::vector<NetStep> steps;
  std::map<std::pair<int, int>, size_t> reduce_step;  // (kind, dtype x op) -> step
  size_t gather_step = SIZE_MAX;
  for (size_t i = 0; i < p.items.size(); ++i) {
    const BatchItem& it = p.items[i];
    if (it.count == 0) continue;  // nothing moves (nor would its collective change a byte)
    size_t s = 0;
    if (it.kind == BatchKind::kAllGather || it.kind == BatchKind::kBroadcast) {
      if (gather_step == SIZE_MAX) {
        gather_step = steps.size();
        steps.emplace_back().kind = StepKind::kGather;
      }
      s = gather_step;
    } else {
      const StepKind k =
          it.kind == BatchKind::kAllReduce ? StepKind::kAllReduce : StepKind::kReduceScatter;
      const auto key = std::make_pair(static_cast<int>(k),
                                      static_cast<int>(it.dtype) * 256 + static_cast<int>(it.op));
      auto [pos, fresh] = reduce_step.try_emplace(key, steps.size());
      if (fresh) steps.emplace_back().kind = k;
      s = pos->second;
    }
    steps[s].items.push_back(i);
  }
  for (NetStep& st : steps) {
    const BatchItem& first = p.items[st.items.front()];
    st.packed = st.items.size() > 1;
    if (!st.packed) {
      st.args = OwnArgs(first, n);
      continue;
    }
    CollArgs& a = st.args;
    a.dtype = first.dtype;
    a.op = first.op;
    if (st.kind != StepKind::kGather) {
      for (size_t i : st.items) {
        st.at.push_back(st.total);
        st.total += p.items[i].count;
      }
      if (st.kind == StepKind::kAllReduce) {
        a.kind = OpKind::kAllReduce;
        a.count = st.total;
        a.in_place = true;
      } else {
        a.kind = OpKind::kReduceScatterV;
        a.counts.assign(n, st.total);
        a.displs.resize(n);
        for (int r = 0; r < n; ++r) a.displs[r] = r * st.total;
      }
      continue;
    }
    // Bytes: every rank's all_gather contributions, then the inputs of the
    // broadcasts it roots.
    a.kind = OpKind::kAllGatherV;
    a.dtype = DType::kU8;
    a.in_place = true;
    size_t gathered = 0;
    for (size_t i : st.items)
      if (p.items[i].kind == BatchKind::kAllGather) gathered += p.items[i].contrib;
    a.counts.assign(n, gathered);
    size_t ag_at = 0;
    for (size_t i : st.items) {
      const BatchItem& it = p.items[i];
      if (it.kind == BatchKind::kAllGather) {
        st.at.push_back(ag_at);
        ag_at += it.contrib;
      } else {
        st.at.push_back(a.counts[it.root]);
        a.counts[it.root] += it.contrib;
      }
    }
    a.displs.resize(n);
    size_t off = 0;
    for (int r = 0; r < n; ++r) a.displs[r] = std::exchange(off, off + a.counts[r]);
  }
  return steps;
}

// A packing buffer: every byte of it is written before it is read (the
// packed inputs, or the collective's output), so it is not zeroed first.
std::unique_ptr<char[]> Uninit(size_t bytes) {
  return std::make_unique_for_overwrite<char[]>(bytes);
}

// Runs packed step `st` of `p` on this rank: packs, runs the collective,
// unpacks.
void RunPacked(NetGroup& s, const BatchPlan& p, const NetStep& st, Deadline deadline) {
  const int n = static_cast<int>(s.members.size()), me = s.rank;
  CollArgs a = st.args;
  const size_t e = a.esize;
  switch (st.kind) {
    case StepKind::kAllReduce: {
      const auto buf = Uninit(st.total * e);
      for (size_t k = 0; k < st.items.size(); ++k) {
        const BatchItem& it = p.items[st.items[k]];
        std::memcpy(buf.get() + st.at[k] * e, it.send, it.count * e);
      }
      a.send = a.recv = buf.get();
      st.fn(s, a, deadline);
      for (size_t k = 0; k < st.items.size(); ++k) {
        const BatchItem& it = p.items[st.items[k]];
        std::memcpy(it.recv, buf.get() + st.at[k] * e, it.count * e);
      }
      break;
    }
    case StepKind::kReduceScatter: {
      const auto in = Uninit(static_cast<size_t>(n) * st.total * e), out = Uninit(st.total * e);
      for (size_t k = 0; k < st.items.size(); ++k) {
        const BatchItem& it = p.items[st.items[k]];
        const size_t b = it.count * e;
        for (int r = 0; r < n; ++r)
          std::memcpy(in.get() + (r * st.total + st.at[k]) * e, it.send + r * b, b);
      }
      a.send = in.get();
      a.recv = out.get();
      st.fn(s, a, deadline);
      for (size_t k = 0; k < st.items.size(); ++k) {
        const BatchItem& it = p.items[st.items[k]];
        std::memcpy(it.recv, out.get() + st.at[k] * e, it.count * e);
      }
      break;
    }
    case StepKind::kGather: {
      const auto buf = Uninit(a.displs[n - 1] + a.counts[n - 1]);
      char* mine = buf.get() + a.displs[me];
      for (size_t k = 0; k < st.items.size(); ++k) {
        const BatchItem& it = p.items[st.items[k]];
        if (it.kind == BatchKind::kAllGather || it.root == me)
          std::memcpy(mine + st.at[k], it.send, it.contrib);
      }
      a.recv = buf.get();
      a.send = mine;
      st.fn(s, a, deadline);
      for (size_t k = 0; k < st.items.size(); ++k) {
        const BatchItem& it = p.items[st.items[k]];
        const size_t b = it.contrib;
        if (it.kind == BatchKind::kBroadcast) {
          if (!it.in_place) std::memcpy(it.recv, buf.get() + a.displs[it.root] + st.at[k], b);
          continue;
        }
        for (int r = 0; r < n; ++r)
          if (!(it.in_place && r == me))
            std::memcpy(it.recv + r * b, buf.get() + a.displs[r] + st.at[k], b);
      }
      break;
    }
  }
}

// Every rank passed the same entries: one all_gather of (count, hash), on
// the caller, before any data moves; kMismatch on every rank otherwise.
void CheckSameEntries(const Group& g, const BatchPlan& p, const CollectiveOptions& opts) {
  const int n = g.size();
  uint64_t mine[2] = {p.items.size(), p.hash};
  std::vector<uint64_t> all(2 * static_cast<size_t>(n));
  CollectiveOptions check = opts;
  check.algorithm = Algorithm::kAuto;
  AllGather(g, mine, all.data(), 2, DType::kI64, check).Wait();
  for (int r = 0; r < n; ++r)
    if (all[2 * r] != mine[0] || all[2 * r + 1] != mine[1])
      throw Error(ErrorCode::kMismatch,
                  fmt::format("mismatched operations across ranks: rank {} called "
                              "batch(entries={}, entries hash={:#x}) but rank {} called "
                              "batch(entries={}, entries hash={:#x})",
                              g.rank(), mine[0], mine[1], r, all[2 * r], all[2 * r + 1]),
                  g.rank(), "batch");
}

}  // namespace

Work NetBatch(const Group& g, BatchPlan&& plan, const CollectiveOptions& opts) {
  CheckSameEntries(g, plan, opts);
  GroupImpl* gi = internal::Access::Impl(g);
  std::vector<NetStep> steps = MakeSteps(plan, g.size());
  if (steps.empty()) return Work{};
  CollectiveOptions o = opts;
  o.algorithm = Algorithm::kAuto;
  for (NetStep& st : steps) st.fn = ChooseNet(*gi, st.args, o).fn;
  // Each step has the call's timeout, as each separate collective would.
  const std::chrono::nanoseconds to = opts.timeout.count() > 0 ? opts.timeout : gi->world().timeout;
  return internal::NetSubmit(
      *gi, internal::OpKindName(OpKind::kBatch), opts.timeout,
      [plan = std::move(plan), steps = std::move(steps), to](NetGroup& s, Deadline deadline) {
        for (const NetStep& st : steps) {
          deadline = std::max(deadline, std::chrono::steady_clock::now() + to);
          if (st.packed)
            RunPacked(s, plan, st, deadline);
          else
            st.fn(s, st.args, deadline);
        }
      },
      "batch");
}

}  // namespace mc2::collectives
