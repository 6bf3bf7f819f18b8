// `mc2 bench ops`: the MoE cases (moe: AllToAllMatmul then MatmulAllToAll;
// moe_mlp: MoeMlp).
//
// Rank r has about M tokens (M (2 + r % 3) / 3: uneven), each routed to
// kMoeTopk of kMoeExpertsPerRank * n experts with a skewed (Zipf-like,
// weight 1 / (e+1)^0.7) assignment, so ranks and experts receive uneven
// counts; tokens are [M x K], each expert's weights [K x N] then [N x K]
// (moe_mlp: [K x 2N] gate|up, SwiGLU, [N x K]).
#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <vector>

#include "bench_ops.h"

namespace mc2::tools::bench_ops {

namespace {

constexpr int kMoeTopk = 2;
constexpr int kMoeExpertsPerRank = 2;
constexpr int kMoeTag = 0x4d43424d;

size_t MoeTokens(const OpsConfig& c, int rank) { return c.m * (2 + rank % 3) / 3; }

std::vector<int32_t> MoeIds(const OpsConfig& c, int rank, int n) {
  const int E = kMoeExpertsPerRank * n;
  std::vector<double> cum(E);
  double total = 0;
  for (int e = 0; e < E; ++e) cum[e] = total += 1.0 / std::pow(e + 1.0, 0.7);
  const size_t T = MoeTokens(c, rank);
  std::vector<int32_t> ids(T * kMoeTopk);
  uint64_t x = 0x9e3779b97f4a7c15ull * (rank + 7);
  for (size_t t = 0; t < T; ++t) {
    for (int j = 0; j < kMoeTopk; ++j) {
      int e = 0;
      bool dup = true;
      while (dup) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        double u = double(x >> 11) / double(1ull << 53) * total;
        e = static_cast<int>(std::lower_bound(cum.begin(), cum.end(), u) - cum.begin());
        e = std::min(e, E - 1);
        dup = false;
        for (int q = 0; q < j; ++q) dup = dup || ids[t * kMoeTopk + q] == e;
      }
      ids[t * kMoeTopk + j] = e;
    }
  }
  return ids;
}

FusedOptions SerialOptions() {
  FusedOptions o;
  o.pipeline = Pipeline::kSerial;
  return o;
}

class MoeCase : public OpCase {
 public:
  MoeCase(const Group& g, const OpsConfig& c) : g_(g), c_(c) {
    const int n = g.size(), me = g.rank();
    const size_t T = MoeTokens(c, me), es = DTypeSize(c.dtype);
    ids_ = MoeIds(c, me, n);
    routing_ = MoeRoute(g, ids_.data(), T, kMoeTopk, kMoeExpertsPerRank * n);
    const size_t R = routing_.num_received();
    Fill(x_, T * c.k, c.dtype, 41 + me);
    Fill(w1_, kMoeExpertsPerRank * c.k * c.n, c.dtype, 4000 + me);
    Fill(w2_, kMoeExpertsPerRank * c.n * c.k, c.dtype, 5000 + me);
    Fill(hidden_, R * c.n, c.dtype, 6000 + me);
    probs_.resize(T * kMoeTopk);
    for (size_t i = 0; i < probs_.size(); ++i) probs_[i] = 0.25f + 0.5f * float(i % 2);
    // y and out in one buffer, so that Output() checks both.
    all_.resize(R * c.n + T * c.k);
    xe_.resize(R * c.k * es);
    ye_.resize(R * c.k);
    y_alone_.resize(R * c.n);
    // The serial pipeline's exchanges: blocks to / from every rank.
    const int E = kMoeExpertsPerRank * n;
    send_.assign(n, 0);
    recv_.assign(n, 0);
    for (int q = 0; q < n; ++q) {
      for (int le = 0; le < kMoeExpertsPerRank; ++le) {
        send_[q] += routing_.counts[me * E + q * kMoeExpertsPerRank + le];
        recv_[q] += routing_.counts[q * E + me * kMoeExpertsPerRank + le];
      }
    }
    xs_.resize(routing_.num_sent() * c.k * es);
    yr_.resize(routing_.num_sent() * c.k);
    MakeAlone();
  }
  FusedReport Run(const FusedOptions& o) override {
    const size_t R = routing_.num_received();
    AllToAllMatmul(g_, routing_,
                   {.a = x_.data(),
                    .b = w1_.data(),
                    .c = all_.data(),
                    .k = c_.k,
                    .n = c_.n,
                    .dtype = c_.dtype},
                   o);
    return MatmulAllToAll(g_, routing_,
                          {.a = hidden_.data(),
                           .b = w2_.data(),
                           .c = all_.data() + R * c_.n,
                           .k = c_.n,
                           .n = c_.k,
                           .dtype = c_.dtype,
                           .probs = probs_.data()},
                          o);
  }
  void ComputeOnly() override {
    AllToAllMatmul(alone_, alone_routing_,
                   {.a = xe_.data(),
                    .b = w1_.data(),
                    .c = y_alone_.data(),
                    .k = c_.k,
                    .n = c_.n,
                    .dtype = c_.dtype},
                   SerialOptions());
    MatmulAllToAll(alone_, alone_routing_,
                   {.a = hidden_.data(),
                    .b = w2_.data(),
                    .c = ye_.data(),
                    .k = c_.n,
                    .n = c_.k,
                    .dtype = c_.dtype},
                   SerialOptions());
  }
  // The operators move rows point-to-point (ops.h), so the comm-only time
  // is that of the same messages: the dispatch, then the combine.
  void CommOnly(const CollectiveOptions&) override {
    Exchange(xs_.data(), send_, xe_.data(), recv_, c_.k * DTypeSize(c_.dtype));
    Exchange(reinterpret_cast<char*>(ye_.data()), recv_, reinterpret_cast<char*>(yr_.data()), send_,
             c_.k * DTypeSize(c_.dtype));
  }
  std::span<const float> Output() const override { return all_; }

 protected:
  // Compute-only runs the operator's serial pipeline on a group of this
  // rank alone, fed the rows its experts receive in the whole group: the
  // library's own grouped GEMMs (and activation and combine) on the same
  // per-expert shapes, with no peer to talk to.
  void MakeAlone() {
    alone_ = g_.Split(g_.rank(), 0);
    std::vector<int32_t> ids;
    for (int le = 0; le < kMoeExpertsPerRank; ++le)
      ids.insert(ids.end(), routing_.expert_rows(le), le);
    alone_routing_ = MoeRoute(alone_, ids.data(), ids.size(), 1, kMoeExpertsPerRank);
  }

  void Exchange(char* sbuf, const std::vector<size_t>& srows, char* rbuf,
                const std::vector<size_t>& rrows, size_t row_bytes) {
    const int n = g_.size(), me = g_.rank();
    std::vector<Work> works;
    size_t so = 0, ro = 0;
    std::vector<size_t> soff(n), roff(n);
    for (int q = 0; q < n; ++q) {
      soff[q] = so;
      roff[q] = ro;
      so += srows[q];
      ro += rrows[q];
    }
    for (int i = 1; i < n; ++i) {
      const int src = (me - i + n) % n, dst = (me + i) % n;
      if (rrows[src])
        works.push_back(
            g_.Recv(rbuf + roff[src] * row_bytes, rrows[src] * row_bytes, src, kMoeTag));
      if (srows[dst])
        works.push_back(
            g_.Send(sbuf + soff[dst] * row_bytes, srows[dst] * row_bytes, dst, kMoeTag));
    }
    for (Work& w : works) w.Wait();
  }

  const Group& g_;
  const OpsConfig& c_;
  std::vector<int32_t> ids_;
  MoeRouting routing_;
  Group alone_;               // this rank alone (compute-only)
  MoeRouting alone_routing_;  // its experts' rows, routed within alone_
  std::vector<char> x_, w1_, w2_, hidden_, xe_, xs_;
  std::vector<float> probs_, all_, ye_, yr_, y_alone_;
  std::vector<size_t> send_, recv_;
};

// The same MoE layer in one call (MoeMlp): dispatch, each expert's SwiGLU
// MLP (K x 2N gate|up, silu(gate) * up, N x K) and combine, so a chunk's
// result goes back while later chunks are multiplied. Tokens, routing and
// bytes moved as MoeCase's; the GEMMs are 1.5x its (the gate).
class MoeMlpCase : public MoeCase {
 public:
  MoeMlpCase(const Group& g, const OpsConfig& c) : MoeCase(g, c) {
    const size_t R = routing_.num_received(), T = routing_.num_tokens;
    Fill(w13_, kMoeExpertsPerRank * c.k * 2 * c.n, c.dtype, 7000 + g.rank());
    // y1 (what backward keeps) and out in one buffer, so that Output()
    // checks both.
    all_.resize(R * 2 * c.n + T * c.k);
    y_alone_.resize(R * 2 * c.n);
  }
  FusedReport Run(const FusedOptions& o) override {
    const size_t R = routing_.num_received();
    MoeMlpSaved saved;
    saved.y1 = all_.data();
    return MoeMlp(g_, routing_,
                  {.a = x_.data(),
                   .w1 = w13_.data(),
                   .w2 = w2_.data(),
                   .c = all_.data() + R * 2 * c_.n,
                   .d = c_.k,
                   .h1 = 2 * c_.n,
                   .h2 = c_.n,
                   .dtype = c_.dtype,
                   .act = SwiGlu(c_.n),
                   .probs = probs_.data(),
                   .saved = saved},
                  o);
  }
  // As MoeCase's: the operator's serial pipeline on this rank alone (both
  // GEMMs, SwiGLU and its rounding, the combine), keeping y1 as Run does.
  void ComputeOnly() override {
    MoeMlpSaved saved;
    saved.y1 = y_alone_.data();
    MoeMlp(alone_, alone_routing_,
           {.a = xe_.data(),
            .w1 = w13_.data(),
            .w2 = w2_.data(),
            .c = ye_.data(),
            .d = c_.k,
            .h1 = 2 * c_.n,
            .h2 = c_.n,
            .dtype = c_.dtype,
            .act = SwiGlu(c_.n),
            .saved = saved},
           SerialOptions());
  }

 private:
  // in = [gate | up] (rows x 2n): out = silu(gate) * up (rows x n).
  static MoeActivation SwiGlu(size_t n) {
    return [n](const float* in, size_t rows, float* out) {
      for (size_t r = 0; r < rows; ++r) {
        const float* gate = in + r * 2 * n;
        const float* up = gate + n;
        for (size_t i = 0; i < n; ++i)
          out[r * n + i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
      }
    };
  }
  std::vector<char> w13_;
};

}  // namespace

// The bytes the busiest port carries in the serial pipeline (the dispatch
// and the combine both in dtype).
double MoePortBytes(const OpsConfig& c, int n) {
  std::vector<std::vector<size_t>> sent(n, std::vector<size_t>(n, 0));
  for (int r = 0; r < n; ++r)
    for (int32_t e : MoeIds(c, r, n)) sent[r][e / kMoeExpertsPerRank]++;
  double worst = 0;
  for (int r = 0; r < n; ++r) {
    double bytes = 0;
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      bytes += double(sent[r][q] + sent[q][r]) * c.k * DTypeSize(c.dtype);
    }
    worst = std::max(worst, bytes);
  }
  return worst;
}

std::unique_ptr<OpCase> MakeMoeCase(const Group& g, const OpsConfig& c) {
  return std::make_unique<MoeCase>(g, c);
}

std::unique_ptr<OpCase> MakeMoeMlpCase(const Group& g, const OpsConfig& c) {
  return std::make_unique<MoeMlpCase>(g, c);
}

}  // namespace mc2::tools::bench_ops
