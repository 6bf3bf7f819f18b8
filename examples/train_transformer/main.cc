// train_transformer: trains the decoder-only transformer of <mc2/models.h>
// with DP x TP (tensor + sequence parallel) on a synthetic task and prints
// the loss and the time of every step on rank 0.
//
//   mc2 run -n 4 ./train_transformer --tp 2 --steps 20 --pipeline chunked --splits 4
//   MC2_TRACE=/tmp/tr mc2 run -n 4 ./train_transformer --tp 4 && mc2 trace report /tmp/tr
//
// Options (defaults in brackets): --tp N [world size], --steps N [20],
// --pipeline serial|chunked|fused|auto [auto], --splits N [4], --layers N [2],
// --hidden N [256], --heads N [8], --ffn N [1024], --vocab N [64],
// --seq N [128], --batch N [8, global], --task modadd|copy [modadd],
// --lr X [3e-3], --bf16, --seed N [1].
#include <mc2/mc2.h>
#include <mc2/models.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr, "train_transformer: %s (see the comment at the top of main.cc)\n", why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    mc2::Group world = mc2::Group::FromEnv();
    mc2::models::TransformerConfig c;
    c.vocab = 64;
    c.hidden = 256;
    c.heads = 8;
    c.ffn = 1024;
    c.layers = 2;
    c.seq_len = 128;
    c.batch = 8;
    int tp = world.size(), steps = 20;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) Usage((a + " needs a value").c_str());
        return argv[++i];
      };
      if (a == "--tp") tp = std::atoi(next().c_str());
      else if (a == "--steps") steps = std::atoi(next().c_str());
      else if (a == "--pipeline") {
        auto p = mc2::ParsePipeline(next());
        if (!p) Usage("unknown pipeline");
        c.fused.pipeline = *p;
      } else if (a == "--splits") c.fused.splits = std::atoi(next().c_str());
      else if (a == "--layers") c.layers = std::atoi(next().c_str());
      else if (a == "--hidden") c.hidden = std::atoi(next().c_str());
      else if (a == "--heads") c.heads = std::atoi(next().c_str());
      else if (a == "--ffn") c.ffn = std::atoi(next().c_str());
      else if (a == "--vocab") c.vocab = std::atoi(next().c_str());
      else if (a == "--seq") c.seq_len = std::atoi(next().c_str());
      else if (a == "--batch") c.batch = std::atoi(next().c_str());
      else if (a == "--lr") c.lr = std::strtof(next().c_str(), nullptr);
      else if (a == "--seed") c.seed = std::strtoull(next().c_str(), nullptr, 10);
      else if (a == "--bf16") c.gemm_dtype = mc2::DType::kBF16;
      else if (a == "--task") {
        auto t = mc2::models::ParseTask(next());
        if (!t) Usage("unknown task");
        c.task = *t;
      } else Usage(("unknown option " + a).c_str());
    }
    const bool root = world.rank() == 0;
    if (root) {
      std::printf("train_transformer: %d ranks = dp %d x tp %d, %d layers, hidden %d, %d heads, "
                  "ffn %d, vocab %d, %d x %d tokens per step, %s, pipeline %s (splits %d)\n",
                  world.size(), world.size() / (tp > 0 ? tp : 1), tp, c.layers, c.hidden, c.heads,
                  c.ffn, c.vocab, c.batch, c.seq_len, mc2::DTypeName(c.gemm_dtype),
                  mc2::PipelineName(c.fused.pipeline), c.fused.splits);
      std::printf("%5s %10s %9s %9s %9s %9s %9s %11s\n", "step", "loss", "step_ms", "fwd_ms",
                  "bwd_ms", "sync_ms", "opt_ms", "tokens/s");
    }
    double total = 0;
    int timed = 0;
    auto stats = mc2::models::TrainSteps(world, c, tp, steps, [&](const auto& s) {
      if (s.step > 0) {  // step 0 pays for first-call set-up (GEMM primitives)
        total += s.seconds;
        ++timed;
      }
      if (root) {
        std::printf("%5d %10.5f %9.2f %9.2f %9.2f %9.2f %9.2f %11.0f\n", s.step, s.loss,
                    s.seconds * 1e3, s.forward_seconds * 1e3, s.backward_seconds * 1e3,
                    s.sync_wait_seconds * 1e3, s.optimizer_seconds * 1e3, s.tokens / s.seconds);
        std::fflush(stdout);
      }
    });
    if (root && !stats.empty()) {
      const auto& last = stats.back();
      for (size_t l = 0; l < last.block_forward_seconds.size(); ++l) {
        std::printf("block %zu (last step): forward %.2f ms, backward %.2f ms\n", l,
                    last.block_forward_seconds[l] * 1e3, last.block_backward_seconds[l] * 1e3);
      }
    }
    if (root && timed > 0) {
      std::printf("mean step %.2f ms (steps 1..%d), %.0f tokens/s; loss %.5f -> %.5f\n",
                  total / timed * 1e3, steps - 1, stats.back().tokens / (total / timed),
                  stats.front().loss, stats.back().loss);
    }
    return 0;
  } catch (const mc2::Error& e) {
    std::fprintf(stderr, "train_transformer: %s\n", e.what());
    return 1;
  }
}
