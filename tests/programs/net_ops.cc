// The fused-operator suite for groups that span hosts, run as one job
// (under `mc2 run -n N` on one host, or under mpirun across the cluster in
// a box).
//
//   test_prog_net_ops suite OUTDIR   every fused operator, every pipeline;
//                                     each rank writes OUTDIR/rank<R>.txt
//   test_prog_net_ops train OUTDIR   a few training steps of the reference
//                                     transformer (TP over 4 ranks; TP 2 x
//                                     DP 2 with MoE over EP 2; on 4 ranks
//                                     also TP 2 x PP 2, 1F1B and
//                                     interleaved): each rank
//                                     writes its losses and a hash of its
//                                     parameters to OUTDIR/rank<R>.txt
//   test_prog_net_ops stall          rank 1 stops producing in the middle
//                                     of a fused MatmulAllReduce (its
//                                     overlap work sleeps 5 s); the others
//                                     must fail with the call's 1 s timeout
//                                     naming the missing chunk; each rank
//                                     prints "rank R error: WHAT", exits 3
//   test_prog_net_ops stall_recv     rank 0 receives from rank 3, which
//                                     never sends (MC2_TIMEOUT set short);
//                                     the receive must fail with kTimeout
//                                     naming rank 3 and every other rank
//                                     (in a barrier) must learn of it; each
//                                     rank prints "rank R error: WHAT",
//                                     exits 3
//   test_prog_net_ops bad            a bad shape on one rank: every rank
//                                     must raise an mc2::Error, then the
//                                     group must still work
//
// suite: inputs are a pure function of (rank, case, index), so every rank
// can compute the whole product. Each operator runs with every pipeline
// (serial, chunked, fused, auto); the serial result is checked against a
// double-precision reference computed here, and every other pipeline must
// equal serial bit for bit (deterministic mode). Each result's bytes are
// hashed into the rank's file, and the test compares the files of a run
// across hosts with those of a run on one host: bit for bit.
#include <mc2/mc2.h>
#include <mc2/models.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

int g_failures = 0;
const mc2::Pipeline kPipelines[] = {mc2::Pipeline::kSerial, mc2::Pipeline::kChunked,
                                    mc2::Pipeline::kFused, mc2::Pipeline::kAuto};

uint64_t Hash(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

// Values of varied magnitude: the order of a floating-point sum shows.
float Input(int rank, int kase, size_t i) {
  double x = std::sin(0.37 * static_cast<double>(i) + 1.7 * rank + 0.11 * kase);
  return static_cast<float>(x * std::pow(2.0, static_cast<int>((rank * 3 + i) % 5) - 2));
}
std::vector<float> Inputs(int rank, int kase, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = Input(rank, kase, i);
  return v;
}

struct Out {
  std::ofstream file;
  void Record(const std::string& name, const void* p, size_t bytes) {
    file << name << " " << std::hex << Hash(p, bytes) << std::dec << "\n";
  }
  void Check(const std::string& name, bool ok, const std::string& detail) {
    if (!ok) {
      ++g_failures;
      std::fprintf(stderr, "FAILED %s: %s\n", name.c_str(), detail.c_str());
    }
  }
  // `got` against the reference: |got - want| <= 1e-4 |want|-scale.
  void Near(const std::string& name, const std::vector<float>& got, const std::vector<double>& want,
            const std::vector<double>& scale) {
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::fabs(got[i] - want[i]) > 1e-4 * scale[i] + 1e-6) {
        Check(name, false,
              "element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
                  std::to_string(want[i]));
        return;
      }
    }
  }
  // Every pipeline's result equals serial's, bit for bit; each is hashed.
  void Pipelines(const std::string& name, const std::vector<std::vector<float>>& res) {
    for (size_t p = 0; p < res.size(); ++p) {
      const std::string pn = name + "_" + mc2::PipelineName(kPipelines[p]);
      Record(pn, res[p].data(), res[p].size() * 4);
      if (p > 0)
        Check(pn, res[p] == res[0], std::string("differs from serial (deterministic mode)"));
    }
  }
};

mc2::FusedOptions Options(mc2::Pipeline p) {
  mc2::FusedOptions o;
  o.pipeline = p;
  o.splits = 3;
  return o;
}

// c[i, j] = sum_l a[i, l] b[l, j] in double, and the sum of |terms|.
void Reference(const float* a, const float* b, size_t m, size_t k, size_t n, double* c,
               double* scale) {
  for (size_t i = 0; i < m; ++i)
    for (size_t j = 0; j < n; ++j) {
      double s = 0, t = 0;
      for (size_t l = 0; l < k; ++l) {
        double x = double(a[i * k + l]) * b[l * n + j];
        s += x;
        t += std::fabs(x);
      }
      c[i * n + j] += s;
      scale[i * n + j] += t;
    }
}

void AllGatherMatmulCases(const mc2::Group& g, Out& out) {
  const int P = g.size(), r = g.rank();
  const size_t k = 64, n = 48;
  auto rows = [](int q) { return size_t(24 + 7 * q); };
  size_t M = 0;
  for (int q = 0; q < P; ++q) M += rows(q);
  std::vector<float> b = Inputs(100, 1, k * n);
  std::vector<double> want(M * n, 0), scale(M * n, 0);
  size_t off = 0;
  for (int q = 0; q < P; ++q) {
    std::vector<float> aq = Inputs(q, 1, rows(q) * k);
    Reference(aq.data(), b.data(), rows(q), k, n, want.data() + off * n, scale.data() + off * n);
    off += rows(q);
  }
  std::vector<float> a = Inputs(r, 1, rows(r) * k);
  std::vector<std::vector<float>> res;
  for (mc2::Pipeline p : kPipelines) {
    std::vector<float> c(M * n, -1.f), ag(M * k, -1.f);
    mc2::AllGatherMatmulArgs args;
    args.a = a.data();
    args.b = b.data();
    args.c = c.data();
    args.m = rows(r);
    args.k = k;
    args.n = n;
    args.gathered_a = ag.data();
    mc2::AllGatherMatmul(g, args, Options(p));
    // The gathered A is every rank's shard in rank order, exactly.
    size_t at = 0;
    bool ok = true;
    for (int q = 0; q < P; ++q) {
      std::vector<float> aq = Inputs(q, 1, rows(q) * k);
      ok = ok && std::memcmp(ag.data() + at * k, aq.data(), aq.size() * 4) == 0;
      at += rows(q);
    }
    out.Check(std::string("ag_matmul_gathered_") + mc2::PipelineName(p), ok, "wrong gathered A");
    res.push_back(std::move(c));
  }
  out.Near("ag_matmul", res[0], want, scale);
  out.Pipelines("ag_matmul", res);
}

void MatmulReduceScatterCases(const mc2::Group& g, Out& out, bool all_reduce) {
  const int P = g.size(), r = g.rank();
  const size_t n = 40;
  auto kr = [](int q) { return size_t(32 + 4 * q); };
  auto mloc = [](int q) { return size_t(20 + 3 * q); };
  size_t m = 0, m_off = 0;
  for (int q = 0; q < P; ++q) {
    if (q == r) m_off = m;
    m += mloc(q);
  }
  std::vector<double> want(m * n, 0), scale(m * n, 0);
  for (int q = 0; q < P; ++q) {
    std::vector<float> aq = Inputs(q, 2, m * kr(q)), bq = Inputs(q, 3, kr(q) * n);
    Reference(aq.data(), bq.data(), m, kr(q), n, want.data(), scale.data());
  }
  std::vector<float> a = Inputs(r, 2, m * kr(r)), b = Inputs(r, 3, kr(r) * n);
  std::vector<std::vector<float>> res;
  for (mc2::Pipeline p : kPipelines) {
    if (all_reduce) {
      std::vector<float> c(m * n, -1.f);
      mc2::MatmulAllReduceArgs args;
      args.a = a.data();
      args.b = b.data();
      args.c = c.data();
      args.m = m;
      args.k = kr(r);
      args.n = n;
      mc2::MatmulAllReduce(g, args, Options(p));
      res.push_back(std::move(c));
    } else {
      std::vector<float> c(mloc(r) * n, -1.f);
      mc2::MatmulReduceScatterArgs args;
      args.a = a.data();
      args.b = b.data();
      args.c = c.data();
      args.m = m;
      args.k = kr(r);
      args.n = n;
      args.m_local = mloc(r);
      mc2::MatmulReduceScatter(g, args, Options(p));
      res.push_back(std::move(c));
    }
  }
  if (all_reduce) {
    out.Near("matmul_all_reduce", res[0], want, scale);
    out.Pipelines("matmul_all_reduce", res);
  } else {
    std::vector<double> w(want.begin() + m_off * n, want.begin() + (m_off + mloc(r)) * n);
    std::vector<double> s(scale.begin() + m_off * n, scale.begin() + (m_off + mloc(r)) * n);
    out.Near("matmul_reduce_scatter", res[0], w, s);
    out.Pipelines("matmul_reduce_scatter", res);
  }
}

void AllGatherBatchMatmulCases(const mc2::Group& g, Out& out) {
  const int P = g.size(), r = g.rank();
  const size_t batch = 3, k = 24, n = 20;
  auto rows = [](int q) { return size_t(10 + 2 * q); };
  size_t M = 0;
  for (int q = 0; q < P; ++q) M += rows(q);
  std::vector<float> b = Inputs(100, 4, batch * k * n);
  std::vector<double> want(batch * M * n, 0), scale(batch * M * n, 0);
  for (size_t e = 0; e < batch; ++e) {
    size_t off = 0;
    for (int q = 0; q < P; ++q) {
      std::vector<float> aq = Inputs(q, 5, batch * rows(q) * k);
      Reference(aq.data() + e * rows(q) * k, b.data() + e * k * n, rows(q), k, n,
                want.data() + (e * M + off) * n, scale.data() + (e * M + off) * n);
      off += rows(q);
    }
  }
  std::vector<float> a = Inputs(r, 5, batch * rows(r) * k);
  std::vector<std::vector<float>> res;
  for (mc2::Pipeline p : kPipelines) {
    std::vector<float> c(batch * M * n, -1.f);
    mc2::AllGatherBatchMatmulArgs args;
    args.a = a.data();
    args.b = b.data();
    args.c = c.data();
    args.m = rows(r);
    args.k = k;
    args.n = n;
    args.batch = batch;
    mc2::AllGatherBatchMatmul(g, args, Options(p));
    res.push_back(std::move(c));
  }
  out.Near("ag_batch_matmul", res[0], want, scale);
  out.Pipelines("ag_batch_matmul", res);
}

// MoE: E experts, E/P per rank, top-2 routing with some slots dropped.
// Expert e's weights are a pure function of e, so every rank knows them.
void MoeCases(const mc2::Group& g, Out& out) {
  const int P = g.size(), r = g.rank();
  const int epr = 2, E = epr * P, topk = 2;
  const size_t d = 32, h = 24;
  auto tokens = [](int q) { return size_t(40 + 3 * q); };
  auto expert_ids = [&](int q) {
    std::vector<int32_t> ids(tokens(q) * topk);
    for (size_t t = 0; t < tokens(q); ++t)
      for (int j = 0; j < topk; ++j)
        ids[t * topk + j] = (t % 11 == 5 && j == 1) ? -1 : int32_t((q * 7 + t * 3 + j * 5) % E);
    return ids;
  };
  auto w1_of = [&](int e) { return Inputs(200 + e, 6, d * h); };
  auto w2_of = [&](int e) { return Inputs(300 + e, 7, h * d); };
  const size_t T = tokens(r);
  std::vector<int32_t> ids = expert_ids(r);
  std::vector<float> x = Inputs(r, 8, T * d), probs = Inputs(r, 9, T * topk);
  // Reference: out[t] = sum_j probs[t, j] (x[t] W1[e] W2[e]), e = ids[t, j].
  std::vector<double> want(T * d, 0), scale(T * d, 0);
  for (size_t t = 0; t < T; ++t)
    for (int j = 0; j < topk; ++j) {
      const int e = ids[t * topk + j];
      if (e < 0) continue;
      std::vector<float> w1 = w1_of(e), w2 = w2_of(e);
      std::vector<double> y(h, 0), ys(h, 0);
      for (size_t c = 0; c < h; ++c)
        for (size_t l = 0; l < d; ++l) {
          y[c] += double(x[t * d + l]) * w1[l * h + c];
          ys[c] += std::fabs(double(x[t * d + l]) * w1[l * h + c]);
        }
      for (size_t c = 0; c < d; ++c)
        for (size_t l = 0; l < h; ++l) {
          want[t * d + c] += probs[t * topk + j] * y[l] * w2[l * d + c];
          scale[t * d + c] += std::fabs(probs[t * topk + j] * w2[l * d + c]) * ys[l];
        }
    }
  // This rank's experts.
  std::vector<float> w1(epr * d * h), w2(epr * h * d);
  for (int le = 0; le < epr; ++le) {
    std::vector<float> a = w1_of(r * epr + le), b = w2_of(r * epr + le);
    std::copy(a.begin(), a.end(), w1.begin() + le * d * h);
    std::copy(b.begin(), b.end(), w2.begin() + le * h * d);
  }
  mc2::MoeRouting routing = mc2::MoeRoute(g, ids.data(), T, topk, E);
  const size_t R = routing.num_received();
  std::vector<std::vector<float>> mlp, chained, dispatched;
  for (mc2::Pipeline p : kPipelines) {
    // MoeMlp (identity activation).
    std::vector<float> c(T * d, -1.f);
    mc2::MoeMlpArgs m;
    m.a = x.data();
    m.w1 = w1.data();
    m.w2 = w2.data();
    m.c = c.data();
    m.d = d;
    m.h1 = m.h2 = h;
    m.probs = probs.data();
    mc2::MoeMlp(g, routing, m, Options(p));
    mlp.push_back(std::move(c));
    // The same as dispatch + expert GEMM, then expert GEMM + combine.
    std::vector<float> y(R * h, -1.f), o(T * d, -1.f);
    mc2::AllToAllMatmulArgs a2a;
    a2a.a = x.data();
    a2a.b = w1.data();
    a2a.c = y.data();
    a2a.k = d;
    a2a.n = h;
    mc2::AllToAllMatmul(g, routing, a2a, Options(p));
    mc2::MatmulAllToAllArgs back;
    back.a = y.data();
    back.b = w2.data();
    back.c = o.data();
    back.k = h;
    back.n = d;
    back.probs = probs.data();
    mc2::MatmulAllToAll(g, routing, back, Options(p));
    dispatched.push_back(std::move(y));
    chained.push_back(std::move(o));
  }
  out.Near("moe_mlp", mlp[0], want, scale);
  out.Pipelines("moe_mlp", mlp);
  out.Pipelines("moe_all_to_all_matmul", dispatched);
  out.Near("moe_matmul_all_to_all", chained[0], want, scale);
  out.Pipelines("moe_matmul_all_to_all", chained);
}

int Suite(const char* dir) {
  mc2::Group world = mc2::Group::FromEnv();
  Out out;
  out.file.open(std::string(dir) + "/rank" + std::to_string(world.rank()) + ".txt");
  AllGatherMatmulCases(world, out);
  MatmulReduceScatterCases(world, out, false);
  MatmulReduceScatterCases(world, out, true);
  AllGatherBatchMatmulCases(world, out);
  MoeCases(world, out);
  // A subgroup across hosts (by parity, with 2 ranks per host), and the
  // whole suite once more on the world (the channel's counters and windows
  // carry over from call to call).
  {
    mc2::Group sub = world.Split(world.rank() % 2, world.rank());
    AllGatherMatmulCases(sub, out);
    MatmulReduceScatterCases(sub, out, true);
    mc2::Barrier(sub).Wait();
  }
  MatmulReduceScatterCases(world, out, false);
  mc2::Barrier(world).Wait();
  out.file.close();
  std::printf("rank %d: %s\n", world.rank(), g_failures ? "FAILED" : "ok");
  return g_failures ? 1 : 0;
}

// Trains `model` for 3 steps (`step_loss(step)` runs one, returns its
// loss), records each loss and a hash of the parameters under `name`, and
// checks that the loss fell.
template <typename Model, typename StepLoss>
void TrainAndRecord(Out& out, const std::string& name, Model& model, StepLoss step_loss) {
  double first = 0, last = 0;
  for (int step = 0; step < 3; ++step) {
    const auto loss = step_loss(step);
    out.Record(name + "loss" + std::to_string(step), &loss, sizeof(loss));
    (step == 0 ? first : last) = loss;
  }
  out.Check(name + "loss", std::isfinite(last) && last < first,
            "loss went from " + std::to_string(first) + " to " + std::to_string(last));
  uint64_t h = 0;
  for (const mc2::models::ParamView& p : model.Parameters())
    h = h * 31 + Hash(p.value, p.rows * p.cols * sizeof(float));
  out.Record(name + "params", &h, sizeof(h));
}

// Pipeline parallelism on 4 ranks: TP 2 inside each of 2 stages (world
// ranks 0-1 and 2-3, so on 2 hosts x 2 ranks TP stays inside a host and the
// stages' activations and gradients cross between the hosts by Send/Recv),
// with the 1F1B and the interleaved schedule; each rank records its losses
// and a hash of its stage's parameters.
void TrainPipeline(mc2::Group& world, Out& out) {
  if (world.size() != 4) return;
  mc2::models::ProcessGrid grid = mc2::models::MakeGrid3D(world, {.tp = 2, .pp = 2});
  for (int interleaved = 0; interleaved < 2; ++interleaved) {
    mc2::models::TransformerConfig cfg;
    cfg.seed = 9;
    cfg.layers = 4;
    cfg.fused.pipeline = mc2::Pipeline::kFused;
    cfg.fused.splits = 2;
    mc2::models::PipelineConfig pipe;
    pipe.micro_batches = interleaved ? 2 : 4;
    if (interleaved) {
      pipe.schedule = mc2::models::PipelineSchedule::kInterleaved;
      pipe.virtual_stages = 2;
    }
    mc2::models::PipelineTransformer model(grid, cfg, pipe);
    TrainAndRecord(out, interleaved ? "train_pp_interleaved_" : "train_pp_1f1b_", model,
                   [&](int step) { return model.TrainStep(step).step.loss; });
  }
}

int Train(const char* dir) {
  mc2::Group world = mc2::Group::FromEnv();
  Out out;
  out.file.open(std::string(dir) + "/rank" + std::to_string(world.rank()) + ".txt");
  for (int moe = 0; moe < 2; ++moe) {
    mc2::models::TransformerConfig cfg;
    cfg.seed = 7;
    cfg.fused.pipeline = mc2::Pipeline::kFused;
    cfg.fused.splits = 2;
    const int tp = moe ? 2 : world.size(), ep = moe ? 2 : 1;
    if (moe) {
      cfg.moe_experts = 4;
      cfg.fused.pipeline = mc2::Pipeline::kAuto;
    }
    mc2::models::ProcessGrid grid = mc2::models::MakeGrid(world, tp, ep);
    mc2::models::Transformer model(grid, cfg);
    TrainAndRecord(out, moe ? "train_moe_" : "train_dense_", model,
                   [&](int step) { return model.TrainStep(step).loss; });
  }
  TrainPipeline(world, out);
  mc2::Barrier(world).Wait();
  out.file.close();
  std::printf("rank %d: train %s\n", world.rank(), g_failures ? "FAILED" : "ok");
  return g_failures ? 1 : 0;
}

int Stall() {
  mc2::Group g = mc2::Group::FromEnv();
  const int r = g.rank();
  // Rank 1's slice is one column: its partials are ready long before the
  // others', so it blocks waiting for theirs (and runs its overlap work).
  const size_t m = 64 * g.size(), k = r == 1 ? 1 : 8192, n = 64;
  std::vector<float> a(m * k, 1.f), b(k * n, 1.f), c(m * n);
  mc2::MatmulAllReduceArgs args;
  args.a = a.data();
  args.b = b.data();
  args.c = c.data();
  args.m = m;
  args.k = k;
  args.n = n;
  mc2::FusedOptions o = Options(mc2::Pipeline::kFused);
  o.splits = 4;
  o.timeout = std::chrono::seconds(1);
  try {
    mc2::MatmulAllReduce(g, args, o);  // a good call first
    // Rank 1's overlap work then runs before it reduces and hands out its
    // block's chunks, which the others wait for.
    if (r == 1) o.overlap_work = [] { std::this_thread::sleep_for(std::chrono::seconds(5)); };
    mc2::MatmulAllReduce(g, args, o);
  } catch (const mc2::Error& e) {
    std::printf("rank %d error: %s\n", r, e.what());
    std::fflush(stdout);
    std::exit(3);
  }
  std::printf("rank %d: stall finished\n", r);
  return 0;
}

int StallRecv() {
  mc2::Group g = mc2::Group::FromEnv();
  const int r = g.rank();
  std::vector<float> buf(1024);
  try {
    if (r == 0) {
      g.Recv(buf.data(), buf.size() * sizeof(float), g.size() - 1, 7).Wait();
    } else {
      // A barrier rank 0 never joins, with a timeout longer than the
      // receive's: the receive's error must be what ends it.
      mc2::CollectiveOptions o;
      o.timeout = std::chrono::seconds(30);
      mc2::Barrier(g, o).Wait();
    }
  } catch (const mc2::Error& e) {
    std::printf("rank %d error: %s\n", r, e.what());
    std::fflush(stdout);
    std::exit(3);
  }
  std::printf("rank %d: stall_recv finished\n", r);
  return 0;
}

// A bad shape on one rank: rank 1 gives k + 1 (a mismatch), then rank 2 a
// null C (invalid). Every rank must raise the error; the group stays usable.
int Bad() {
  mc2::Group g = mc2::Group::FromEnv();
  const int r = g.rank();
  const size_t m = 8, k = 16, n = 8;
  std::vector<float> a(m * (k + 1), 1.f), b((k + 1) * n, 1.f), c(m * g.size() * n);
  int fails = 0;
  for (int step = 0; step < 2; ++step) {
    mc2::AllGatherMatmulArgs args;
    args.a = a.data();
    args.b = b.data();
    args.c = c.data();
    args.m = m;
    args.k = (step == 0 && r == 1) ? k + 1 : k;
    args.n = n;
    if (step == 1 && r == 2 % g.size()) args.c = nullptr;
    const mc2::ErrorCode expect =
        step == 0 ? mc2::ErrorCode::kMismatch : mc2::ErrorCode::kInvalidArgument;
    try {
      mc2::AllGatherMatmul(g, args, Options(mc2::Pipeline::kFused));
      std::printf("rank %d: step %d raised nothing\n", r, step);
      ++fails;
    } catch (const mc2::Error& e) {
      std::printf("rank %d error: %s\n", r, e.what());
      if (e.code() != expect) ++fails;
    }
  }
  // Still usable: a good call with the fused pipeline.
  mc2::AllGatherMatmulArgs args;
  args.a = a.data();
  args.b = b.data();
  args.c = c.data();
  args.m = m;
  args.k = k;
  args.n = n;
  mc2::AllGatherMatmul(g, args, Options(mc2::Pipeline::kFused));
  bool ok = true;
  for (float v : c) ok = ok && v == float(k);
  if (!ok) {
    std::printf("rank %d: wrong result after the errors\n", r);
    ++fails;
  }
  mc2::Barrier(g).Wait();
  std::printf("rank %d: bad %s\n", r, fails ? "FAILED" : "ok");
  return fails ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 3 && std::string(argv[1]) == "suite") return Suite(argv[2]);
    if (argc == 3 && std::string(argv[1]) == "train") return Train(argv[2]);
    if (argc == 2 && std::string(argv[1]) == "bad") return Bad();
    if (argc == 2 && std::string(argv[1]) == "stall") return Stall();
    if (argc == 2 && std::string(argv[1]) == "stall_recv") return StallRecv();
  } catch (const mc2::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: %s suite OUTDIR | train OUTDIR | bad | stall | stall_recv\n", argv[0]);
  return 2;
}
