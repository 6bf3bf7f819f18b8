// A double-precision reference of the transformer's loss (dense and MoE
// layers), written independently of src/models, shared by the models
// tests: per sequence, per position, textbook formulas.
#ifndef MC2_TESTS_COMMON_REFERENCE_MODEL_H_
#define MC2_TESTS_COMMON_REFERENCE_MODEL_H_

#include "mc2/models.h"

namespace mc2::models {

// The loss of `model` (one rank's parameters: tp = ep = 1) on the batch of
// `step`. MoE layers: softmax router, top-k by probability (ties to the
// lower index), gates = the chosen probabilities, SwiGLU experts, and the
// load-balancing loss coef * E * sum_e f_e P_e over the whole batch, which
// `aux_out` (optional) receives alone. Throws std::runtime_error if the
// model lacks a parameter it needs.
double ReferenceLoss(Transformer& model, int step, double* aux_out = nullptr);
// The same over sequences [first_sequence, first_sequence + sequences) of
// the batch of `step` alone (a micro-batch): the mean cross-entropy over
// their tokens, and the load-balancing loss with f_e and P_e over them.
double ReferenceLoss(Transformer& model, int step, int first_sequence, int sequences,
                     double* aux_out = nullptr);

// The tests' tiny dense model: 2 layers, hidden 16, 4 heads of width 4
// (every TP size 1, 2, 4 valid), ffn 32, 4 sequences of 8 tokens of
// modular addition, seed 7, serial pipeline.
TransformerConfig TinyConfig();

// A pipeline of `m` micro-batches under schedule `s` (v virtual stages).
PipelineConfig Pipe(int m, PipelineSchedule s = PipelineSchedule::k1F1B, int v = 1);

}  // namespace mc2::models

#endif  // MC2_TESTS_COMMON_REFERENCE_MODEL_H_
