// The reference transformer's shape as the demos that run it (`mc2 demo`,
// `demo infer`, `demo fsdp`, `demo pp`) take it on their command lines:
// one struct, registered once per command, handed on to the command's rank
// job as the same options, and turned into the model's configuration.
//
// A demo sets its own defaults in the ModelDims it registers; what the
// demos word or bound differently is said by ModelOptionsText, so that each
// command's --help stays its own.
#ifndef MC2_TOOLS_DEMO_MODEL_H_
#define MC2_TOOLS_DEMO_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "mc2/models.h"

namespace mc2::tools {

struct ModelDims {
  int layers = 2;
  int hidden = 1024;
  int heads = 16;
  int ffn = 2048;
  int vocab = 64;
  int seq_len = 256;  // 0: the demo has no --seq-len (inference: --prompt-len)
  int batch = 4;      // global
  uint64_t seed = 1;  // of the weights and the data
};

// How a demo words and bounds the shared options.
struct ModelOptionsText {
  const char* heads = "Attention heads";
  const char* batch = "Sequences per step (global)";
  int min_vocab = 2;
  int max_tokens = 1 << 16;  // the upper bound of --seq-len and --batch
  bool batch_first = false;  // --batch before --seq-len in --help
};

// Registers --layers, --hidden, --heads, --ffn, --vocab, then --seq-len (when
// dims.seq_len > 0) and --batch into `dims`, in that order (batch_first: --batch
// first), their defaults shown. --seed is not among them: AddSeedOption
// places it where the command lists it.
void AddModelOptions(CLI::App& cmd, ModelDims& dims, const ModelOptionsText& text = {});

// Registers --seed into dims.seed, its default shown.
void AddSeedOption(CLI::App& cmd, ModelDims& dims, const char* help);

// Appends the options AddModelOptions and AddSeedOption register, with the
// values of `dims`, to a rank job's argv.
void AppendModelArgs(const ModelDims& dims, std::vector<std::string>& argv);

// The model configuration of `dims` (seq_len left at its default when the
// demo has none); every other field is the library's default.
models::TransformerConfig TransformerShape(const ModelDims& dims);

// --heads must divide --hidden into an even head width (rotary embeddings
// rotate pairs); else a usage error of `command` (DemoUsage) naming both.
void CheckHeads(const ModelDims& dims, const char* command);

}  // namespace mc2::tools

#endif  // MC2_TOOLS_DEMO_MODEL_H_
