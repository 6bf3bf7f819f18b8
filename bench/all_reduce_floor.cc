// The memory floor of an all_reduce on this host: what the data movement of
// a shared-memory all_reduce costs with no synchronisation but two barriers,
// for comparison with real implementations (bench/compare_mpi.sh --floor).
//
// N threads stand for N ranks, each with its own input and output of B bytes
// (f32, sum), every buffer first touched by its owner. One iteration:
//   1. thread t reduces slice t of all N inputs into slice t of its output
//      (each input element read once: the least any all_reduce must read);
//   2. barrier;
//   3. thread t copies every other slice from the output of the thread that
//      reduced it (each reduced element read once per other rank, each
//      output element written once: the least any all_reduce must write);
//   4. barrier.
// That is the traffic of the best shared-memory algorithm (reduce-scatter
// read in place, then all-gather read in place), without its flags,
// staging or progress threads (its barriers spin, as a rank waiting for a
// flag does). The kernels are mc2's fastest (one-pass
// tree reduction with streaming stores, streaming copies) and, for
// comparison, plain loops the compiler vectorises; the floor is the faster
// of the two. An implementation that needs less time than the floor would
// have to move less data, which an all_reduce of B bytes cannot.
//
//   all_reduce_floor [-n N] [-b MIN] [-e MAX] [-f F] [-i ITERS] [-w WARMUP] [--json FILE]
//
// Prints, per size, the floor (the smaller of the two kernels' median times
// over ITERS iterations, timed on thread 0, which waits at the last barrier
// for all), the fastest single iteration, and the floor's bus bandwidth,
// nccl-tests' convention: 2 (N - 1) / N x B / time.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/copy.h"
#include "core/reduce.h"

namespace {

struct Args {
  int n = 2;
  size_t min_bytes = 8 << 20, max_bytes = 64 << 20, factor = 2;
  int iters = 30, warmup = 5;
  std::string json;
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr, "all_reduce_floor: %s\nusage: all_reduce_floor [-n N] [-b MIN] [-e MAX] "
               "[-f F] [-i ITERS] [-w WARMUP] [--json FILE]\n", why);
  std::exit(2);
}

size_t ParseBytes(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  double mult = 1;
  if (*end == 'K' || *end == 'k') mult = 1 << 10, ++end;
  else if (*end == 'M' || *end == 'm') mult = 1 << 20, ++end;
  else if (*end == 'G' || *end == 'g') mult = 1 << 30, ++end;
  if (end == s || *end != '\0' || !(v > 0) || v * mult > double(size_t{1} << 40))
    Usage((std::string("bad size ") + s).c_str());
  return static_cast<size_t>(v * mult);
}

int ParseInt(const char* s, int lo) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > 1 << 20) Usage((std::string("bad count ") + s).c_str());
  return static_cast<int>(v);
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string opt = argv[i];
    if (i + 1 >= argc) Usage(("missing value after " + opt).c_str());
    const char* v = argv[++i];
    if (opt == "-n") a.n = ParseInt(v, 1);
    else if (opt == "-b") a.min_bytes = ParseBytes(v);
    else if (opt == "-e") a.max_bytes = ParseBytes(v);
    else if (opt == "-f") a.factor = ParseInt(v, 2);
    else if (opt == "-i") a.iters = ParseInt(v, 1);
    else if (opt == "-w") a.warmup = ParseInt(v, 0);
    else if (opt == "--json") a.json = v;
    else Usage(("unknown option " + opt).c_str());
  }
  if (a.min_bytes > a.max_bytes) Usage("-b is larger than -e");
  return a;
}

enum class Kernels { kMc2, kPlain };

// A spinning barrier: a sleeping one (std::barrier) adds a futex wake-up
// of tens of microseconds to every phase, which is not data movement.
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void arrive_and_wait() {
    unsigned gen = gen_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      arrived_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    for (int spins = 0; gen_.load(std::memory_order_acquire) == gen; ++spins) {
      if (spins > 100000) std::this_thread::yield();  // more threads than free cores
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
  }

 private:
  const int n_;
  std::atomic<int> arrived_{0};
  std::atomic<unsigned> gen_{0};
};

// One size, one kind of kernel: per-iteration times of thread 0, in us.
std::vector<double> Measure(const Args& a, size_t bytes, Kernels kernels) {
  const int n = a.n;
  const size_t count = bytes / sizeof(float);
  std::vector<float*> in(n), out(n);
  std::vector<double> times;
  SpinBarrier sync(n);
  auto slice = [&](int t, size_t& lo, size_t& len) {
    size_t per = (count + n - 1) / n;
    lo = std::min(count, per * t);
    len = std::min(count, lo + per) - lo;
  };
  auto rank = [&](int t) {
    in[t] = static_cast<float*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    out[t] = static_cast<float*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    for (size_t i = 0; i < count; ++i) in[t][i] = float(t + 1) + float(i % 7), out[t][i] = 0;
    std::vector<const void*> srcs(n);
    size_t lo, len;
    slice(t, lo, len);
    for (int it = 0; it < a.warmup + a.iters; ++it) {
      sync.arrive_and_wait();
      auto t0 = std::chrono::steady_clock::now();
      if (kernels == Kernels::kMc2) {
        for (int s = 0; s < n; ++s) srcs[s] = in[s] + lo;
        mc2::core::ReduceTree(mc2::DType::kF32, mc2::ReduceOp::kSum, out[t] + lo, srcs.data(), n,
                              len, n, mc2::core::ResultUse::kPeers);
      } else {
        float* o = out[t] + lo;
        if (n == 1) std::memcpy(o, in[0] + lo, len * sizeof(float));
        const float *x0 = in[0] + lo, *x1 = n > 1 ? in[1] + lo : nullptr;
        if (n > 1)
          for (size_t i = 0; i < len; ++i) o[i] = x0[i] + x1[i];
        for (int s = 2; s < n; ++s) {
          const float* x = in[s] + lo;
          for (size_t i = 0; i < len; ++i) o[i] += x[i];
        }
      }
      sync.arrive_and_wait();
      for (int s = 1; s < n; ++s) {
        int peer = (t + s) % n;
        size_t plo, plen;
        slice(peer, plo, plen);
        if (kernels == Kernels::kMc2)
          mc2::core::CopyBytes(out[t] + plo, out[peer] + plo, plen * sizeof(float));
        else
          std::memcpy(out[t] + plo, out[peer] + plo, plen * sizeof(float));
      }
      sync.arrive_and_wait();
      auto t1 = std::chrono::steady_clock::now();
      if (t == 0 && it >= a.warmup)
        times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    sync.arrive_and_wait();  // nobody frees while a peer still reads
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < n; ++t) threads.emplace_back(rank, t);
  rank(0);
  for (auto& th : threads) th.join();
  // Check the result, so that the floor is the time of a correct all_reduce.
  for (int t = 0; t < n; ++t)
    for (size_t i = 0; i < count; i += 4099) {
      float want = 0;
      for (int s = 0; s < n; ++s) want += float(s + 1) + float(i % 7);
      if (out[t][i] != want) {
        std::fprintf(stderr, "all_reduce_floor: wrong result at rank %d element %zu\n", t, i);
        std::exit(1);
      }
    }
  for (int t = 0; t < n; ++t) std::free(in[t]), std::free(out[t]);
  return times;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = Parse(argc, argv);
  nlohmann::json rows = nlohmann::json::array();
  std::printf("# all_reduce floor: %d threads as ranks, f32 sum, %d iterations (+%d warmup)\n", a.n,
              a.iters, a.warmup);
  std::printf("# %10s  %10s %10s %10s %8s  %s\n", "size", "floor us", "min us", "plain us",
              "busbw", "kernels");
  for (size_t b = a.min_bytes; b <= a.max_bytes; b *= a.factor) {
    auto mc2 = Measure(a, b, Kernels::kMc2), plain = Measure(a, b, Kernels::kPlain);
    double mc2_us = Median(mc2), plain_us = Median(plain);
    double med = std::min(mc2_us, plain_us);
    double mn = std::min(*std::min_element(mc2.begin(), mc2.end()),
                         *std::min_element(plain.begin(), plain.end()));
    double busbw = a.n > 1 ? 2.0 * (a.n - 1) / a.n * double(b) / (med * 1e3) : 0;
    const char* kind = mc2_us <= plain_us ? "mc2" : "plain";
    std::printf("  %10zu  %10.1f %10.1f %10.1f %8.2f  %s\n", b, med, mn, plain_us, busbw, kind);
    rows.push_back({{"size", b}, {"floor_us", med}, {"min_us", mn}, {"mc2_kernels_us", mc2_us},
                    {"plain_kernels_us", plain_us}, {"busbw_gbs", busbw}, {"kernels", kind}});
    if (b > a.max_bytes / a.factor) break;
  }
  if (!a.json.empty()) {
    FILE* f = std::fopen(a.json.c_str(), "w");
    if (!f) {
      std::perror(("all_reduce_floor: " + a.json).c_str());
      return 1;
    }
    std::string s = nlohmann::json{{"ranks", a.n}, {"iters", a.iters}, {"rows", rows}}.dump(1);
    std::fprintf(f, "%s\n", s.c_str());
    std::fclose(f);
  }
  return 0;
}
