// Synthetic token batches (Task in include/mc2/models/config.h), generated from a
// counter-based hash of (seed, step, sequence, position): any rank can make
// any part of any step's global batch without state or communication.
#ifndef MC2_MODELS_DATA_H_
#define MC2_MODELS_DATA_H_

#include <cstdint>

#include "mc2/models.h"

namespace mc2::models {

// Token t (0..seq_len) of global sequence `sequence` of the batch of `step`.
int32_t SequenceToken(const TransformerConfig& c, int step, int64_t sequence, int t);

// The rows [row_begin, row_end) of a batch of `sequences` sequences
// (global indices first_sequence..+sequences) in sequence-major layout:
// row = t * sequences + b, as the sequence-parallel shards need it (a TP
// rank's contiguous rows are a contiguous range of positions). inputs =
// token t, targets = token t + 1.
void MakeBatch(const TransformerConfig& c, int step, int64_t first_sequence, int sequences,
               int64_t row_begin, int64_t row_end, int32_t* inputs, int32_t* targets);

}  // namespace mc2::models

#endif  // MC2_MODELS_DATA_H_
