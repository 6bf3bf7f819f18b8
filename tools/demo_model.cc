#include "demo_model.h"

#include <fmt/format.h>

#include "demo_job.h"

namespace mc2::tools {

void AddModelOptions(CLI::App& cmd, ModelDims& dims, const ModelOptionsText& text) {
  auto add = [&](const char* name, int& value, const char* help, int lo, int hi) {
    cmd.add_option(name, value, help)->capture_default_str()->check(CLI::Range(lo, hi));
  };
  add("--layers", dims.layers, "Transformer blocks", 1, 1 << 20);
  add("--hidden", dims.hidden, "Hidden size", 1, 1 << 20);
  add("--heads", dims.heads, text.heads, 1, 1 << 20);
  add("--ffn", dims.ffn, "SwiGLU inner width", 1, 1 << 20);
  add("--vocab", dims.vocab, "Vocabulary", text.min_vocab, 1 << 20);
  auto seq_len = [&] {
    if (dims.seq_len > 0)
      add("--seq-len", dims.seq_len, "Tokens per sequence", 1, text.max_tokens);
  };
  if (!text.batch_first) seq_len();
  add("--batch", dims.batch, text.batch, 1, text.max_tokens);
  if (text.batch_first) seq_len();
}

void AddSeedOption(CLI::App& cmd, ModelDims& dims, const char* help) {
  cmd.add_option("--seed", dims.seed, help)->capture_default_str();
}

void AppendModelArgs(const ModelDims& dims, std::vector<std::string>& argv) {
  auto add = [&](const char* flag, auto value) {
    argv.push_back(flag);
    argv.push_back(std::to_string(value));
  };
  add("--layers", dims.layers);
  add("--hidden", dims.hidden);
  add("--heads", dims.heads);
  add("--ffn", dims.ffn);
  add("--vocab", dims.vocab);
  if (dims.seq_len > 0) add("--seq-len", dims.seq_len);
  add("--batch", dims.batch);
  add("--seed", dims.seed);
}

models::TransformerConfig TransformerShape(const ModelDims& dims) {
  models::TransformerConfig c;
  c.layers = dims.layers;
  c.hidden = dims.hidden;
  c.heads = dims.heads;
  c.ffn = dims.ffn;
  c.vocab = dims.vocab;
  if (dims.seq_len > 0) c.seq_len = dims.seq_len;
  c.batch = dims.batch;
  c.seed = dims.seed;
  return c;
}

void CheckHeads(const ModelDims& d, const char* command) {
  if (d.hidden % d.heads != 0)
    DemoUsage(command, fmt::format("--heads {} must divide --hidden {}", d.heads, d.hidden));
  if ((d.hidden / d.heads) % 2 != 0)
    DemoUsage(command,
              fmt::format("--hidden {} / --heads {} = {} must be even (rotary embeddings rotate "
                          "pairs)",
                          d.hidden, d.heads, d.hidden / d.heads));
}

}  // namespace mc2::tools
