// GEMM: f32 through OpenBLAS, bf16 (and f32 on request) through oneDNN, or
// where oneDNN has no row-invariant kernel (hosts without AVX-512) through
// mc2's tiled kernel (tiled_gemm.h), with the same row-block threading.
//
// Works as follows. Arguments are checked once, up front. k == 0 (and an
// empty C) never reaches a library. OpenBLAS calls go to cblas_sgemm; a bias
// is folded into C first (C = beta * C + bias, then sgemm with beta = 1), one
// extra pass over C, which is noise next to the 2mnk flops.
//
// oneDNN calls run a matmul primitive built for the exact call on dense
// operands (strided or transposed ones are copied first, see MakeOperand;
// layouts are described by strides: A^T stored k x m is the m x k matrix
// with strides {1, lda}). alpha, beta and the bias
// are post-ops applied in that order (eltwise_linear, sum, binary_add), which
// keeps oneDNN on its brgemm kernels; its output scales would not, and its
// own bias would be scaled by alpha. Primitives are cached per (shape,
// strides, transposes, types, alpha, beta, bias or not, threads): oneDNN's
// JIT kernels are
// specialised for all of these, and a kernel made for t threads must run
// on t threads. Scratchpads are user-managed and per thread, so one primitive
// runs concurrently on several threads (ranks of an in-process world).
//
// Threads: a oneDNN call on T threads cuts C into T row blocks (fewer when
// a block would have under kMinBlockRows rows) and computes each block on
// its own thread (helper_threads.h) with a single-threaded primitive. A
// single-threaded oneDNN product is row-invariant (row i is the same bits whatever rows are
// computed with it), so the result is bitwise the one-thread result for
// every T: deterministic mode needs no particular thread count. oneDNN's
// own multi-threaded kernels would also split N and K across threads, and
// their sums then depend on T. OpenBLAS (f32 outside deterministic mode)
// runs its own threads; its thread count is process-wide and set only when
// it changes.
#include "ops/gemm.h"

#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/checked.h"
#include "core/enforce.h"
#include "core/env.h"
#include "core/log.h"
#include "core/reduce.h"
#include "core/scratch.h"
#include "ops/helper_threads.h"
#include "ops/tiled_gemm.h"
#include "trace/recorder.h"

namespace mc2::ops {
namespace {

using dnnl::memory;

struct Key {
  size_t m, n, k, lda, ldb, ldc;
  bool ta, tb;
  DType ab_type, c_type;
  uint32_t alpha;  // bit pattern of alpha (1.0f: no scaling post-op)
  uint32_t beta;   // bit pattern of beta (0: no sum post-op)
  bool bias;
  int threads;
  bool packed_b = false;  // B in PackedLayout (ldb, tb unused)
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(k.m);
    mix(k.n);
    mix(k.k);
    mix(k.lda);
    mix(k.ldb);
    mix(k.ldc);
    mix(uint64_t{k.ta} | uint64_t{k.tb} << 1 | uint64_t{k.bias} << 3 | uint64_t{k.packed_b} << 4 |
        static_cast<uint64_t>(k.c_type) << 8 | static_cast<uint64_t>(k.ab_type) << 16);
    mix(k.alpha);
    mix(k.beta);
    mix(static_cast<uint64_t>(k.threads));
    return static_cast<size_t>(h);
  }
};

// One operand as the caller stores it (`user`) and as the matmul reads it
// (`dense`); when they differ, a reorder copies between them through a
// per-thread buffer.
struct Operand {
  memory::desc user, dense;
  bool copy = false;
  dnnl::reorder in, out;  // user -> dense; dense -> user (C only)
};

struct Entry {
  dnnl::matmul prim;
  Operand a, b, c;
  bool read_c = false;  // beta != 0: C is an input too
  memory::desc bias_md, scratch_md;
  int bias_post_op_index = -1;
  size_t scratch_bytes = 0;
  std::string impl;
  // A packed_b entry whose kernel is not the plain call's for the same
  // shape: not used (see PackedGemmB), the plain call runs instead.
  bool usable = true;
};

// oneDNN's AMX kernels (bf16 on hosts with AMX tiles) choose their blocking
// of M from the row count, so a row block of a product is not bitwise the
// same rows of the full product. The pipelines rely on that invariance for
// their results to equal serial's, so the ISA is capped below AMX, before
// any kernel is made, unless the user chose one with ONEDNN_MAX_CPU_ISA
// (or DNNL_MAX_CPU_ISA), e.g. ALL: faster bf16 on such hosts, without the
// bitwise guarantee.
void CapCpuIsa() {
  if (std::getenv("ONEDNN_MAX_CPU_ISA") != nullptr || std::getenv("DNNL_MAX_CPU_ISA") != nullptr)
    return;
  try {
    dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx512_core_bf16);
  } catch (const dnnl::error& e) {
    // Too late: the process made a oneDNN kernel before mc2's first GEMM.
    MC2_LOG(kWarn, "oneDNN's CPU ISA could not be capped below AMX ({}): bf16 pipelines may "
                 "differ from serial in the last bits",
                 e.what());
  }
}

dnnl::engine& Engine() {
  static dnnl::engine engine = [] {
    CapCpuIsa();
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return engine;
}

struct Cache {
  std::mutex mu;
  std::unordered_map<Key, std::shared_ptr<const Entry>, KeyHash> map;
};
Cache& GetCache() {
  static Cache* cache = new Cache;  // never destroyed: calls may outlive statics
  return *cache;
}

memory::dim Dim(size_t v) { return static_cast<memory::dim>(v); }

// oneDNN 2.6 runs its fast brgemm kernels only on dense operands: A as
// plain m x k (a transposed A goes to brgemm only for large m), B as k x n
// or its transpose, C as m x n. Strided or transposed layouts fall back to
// slower kernels -- with post-ops even to the reference loops -- whose sums
// differ from brgemm's. So operands that are not dense are first copied to
// dense buffers: m k elements for A, k n for B, m n for C, next to the
// 2 m n k flops. Every call thus runs on one kernel family, and a row of C
// does not depend on m or on the layouts.
void MakeOperand(Operand* op, const memory::desc& user, const memory::desc& dense) {
  op->user = user;
  op->dense = dense;
  op->copy = user != dense;
  if (op->copy) {
    op->in = dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), user, Engine(), dense));
    op->out = dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), dense, Engine(), user));
  }
}

// The blocked layout oneDNN's matmul reads B (k x n, type `ab`) in, for
// the current thread count: the weights layout it picks for a 256-row
// product given the choice ("any"). The same for every m here (checked for
// 16-2048 rows, f32 and bf16), and an m whose kernel would read another one
// falls back to the plain call (Entry::usable). Throws dnnl::error.
memory::desc PackedLayout(memory::dim k, memory::dim n, memory::data_type ab) {
  constexpr memory::dim kRefRows = 256;
  const auto f32 = memory::data_type::f32;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::primitive_desc pd(
      dnnl::matmul::desc(memory::desc({kRefRows, k}, ab, memory::dims{k, 1}),
                         memory::desc({k, n}, ab, memory::format_tag::any),
                         memory::desc({kRefRows, n}, f32, memory::dims{n, 1})),
      attr, Engine());
  return pd.weights_desc();
}

std::shared_ptr<const Entry> Lookup(const Key& key);

std::shared_ptr<const Entry> MakeEntry(const Key& key) {
  auto e = std::make_shared<Entry>();
  const auto bf16 = memory::data_type::bf16;
  const auto f32 = memory::data_type::f32;
  const auto ab = key.ab_type == DType::kBF16 ? bf16 : f32;
  const auto ct = key.c_type == DType::kBF16 ? bf16 : f32;
  const memory::dim m = Dim(key.m), n = Dim(key.n), k = Dim(key.k);
  MakeOperand(&e->a,
              memory::desc({m, k}, ab,
                           key.ta ? memory::dims{1, Dim(key.lda)} : memory::dims{Dim(key.lda), 1}),
              memory::desc({m, k}, ab, memory::dims{k, 1}));
  if (key.packed_b) {
    const memory::desc packed = PackedLayout(k, n, ab);  // a primitive_desc each time
    MakeOperand(&e->b, packed, packed);
  } else {
    MakeOperand(&e->b,
                memory::desc({k, n}, ab,
                             key.tb ? memory::dims{1, Dim(key.ldb)} : memory::dims{Dim(key.ldb), 1}),
                memory::desc({k, n}, ab, key.tb ? memory::dims{1, k} : memory::dims{n, 1}));
  }
  MakeOperand(&e->c, memory::desc({m, n}, ct, memory::dims{Dim(key.ldc), 1}),
              memory::desc({m, n}, ct, memory::dims{n, 1}));
  e->read_c = key.beta != 0;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // dst = alpha * acc, then + beta * dst, then + bias, all in f32 before
  // the one rounding to the output type.
  dnnl::post_ops po;
  if (key.alpha != std::bit_cast<uint32_t>(1.0f))
    po.append_eltwise(1.0f, dnnl::algorithm::eltwise_linear, std::bit_cast<float>(key.alpha), 0.0f);
  if (key.beta != 0) po.append_sum(std::bit_cast<float>(key.beta));
  if (key.bias) {
    e->bias_md = memory::desc({1, n}, f32, memory::dims{n, 1});
    e->bias_post_op_index = po.len();
    po.append_binary(dnnl::algorithm::binary_add, e->bias_md);
  }
  attr.set_post_ops(po);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e->a.dense, e->b.dense, e->c.dense), attr,
                                  Engine());
  e->impl = pd.impl_info_str();
  if (e->impl.find("ref") != std::string::npos)
    MC2_LOG(kWarn, "Gemm: oneDNN runs m={} n={} k={} on its slow reference kernel ({})", m, n, k,
            e->impl);
  e->scratch_md = pd.scratchpad_desc();
  e->scratch_bytes = e->scratch_md.get_size();
  e->prim = dnnl::matmul(pd);
  if (key.packed_b) {
    // Bitwise the plain call's rows only on the plain call's kernel.
    Key plain = key;
    plain.packed_b = false;
    plain.ldb = key.n;
    plain.tb = false;
    e->usable = Lookup(plain)->impl == e->impl;
  }
  return e;
}

std::shared_ptr<const Entry> Lookup(const Key& key) {
  Cache& cache = GetCache();
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.map.find(key);
    if (it != cache.map.end()) return it->second;
  }
  // Created outside the lock (creation is slow); a racing thread may create
  // the same primitive, and the first one stored wins.
  auto entry = MakeEntry(key);
  std::lock_guard<std::mutex> lock(cache.mu);
  return cache.map.emplace(key, std::move(entry)).first->second;
}

// Per-thread buffers, 64-byte aligned, grown on demand: `which` 0 is the
// primitive's scratchpad, 1-3 the dense copies of A, B and C.
void* Scratch(int which, size_t bytes) {
  struct Buf {
    void* p = nullptr;
    size_t size = 0;
    ~Buf() { std::free(p); }
  };
  thread_local Buf bufs[4];
  Buf& buf = bufs[which];
  if (bytes > buf.size) {
    std::free(buf.p);
    buf.p = nullptr;
    buf.size = 0;
    size_t sz = (bytes + 4095) / 4096 * 4096;
    buf.p = std::aligned_alloc(64, sz);
    if (!buf.p)
      throw Error(ErrorCode::kInternal,
                  fmt::format("Gemm: cannot allocate {} bytes of scratch", sz));
    buf.size = sz;
  }
  return buf.p;
}

dnnl::stream& Stream() {
  thread_local dnnl::stream stream(Engine());
  return stream;
}

// OpenBLAS's thread count (process-wide), set when it changes.
void SetBlasThreads(int threads) {
  static std::atomic<int> blas_threads{-1};
  if (blas_threads.load(std::memory_order_relaxed) != threads) {
    openblas_set_num_threads(threads);
    blas_threads.store(threads, std::memory_order_relaxed);
  }
}

// Fewer rows per block than this and a block's call overhead and the
// kernel's efficiency loss on short blocks outweigh another thread.
constexpr size_t kMinBlockRows = 16;

// The row blocks a oneDNN call on `threads` threads computes.
int RowBlocks(size_t m, int threads) {
  return static_cast<int>(std::clamp<size_t>(m / kMinBlockRows, 1, static_cast<size_t>(threads)));
}

inline float Load(float v) { return v; }
inline float Load(uint16_t v) { return core::BF16ToF32(v); }
inline void Store(float* p, float v) { *p = v; }
inline void Store(uint16_t* p, float v) { *p = core::F32ToBF16(v); }

// C = beta * C + bias over an m x n block (beta == 0: C is not read).
template <typename T>
void ScaleAddBias(size_t m, size_t n, T* c, size_t ldc, float beta, const float* bias) {
  for (size_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    for (size_t j = 0; j < n; ++j) {
      float v = beta == 0.0f ? 0.0f : beta * Load(row[j]);
      if (bias) v += bias[j];
      Store(&row[j], v);
    }
  }
}

struct Resolved {
  size_t lda, ldb, ldc;
  int threads;
};

// Checks the arguments (once per call, before any work) and fills in the
// default strides and thread count.
// `check_pointers` is false for GemmImplementation, which runs nothing.
Resolved Check(size_t m, size_t n, size_t k, DType ab, const void* a, const void* b, DType c_type,
               const void* c, const GemmOptions& o, bool check_pointers = true) {
  MC2_CHECK_ARG((ab == DType::kF32 && c_type == DType::kF32) ||
                    (ab == DType::kBF16 && (c_type == DType::kF32 || c_type == DType::kBF16)),
                "Gemm: unsupported types A/B {} and C {}: expected f32/f32, bf16/f32 or "
                "bf16/bf16",
                DTypeName(ab), DTypeName(c_type));
  MC2_CHECK_ARG(o.backend == GemmBackend::kAuto || o.backend == GemmBackend::kOneDNN ||
                    (o.backend == GemmBackend::kOpenBLAS && ab == DType::kF32),
                "Gemm: backend {} cannot run {} inputs (OpenBLAS here has no bf16 GEMM)",
                static_cast<int>(o.backend), DTypeName(ab));
  MC2_CHECK_ARG(o.threads >= 0 && o.threads <= 1024,
                "Gemm: threads={} is invalid: expected 0 (default) to 1024", o.threads);
  constexpr size_t kMax = INT_MAX;  // OpenBLAS's blasint
  MC2_CHECK_ARG(m <= kMax && n <= kMax && k <= kMax, "Gemm: dimensions m={} n={} k={} exceed {}", m,
                n, k, kMax);
  Resolved r;
  const size_t a_row = o.trans_a ? m : k;  // stored row lengths
  const size_t b_row = o.trans_b ? k : n;
  // (An empty row still needs a positive stride for the libraries.)
  r.lda = o.lda ? o.lda : std::max<size_t>(a_row, 1);
  r.ldb = o.ldb ? o.ldb : std::max<size_t>(b_row, 1);
  r.ldc = o.ldc ? o.ldc : std::max<size_t>(n, 1);
  MC2_CHECK_ARG(r.lda >= std::max<size_t>(a_row, 1) && r.lda <= kMax,
                "Gemm: lda={} is invalid: A's stored rows ({} x {}{}) need a stride of at least {}",
                r.lda, o.trans_a ? k : m, a_row, o.trans_a ? ", transposed" : "", a_row);
  MC2_CHECK_ARG(r.ldb >= std::max<size_t>(b_row, 1) && r.ldb <= kMax,
                "Gemm: ldb={} is invalid: B's stored rows ({} x {}{}) need a stride of at least {}",
                r.ldb, o.trans_b ? n : k, b_row, o.trans_b ? ", transposed" : "", b_row);
  MC2_CHECK_ARG(r.ldc >= std::max<size_t>(n, 1) && r.ldc <= kMax,
                "Gemm: ldc={} is invalid: C ({} x {}) needs a stride of at least {}", r.ldc, m, n,
                n);
  // Every stored matrix must fit one buffer: (rows - 1) x stride + row
  // elements, at most core::kMaxBufferBytes (the bound of every public call).
  const size_t ab_size = DTypeSize(ab);
  auto fits = [](size_t rows, size_t ld, size_t row, size_t esize) {
    if (rows == 0 || row == 0) return true;
    using u128 = unsigned __int128;
    return ((static_cast<u128>(rows) - 1) * ld + row) * esize <= core::kMaxBufferBytes;
  };
  MC2_CHECK_ARG(fits(o.trans_a ? k : m, r.lda, a_row, ab_size),
                "Gemm: A ({} x {}, stride {}) is larger than any buffer can be",
                o.trans_a ? k : m, a_row, r.lda);
  MC2_CHECK_ARG(fits(o.trans_b ? n : k, r.ldb, b_row, ab_size),
                "Gemm: B ({} x {}, stride {}) is larger than any buffer can be",
                o.trans_b ? n : k, b_row, r.ldb);
  MC2_CHECK_ARG(fits(m, r.ldc, n, DTypeSize(c_type)),
                "Gemm: C ({} x {}, stride {}) is larger than any buffer can be", m, n, r.ldc);
  const bool has_c = check_pointers && m > 0 && n > 0;
  MC2_CHECK_ARG(!has_c || c != nullptr, "Gemm: C is null for a {} x {} result", m, n);
  MC2_CHECK_ARG(!has_c || k == 0 || (a != nullptr && b != nullptr),
                "Gemm: A or B is null with m={} n={} k={}", m, n, k);
  r.threads = o.threads ? o.threads : DefaultGemmThreads();
  return r;
}

Key MakeKey(size_t m, size_t n, size_t k, DType ab, DType c_type, const GemmOptions& o,
            const Resolved& r) {
  Key key;
  key.ab_type = ab;
  key.m = m;
  key.n = n;
  key.k = k;
  key.lda = r.lda;
  key.ldb = r.ldb;
  key.ldc = r.ldc;
  key.ta = o.trans_a;
  key.tb = o.trans_b;
  key.c_type = c_type;
  key.alpha = std::bit_cast<uint32_t>(o.alpha);
  // -0.0f and 0.0f both mean "do not read C".
  key.beta = o.beta == 0.0f ? 0u : std::bit_cast<uint32_t>(o.beta);
  key.bias = o.bias != nullptr;
  key.threads = r.threads;
  return key;
}

std::string DnnlMessage(const dnnl::error& e) {
  return fmt::format("{} (status {})", e.what(), static_cast<int>(e.status));
}

// `packed`: B as PackedGemmB laid it out (`b` is then its source, used
// when the packed call would run another kernel than the plain one).
void GemmOneDNN(size_t m, size_t n, size_t k, DType ab, const void* a, const void* b, DType c_type,
                void* c, const GemmOptions& o, const Resolved& r, const void* packed = nullptr) {
  Key key = MakeKey(m, n, k, ab, c_type, o, r);
  try {
    std::shared_ptr<const Entry> e;
    if (packed) {
      Key pk = key;
      pk.packed_b = true;
      pk.ldb = 0;
      pk.tb = false;
      e = Lookup(pk);
      if (e->usable) b = packed;
      else e = nullptr;
    }
    if (!e) e = Lookup(key);
    auto& eng = Engine();
    auto& stream = Stream();
    // oneDNN's memory objects only wrap the callers' pointers (or ours).
    auto bind = [&](const Operand& op, int buf, const void* user, bool copy_in) {
      memory u(op.user, eng, const_cast<void*>(user));
      if (!op.copy) return u;
      memory d(op.dense, eng, Scratch(buf, op.dense.get_size()));
      if (copy_in) op.in.execute(stream, u, d);
      return d;
    };
    memory am = bind(e->a, 1, a, true);
    memory bm = bind(e->b, 2, b, true);
    memory cm = bind(e->c, 3, c, e->read_c);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    if (key.bias)
      args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(e->bias_post_op_index) | DNNL_ARG_SRC_1,
                   memory(e->bias_md, eng, const_cast<float*>(o.bias)));
    if (e->scratch_bytes)
      args.emplace(DNNL_ARG_SCRATCHPAD, memory(e->scratch_md, eng, Scratch(0, e->scratch_bytes)));
    e->prim.execute(stream, args);
    if (e->c.copy) {
      memory cu(e->c.user, eng, c);
      e->c.out.execute(stream, cm, cu);
    }
    stream.wait();
  } catch (const dnnl::error& err) {
    throw Error(ErrorCode::kInternal,
                fmt::format("Gemm: oneDNN matmul failed for m={} n={} k={} ({} -> {}): {}", m, n, k,
                            DTypeName(ab), DTypeName(c_type), DnnlMessage(err)));
  }
}

// A oneDNN call on r.threads threads: row blocks of C, each on one thread
// (the caller's or one of its helpers, helper_threads.h) with a
// single-threaded primitive (see the file comment), or with the tiled
// kernel where oneDNN's are not row-invariant (tiled_gemm.h; `packed` is
// then in its layout). The first error of any block is rethrown once every
// block has finished.
void GemmOneDNNRows(size_t m, size_t n, size_t k, DType ab, const void* a, const void* b,
                    DType c_type, void* c, const GemmOptions& o, const Resolved& r,
                    const void* packed = nullptr) {
  Resolved one = r;
  one.threads = 1;
  const bool tiled = !OneDnnRowInvariant();
  const size_t a_row_bytes = (o.trans_a ? 1 : r.lda) * DTypeSize(ab);  // A^T: a column
  const size_t c_row_bytes = r.ldc * DTypeSize(c_type);
  auto rows = [&](size_t r0, size_t r1) {
    if (r1 == r0) return;
    const char* ar = static_cast<const char*>(a) + r0 * a_row_bytes;
    char* cr = static_cast<char*>(c) + r0 * c_row_bytes;
    if (tiled) {
      return TiledGemm(r1 - r0, n, k, ab, ar, r.lda, o.trans_a, b, r.ldb, o.trans_b, c_type, cr,
                       r.ldc, o.alpha, o.beta, o.bias, static_cast<const float*>(packed));
    }
    omp_set_num_threads(1);  // the block's primitive runs on this thread alone
    GemmOneDNN(r1 - r0, n, k, ab, ar, b, c_type, cr, o, one, packed);
  };
  const int blocks = RowBlocks(m, r.threads);
  if (blocks == 1) return rows(0, m);
  RunBlocks(blocks, [&](int t) { rows(t * m / blocks, (t + 1) * m / blocks); });
}

}  // namespace

int DefaultGemmThreads() {
  static const int threads = static_cast<int>(core::EnvInt("MC2_GEMM_THREADS", 1, 1, 1024));
  return threads;
}

size_t CachedGemmPrimitives() {
  Cache& cache = GetCache();
  std::lock_guard<std::mutex> lock(cache.mu);
  return cache.map.size();
}

std::string GemmImplementation(size_t m, size_t n, size_t k, DType ab, DType c_type,
                               const GemmOptions& options) {
  Resolved r = Check(m, n, k, ab, nullptr, nullptr, c_type, nullptr, options, false);
  if (!OneDnnRowInvariant()) return TiledGemmName();
  r.threads = 1;  // every row block runs a single-threaded primitive
  omp_set_num_threads(1);
  try {
    return Lookup(MakeKey(m, n, k, ab, c_type, options, r))->impl;
  } catch (const dnnl::error& err) {
    throw Error(ErrorCode::kInternal,
                fmt::format("Gemm: oneDNN cannot create a matmul for m={} n={} k={}: {}", m, n, k,
                            DnnlMessage(err)));
  }
}

namespace {

// How a B layout is packed: the layout and the reorder into it (once per
// shape; creating a reorder is slow).
struct PackInfo {
  memory::desc user, packed;
  dnnl::reorder reorder;
  bool useful = false;  // the layout is not B's plain one
};

std::shared_ptr<const PackInfo> LookupPack(const Key& key) {
  static std::mutex mu;
  static auto* map = new std::unordered_map<Key, std::shared_ptr<const PackInfo>, KeyHash>;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = map->find(key);
    if (it != map->end()) return it->second;
  }
  auto info = std::make_shared<PackInfo>();
  const auto ab = key.ab_type == DType::kBF16 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::dim n = Dim(key.n), k = Dim(key.k);
  info->user = memory::desc(
      {k, n}, ab, key.tb ? memory::dims{1, Dim(key.ldb)} : memory::dims{Dim(key.ldb), 1});
  info->packed = PackedLayout(k, n, ab);
  info->useful = info->packed != memory::desc({k, n}, ab, memory::dims{n, 1});
  if (info->useful)
    info->reorder = dnnl::reorder(
        dnnl::reorder::primitive_desc(Engine(), info->user, Engine(), info->packed));
  std::lock_guard<std::mutex> lock(mu);
  return map->emplace(key, std::move(info)).first->second;
}

}  // namespace

PackedGemmB::PackedGemmB(size_t k, size_t n, DType ab, const void* b, const GemmOptions& o)
    : k_(k), n_(n), ab_(ab), b_(b), options_(o) {
  const Resolved r = Check(1, n, k, ab, nullptr, b, DType::kF32, nullptr, o, false);
  MC2_CHECK_ARG(k == 0 || n == 0 || b != nullptr, "PackedGemmB: B is null with k={} n={}", k, n);
  options_.ldb = r.ldb;
  options_.threads = r.threads;
  if (k == 0 || n == 0 || !(ab == DType::kBF16 || o.backend == GemmBackend::kOneDNN)) return;
  if (!OneDnnRowInvariant()) {  // TiledGemm's layout (tiled_gemm.h)
    auto block = std::make_shared<core::ScratchBlock>(TiledPackedBFloats(k, n) * sizeof(float));
    float* data = static_cast<float*>(block->data());
    TiledPackB(k, n, ab, b, r.ldb, o.trans_b, data);
    packed_ = std::shared_ptr<void>(block, data);
    return;
  }
  // Packed for the single-threaded primitives every row block runs.
  Resolved one = r;
  one.threads = 1;
  omp_set_num_threads(1);
  Key key = MakeKey(0, n, k, ab, DType::kF32, GemmOptions{}, one);
  key.tb = o.trans_b;
  key.packed_b = true;
  try {
    auto info = LookupPack(key);
    if (!info->useful) return;
    // From the thread's scratch cache (core/scratch.h), not the allocator:
    // a call packs each B afresh, and a fresh 16 MiB buffer whose pages the
    // allocator gave back to the kernel (and a VM to its host) pays its page
    // faults on every fill, many times what a reused one costs.
    auto block = std::make_shared<core::ScratchBlock>(info->packed.get_size());
    void* data = block->data();
    packed_ = std::shared_ptr<void>(block, data);
    memory user(info->user, Engine(), const_cast<void*>(b));
    memory packed(info->packed, Engine(), data);
    info->reorder.execute(Stream(), user, packed);
    Stream().wait();
  } catch (const dnnl::error& err) {
    throw Error(ErrorCode::kInternal,
                fmt::format("PackedGemmB: oneDNN cannot pack B ({} x {}, {}): {}", k, n,
                            DTypeName(ab), DnnlMessage(err)));
  }
}

void PackedGemmB::Multiply(size_t m, const void* a, DType c_type, void* c,
                           const GemmOptions& o) const {
  GemmOptions opt = o;
  opt.trans_b = options_.trans_b;
  opt.ldb = options_.ldb;
  opt.threads = options_.threads;
  opt.backend = options_.backend;
  if (!packed_) return Gemm(m, n_, k_, ab_, a, b_, c_type, c, opt);
  const Resolved r = Check(m, n_, k_, ab_, a, b_, c_type, c, opt);
  if (m == 0) return;
  GemmOneDNNRows(m, n_, k_, ab_, a, b_, c_type, c, opt, r, packed_.get());
}

void PackedGemmBSet::Gemm(size_t m, size_t n, size_t k, const void* a, const void* b,
                          DType c_type, void* c) {
  if (m == 0 || n == 0) return;
  // A call multiplies by a handful of Bs (one, or one per expert or batch
  // entry): a linear search is enough.
  for (const Entry& e : packs_)
    if (e.b == b && e.k == k && e.n == n) return e.packed.Multiply(m, a, c_type, c, options_);
  Entry& e = packs_.emplace_back(Entry{b, k, n, {}});
  {
    trace::ScopedSpan span(trace::Category::kCompute);
    if (span.on()) span.span().name = "gemm_pack_b";
    e.packed = PackedGemmB(k, n, ab_, b, options_);
  }
  e.packed.Multiply(m, a, c_type, c, options_);
}

}  // namespace mc2::ops

namespace mc2 {

void Gemm(size_t m, size_t n, size_t k, DType ab, const void* a, const void* b, DType c_type,
          void* c, const GemmOptions& o) {
  const ops::Resolved r = ops::Check(m, n, k, ab, a, b, c_type, c, o);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // no product: C = beta * C + bias
    if (c_type == DType::kF32)
      ops::ScaleAddBias(m, n, static_cast<float*>(c), r.ldc, o.beta, o.bias);
    else
      ops::ScaleAddBias(m, n, static_cast<uint16_t*>(c), r.ldc, o.beta, o.bias);
    return;
  }
  if (ab == DType::kBF16 || o.backend == GemmBackend::kOneDNN)
    return ops::GemmOneDNNRows(m, n, k, ab, a, b, c_type, c, o, r);
  ops::SetBlasThreads(r.threads);

  float* cf = static_cast<float*>(c);
  float beta = o.beta;
  if (o.bias) {
    ops::ScaleAddBias(m, n, cf, r.ldc, beta, o.bias);
    beta = 1.0f;
  }
  cblas_sgemm(
      CblasRowMajor, o.trans_a ? CblasTrans : CblasNoTrans, o.trans_b ? CblasTrans : CblasNoTrans,
      static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), o.alpha,
      static_cast<const float*>(a), static_cast<blasint>(r.lda), static_cast<const float*>(b),
      static_cast<blasint>(r.ldb), beta, cf, static_cast<blasint>(r.ldc));
}

void ConvertF32ToBF16(const float* src, bf16* dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i].bits = core::F32ToBF16(src[i]);
}

void ConvertBF16ToF32(const bf16* src, float* dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = core::BF16ToF32(src[i].bits);
}

}  // namespace mc2
