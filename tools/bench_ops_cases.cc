// `mc2 bench ops`: the dense operator cases and the runner table.
//
// Every rank runs a GEMM of M x K x N (2 M N K flops): AllGatherMatmul
// gathers M rows of A [M x K] (each rank holds M/n) and multiplies by its
// B [K x N]; MatmulReduceScatter and MatmulAllReduce multiply A [M x K] by
// B [K x N] and reduce the [M x N] products over the ranks;
// AllGatherBatchMatmul does the same as AllGatherMatmul as a batch of four.
// Each case's compute-only is the serial pipeline's GEMMs, run as the
// operators run them, and its comm-only the serial pipeline's collective.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bench_ops.h"
#include "launcher.h"

namespace mc2::tools::bench_ops {

void Fill(std::vector<char>& bytes, size_t count, DType dtype, uint64_t seed) {
  std::vector<float> f(count);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& v : f) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<float>(static_cast<int64_t>(x % 2001) - 1000) / 1000.0f;
  }
  bytes.resize(count * DTypeSize(dtype));
  if (count == 0) return;
  if (dtype == DType::kF32)
    std::memcpy(bytes.data(), f.data(), count * 4);
  else
    ConvertF32ToBF16(f.data(), reinterpret_cast<bf16*>(bytes.data()), count);
}

ops::PackedGemmBSet OpCase::OpGemms(const Group& g, DType dtype) {
  GemmOptions o;
  if (g.deterministic() && dtype == DType::kF32) o.backend = GemmBackend::kOneDNN;
  return ops::PackedGemmBSet(dtype, o);
}

namespace {

class AllGatherMatmulCase : public OpCase {
 public:
  AllGatherMatmulCase(const Group& g, const OpsConfig& c)
      : g_(g), c_(c), rows_(RowsOf(c.m, g.rank(), g.size())) {
    Fill(a_, rows_ * c.k, c.dtype, 11 + g.rank());
    Fill(b_, c.k * c.n, c.dtype, 1000 + g.rank());
    ag_.resize(c.m * c.k * DTypeSize(c.dtype));
    out_.resize(c.m * c.n);
    for (int r = 0; r < g.size(); ++r) {
      counts_.push_back(RowsOf(c.m, r, g.size()) * c.k * DTypeSize(c.dtype));
      displs_.push_back(r == 0 ? 0 : displs_.back() + counts_[r - 1]);
    }
  }
  FusedReport Run(const FusedOptions& o) override {
    return AllGatherMatmul(g_,
                           {.a = a_.data(),
                            .b = b_.data(),
                            .c = out_.data(),
                            .m = rows_,
                            .k = c_.k,
                            .n = c_.n,
                            .dtype = c_.dtype},
                           o);
  }
  void ComputeOnly() override {
    auto gemms = OpGemms(g_, c_.dtype);
    gemms.Gemm(c_.m, c_.n, c_.k, ag_.data(), b_.data(), DType::kF32, out_.data());
  }
  void CommOnly(const CollectiveOptions& co) override {
    AllGatherV(g_, a_.data(), ag_.data(), counts_, displs_, DType::kU8, co).Wait();
  }
  std::span<const float> Output() const override { return out_; }

 private:
  const Group& g_;
  const OpsConfig& c_;
  size_t rows_;
  std::vector<char> a_, b_, ag_;
  std::vector<float> out_;
  std::vector<size_t> counts_, displs_;
};

// MatmulReduceScatter (all_reduce = false) and MatmulAllReduce.
class MatmulReduceCase : public OpCase {
 public:
  MatmulReduceCase(const Group& g, const OpsConfig& c, bool all_reduce)
      : g_(g), c_(c), all_reduce_(all_reduce), rows_(RowsOf(c.m, g.rank(), g.size())) {
    Fill(a_, c.m * c.k, c.dtype, 21 + g.rank());
    Fill(b_, c.k * c.n, c.dtype, 2000 + g.rank());
    full_.resize(c.m * c.n);
    out_.resize((all_reduce ? c.m : rows_) * c.n);
    for (int r = 0; r < g.size(); ++r) counts_.push_back(RowsOf(c.m, r, g.size()) * c.n);
  }
  FusedReport Run(const FusedOptions& o) override {
    if (all_reduce_) {
      return MatmulAllReduce(g_,
                             {.a = a_.data(),
                              .b = b_.data(),
                              .c = out_.data(),
                              .m = c_.m,
                              .k = c_.k,
                              .n = c_.n,
                              .dtype = c_.dtype},
                             o);
    }
    return MatmulReduceScatter(g_,
                               {.a = a_.data(),
                                .b = b_.data(),
                                .c = out_.data(),
                                .m = c_.m,
                                .k = c_.k,
                                .n = c_.n,
                                .dtype = c_.dtype,
                                .m_local = rows_},
                               o);
  }
  void ComputeOnly() override {
    auto gemms = OpGemms(g_, c_.dtype);
    gemms.Gemm(c_.m, c_.n, c_.k, a_.data(), b_.data(), DType::kF32, full_.data());
  }
  void CommOnly(const CollectiveOptions& co) override {
    if (all_reduce_) {
      AllReduce(g_, full_.data(), full_.data(), full_.size(), DType::kF32, ReduceOp::kSum, co)
          .Wait();
    } else {
      ReduceScatterV(g_, full_.data(), out_.data(), counts_, DType::kF32, ReduceOp::kSum, co)
          .Wait();
    }
  }
  std::span<const float> Output() const override { return out_; }

 private:
  const Group& g_;
  const OpsConfig& c_;
  bool all_reduce_;
  size_t rows_;
  std::vector<char> a_, b_;
  std::vector<float> full_, out_;
  std::vector<size_t> counts_;
};

// AllGatherBatchMatmul: a batch of kBatchEntries products, each gathering
// M / kBatchEntries rows (split unevenly over the ranks) of K, times its own
// B [K x N]: the same 2 M N K flops and port bytes as all_gather_matmul.
constexpr size_t kBatchEntries = 4;

class AllGatherBatchMatmulCase : public OpCase {
 public:
  AllGatherBatchMatmulCase(const Group& g, const OpsConfig& c)
      : g_(g), c_(c), m_(c.m / kBatchEntries), rows_(RowsOf(m_, g.rank(), g.size())) {
    const size_t es = DTypeSize(c.dtype);
    Fill(a_, kBatchEntries * rows_ * c.k, c.dtype, 31 + g.rank());
    Fill(b_, kBatchEntries * c.k * c.n, c.dtype, 3000 + g.rank());
    ag_.resize(kBatchEntries * m_ * c.k * es);
    out_.resize(kBatchEntries * m_ * c.n);
    for (int r = 0; r < g.size(); ++r) {
      counts_.push_back(kBatchEntries * RowsOf(m_, r, g.size()) * c.k * es);
      displs_.push_back(r == 0 ? 0 : displs_.back() + counts_[r - 1]);
    }
  }
  FusedReport Run(const FusedOptions& o) override {
    return AllGatherBatchMatmul(g_,
                                {.a = a_.data(),
                                 .b = b_.data(),
                                 .c = out_.data(),
                                 .m = rows_,
                                 .k = c_.k,
                                 .n = c_.n,
                                 .dtype = c_.dtype,
                                 .batch = kBatchEntries,
                                 .b_layout = BatchB::kPerBatch},
                                o);
  }
  void ComputeOnly() override {
    auto gemms = OpGemms(g_, c_.dtype);
    const size_t es = DTypeSize(c_.dtype);
    for (size_t e = 0; e < kBatchEntries; ++e) {
      gemms.Gemm(m_, c_.n, c_.k, ag_.data() + e * m_ * c_.k * es, b_.data() + e * c_.k * c_.n * es,
                 DType::kF32, out_.data() + e * m_ * c_.n);
    }
  }
  void CommOnly(const CollectiveOptions& co) override {
    AllGatherV(g_, a_.data(), ag_.data(), counts_, displs_, DType::kU8, co).Wait();
  }
  std::span<const float> Output() const override { return out_; }

 private:
  const Group& g_;
  const OpsConfig& c_;
  size_t m_, rows_;
  std::vector<char> a_, b_, ag_;
  std::vector<float> out_;
  std::vector<size_t> counts_, displs_;
};

const OpRunner kRunners[] = {
    {"all_gather_matmul", ops::FusedOpKind::kAllGatherMatmul,
     "A [M x K] gathered from M/n rows per rank, times B [K x N]",
     [](const Group& g, const OpsConfig& c) -> std::unique_ptr<OpCase> {
       return std::make_unique<AllGatherMatmulCase>(g, c);
     }},
    {"matmul_reduce_scatter", ops::FusedOpKind::kMatmulReduceScatter,
     "A [M x K] times B [K x N] per rank, reduce-scattered by rows",
     [](const Group& g, const OpsConfig& c) { return MakeMatmulReduceCase(g, c, false); }},
    {"matmul_all_reduce", ops::FusedOpKind::kMatmulAllReduce,
     "A [M x K] times B [K x N] per rank, all-reduced",
     [](const Group& g, const OpsConfig& c) { return MakeMatmulReduceCase(g, c, true); }},
    {"all_gather_batch_matmul", ops::FusedOpKind::kAllGatherMatmul,
     "a batch of 4: A [4 x M/4 x K] gathered from M/4n rows per rank and entry, times B [4 x K "
     "x N]",
     [](const Group& g, const OpsConfig& c) -> std::unique_ptr<OpCase> {
       return std::make_unique<AllGatherBatchMatmulCase>(g, c);
     }},
    {"moe", ops::FusedOpKind::kAllGatherMatmul,
     "~M tokens [x K] per rank (uneven), top-2 of 2n experts (skewed), experts K x N then N x "
     "K: dispatch + experts + combine",
     MakeMoeCase, MoePortBytes},
    {"moe_mlp", ops::FusedOpKind::kAllGatherMatmul,
     "as moe, in one call (MoeMlp): experts K x 2N (gate|up), SwiGLU, N x K", MakeMoeMlpCase,
     MoePortBytes},
};

}  // namespace

std::unique_ptr<OpCase> MakeMatmulReduceCase(const Group& g, const OpsConfig& c, bool all_reduce) {
  return std::make_unique<MatmulReduceCase>(g, c, all_reduce);
}

std::span<const OpRunner> Runners() { return kRunners; }

const OpRunner* FindRunner(const std::string& name) {
  for (const OpRunner& r : kRunners)
    if (name == r.name) return &r;
  return nullptr;
}

std::vector<std::string> RunnerNames() {
  std::vector<std::string> names;
  for (const OpRunner& r : kRunners) names.emplace_back(r.name);
  return names;
}

ops::Problem ProblemOf(const OpRunner& r, const OpsConfig& c, int n) {
  ops::Problem p;
  p.op = r.kind;
  p.ranks = n;
  p.dtype = c.dtype;
  p.M = c.m;
  p.k = c.k;
  p.n = c.n;
  for (int q = 0; q < n; ++q) p.rows.push_back(RowsOf(c.m, q, n));
  return p;
}

// The fused workspace (grown geometrically, so twice) plus the groups'
// areas and the collectives' scratch.
size_t HeapBytesFor(const OpRunner& r, const OpsConfig& c, int n) {
  size_t ws = ops::FusedWorkspaceBytes(ProblemOf(r, c, n));
  return std::max<size_t>(tools::kDefaultHeapBytes, 2 * ws + (size_t{64} << 20));
}

CollectiveOptions OpCollectiveOptions(bool emulated) {
  CollectiveOptions co;
  co.may_run_inline = false;
  if (emulated) co.algorithm = Algorithm::kRing;
  return co;
}

}  // namespace mc2::tools::bench_ops
