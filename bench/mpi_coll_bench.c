/* mpi_coll_bench: the sweep of `mc2 bench`, run over MPI, for comparison.
 *
 *   mpirun -np N ./mpi_coll_bench all_reduce|all_gather|reduce_scatter|
 *       all_to_all|broadcast|reduce|send_recv [-b 8] [-e 256M] [-f 2]
 *       [-d f32] [-o sum] [-i 20] [-w 5] [-c 0|1] [--root R] [--in-place 0|1]
 *       [--json FILE]
 *
 * Same sizes (nccl-tests convention: the total bytes per rank; all_gather:
 * the output, reduce_scatter: the input), same columns, same bus bandwidth
 * factors, same timing (per-iteration times, the max over ranks; the row
 * shows the average) and the same exactly checkable data as mc2 bench, so
 * bench/compare_mpi.sh can join the two --json outputs. MPI has no f16/bf16
 * and no avg: those are usage errors. Broadcast has one buffer in MPI, so
 * out-of-place and in-place run the same call. --in-place 0 skips the in-place
 * calls (N/A, null in the JSON): Open MPI 4.1's coll/han mishandles
 * MPI_IN_PLACE in its all-reduce and crashes.
 */
#include <mpi.h>

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, BROADCAST, REDUCE, SEND_RECV };
static const char* kCollNames[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                   "broadcast",  "reduce",     "send_recv"};
enum { F32, F64, I8, U8, I32, I64 };
static const char* kTypeNames[] = {"f32", "f64", "i8", "u8", "i32", "i64"};
static const size_t kTypeSizes[] = {4, 8, 1, 1, 4, 8};
enum { SUM, PROD, MIN, MAX, BAND, BOR, BXOR };
static const char* kOpNames[] = {"sum", "prod", "min", "max", "band", "bor", "bxor"};

static int g_rank, g_n;
static int g_coll, g_type = F32, g_op = SUM, g_root = 0, g_iters = 20, g_warmup = 5, g_check = 1;
static int g_in_place = 1;
static int64_t g_modulus = 1;
static int g_prod_ranks = 0;

static void Usage(const char* msg, const char* arg) {
  if (g_rank == 0) fprintf(stderr, "mpi_coll_bench: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
  MPI_Finalize();
  exit(2);
}

static int Lookup(const char* s, const char** names, int n) {
  for (int i = 0; i < n; ++i)
    if (strcmp(s, names[i]) == 0) return i;
  return -1;
}

static int ParseSize(const char* s, size_t* out) {
  char* end;
  if (!isdigit((unsigned char)*s)) return 0;
  unsigned long long v = strtoull(s, &end, 10);
  int shift = 0;
  switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'K': shift = 10; ++end; break;
    case 'M': shift = 20; ++end; break;
    case 'G': shift = 30; ++end; break;
    default: return 0;
  }
  if (*end && strcmp(end, "B") != 0 && strcmp(end, "iB") != 0) return 0;
  *out = (size_t)(v << shift);
  return *out > 0;
}

static int IsReducing(void) { return g_coll == ALL_REDUCE || g_coll == REDUCE_SCATTER || g_coll == REDUCE; }
static int IsRooted(void) { return g_coll == BROADCAST || g_coll == REDUCE; }

static double BusFactor(void) {
  switch (g_coll) {
    case ALL_REDUCE: return 2.0 * (g_n - 1) / g_n;
    case ALL_GATHER: case REDUCE_SCATTER: case ALL_TO_ALL: return (double)(g_n - 1) / g_n;
    default: return 1.0;
  }
}

static MPI_Datatype MpiType(void) {
  switch (g_type) {
    case F32: return MPI_FLOAT;
    case F64: return MPI_DOUBLE;
    case I8: return MPI_INT8_T;
    case U8: return MPI_UINT8_T;
    case I32: return MPI_INT32_T;
    default: return MPI_INT64_T;
  }
}

static MPI_Op MpiOp(void) {
  switch (g_op) {
    case SUM: return MPI_SUM;
    case PROD: return MPI_PROD;
    case MIN: return MPI_MIN;
    case MAX: return MPI_MAX;
    case BAND: return MPI_BAND;
    case BOR: return MPI_BOR;
    default: return MPI_BXOR;
  }
}

/* ---- checkable data: the same values as mc2 bench (tools/bench_data.cc) ---- */

static uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static int64_t ExactLimit(void) {
  switch (g_type) {
    case F32: return (int64_t)1 << 24;
    case F64: return (int64_t)1 << 53;
    case I8: return 127;
    case U8: return 255;
    case I32: return INT32_MAX;
    default: return INT64_MAX;
  }
}

static int FloorLog2(int64_t v) {
  int k = 0;
  while (v > 1) v >>= 1, ++k;
  return k;
}

static int64_t Clamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

static void InitPattern(void) {
  const int64_t cap = (int64_t)1 << 20, limit = ExactLimit();
  if (!IsReducing()) { g_modulus = limit < cap ? limit : cap; return; }
  switch (g_op) {
    case SUM: g_modulus = Clamp(limit / g_n, 1, cap); break;
    case MIN: case MAX: g_modulus = limit < cap ? limit : cap; break;
    case PROD:
      g_modulus = 2;
      g_prod_ranks = g_n < FloorLog2(limit) ? g_n : FloorLog2(limit);
      break;
    default: {
      int k = FloorLog2(limit);
      if (k < 62 && limit == ((int64_t)1 << (k + 1)) - 1) ++k;
      g_modulus = (int64_t)1 << (k < 20 ? k : 20);
    }
  }
}

static int64_t Value(int rank, size_t i) {
  /* The collective index matches mc2's enum order (bench.h). */
  const uint64_t h = Mix((uint64_t)i * 0x100000001B3ull ^ ((uint64_t)(rank + 1) << 44) ^
                         (uint64_t)g_coll);
  if (!IsReducing()) return (int64_t)(h % (uint64_t)g_modulus);
  switch (g_op) {
    case PROD: return (rank < g_prod_ranks && (h & 1)) ? 2 : 1;
    case BAND: case BOR: case BXOR: return (int64_t)(h & (uint64_t)(g_modulus - 1));
    default: return (int64_t)(h % (uint64_t)g_modulus);
  }
}

static int64_t Reduced(size_t i) {
  int64_t acc = Value(0, i);
  for (int r = 1; r < g_n; ++r) {
    const int64_t v = Value(r, i);
    switch (g_op) {
      case SUM: acc += v; break;
      case PROD: acc *= v; break;
      case MIN: acc = v < acc ? v : acc; break;
      case MAX: acc = v > acc ? v : acc; break;
      case BAND: acc &= v; break;
      case BOR: acc |= v; break;
      default: acc ^= v; break;
    }
  }
  return acc;
}

static void Store(void* buf, size_t i, int64_t v) {
  switch (g_type) {
    case F32: ((float*)buf)[i] = (float)v; break;
    case F64: ((double*)buf)[i] = (double)v; break;
    case I8: ((int8_t*)buf)[i] = (int8_t)v; break;
    case U8: ((uint8_t*)buf)[i] = (uint8_t)v; break;
    case I32: ((int32_t*)buf)[i] = (int32_t)v; break;
    default: ((int64_t*)buf)[i] = v; break;
  }
}

static void Fill(void* buf, size_t n, int rank, size_t first) {
  for (size_t k = 0; k < n; ++k) Store(buf, k, Value(rank, first + k));
}

static void FillReduced(void* buf, size_t n, size_t first) {
  for (size_t k = 0; k < n; ++k) Store(buf, k, Reduced(first + k));
}

static int64_t CountWrong(const char* a, const char* b, size_t n, size_t e) {
  if (n == 0 || memcmp(a, b, n * e) == 0) return 0;
  int64_t w = 0;
  for (size_t i = 0; i < n; ++i) w += memcmp(a + i * e, b + i * e, e) != 0;
  return w;
}

/* ---- the sweep ---- */

typedef struct {
  size_t bytes, elements, count, send_bytes, recv_bytes;
} Shape;

static Shape ShapeFor(size_t req, size_t e) {
  Shape s;
  size_t elems = req / e ? req / e : 1;
  size_t block = elems / g_n ? elems / g_n : 1;
  switch (g_coll) {
    case ALL_GATHER:
      s.count = block, s.elements = block * g_n;
      s.send_bytes = block * e, s.recv_bytes = s.bytes = s.elements * e;
      break;
    case REDUCE_SCATTER:
      s.count = block, s.elements = block * g_n;
      s.send_bytes = s.bytes = s.elements * e, s.recv_bytes = block * e;
      break;
    case ALL_TO_ALL:
      s.count = block, s.elements = block * g_n;
      s.send_bytes = s.recv_bytes = s.bytes = s.elements * e;
      break;
    default:
      s.count = s.elements = elems;
      s.send_bytes = s.recv_bytes = s.bytes = elems * e;
  }
  return s;
}

static char *g_send, *g_recv;
static size_t g_esize;

static void Once(const Shape* s, int ip) {
  const int c = (int)s->count;
  MPI_Datatype t = MpiType();
  switch (g_coll) {
    case ALL_REDUCE:
      MPI_Allreduce(ip ? MPI_IN_PLACE : g_send, g_recv, c, t, MpiOp(), MPI_COMM_WORLD);
      break;
    case ALL_GATHER:
      if (ip) MPI_Allgather(MPI_IN_PLACE, 0, t, g_recv, c, t, MPI_COMM_WORLD);
      else MPI_Allgather(g_send, c, t, g_recv, c, t, MPI_COMM_WORLD);
      break;
    case REDUCE_SCATTER: /* in place: the input is g_send, the result lands at its start */
      MPI_Reduce_scatter_block(ip ? MPI_IN_PLACE : g_send, ip ? g_send : g_recv, c, t, MpiOp(),
                               MPI_COMM_WORLD);
      break;
    case ALL_TO_ALL:
      if (ip) MPI_Alltoall(MPI_IN_PLACE, 0, t, g_recv, c, t, MPI_COMM_WORLD);
      else MPI_Alltoall(g_send, c, t, g_recv, c, t, MPI_COMM_WORLD);
      break;
    case BROADCAST:
      MPI_Bcast(g_recv, c, t, g_root, MPI_COMM_WORLD);
      break;
    case REDUCE:
      if (ip) MPI_Reduce(g_rank == g_root ? MPI_IN_PLACE : g_recv, g_recv, c, t, MpiOp(), g_root,
                         MPI_COMM_WORLD);
      else MPI_Reduce(g_send, g_recv, c, t, MpiOp(), g_root, MPI_COMM_WORLD);
      break;
    case SEND_RECV: {
      const int p = g_rank ^ 1;
      if (p < g_n)
        MPI_Sendrecv(g_send, c, t, p, 0, g_recv, c, t, p, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      break;
    }
  }
}

static void PrepareInputs(const Shape* s, int ip) {
  const size_t c = s->count, e = g_esize;
  switch (g_coll) {
    case ALL_REDUCE: case REDUCE: Fill(ip ? g_recv : g_send, c, g_rank, 0); break;
    case SEND_RECV: Fill(g_send, c, g_rank, 0); break;
    case ALL_GATHER: Fill(ip ? g_recv + g_rank * c * e : g_send, c, g_rank, 0); break;
    case REDUCE_SCATTER: Fill(g_send, c * g_n, g_rank, 0); break;
    case ALL_TO_ALL: Fill(ip ? g_recv : g_send, c * g_n, g_rank, 0); break;
    case BROADCAST: if (g_rank == g_root) Fill(g_recv, c, g_rank, 0); break;
  }
}

static void Poison(const Shape* s, int ip) {
  const size_t c = s->count, e = g_esize;
  switch (g_coll) {
    case ALL_GATHER:
      if (!ip) memset(g_recv, 0xA5, c * g_n * e);
      else {
        memset(g_recv, 0xA5, g_rank * c * e);
        memset(g_recv + (g_rank + 1) * c * e, 0xA5, (g_n - g_rank - 1) * c * e);
      }
      break;
    case ALL_TO_ALL: if (!ip) memset(g_recv, 0xA5, c * g_n * e); break;
    case BROADCAST: if (g_rank != g_root) memset(g_recv, 0xA5, c * e); break;
    default: if (!ip) memset(g_recv, 0xA5, c * e); break;
  }
}

static int64_t Check(const Shape* s, int ip, char* exp) {
  const size_t c = s->count, e = g_esize;
  const char* out = g_recv;
  size_t n = c;
  switch (g_coll) {
    case ALL_REDUCE: FillReduced(exp, c, 0); break;
    case REDUCE: if (g_rank != g_root) return 0; FillReduced(exp, c, 0); break;
    case BROADCAST: Fill(exp, c, g_root, 0); break;
    case SEND_RECV: if ((g_rank ^ 1) >= g_n) return 0; Fill(exp, c, g_rank ^ 1, 0); break;
    case ALL_GATHER:
      n = c * g_n;
      for (int q = 0; q < g_n; ++q) Fill(exp + q * c * e, c, q, 0);
      break;
    case REDUCE_SCATTER:
      if (ip) out = g_send;
      FillReduced(exp, c, g_rank * c);
      break;
    case ALL_TO_ALL:
      n = c * g_n;
      for (int q = 0; q < g_n; ++q) Fill(exp + q * c * e, c, q, g_rank * c);
      break;
  }
  return CountWrong(out, exp, n, e);
}

typedef struct {
  double avg, median, min, algbw, busbw;
  int64_t wrong;
} Mode;

static int CmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static Mode Measure(const Shape* s, int ip, char* exp) {
  Mode m;
  if (g_check) PrepareInputs(s, ip);
  for (int i = 0; i < g_warmup; ++i) Once(s, ip);
  MPI_Barrier(MPI_COMM_WORLD);
  double* t = malloc(sizeof(double) * (g_iters + 1));
  const double start = MPI_Wtime();
  for (int k = 0; k < g_iters; ++k) {
    const double t0 = MPI_Wtime();
    Once(s, ip);
    t[1 + k] = (MPI_Wtime() - t0) * 1e6;
  }
  t[0] = (MPI_Wtime() - start) * 1e6;
  MPI_Allreduce(MPI_IN_PLACE, t, g_iters + 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  m.avg = t[0] / g_iters;
  qsort(t + 1, g_iters, sizeof(double), CmpDouble);
  m.min = t[1];
  m.median = g_iters % 2 ? t[1 + g_iters / 2] : (t[g_iters / 2] + t[1 + g_iters / 2]) / 2;
  free(t);
  m.algbw = m.avg > 0 ? (double)s->bytes / (m.avg * 1e3) : 0;
  m.busbw = m.algbw * BusFactor();
  m.wrong = -1;
  if (g_check) {
    PrepareInputs(s, ip);
    Poison(s, ip);
    Once(s, ip);
    int64_t w = Check(s, ip, exp);
    MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    m.wrong = w;
  }
  return m;
}

static void PrintTime(double us) {
  if (us >= 10000.0) printf("  %7.0f", us);
  else if (us >= 100.0) printf("  %7.1f", us);
  else printf("  %7.2f", us);
}

static void JsonMode(FILE* f, const Mode* m) {
  fprintf(f, "{\"time_us\": %.6g, \"time_avg_us\": %.6g, \"time_median_us\": %.6g, "
             "\"time_min_us\": %.6g, \"algbw_gbs\": %.6g, \"busbw_gbs\": %.6g, \"wrong\": ",
          m->avg, m->avg, m->median, m->min, m->algbw, m->busbw);
  if (m->wrong < 0) fprintf(f, "null");
  else fprintf(f, "%lld", (long long)m->wrong);
  fprintf(f, ", \"algo\": \"mpi\"}");
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_n);
  size_t min_bytes = 8, max_bytes = (size_t)256 << 20;
  int factor = 2;
  const char* json = NULL;
  if (argc < 2) Usage("usage: mpi_coll_bench COLLECTIVE [-b MIN] [-e MAX] [-f F] [-d T] [-o OP] "
                      "[-i N] [-w N] [-c 0|1] [--root R] [--in-place 0|1] [--json FILE]", NULL);
  g_coll = Lookup(argv[1], kCollNames, 7);
  if (g_coll < 0) Usage("unknown collective", argv[1]);
  for (int i = 2; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) Usage("missing value after", a);
    ++i;
    if (!strcmp(a, "-b")) { if (!ParseSize(v, &min_bytes)) Usage("bad size", v); }
    else if (!strcmp(a, "-e")) { if (!ParseSize(v, &max_bytes)) Usage("bad size", v); }
    else if (!strcmp(a, "-f")) factor = atoi(v);
    else if (!strcmp(a, "-d")) { if ((g_type = Lookup(v, kTypeNames, 6)) < 0) Usage("unsupported dtype", v); }
    else if (!strcmp(a, "-o")) { if ((g_op = Lookup(v, kOpNames, 7)) < 0) Usage("unsupported op", v); }
    else if (!strcmp(a, "-i")) g_iters = atoi(v);
    else if (!strcmp(a, "-w")) g_warmup = atoi(v);
    else if (!strcmp(a, "-c")) g_check = atoi(v);
    else if (!strcmp(a, "--root")) g_root = atoi(v);
    else if (!strcmp(a, "--in-place")) {
      if (strcmp(v, "0") && strcmp(v, "1")) Usage("--in-place expects 0 or 1", v);
      g_in_place = atoi(v);
    }
    else if (!strcmp(a, "--json")) json = v;
    else Usage("unknown option", a);
  }
  if (min_bytes > max_bytes || factor < 2 || g_iters < 1 || g_warmup < 0) Usage("bad sweep", NULL);
  if (g_root < 0 || g_root >= g_n) Usage("root out of range", NULL);
  if (IsReducing() && g_op >= BAND && (g_type == F32 || g_type == F64))
    Usage("bitwise ops need an integer dtype", NULL);
  g_esize = kTypeSizes[g_type];
  InitPattern();

  Shape shapes[128];
  int nshapes = 0;
  size_t max_send = 0, max_recv = 0;
  for (size_t s = min_bytes; s <= max_bytes && nshapes < 128;) {
    Shape sh = ShapeFor(s, g_esize);
    if (nshapes == 0 || sh.bytes != shapes[nshapes - 1].bytes) shapes[nshapes++] = sh;
    if (sh.send_bytes > max_send) max_send = sh.send_bytes;
    if (sh.recv_bytes > max_recv) max_recv = sh.recv_bytes;
    if (s > max_bytes / (size_t)factor) break;
    s *= (size_t)factor;
  }
  g_send = aligned_alloc(4096, (max_send + 4095) / 4096 * 4096);
  g_recv = aligned_alloc(4096, (max_recv + 4095) / 4096 * 4096);
  char* exp = malloc(max_send > max_recv ? max_send : max_recv);
  memset(g_send, 0, max_send);
  memset(g_recv, 0, max_recv);

  const char* redop = IsReducing() ? kOpNames[g_op] : "none";
  if (g_rank == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len;
    MPI_Get_library_version(lib, &len);
    char* nl = strchr(lib, '\n');
    if (nl) *nl = 0;
    char* comma = strchr(lib, ',');
    if (comma) *comma = 0;
    printf("# mpi_coll_bench %s: %d ranks, buffers private, dtype %s, op %s, algo mpi, iters %d, "
           "warmup %d\n", kCollNames[g_coll], g_n, kTypeNames[g_type], redop, g_iters, g_warmup);
    printf("# minBytes %zu maxBytes %zu step: %d(factor) sizes: %d validation: %d\n", min_bytes,
           max_bytes, factor, nshapes, g_check);
    printf("# link: %s\n#\n", lib);
    printf("# %10s  %12s  %8s  %6s  %6s  %33s  %33s\n", "", "", "", "", "",
           "out-of-place                    ", "in-place                    ");
    printf("# %10s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
    for (int i = 0; i < 2; ++i) printf("  %7s  %6s  %6s  %6s", "time", "algbw", "busbw", "#wrong");
    printf("  algo\n# %10s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "");
    for (int i = 0; i < 2; ++i) printf("  %7s  %6s  %6s  %6s", "(us)", "(GB/s)", "(GB/s)", "");
    printf("\n");
    fflush(stdout);
  }
  Mode* res = malloc(sizeof(Mode) * 2 * nshapes);
  int64_t wrong = 0;
  double bw = 0;
  int nbw = 0;
  for (int i = 0; i < nshapes; ++i) {
    const Shape* s = &shapes[i];
    Mode* m = &res[2 * i];
    m[0] = Measure(s, 0, exp);
    const int has_ip = g_coll != SEND_RECV && g_in_place;
    if (has_ip) m[1] = Measure(s, 1, exp);
    for (int k = 0; k < 1 + has_ip; ++k) {
      bw += m[k].busbw, ++nbw;
      if (m[k].wrong > 0) wrong += m[k].wrong;
    }
    if (g_rank == 0) {
      printf("%12zu  %12zu  %8s  %6s  %6d", s->bytes, s->elements, kTypeNames[g_type], redop,
             IsRooted() ? g_root : -1);
      for (int k = 0; k < 2; ++k) {
        if (k == 1 && !has_ip) {
          printf("  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
          continue;
        }
        PrintTime(m[k].avg);
        printf("  %6.2f  %6.2f", m[k].algbw, m[k].busbw);
        if (m[k].wrong < 0) printf("  %6s", "N/A");
        else printf("  %6lld", (long long)m[k].wrong);
      }
      printf("  mpi\n");
      fflush(stdout);
    }
  }
  if (g_rank == 0) {
    if (g_check) printf("# Out of bounds values : %lld %s\n", (long long)wrong, wrong ? "FAILED" : "OK");
    else printf("# Out of bounds values : N/A (not checked, -c 0)\n");
    printf("# Avg bus bandwidth    : %.4f \n#\n# %s\n", nbw ? bw / nbw : 0.0, wrong ? "FAILED" : "OK");
    fflush(stdout);
    if (json) {
      FILE* f = fopen(json, "w");
      if (!f) {
        fprintf(stderr, "mpi_coll_bench: cannot write %s\n", json);
      } else {
        fprintf(f, "{\"tool\": \"mpi\", \"collective\": \"%s\", \"ranks\": %d, \"buffers\": "
                   "\"private\", \"dtype\": \"%s\", \"op\": \"%s\", \"root\": %d, \"iters\": %d, "
                   "\"warmup\": %d, \"check\": %s, \"rows\": [\n",
                kCollNames[g_coll], g_n, kTypeNames[g_type], redop, IsRooted() ? g_root : -1,
                g_iters, g_warmup, g_check ? "true" : "false");
        for (int i = 0; i < nshapes; ++i) {
          fprintf(f, " {\"size\": %zu, \"count\": %zu, \"out_of_place\": ", shapes[i].bytes,
                  shapes[i].elements);
          JsonMode(f, &res[2 * i]);
          fprintf(f, ", \"in_place\": ");
          if (g_coll == SEND_RECV || !g_in_place) fprintf(f, "null");
          else JsonMode(f, &res[2 * i + 1]);
          fprintf(f, "}%s\n", i + 1 < nshapes ? "," : "");
        }
        fprintf(f, "], \"wrong_total\": %lld, \"avg_busbw_gbs\": %.6g, \"ok\": %s}\n",
                (long long)wrong, nbw ? bw / nbw : 0.0, wrong ? "false" : "true");
        fclose(f);
      }
    }
  }
  free(res);
  free(exp);
  free(g_send);
  free(g_recv);
  MPI_Finalize();
  return wrong ? 1 : 0;
}
