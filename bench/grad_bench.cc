// GradSync benchmarks (include/mc2/grad.h), on in-process ranks over an
// optional emulated link. Two parts:
//
//   build/bench/grad_bench exchange [-n 2] [--mib 16] [--tensors 64] [--reps 9]
//                                   [--link SPEC] [--ways LIST] [--json FILE]
//     One gradient-sync step (every tensor marked ready, then Finish) per
//     way of doing it, round-robin over repetitions so that every way sees
//     the same machine: one all-reduce per tensor (issued together, then
//     waited), GradSync uncompressed, f16, bf16, threshold (1e-6 and
//     1e-3), top-k 1% and 10% with error feedback, and `auto`
//     (Compression::kAuto, bf16 against dense). Before the timed
//     repetitions `auto` runs its measuring steps back to back (the
//     gradients' refill stands for backward) and keeps what it chose.
//     Prints, per way, the median and min time of rank 0, the bytes one
//     rank receives (GradSyncStats::wire_bytes) against the dense
//     all-reduce, and what `auto` chose with the medians it saw.
//
//   build/bench/grad_bench train [-n 2] [--steps 200] [--schemes LIST] [--warmup W]
//                                [--json FILE]
//     Trains the reference transformer (DP = n, TP = 1) for --steps steps
//     from the same weights once per compression scheme (LIST: names of
//     mc2::ParseCompression, top-k as topk@RATIO, PowerSGD as powersgd@RANK;
//     every scheme exchanges its first W steps uncompressed:
//     CompressionOptions::warmup_steps) and prints the
//     loss every 10 steps, the mean loss of the last 10 steps and its
//     difference from the uncompressed run.
//
//   build/bench/grad_bench overlap [-n 2] [--layers 8] [--hidden 512] [--reps 9]
//                                  [--ratio 0.5] [--json FILE]
//     A synthetic backward (per layer, last first: a weight-gradient GEMM
//     [hidden x rows] x [rows x hidden] into the layer's gradient) over an
//     emulated link calibrated so that the gradient all-reduce takes
//     --ratio x the backward's compute, three ways, round-robin: GradSync
//     marking each layer's gradient ready as it is computed (overlapped),
//     GradSync marking everything after backward, and one all-reduce per
//     tensor after backward. Prints the medians and the speedup of the
//     overlapped step over the step that syncs after backward.
//
//   build/bench/grad_bench overlap --model demo [-n 2] [--reps 4] [--ratio 0.5]
//                                  [--batch 4] [--json FILE]
//     The same on the data-parallel training step of `mc2 demo`'s model
//     (2 layers, hidden 1024, 16 heads, ffn 2048, --batch x 256 tokens per
//     step over all ranks, a multiple of n; DP = n, TP = 1): its backward is timed without a link first, then the
//     link is calibrated so that the gradients' all-reduce takes --ratio x
//     that backward, and three copies of the model train side by side, one
//     step each in turn: GradSync buckets marked during backward
//     (overlapped), every gradient marked after backward
//     (TransformerConfig::grad_overlap off), and one all-reduce per tensor
//     marked during backward (grad_bucket_cap_bytes = 1). Step times are
//     rank 0's StepStats::seconds (forward, backward, waiting for the
//     gradients); bwd+sync is the part the gradient sync can change,
//     backward_seconds + sync_wait_seconds. The forward caps the whole
//     step's speedup at (F + B + S) / (F + B) for a sync S hidden entirely.
//
// Gradients are synthetic in `exchange`: normal-like values of scale 1e-3
// with a tail of small ones, different per rank and step.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mc2/mc2.h"
#include "mc2/models.h"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string mode;
  int n = 2;
  double mib = 16;
  int tensors = 64;
  int reps = 9;
  int steps = 200;
  int warmup = 0;
  int layers = 8;
  int hidden = 512;
  double ratio = 0.5;
  std::string link = "none";
  std::string schemes = "none,bf16,f16,threshold,topk";
  std::string json_path;
  std::string ways;  // exchange: a comma-separated subset (empty: all)
  std::string model = "synthetic";  // overlap: synthetic or demo
  bool reps_given = false;
  int batch = 4;  // overlap --model demo: sequences per step, over all ranks
};

[[noreturn]] void Usage(const char* msg) {
  std::fprintf(stderr,
               "grad_bench: %s\nusage: grad_bench exchange|train [options] (see the file's opening "
               "comment)\n",
               msg);
  std::exit(2);
}

Args Parse(int argc, char** argv) {
  Args a;
  if (argc < 2) Usage("missing mode");
  a.mode = argv[1];
  if (a.mode != "exchange" && a.mode != "train" && a.mode != "overlap") {
    Usage("mode must be exchange, train or overlap");
  }
  for (int i = 2; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) Usage((k + " needs a value").c_str());
      return argv[++i];
    };
    if (k == "-n")
      a.n = std::stoi(val());
    else if (k == "--mib")
      a.mib = std::stod(val());
    else if (k == "--tensors")
      a.tensors = std::stoi(val());
    else if (k == "--reps")
      a.reps = std::stoi(val()), a.reps_given = true;
    else if (k == "--model")
      a.model = val();
    else if (k == "--steps")
      a.steps = std::stoi(val());
    else if (k == "--warmup")
      a.warmup = std::stoi(val());
    else if (k == "--layers")
      a.layers = std::stoi(val());
    else if (k == "--hidden")
      a.hidden = std::stoi(val());
    else if (k == "--ratio")
      a.ratio = std::stod(val());
    else if (k == "--batch")
      a.batch = std::stoi(val());
    else if (k == "--link")
      a.link = val();
    else if (k == "--schemes")
      a.schemes = val();
    else if (k == "--json")
      a.json_path = val();
    else if (k == "--ways")
      a.ways = val();
    else
      Usage(("unknown option " + k).c_str());
  }
  if (a.n < 1 || a.tensors < 1 || a.reps < 1 || a.steps < 1 || !(a.mib > 0) || a.layers < 1 ||
      a.hidden < 1 || !(a.ratio > 0) || a.batch < 1) {
    Usage("bad value");
  }
  if (a.model != "synthetic" && a.model != "demo") Usage("--model must be synthetic or demo");
  if (a.model == "demo" && a.mode != "overlap") Usage("--model applies to overlap only");
  return a;
}

float Synthetic(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  // Sum of four uniforms: roughly normal, scale 1e-3; one in 16 is 1e-7 x.
  double s = 0;
  for (int k = 0; k < 4; ++k) s += static_cast<double>((x >> (16 * k)) & 0xffff) / 65536.0 - 0.5;
  if ((x & 0xf) == 0) s *= 1e-4;
  return static_cast<float>(s * 2e-3);
}

struct Way {
  std::string name;
  bool per_tensor = false;
  mc2::CompressionOptions c;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Exchange(const Args& a) {
  std::vector<Way> ways = {
      {"per_tensor", true, {}},
      {"bucketed", false, {}},
      {"f16", false, {.scheme = mc2::Compression::kF16}},
      {"bf16", false, {.scheme = mc2::Compression::kBF16}},
      {"threshold_1e-6", false, {.scheme = mc2::Compression::kThreshold}},
      {"threshold_1e-3", false, {.scheme = mc2::Compression::kThreshold, .threshold = 1e-3f}},
      {"topk_1%", false, {.scheme = mc2::Compression::kTopK, .topk_ratio = 0.01}},
      {"topk_10%", false, {.scheme = mc2::Compression::kTopK, .topk_ratio = 0.1}},
      {"auto", false, {.scheme = mc2::Compression::kAuto}}};
  if (!a.ways.empty()) {  // keep per_tensor and bucketed: the baselines
    std::vector<Way> kept;
    for (const Way& w : ways) {
      if (w.name == "per_tensor" || w.name == "bucketed" ||
          ("," + a.ways + ",").find("," + w.name + ",") != std::string::npos) {
        kept.push_back(w);
      }
    }
    ways = kept;
  }
  const size_t total = static_cast<size_t>(a.mib * (1 << 20) / 4);
  // Tensor sizes: a spread (1x .. 4x) around the mean, as a model's are.
  std::vector<size_t> sizes;
  {
    double wsum = 0;
    std::vector<double> w;
    for (int t = 0; t < a.tensors; ++t)
      w.push_back(1.0 + 3.0 * ((t * 7) % a.tensors) / a.tensors), wsum += w.back();
    for (int t = 0; t < a.tensors; ++t)
      sizes.push_back(std::max<size_t>(1, static_cast<size_t>(total * w[t] / wsum)));
  }
  std::vector<std::vector<double>> times(ways.size());
  std::vector<mc2::GradSyncStats> stats(ways.size());
  std::vector<mc2::GradSyncTuning> tuning(ways.size());
  int auto_steps = 0;
  mc2::WorldOptions wo;
  wo.link = a.link;
  wo.heap_bytes = static_cast<size_t>(a.mib * 4 * (1 << 20)) + (size_t{256} << 20);
  std::mutex mu;
  mc2::Group::RunInProcess(
      a.n,
      [&](mc2::Group& g) {
        std::vector<std::unique_ptr<mc2::GradSync>> syncs;
        std::vector<std::vector<int>> ids(ways.size());
        for (const Way& w : ways) {
          mc2::GradSyncOptions o;
          o.compression = w.c;
          o.bucket_cap_bytes = size_t{4} << 20;
          auto s = std::make_unique<mc2::GradSync>(g, o);
          for (size_t t = 0; t < sizes.size(); ++t) {
            std::string name = "t";  // not "t" + ...: GCC 12 warns falsely (-Wrestrict)
            name += std::to_string(t);
            s->Register(name, sizes[t], mc2::DType::kF32);
          }
          s->Finalize();
          syncs.push_back(std::move(s));
        }
        // The per-tensor baseline: its own symmetric buffers, in place.
        std::vector<mc2::SymmetricBuffer> own;
        for (size_t sz : sizes) own.push_back(g.AllocSymmetric(sz * 4));
        auto fill = [&](size_t wi, int rep) {
          mc2::GradSync& s = *syncs[wi];
          for (size_t t = 0; t < sizes.size(); ++t) {
            float* d =
                ways[wi].per_tensor ? own[t].as<float>() : s.GradAs<float>(static_cast<int>(t));
            const uint64_t base =
                (uint64_t(rep + 2) << 48) ^ (uint64_t(g.rank()) << 40) ^ (uint64_t(t) << 28);
            for (size_t i = 0; i < sizes[t]; ++i) d[i] = Synthetic(base + i);
          }
        };
        // `auto` decides first, from its own consecutive steps (the same
        // number on every rank: the schedule depends on step counts only).
        for (size_t wi = 0; wi < ways.size(); ++wi) {
          mc2::GradSync& s = *syncs[wi];
          int steps = 0;
          while (ways[wi].c.scheme == mc2::Compression::kAuto && s.tuning().compression_deciding) {
            fill(wi, 1000 + steps++);
            for (size_t t = sizes.size(); t-- > 0;) s.MarkReady(static_cast<int>(t));
            s.Finish();
          }
          if (g.rank() == 0) {
            std::lock_guard<std::mutex> lock(mu);
            tuning[wi] = s.tuning();
            auto_steps = std::max(auto_steps, steps);
          }
        }
        for (int rep = -1; rep < a.reps; ++rep) {  // rep -1: warm-up
          for (size_t wi = 0; wi < ways.size(); ++wi) {
            mc2::GradSync& s = *syncs[wi];
            fill(wi, rep);  // fresh gradients (not timed)
            mc2::Barrier(g).Wait();
            const auto t0 = Clock::now();
            if (ways[wi].per_tensor) {
              std::vector<mc2::Work> works;
              mc2::CollectiveOptions co;
              co.may_run_inline = false;
              for (size_t t = sizes.size(); t-- > 0;) {
                works.push_back(mc2::AllReduce(g, own[t].data(), own[t].data(), sizes[t],
                                               mc2::DType::kF32, mc2::ReduceOp::kAvg, co));
              }
              for (auto& w : works) w.Wait();
            } else {
              for (size_t t = sizes.size(); t-- > 0;) s.MarkReady(static_cast<int>(t));
              s.Finish();
            }
            const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
            if (g.rank() == 0 && rep >= 0) {
              std::lock_guard<std::mutex> lock(mu);
              times[wi].push_back(sec);
              if (!ways[wi].per_tensor) stats[wi] = s.stats();
            }
          }
        }
        mc2::Barrier(g).Wait();
      },
      wo);
  const size_t dense = stats[1].dense_bytes;
  stats[0] = stats[1];  // the same all-reduces, one per tensor
  std::printf(
      "# grad_bench exchange: %d ranks, %zu f32 gradients (%.1f MiB) in %d tensors, "
      "link %s, %d reps (median, min)\n",
      a.n, total, a.mib, a.tensors, a.link.c_str(), a.reps);
  std::printf("%-16s %12s %12s %14s %10s %10s\n", "way", "median_ms", "min_ms", "wire_bytes",
              "wire/dense", "vs_bucketed");
  json out = {{"ranks", a.n},   {"elements", total}, {"tensors", a.tensors},
              {"link", a.link}, {"reps", a.reps},    {"ways", json::array()}};
  std::string auto_line;
  const double base = Median(times[1]);
  for (size_t wi = 0; wi < ways.size(); ++wi) {
    const double med = Median(times[wi]);
    const double mn = *std::min_element(times[wi].begin(), times[wi].end());
    const double ratio = dense ? static_cast<double>(stats[wi].wire_bytes) / dense : 0;
    std::printf("%-16s %12.3f %12.3f %14zu %10.3f %10.2f\n", ways[wi].name.c_str(), med * 1e3,
                mn * 1e3, stats[wi].wire_bytes, ratio, med > 0 ? base / med : 0);
    out["ways"].push_back({{"name", ways[wi].name},
                           {"median_s", med},
                           {"min_s", mn},
                           {"wire_bytes", stats[wi].wire_bytes},
                           {"dense_bytes", dense},
                           {"sent_elements", stats[wi].sent_elements},
                           {"scheme", mc2::CompressionName(stats[wi].scheme)}});
    if (ways[wi].c.scheme == mc2::Compression::kAuto) {
      const mc2::GradSyncTuning& t = tuning[wi];
      const char* lossy = mc2::CompressionName(ways[wi].c.auto_scheme);
      out["auto"] = {{"lossy", lossy},
                     {"chose", mc2::CompressionName(t.compression)},
                     {"dense_step_s", t.dense_step_seconds},
                     {"lossy_step_s", t.lossy_step_seconds},
                     {"min_speedup", ways[wi].c.auto_min_speedup},
                     {"measuring_steps", auto_steps}};
      auto_line = fmt::format(
          "auto: chose {} after {} steps (median step, slowest rank: none {:.3f} ms, {} {:.3f} "
          "ms; {} kept only when {:.2f}x faster)\n",
          mc2::CompressionName(t.compression), auto_steps, t.dense_step_seconds * 1e3, lossy,
          t.lossy_step_seconds * 1e3, lossy, ways[wi].c.auto_min_speedup);
    }
  }
  std::fputs(auto_line.c_str(), stdout);
  if (!a.json_path.empty()) std::ofstream(a.json_path) << out.dump(2) << "\n";
  return 0;
}

int Train(const Args& a) {
  std::vector<std::string> names;
  {
    std::string s = a.schemes;
    size_t p;
    while ((p = s.find(',')) != std::string::npos)
      names.push_back(s.substr(0, p)), s = s.substr(p + 1);
    names.push_back(s);
  }
  mc2::models::TransformerConfig base;
  base.vocab = 64;
  base.hidden = 128;
  base.heads = 4;
  base.ffn = 256;
  base.layers = 2;
  base.seq_len = 32;
  base.batch = 8 * a.n;
  base.task = mc2::models::Task::kCopy;
  base.task_param = 8;
  json out = {{"ranks", a.n}, {"steps", a.steps}, {"warmup", a.warmup}, {"runs", json::array()}};
  std::printf(
      "# grad_bench train: transformer hidden %d, %d layers, batch %d x %d tokens, DP %d, "
      "%d steps per scheme, %d warm-up steps uncompressed\n",
      base.hidden, base.layers, base.batch, base.seq_len, a.n, a.steps, a.warmup);
  double ref_tail = 0;
  for (const std::string& name : names) {
    mc2::models::TransformerConfig c = base;
    double ratio = 0.01;
    std::string scheme = name;
    if (auto at = name.find('@'); at != std::string::npos) {
      scheme = name.substr(0, at);
      ratio = std::stod(name.substr(at + 1));
    }
    auto parsed = mc2::ParseCompression(scheme);
    if (!parsed) Usage(("unknown scheme " + name).c_str());
    c.grad_compression.scheme = *parsed;
    c.grad_compression.topk_ratio = ratio;
    if (*parsed == mc2::Compression::kPowerSgd)  // powersgd@RANK (default rank 1)
      c.grad_compression.powersgd_rank = name.find('@') != std::string::npos
                                             ? static_cast<int>(ratio) : 1;
    c.grad_compression.warmup_steps = a.warmup;
    std::vector<double> losses;
    const auto t0 = Clock::now();
    mc2::Group::RunInProcess(a.n, [&](mc2::Group& world) {
      auto st = mc2::models::TrainSteps(world, c, 1, a.steps);
      if (world.rank() == 0) {
        for (auto& s : st) losses.push_back(s.loss);
      }
    });
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    double tail = 0;
    const size_t k = std::min<size_t>(10, losses.size());
    for (size_t i = losses.size() - k; i < losses.size(); ++i) tail += losses[i] / k;
    if (name == names.front()) ref_tail = tail;
    std::printf(
        "%-14s first %.4f  last-10 mean %.4f  vs %s %+.2f%%  (%.1f s)\n  curve:", name.c_str(),
        losses.front(), tail, names.front().c_str(), 100 * (tail - ref_tail) / ref_tail, sec);
    for (size_t i = 0; i < losses.size(); i += 10) std::printf(" %.3f", losses[i]);
    std::printf("\n");
    out["runs"].push_back({{"scheme", name},
                           {"losses", losses},
                           {"tail_mean", tail},
                           {"rel_to_first", (tail - ref_tail) / ref_tail},
                           {"seconds", sec}});
  }
  if (!a.json_path.empty()) std::ofstream(a.json_path) << out.dump(2) << "\n";
  return 0;
}

// The overlap benchmark's per-rank state: weights-gradient inputs and the
// three ways' gradient buffers.
struct OverlapRank {
  size_t h, rows;
  std::vector<float> x, dy;  // [rows x h] each
  void Init(size_t hidden, int rank) {
    h = hidden;
    rows = hidden;
    x.resize(rows * h);
    dy.resize(rows * h);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = Synthetic(i ^ (uint64_t(rank) << 40));
      dy[i] = Synthetic(i ^ (uint64_t(rank) << 40) ^ (1ull << 50));
    }
  }
  // grad = x^T dy: [h x h], 2 h^2 rows flops.
  void Wgrad(float* grad) const {
    mc2::GemmOptions o;
    o.trans_a = true;
    mc2::Gemm(h, h, rows, x.data(), dy.data(), grad, o);
  }
};

mc2::models::TransformerConfig DemoModel() {
  mc2::models::TransformerConfig c;  // mc2 demo's defaults (tools/demo_command.cc)
  c.layers = 2;
  c.hidden = 1024;
  c.heads = 16;
  c.ffn = 2048;
  c.vocab = 64;
  c.seq_len = 256;
  c.batch = 4;
  c.lr = 3e-4f;
  return c;
}

int OverlapModel(const Args& a) {
  mc2::models::TransformerConfig base = DemoModel();
  base.batch = a.batch;
  if (base.batch % a.n != 0) Usage("--model demo: -n must divide --batch");
  const int reps = a.reps_given ? a.reps : 4;
  // 1. The backward alone (rank 0's median, no link) and the gradients' size.
  double backward = 0;
  size_t grad_bytes = 0;
  {
    std::vector<double> t;
    mc2::WorldOptions raw;
    raw.heap_bytes = size_t{1} << 30;  // the model's buckets and workspaces
    mc2::Group::RunInProcess(a.n, [&](mc2::Group& world) {
      mc2::models::ProcessGrid grid = mc2::models::MakeGrid(world, 1);
      mc2::models::Transformer m(grid, base);
      for (int s = 0; s < 1 + std::min(reps, 3); ++s) {
        const mc2::models::StepStats st = m.TrainStep(s);
        if (world.rank() == 0 && s > 0) t.push_back(st.backward_seconds);
      }
      if (world.rank() == 0)
        for (const auto& p : m.Parameters()) grad_bytes += p.rows * p.cols * sizeof(float);
    }, raw);
    backward = Median(t);
  }
  // 2. The link: the all-reduce's bytes per rank (2 (N-1)/N B) in ratio x backward.
  const double wire = 2.0 * (a.n - 1) / a.n * static_cast<double>(grad_bytes);
  const double bw = wire / (a.ratio * backward);
  const std::string link = fmt::format("bw={:.0f}B/s,lat=5us", bw);
  const char* names[] = {"overlapped", "after_backward", "per_tensor"};
  std::vector<mc2::models::TransformerConfig> cfgs(3, base);
  cfgs[1].grad_overlap = false;
  cfgs[2].grad_bucket_cap_bytes = 1;
  std::vector<std::vector<double>> times(3), bwd_sync(3), fwd(3), bwd(3), wait(3);
  mc2::WorldOptions wo;
  wo.link = link;
  wo.heap_bytes = 3 * (size_t{1} << 30);  // three models
  std::mutex mu;
  mc2::Group::RunInProcess(
      a.n,
      [&](mc2::Group& world) {
        mc2::models::ProcessGrid grid = mc2::models::MakeGrid(world, 1);
        std::vector<std::unique_ptr<mc2::models::Transformer>> ms;
        for (const auto& c : cfgs) ms.push_back(std::make_unique<mc2::models::Transformer>(grid, c));
        for (int s = 0; s < 1 + reps; ++s) {  // step 0: warm-up (and the bucket rebuild)
          for (int w = 0; w < 3; ++w) {
            mc2::Barrier(world).Wait();
            const mc2::models::StepStats st = ms[w]->TrainStep(s);
            if (world.rank() == 0 && s > 0) {
              std::lock_guard<std::mutex> lock(mu);
              times[w].push_back(st.seconds);
              bwd_sync[w].push_back(st.backward_seconds + st.sync_wait_seconds);
              fwd[w].push_back(st.forward_seconds);
              bwd[w].push_back(st.backward_seconds);
              wait[w].push_back(st.sync_wait_seconds);
            }
          }
        }
        mc2::Barrier(world).Wait();
      },
      wo);
  std::printf(
      "# grad_bench overlap --model demo: DP %d, %d layers, hidden %d, ffn %d, %d x %d tokens, "
      "%.1f MiB of f32 gradients, backward %.2f ms, link %s (all-reduce = %.2f x backward), "
      "%d timed steps per way\n",
      a.n, base.layers, base.hidden, base.ffn, base.batch, base.seq_len, grad_bytes / 1048576.0,
      backward * 1e3, link.c_str(), a.ratio, reps);
  // Paired: the median over steps of the after-backward step / this way's
  // step of the same round (they ran back to back). The cap: the same for
  // the after-backward step without its wait, the speedup of a sync hidden
  // entirely and for free.
  auto paired = [&](int w) {
    std::vector<double> r;
    for (size_t i = 0; i < times[w].size(); ++i) r.push_back(times[1][i] / times[w][i]);
    return Median(r);
  };
  std::vector<double> caps;
  for (size_t i = 0; i < times[1].size(); ++i)
    caps.push_back(times[1][i] / (times[1][i] - wait[1][i]));
  const double cap = Median(caps);
  std::printf("%-18s %12s %12s %10s %10s %16s %10s %10s %10s %10s\n", "way", "median_ms",
              "min_ms", "speedup", "paired", "bwd+sync_ms", "speedup", "fwd_ms", "bwd_ms",
              "wait_ms");
  json out = {{"model", "demo"},       {"ranks", a.n},          {"layers", base.layers},
              {"hidden", base.hidden}, {"ffn", base.ffn},       {"grad_bytes", grad_bytes},
              {"link", link},          {"compute_s", backward}, {"ratio", a.ratio},
              {"reps", reps},          {"batch", base.batch},   {"seq_len", base.seq_len},
              {"ways", json::array()}};
  const double after = Median(times[1]), after_bs = Median(bwd_sync[1]);
  for (int w = 0; w < 3; ++w) {
    const double med = Median(times[w]), bs = Median(bwd_sync[w]);
    const double mn = *std::min_element(times[w].begin(), times[w].end());
    const double pw = paired(w);
    std::printf("%-18s %12.3f %12.3f %9.2fx %9.2fx %16.3f %9.2fx %10.3f %10.3f %10.3f\n",
                names[w], med * 1e3, mn * 1e3, after / med, pw, bs * 1e3, after_bs / bs,
                Median(fwd[w]) * 1e3, Median(bwd[w]) * 1e3, Median(wait[w]) * 1e3);
    out["ways"].push_back(
        {{"name", names[w]},
         {"median_s", med},
         {"speedup_paired", pw},
         {"min_s", mn},
         {"backward_sync_s", bs},
         {"forward_s", Median(fwd[w])},
         {"backward_s", Median(bwd[w])},
         {"sync_wait_s", Median(wait[w])}});
  }
  std::printf(
      "# paired = median over steps of after_backward / this way, each pair run back to back; "
      "cap = the same for a sync hidden entirely at no cost, after_backward / (after_backward - "
      "its wait): %.3fx\n",
      cap);
  out["cap_paired"] = cap;
  if (!a.json_path.empty()) std::ofstream(a.json_path) << out.dump(2) << "\n";
  return 0;
}

int Overlap(const Args& a) {
  if (a.model == "demo") return OverlapModel(a);
  const size_t h = static_cast<size_t>(a.hidden);
  const size_t grad_bytes = static_cast<size_t>(a.layers) * h * h * sizeof(float);
  // 1. The backward's compute alone (rank 0's median), no link.
  double compute = 0;
  {
    std::vector<double> t;
    mc2::Group::RunInProcess(a.n, [&](mc2::Group& g) {
      OverlapRank r;
      r.Init(h, g.rank());
      std::vector<float> grad(h * h);
      for (int rep = -1; rep < a.reps; ++rep) {
        mc2::Barrier(g).Wait();
        const auto t0 = Clock::now();
        for (int l = 0; l < a.layers; ++l) r.Wgrad(grad.data());
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (g.rank() == 0 && rep >= 0) t.push_back(s);
      }
    });
    compute = Median(t);
  }
  // 2. The link: the all-reduce's bytes per rank (2 (N-1)/N B) in ratio x compute.
  const double wire = 2.0 * (a.n - 1) / a.n * static_cast<double>(grad_bytes);
  const double bw = wire / (a.ratio * compute);
  const std::string link = fmt::format("bw={:.0f}B/s,lat=5us", bw);
  std::vector<std::vector<double>> times(3);
  const char* names[] = {"overlapped", "after_backward", "per_tensor_after"};
  mc2::WorldOptions wo;
  wo.link = link;
  wo.heap_bytes = 3 * grad_bytes + (size_t{256} << 20);
  std::mutex mu;
  mc2::Group::RunInProcess(
      a.n,
      [&](mc2::Group& g) {
        OverlapRank r;
        r.Init(h, g.rank());
        mc2::GradSyncOptions o;
        o.bucket_cap_bytes = h * h * sizeof(float);  // a layer per bucket
        o.first_bucket_cap_bytes = o.bucket_cap_bytes;
        mc2::GradSync sync(g, o);
        for (int l = 0; l < a.layers; ++l)
          sync.Register("layer" + std::to_string(l), h * h, mc2::DType::kF32);
        sync.Finalize();
        std::vector<mc2::SymmetricBuffer> own;
        for (int l = 0; l < a.layers; ++l) own.push_back(g.AllocSymmetric(h * h * sizeof(float)));
        for (int rep = -1; rep < a.reps; ++rep) {
          for (int way = 0; way < 3; ++way) {
            mc2::Barrier(g).Wait();
            const auto t0 = Clock::now();
            if (way == 0) {
              for (int l = a.layers; l-- > 0;) {
                r.Wgrad(sync.GradAs<float>(l));
                sync.MarkReady(l);
              }
              sync.Finish();
            } else if (way == 1) {
              for (int l = a.layers; l-- > 0;) r.Wgrad(sync.GradAs<float>(l));
              for (int l = a.layers; l-- > 0;) sync.MarkReady(l);
              sync.Finish();
            } else {
              for (int l = a.layers; l-- > 0;) r.Wgrad(own[l].as<float>());
              std::vector<mc2::Work> works;
              mc2::CollectiveOptions co;
              co.may_run_inline = false;
              for (int l = a.layers; l-- > 0;) {
                works.push_back(mc2::AllReduce(g, own[l].data(), own[l].data(), h * h,
                                               mc2::DType::kF32, mc2::ReduceOp::kAvg, co));
              }
              for (auto& w : works) w.Wait();
            }
            const double s = std::chrono::duration<double>(Clock::now() - t0).count();
            if (g.rank() == 0 && rep >= 0) {
              std::lock_guard<std::mutex> lock(mu);
              times[way].push_back(s);
            }
          }
        }
        mc2::Barrier(g).Wait();
      },
      wo);
  std::printf(
      "# grad_bench overlap: %d ranks, %d layers of %zu x %zu f32 gradients (%.1f MiB), "
      "backward compute %.2f ms, link %s (all-reduce = %.2f x compute), %d reps\n",
      a.n, a.layers, h, h, grad_bytes / 1048576.0, compute * 1e3, link.c_str(), a.ratio, a.reps);
  std::printf("%-18s %12s %12s %10s\n", "way", "median_ms", "min_ms", "speedup");
  json out = {{"ranks", a.n},         {"layers", a.layers}, {"hidden", a.hidden},   {"link", link},
              {"compute_s", compute}, {"ratio", a.ratio},   {"ways", json::array()}};
  const double after = Median(times[1]);
  for (int w = 0; w < 3; ++w) {
    const double med = Median(times[w]);
    const double mn = *std::min_element(times[w].begin(), times[w].end());
    std::printf("%-18s %12.3f %12.3f %9.2fx\n", names[w], med * 1e3, mn * 1e3, after / med);
    out["ways"].push_back({{"name", names[w]}, {"median_s", med}, {"min_s", mn}});
  }
  if (!a.json_path.empty()) std::ofstream(a.json_path) << out.dump(2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
#ifndef NDEBUG
  std::fprintf(stderr, "grad_bench: WARNING: a debug build; figures are not representative\n");
#endif
  try {
    if (a.mode == "overlap") return Overlap(a);
    return a.mode == "exchange" ? Exchange(a) : Train(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grad_bench: %s\n", e.what());
    return 1;
  }
}
