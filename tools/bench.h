// `mc2 bench`: shared pieces of the benchmark subcommand.
//
// bench_command.cc parses the command line and, outside an mc2 job,
// re-executes the tool under the launcher; bench_rank.cc runs the sweep on
// every rank of the job (rank 0 prints, nccl-tests style); bench_tune.cc
// measures each algorithm and writes the selector's tuning table;
// bench_data.cc makes exactly checkable inputs and their expected results.
#ifndef MC2_TOOLS_BENCH_H_
#define MC2_TOOLS_BENCH_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mc2/collectives.h"
#include "mc2/tensor.h"

namespace mc2::tools::bench {

// Exit statuses (as `mc2 run`): 1 = wrong results or a failed run, 2 = usage.
inline constexpr int kExitWrong = 1;
inline constexpr int kExitUsage = 2;

enum class Coll {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBroadcast,
  kReduce,
  kSendRecv,
};

std::optional<Coll> ParseColl(std::string_view name);
const char* CollName(Coll c);
// "all_reduce, all_gather, ...": for error messages.
std::string CollNames();
bool IsReducing(Coll c);
bool IsRooted(Coll c);
// Bus bandwidth factor (nccl-tests doc/PERFORMANCE.md).
double BusFactor(Coll c, int nranks);

// "8 B", "64 KiB", "256 MiB".
std::string FormatSize(size_t bytes);

// The geometry of one size of the sweep. `bytes` is the size as nccl-tests
// reports it: the total bytes per rank (all_gather: the output, and
// reduce_scatter: the input); `count` is the per-call count argument (the
// per-rank block for all_gather, reduce_scatter and all_to_all).
struct Shape {
  size_t bytes = 0;
  size_t elements = 0;  // the "count" column: bytes / element size
  size_t count = 0;
  size_t send_bytes = 0;
  size_t recv_bytes = 0;
};
Shape ShapeFor(Coll c, size_t requested_bytes, size_t esize, int nranks);
// The requested sizes min, min*f, ... <= max, as distinct shapes.
std::vector<Shape> SweepShapes(Coll c, size_t min_bytes, size_t max_bytes, int factor,
                               size_t esize, int nranks);

struct Config {
  Coll coll = Coll::kAllReduce;
  int nranks = 0;  // 0: the job's size
  size_t min_bytes = 8;
  size_t max_bytes = size_t{256} << 20;
  int factor = 2;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  Algorithm algo = Algorithm::kAuto;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  bool symmetric = true;
  int root = 0;
  std::string json_path;
};

// Symmetric heap per rank that a sweep needs: its largest send and recv
// buffers plus room for the group's own areas.
size_t HeapBytesFor(const Config& cfg, int nranks);

// Runs the sweep on this rank of an mc2 job and returns the exit status
// (identical on every rank).
int RunBenchRank(const Config& cfg);

// --tune, inside a job: measures every algorithm of the tunable collectives
// and has rank 0 write the measurements (JSON) to `result_path`.
int RunTuneRank(const std::string& result_path);
// --tune, outside a job: launches the measurements for each rank count and
// writes the tuning table to `output` ("" = the default path).
int RunTune(const std::string& self_exe, const std::vector<int>& nranks,
            const std::string& output);
// --tune inside an mpirun job across hosts (bench_tune_net.cc): measures
// the node level and the level across hosts; rank 0 writes the table to
// `output` ("" = the default path). Exit status identical on every rank.
int RunTuneNet(const std::string& output);
// Heap per rank that a --tune job needs.
size_t TuneHeapBytes();

// Checkable data (bench_data.cc).
//
// Every input element is a small integer chosen so that every result is
// exactly representable in the dtype whatever the order of the reduction,
// so the expected output can be computed independently and compared bit for
// bit.
class Pattern {
 public:
  Pattern(Coll c, DType t, ReduceOp op, int nranks);
  // Element i of rank r's input, as an integer.
  int64_t Value(int rank, size_t i) const;
  // The reduction over every rank of Value(*, i).
  int64_t Reduced(size_t i) const;
  // Writes v into element i of a buffer of the dtype.
  void Store(void* buf, size_t i, int64_t v) const;
  // Fills elements [0, n) of buf with Value(rank, first + k).
  void Fill(void* buf, size_t n, int rank, size_t first) const;
  // Fills elements [0, n) of buf with Reduced(first + k).
  void FillReduced(void* buf, size_t n, size_t first) const;

 private:
  Coll coll_;
  DType dtype_;
  ReduceOp op_;
  int nranks_;
  size_t esize_;
  int64_t modulus_ = 1;  // values in [0, modulus_) (before scaling)
  int prod_ranks_ = 0;   // prod: ranks that may contribute a factor 2
};

// Number of elements of `esize` bytes that differ between a and b.
size_t CountWrong(const void* a, const void* b, size_t n, size_t esize);

// Median of a sample (copied).
double Median(std::vector<double> v);

}  // namespace mc2::tools::bench

#endif  // MC2_TOOLS_BENCH_H_
