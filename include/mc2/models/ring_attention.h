// mc2/models/ring_attention.h: context parallelism: causal attention over a
// sequence split across a CP group, the key/value blocks passed around the
// ring.
#ifndef MC2_MODELS_RING_ATTENTION_H_
#define MC2_MODELS_RING_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "mc2/group.h"

namespace mc2::models {

// Context parallelism: ring attention (ring_attention.cc; docs/models.md
// "Context parallelism").
//
// The sequence is split over a CP group of N ranks. For load balance under
// causal masking it is cut into 2N chunks of C = seq_len / (2N) positions and
// CP rank r holds two of them, chunk r and chunk 2N-1-r (its first and its
// last C local rows), so every rank has the same number of unmasked
// (query, key) pairs; the layout is the same without causal masking. Each
// rank keeps its queries and passes its key/value block around the ring
// (Send to rank r+1, Recv from rank r-1): N steps, at step i a rank holds
// rank (r-i)'s block and folds it into its output with an online softmax
// (running row maximum and sum). Backward passes the blocks around again,
// and the key/value gradients travel with them, each rank adding its part;
// after N steps every block's gradient is back on its owner. dQ stays
// local. With `overlap` the next block's transfer is posted before the
// current block's compute and waited for after it; without, every transfer
// is waited for before the compute it feeds (the baseline).
struct RingAttentionConfig {
  int batch = 1;      // sequences (local, every CP rank the same)
  int seq_len = 16;   // of the whole sequence; 2 * cp must divide it
  int heads = 1;      // heads of this rank (e.g. heads / tp under TP)
  int head_dim = 16;  // d; scores are scaled by 1 / sqrt(d)
  bool causal = true;
  bool overlap = true;
};

// One rank's ring attention over the CP group `cp`.
//
// Layout: this rank's T_l = seq_len / N positions of every sequence, local
// row (t, b) = t * batch + b, t in [0, T_l); row t holds global position
// Position(t). Q, K, V, the output and their gradients are [T_l * batch x
// heads * head_dim] with a row stride (in floats, >= heads * head_dim) per
// argument: head j is columns [j d, (j+1) d).
//
// Thread safety: one thread per rank; Forward and Backward are collective
// over `cp` (every rank calls them in the same order). Not copyable.
class RingAttention {
 public:
  // Throws mc2::Error(kInvalidArgument) naming the field, on every rank
  // and without communicating, unless cp is valid, batch, heads, head_dim
  // and seq_len are >= 1 and 2 * cp.size() divides seq_len.
  RingAttention(const Group& cp, const RingAttentionConfig& config);
  ~RingAttention();
  RingAttention(const RingAttention&) = delete;
  RingAttention& operator=(const RingAttention&) = delete;

  // out = softmax(Q K^T / sqrt(d) [+ causal mask]) V over the whole
  // sequence. Keeps copies of Q, K, V, the output and the row
  // log-sum-exps for Backward. Throws kInvalidArgument for a null pointer
  // or a row stride below heads * head_dim.
  void Forward(const float* q, size_t ldq, const float* k, size_t ldk, const float* v,
               size_t ldv, float* out, size_t ldo);
  // Given dout, writes dq, dk, dv (this rank's rows) of the last Forward.
  // Throws kInvalidArgument as Forward, or if no Forward ran.
  void Backward(const float* dout, size_t lddo, float* dq, size_t ldq, float* dk, size_t ldk,
                float* dv, size_t ldv);

  // The global position of local position t (0 <= t < local_len()).
  int64_t Position(int t) const;
  int local_len() const;
  const RingAttentionConfig& config() const;
  // The last Forward / Backward's time blocked on transfers (seconds).
  double forward_wait_seconds() const;
  double backward_wait_seconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mc2::models

#endif  // MC2_MODELS_RING_ATTENTION_H_
