// RingAttention of include/mc2/models/ring_attention.h: attention over a sequence split
// across a context-parallel group, the key/value blocks passed around the
// ring with point-to-point Send/Recv.
//
// Notation: N ranks, rank r, C = seq_len / (2N) positions per chunk, T_l =
// 2C local positions (local chunk a = 0 is global chunk r, a = 1 is global
// chunk 2N-1-r). Inside, every tensor is tight: [T_l * B x H d], row (t, b)
// = t * B + b; one (sequence b, head h) is the T_l x d matrix at column h d
// of rows b, B + b, 2B + b, ... (row stride B H d).
//
// Forward, at step i (0..N-1) rank r holds the block of rank src = r - i
// (mod N) and, for each (b, h) and each pair (its query chunk a, the
// block's key chunk c), folds S = Q_a K_c^T / sqrt(d) into the running
// state of Q_a's rows (flash-attention style online softmax):
//   m' = max(m, rowmax S), P = exp(S - m'), l' = l e^(m - m') + rowsum P,
//   acc' = acc e^(m - m') + P V_c
// skipping the pairs the causal mask hides whole (key chunk after the
// query chunk) and masking the diagonal ones (the same chunk). At the end
// out = acc / l and LSE = m + log l (kept for backward).
//
// Backward recomputes P = exp(S - LSE) block by block, with D = rowsum(dO *
// O):  dV_c += P^T dO_a,  dS = P (dO_a V_c^T - D) / sqrt(d),  dQ_a += dS K_c,
// dK_c += dS^T Q_a. dQ stays here. The blocks go round the other way (to
// r-1, from r+1): at step j rank r holds rank r+1+j's block, the first the
// one the forward ended with (kept), the last its own. The block's dK, dV
// are summed along: rank r adds its part to what rank r+1 sent (the same
// block's sum over the ranks after it) and sends it on to r-1, so the
// owner adds the last part itself. That takes N-2 key/value transfers and
// N-1 gradient transfers, and none is left after the last block's compute.
//
// Overlap: the next block's Recv (and this block's Send) is posted before
// the current block's compute and waited for after it; the gradient sum's
// Send/Recv runs under the next block's compute. Without overlap every
// transfer is waited for right after it is posted.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mc2/error.h"
#include "mc2/gemm.h"
#include "mc2/models.h"
#include "mc2/trace.h"
#include "mc2/work.h"

namespace mc2::models {

namespace {

constexpr int kTagKv = 0;   // key/value blocks
constexpr int kTagDkv = 1;  // their gradients' partial sums

[[noreturn]] void Invalid(const std::string& msg, int rank) {
  throw Error(ErrorCode::kInvalidArgument, "RingAttention: " + msg, rank);
}

using Clock = std::chrono::steady_clock;

enum class Mask { kSkip, kFull, kDiagonal };

// A posted Send or Recv and its trace span. The point-to-point engine
// records no spans of its own, so the ring records each transfer as a
// communication span from its posting to the moment it is seen complete:
// the compute loops poll between (sequence, head) pairs, and a wait sees
// it at once, so the span ends at most one pair's compute late.
struct Transfer {
  Work w;
  bool pending = false;
  bool traced = false;
  int64_t start_ns = 0;
  uint64_t bytes = 0;
  const char* name = "";

  void Post(Work work, const char* span_name, uint64_t n) {
    w = std::move(work);
    pending = true;
    traced = trace::internal::g_enabled.load(std::memory_order_relaxed);
    start_ns = traced ? trace::internal::NowNs() : 0;
    bytes = n;
    name = span_name;
  }
  // Records the span once the transfer is complete.
  void Poll() {
    if (!pending || !w.Test()) return;
    pending = false;
    if (traced) trace::internal::RecordScope(name, trace::Category::kComm, start_ns, 0, bytes);
  }
};

}  // namespace

struct RingAttention::Impl {
  Group cp;
  RingAttentionConfig cfg;
  int N = 1, r = 0;
  size_t C = 0, Tl = 0, B = 0, H = 0, d = 0, HD = 0, blk = 0;
  float scale = 1.0f;

  std::vector<float> q, out, own_kv;     // tight; own_kv: K then V
  std::vector<float> ring[2];            // the blocks in flight
  std::vector<float> last_kv;            // the forward's last block (rank r+1's)
  std::vector<float> m, l, lse, D;       // [B H x T_l], index (b H + h) T_l + t
  std::vector<float> s, ds;              // [C x C] scratch
  std::vector<float> dout, dq, dkv_loc;  // tight
  std::vector<float> dkv_acc[2], dkv_rcv[2];
  bool has_forward = false;
  double fwd_wait = 0, bwd_wait = 0;
  // Outstanding transfers (waited for before any buffer they use changes,
  // and by the destructor).
  Transfer kv_send, kv_recv, d_send[2], d_recv;

  int GlobalChunk(int rank, int a) const { return a == 0 ? rank : 2 * N - 1 - rank; }
  Mask PairMask(int src, int a, int c) const {
    if (!cfg.causal) return Mask::kFull;
    const int gq = GlobalChunk(r, a), gk = GlobalChunk(src, c);
    return gk < gq ? Mask::kFull : gk == gq ? Mask::kDiagonal : Mask::kSkip;
  }
  // The (b, h) view of local chunk a in a tight buffer (row stride B HD).
  size_t Off(size_t a, size_t b, size_t h) const { return (a * C * B + b) * HD + h * d; }

  void PollAll() {
    for (Transfer* t : {&kv_send, &kv_recv, &d_send[0], &d_send[1], &d_recv}) t->Poll();
  }
  void WaitAll() {
    for (Transfer* t : {&kv_send, &kv_recv, &d_send[0], &d_send[1], &d_recv}) {
      try {
        t->w.Wait();
      } catch (...) {
      }
      t->pending = false;
      t->w = Work();
    }
  }
  // Waits for `t` (if pending), counting the time as blocked on transfers.
  void Wait(Transfer& t, double& total) {
    if (!t.pending) return;
    auto t0 = Clock::now();
    {
      trace::Scope span("ring_attention.wait", trace::Category::kWait);
      t.w.Wait();
    }
    t.Poll();
    t.w = Work();
    total += std::chrono::duration<double>(Clock::now() - t0).count();
  }

  void ForwardBlock(int src, const float* kv);
  void BackwardBlock(int src, const float* kv, float* dkv);
  uint64_t BlockFlops(int src, int passes) const;
};

uint64_t RingAttention::Impl::BlockFlops(int src, int passes) const {
  uint64_t pairs = 0;
  for (int a = 0; a < 2; ++a) {
    for (int c = 0; c < 2; ++c) pairs += PairMask(src, a, c) != Mask::kSkip ? 1 : 0;
  }
  return pairs * passes * 2 * static_cast<uint64_t>(B * H) * C * C * d;
}

void RingAttention::Impl::ForwardBlock(int src, const float* kv) {
  trace::Scope span("ring_attention.block", trace::Category::kCompute, BlockFlops(src, 2));
  const size_t ld = B * HD;
  const float* K = kv;
  const float* V = kv + blk;
  for (size_t b = 0; b < B; ++b) {
    for (size_t h = 0; h < H; ++h) {
      for (int a = 0; a < 2; ++a) {
        for (int c = 0; c < 2; ++c) {
          const Mask mask = PairMask(src, a, c);
          if (mask == Mask::kSkip) continue;
          GemmOptions o;
          o.trans_b = true;
          o.alpha = scale;
          o.lda = ld;
          o.ldb = ld;
          Gemm(C, C, d, q.data() + Off(a, b, h), K + Off(c, b, h), s.data(), o);
          float* acc = out.data() + Off(a, b, h);
          const size_t base = (b * H + h) * Tl + a * C;
          for (size_t i = 0; i < C; ++i) {
            float* row = s.data() + i * C;
            const size_t n = mask == Mask::kDiagonal ? i + 1 : C;
            float mx = m[base + i];
            for (size_t j = 0; j < n; ++j) mx = std::max(mx, row[j]);
            const float alpha = std::exp(m[base + i] - mx);  // 0 for the first block
            float sum = 0;
            for (size_t j = 0; j < n; ++j) {
              row[j] = std::exp(row[j] - mx);
              sum += row[j];
            }
            for (size_t j = n; j < C; ++j) row[j] = 0.0f;
            l[base + i] = l[base + i] * alpha + sum;
            m[base + i] = mx;
            float* ar = acc + i * ld;
            for (size_t e = 0; e < d; ++e) ar[e] *= alpha;
          }
          GemmOptions ov;
          ov.beta = 1.0f;
          ov.ldb = ld;
          ov.ldc = ld;
          Gemm(C, d, C, s.data(), V + Off(c, b, h), acc, ov);
        }
      }
      PollAll();
    }
  }
}

void RingAttention::Impl::BackwardBlock(int src, const float* kv, float* dkv) {
  trace::Scope span("ring_attention.block_backward", trace::Category::kCompute, BlockFlops(src, 5));
  const size_t ld = B * HD;
  const float* K = kv;
  const float* V = kv + blk;
  float* dK = dkv;
  float* dV = dkv + blk;
  std::fill(dkv, dkv + 2 * blk, 0.0f);
  for (size_t b = 0; b < B; ++b) {
    for (size_t h = 0; h < H; ++h) {
      for (int a = 0; a < 2; ++a) {
        for (int c = 0; c < 2; ++c) {
          const Mask mask = PairMask(src, a, c);
          if (mask == Mask::kSkip) continue;
          const float* Qa = q.data() + Off(a, b, h);
          const float* dOa = dout.data() + Off(a, b, h);
          const float* Kc = K + Off(c, b, h);
          const float* Vc = V + Off(c, b, h);
          const size_t base = (b * H + h) * Tl + a * C;
          GemmOptions o;
          o.trans_b = true;
          o.alpha = scale;
          o.lda = ld;
          o.ldb = ld;
          Gemm(C, C, d, Qa, Kc, s.data(), o);  // S
          for (size_t i = 0; i < C; ++i) {
            float* row = s.data() + i * C;
            const size_t n = mask == Mask::kDiagonal ? i + 1 : C;
            for (size_t j = 0; j < n; ++j) row[j] = std::exp(row[j] - lse[base + i]);
            for (size_t j = n; j < C; ++j) row[j] = 0.0f;
          }
          GemmOptions o1;  // dV_c += P^T dO_a
          o1.trans_a = true;
          o1.beta = 1.0f;
          o1.ldb = ld;
          o1.ldc = ld;
          Gemm(C, d, C, s.data(), dOa, dV + Off(c, b, h), o1);
          GemmOptions o2;  // dP = dO_a V_c^T
          o2.trans_b = true;
          o2.lda = ld;
          o2.ldb = ld;
          Gemm(C, C, d, dOa, Vc, ds.data(), o2);
          for (size_t i = 0; i < C; ++i) {
            float* row = ds.data() + i * C;
            const float* p = s.data() + i * C;
            for (size_t j = 0; j < C; ++j) row[j] = p[j] * (row[j] - D[base + i]) * scale;
          }
          GemmOptions o3;  // dQ_a += dS K_c
          o3.beta = 1.0f;
          o3.ldb = ld;
          o3.ldc = ld;
          Gemm(C, d, C, ds.data(), Kc, dq.data() + Off(a, b, h), o3);
          GemmOptions o4;  // dK_c += dS^T Q_a
          o4.trans_a = true;
          o4.beta = 1.0f;
          o4.ldb = ld;
          o4.ldc = ld;
          Gemm(C, d, C, ds.data(), Qa, dK + Off(c, b, h), o4);
        }
      }
      PollAll();
    }
  }
}

// ------------------------------------------------------------------ public

RingAttention::RingAttention(const Group& cp, const RingAttentionConfig& c)
    : impl_(std::make_unique<Impl>()) {
  if (!cp.valid()) Invalid("invalid CP group", -1);
  const int rank = cp.rank();
  auto positive = [rank](const char* name, int v) {
    if (v < 1) Invalid(std::string(name) + " must be >= 1, not " + std::to_string(v), rank);
  };
  positive("batch", c.batch);
  positive("seq_len", c.seq_len);
  positive("heads", c.heads);
  positive("head_dim", c.head_dim);
  const int N = cp.size();
  if (c.seq_len % (2 * N) != 0) {
    Invalid("seq_len (" + std::to_string(c.seq_len) + ") must be divisible by 2 * cp = " +
                std::to_string(2 * N) + ": every rank holds two of 2 * cp equal chunks",
            rank);
  }
  Impl& m = *impl_;
  m.cp = cp;
  m.cfg = c;
  m.N = N;
  m.r = rank;
  m.C = static_cast<size_t>(c.seq_len / (2 * N));
  m.Tl = 2 * m.C;
  m.B = static_cast<size_t>(c.batch);
  m.H = static_cast<size_t>(c.heads);
  m.d = static_cast<size_t>(c.head_dim);
  m.HD = m.H * m.d;
  m.blk = m.Tl * m.B * m.HD;
  m.scale = 1.0f / std::sqrt(static_cast<float>(m.d));
  m.q.resize(m.blk);
  m.out.resize(m.blk);
  m.own_kv.resize(2 * m.blk);
  const size_t rows = m.B * m.H * m.Tl;
  m.m.resize(rows);
  m.l.resize(rows);
  m.lse.resize(rows);
  m.D.resize(rows);
  m.s.resize(m.C * m.C);
  m.ds.resize(m.C * m.C);
  if (N > 1) {
    for (auto& v : m.ring) v.resize(2 * m.blk);
    m.last_kv.resize(2 * m.blk);
    for (auto& v : m.dkv_acc) v.resize(2 * m.blk);
    for (auto& v : m.dkv_rcv) v.resize(2 * m.blk);
  }
}

RingAttention::~RingAttention() { impl_->WaitAll(); }

namespace {

// dst (tight, rows x cols) = src (row stride ld).
void CopyIn(const float* src, size_t ld, size_t rows, size_t cols, float* dst) {
  for (size_t i = 0; i < rows; ++i) std::memcpy(dst + i * cols, src + i * ld, cols * sizeof(float));
}
void CopyOut(const float* src, size_t rows, size_t cols, float* dst, size_t ld) {
  for (size_t i = 0; i < rows; ++i) std::memcpy(dst + i * ld, src + i * cols, cols * sizeof(float));
}

}  // namespace

void RingAttention::Forward(const float* q, size_t ldq, const float* k, size_t ldk, const float* v,
                            size_t ldv, float* out, size_t ldo) {
  Impl& m = *impl_;
  const size_t rows = m.Tl * m.B, HD = m.HD;
  for (auto [p, ld, name] : {std::tuple{static_cast<const void*>(q), ldq, "q"},
                             std::tuple{static_cast<const void*>(k), ldk, "k"},
                             std::tuple{static_cast<const void*>(v), ldv, "v"},
                             std::tuple{static_cast<const void*>(out), ldo, "out"}}) {
    if (p == nullptr) Invalid(std::string("Forward: ") + name + " is null", m.r);
    if (ld < HD) {
      Invalid(std::string("Forward: ld") + name + " (" + std::to_string(ld) +
                  ") is below heads * head_dim (" + std::to_string(HD) + ")",
              m.r);
    }
  }
  m.WaitAll();
  m.has_forward = false;
  m.fwd_wait = 0;
  {
    trace::Scope span("ring_attention.pack", trace::Category::kHost);
    CopyIn(q, ldq, rows, HD, m.q.data());
    CopyIn(k, ldk, rows, HD, m.own_kv.data());
    CopyIn(v, ldv, rows, HD, m.own_kv.data() + m.blk);
    std::fill(m.out.begin(), m.out.end(), 0.0f);
    std::fill(m.m.begin(), m.m.end(), -std::numeric_limits<float>::infinity());
    std::fill(m.l.begin(), m.l.end(), 0.0f);
  }
  const int N = m.N, next = (m.r + 1) % N, prev = (m.r + N - 1) % N;
  const size_t bytes = 2 * m.blk * sizeof(float);
  if (N > 1) m.ring[0] = m.own_kv;
  for (int i = 0; i < N; ++i) {
    const int cur = i % 2;
    const float* kv = N > 1 ? m.ring[cur].data() : m.own_kv.data();
    if (i + 1 < N) {
      m.Wait(m.kv_send, m.fwd_wait);  // it read ring[1 - cur]
      m.kv_recv.Post(m.cp.Recv(m.ring[1 - cur].data(), bytes, prev, kTagKv),
                     "ring_attention.recv_kv", bytes);
      m.kv_send.Post(m.cp.Send(kv, bytes, next, kTagKv), "ring_attention.send_kv", bytes);
      if (!m.cfg.overlap) {
        m.Wait(m.kv_recv, m.fwd_wait);
        m.Wait(m.kv_send, m.fwd_wait);
      }
    }
    m.ForwardBlock((m.r - i + N) % N, kv);
    if (i + 1 < N) m.Wait(m.kv_recv, m.fwd_wait);
  }
  m.Wait(m.kv_send, m.fwd_wait);
  // The last block (rank r+1's) is where the backward starts.
  if (N > 1) std::swap(m.last_kv, m.ring[(N - 1) % 2]);
  // out = acc / l; LSE = m + log l (every row saw at least its own position).
  for (size_t t = 0; t < m.Tl; ++t) {
    for (size_t b = 0; b < m.B; ++b) {
      for (size_t h = 0; h < m.H; ++h) {
        const size_t idx = (b * m.H + h) * m.Tl + t;
        float* o = m.out.data() + (t * m.B + b) * HD + h * m.d;
        const float inv = 1.0f / m.l[idx];
        for (size_t e = 0; e < m.d; ++e) o[e] *= inv;
        m.lse[idx] = m.m[idx] + std::log(m.l[idx]);
      }
    }
  }
  CopyOut(m.out.data(), rows, HD, out, ldo);
  m.has_forward = true;
}

void RingAttention::Backward(const float* dout, size_t lddo, float* dq, size_t ldq, float* dk,
                             size_t ldk, float* dv, size_t ldv) {
  Impl& m = *impl_;
  const size_t rows = m.Tl * m.B, HD = m.HD;
  for (auto [p, ld, name] : {std::tuple{static_cast<const void*>(dout), lddo, "dout"},
                             std::tuple{static_cast<const void*>(dq), ldq, "dq"},
                             std::tuple{static_cast<const void*>(dk), ldk, "dk"},
                             std::tuple{static_cast<const void*>(dv), ldv, "dv"}}) {
    if (p == nullptr) Invalid(std::string("Backward: ") + name + " is null", m.r);
    if (ld < HD) {
      Invalid(std::string("Backward: ld") + name + " (" + std::to_string(ld) +
                  ") is below heads * head_dim (" + std::to_string(HD) + ")",
              m.r);
    }
  }
  if (!m.has_forward) Invalid("Backward: no Forward ran before it", m.r);
  m.WaitAll();
  m.bwd_wait = 0;
  {
    trace::Scope span("ring_attention.pack", trace::Category::kHost);
    m.dout.resize(m.blk);
    m.dq.assign(m.blk, 0.0f);
    m.dkv_loc.resize(2 * m.blk);
    CopyIn(dout, lddo, rows, HD, m.dout.data());
    for (size_t t = 0; t < m.Tl; ++t) {
      for (size_t b = 0; b < m.B; ++b) {
        for (size_t h = 0; h < m.H; ++h) {
          const size_t off = (t * m.B + b) * HD + h * m.d;
          float dot = 0;
          for (size_t e = 0; e < m.d; ++e) dot += m.dout[off + e] * m.out[off + e];
          m.D[(b * m.H + h) * m.Tl + t] = dot;
        }
      }
    }
  }
  // The blocks go the other way round (Send to r-1, Recv from r+1): at
  // step j rank r holds the block of rank r+1+j, starting with the one the
  // forward ended with (last_kv) and ending with its own, so each block's
  // dK, dV partial sum follows it to r-1 and its last addend is its owner's:
  // no gradient transfer after the last block's compute, and one fewer
  // key/value transfer than a ring that starts from the own block.
  const int N = m.N, next = (m.r + 1) % N, prev = (m.r + N - 1) % N;
  const size_t bytes = 2 * m.blk * sizeof(float);
  const float* total = m.dkv_loc.data();  // the own block's dK, dV: complete at step N-1
  const float* kv = N > 1 ? m.last_kv.data() : m.own_kv.data();
  for (int j = 0; j < N; ++j) {
    const int cur = j % 2;
    // Step j + 1's block, unless it is this rank's own (step N-1).
    const bool pass_kv = j + 2 < N;
    if (pass_kv) {
      m.Wait(m.kv_send, m.bwd_wait);  // it read ring[cur] (step j - 1's block)
      m.kv_recv.Post(m.cp.Recv(m.ring[cur].data(), bytes, next, kTagKv),
                     "ring_attention.recv_kv", bytes);
      m.kv_send.Post(m.cp.Send(kv, bytes, prev, kTagKv), "ring_attention.send_kv", bytes);
      if (!m.cfg.overlap) {
        m.Wait(m.kv_recv, m.bwd_wait);
        m.Wait(m.kv_send, m.bwd_wait);
      }
    }
    // Step j's block is rank r+1+j's; its partial sum over ranks r+j ..
    // r+1 comes from rank r+1 (sent at its step j-1).
    m.BackwardBlock((m.r + 1 + j) % N, kv, m.dkv_loc.data());
    if (N > 1) {
      const float* rcv = nullptr;
      if (j > 0) {
        m.Wait(m.d_recv, m.bwd_wait);
        rcv = m.dkv_rcv[1 - cur].data();
      }
      if (j + 1 < N) {
        m.Wait(m.d_send[cur], m.bwd_wait);  // it read dkv_acc[cur] two steps ago
        float* acc = m.dkv_acc[cur].data();
        if (rcv != nullptr) {
          for (size_t e = 0; e < 2 * m.blk; ++e) acc[e] = m.dkv_loc[e] + rcv[e];
        } else {
          std::copy(m.dkv_loc.begin(), m.dkv_loc.end(), acc);
        }
        // On to rank r-1, which holds this block at step j + 1; the next
        // block's partial sum from rank r+1.
        m.d_send[cur].Post(m.cp.Send(acc, bytes, prev, kTagDkv), "ring_attention.send_dkv", bytes);
        m.d_recv.Post(m.cp.Recv(m.dkv_rcv[cur].data(), bytes, next, kTagDkv),
                      "ring_attention.recv_dkv", bytes);
        if (!m.cfg.overlap) {
          m.Wait(m.d_recv, m.bwd_wait);
          m.Wait(m.d_send[cur], m.bwd_wait);
        }
      } else {
        // The own block (j = N-1): its total, on this rank.
        for (size_t e = 0; e < 2 * m.blk; ++e) m.dkv_loc[e] += rcv[e];
      }
    }
    if (pass_kv) {
      m.Wait(m.kv_recv, m.bwd_wait);
      kv = m.ring[cur].data();
    } else if (j + 1 < N) {
      kv = m.own_kv.data();  // step N-1: this rank's own block
    }
  }
  if (N > 1) {
    m.Wait(m.d_send[0], m.bwd_wait);
    m.Wait(m.d_send[1], m.bwd_wait);
    m.Wait(m.kv_send, m.bwd_wait);
  }
  CopyOut(m.dq.data(), rows, HD, dq, ldq);
  CopyOut(total, rows, HD, dk, ldk);
  CopyOut(total + m.blk, rows, HD, dv, ldv);
}

int64_t RingAttention::Position(int t) const {
  const Impl& m = *impl_;
  if (t < 0 || static_cast<size_t>(t) >= m.Tl) {
    Invalid("Position: t = " + std::to_string(t) + " outside [0, " + std::to_string(m.Tl) + ")",
            m.r);
  }
  const size_t a = static_cast<size_t>(t) / m.C, i = static_cast<size_t>(t) % m.C;
  return static_cast<int64_t>(static_cast<size_t>(m.GlobalChunk(m.r, static_cast<int>(a))) * m.C +
                              i);
}

int RingAttention::local_len() const { return static_cast<int>(impl_->Tl); }
const RingAttentionConfig& RingAttention::config() const { return impl_->cfg; }
double RingAttention::forward_wait_seconds() const { return impl_->fwd_wait; }
double RingAttention::backward_wait_seconds() const { return impl_->bwd_wait; }

}  // namespace mc2::models
