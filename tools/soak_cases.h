// `mc2 soak`: the operations one rank runs and checks (soak_collective.cc,
// soak_fused.cc), for the rank driver (soak_rank.cc).
//
// How results are checked: every input element is a function of (step
// seed, group rank, index) that any rank can evaluate, so each rank computes
// the expected output of its own buffers from the definition of the
// collective, with the shared reference (reference/reference_reduce.h). The
// values are small integers, chosen per reduction so that every partial
// result is exact in every dtype (bf16 included) and the result is the same
// in any order of reduction: no tolerance is needed and a single wrong
// element is caught. Fused operators use entries in [-2, 2], whose products
// are exact in f32. Bytes after every output buffer (canaries), gaps between
// V-blocks and the output of non-root ranks must stay untouched.
#ifndef MC2_TOOLS_SOAK_CASES_H_
#define MC2_TOOLS_SOAK_CASES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mc2/mc2.h"

namespace mc2::tools::soak {

inline uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline constexpr unsigned char kSentinel = 0xA5;  // output bytes nobody may write
inline constexpr unsigned char kCanary = 0xC3;    // bytes after every buffer
inline constexpr size_t kCanaryBytes = 64;
// Largest buffer of one collective, per rank (the symmetric ones hold it).
inline constexpr size_t kMaxBufferBytes = size_t{3} << 20;

// Element equality: floats by value (+0 == -0; NaN is never right),
// integers by bits.
bool SameElement(DType t, const unsigned char* a, const unsigned char* b);

// A buffer of `bytes` plus canary bytes, private (heap) or carved from a
// symmetric buffer.
struct Buf {
  std::vector<unsigned char> own;
  unsigned char* p = nullptr;
  size_t bytes = 0;

  void Private(size_t n) {
    own.assign(n + kCanaryBytes, kSentinel);
    p = own.data();
    bytes = n;
    std::memset(p + n, kCanary, kCanaryBytes);
  }
  void Symmetric(const SymmetricBuffer& s, size_t n) {
    p = s.as<unsigned char>();
    bytes = n;
    std::memset(p, kSentinel, n);
    std::memset(p + n, kCanary, kCanaryBytes);
  }
  size_t CanaryDamage() const {
    size_t bad = 0;
    for (size_t i = 0; i < kCanaryBytes; ++i) bad += p[bytes + i] != kCanary;
    return bad;
  }
};

struct SoakGroup {
  Group g;        // invalid when this rank is in no group of the family
  int color = 0;  // which subgroup of the family this rank is in
  SymmetricBuffer a, b;
};

// ---------------------------------------------------------------------------
// One collective (soak_collective.cc).

enum class Kind {
  kAllReduce,
  kReduce,
  kBroadcast,
  kAllGather,
  kAllGatherV,
  kGather,
  kScatter,
  kReduceScatter,
  kReduceScatterV,
  kAllToAll,
  kAllToAllV,
  kBarrier,
  kCount
};

struct CollPlan {
  Kind kind = Kind::kBarrier;
  DType t = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  Algorithm algo = Algorithm::kAuto;
  int root = 0;
  bool in_place = false;
  bool symmetric = false;
  uint64_t s = 0;                           // value seed
  size_t count = 0;                         // uniform collectives
  std::vector<size_t> counts, displs;       // V collectives (displs may be empty)
  std::vector<std::vector<size_t>> c2c;     // all_to_allv counts [from][to]
  std::vector<std::vector<size_t>> sd, rd;  // all_to_allv displs per rank

  std::string Describe(int n) const;
};

// The buffers of one collective on this rank, filled with the inputs, and
// the expected content of the output buffer after the call.
struct CollRun {
  CollPlan plan;
  int n = 0, me = 0;
  Buf send, recv;  // in place only `recv` is used
  const void* send_ptr = nullptr;
  void* recv_ptr = nullptr;
  std::vector<unsigned char> expected;  // the whole of `recv` after the call
};

// Draws the collective of one step for a group of `n` ranks; only one whose
// `symmetric_ok` may use the group's symmetric buffers.
CollPlan PlanCollective(std::mt19937_64& rng, int n, bool symmetric_ok);
// Prepares `run` (buffers, inputs, expected output) for its plan on `sg`.
void Prepare(CollRun& run, const SoakGroup& sg);
// Issues the prepared collective on `g`.
Work Issue(CollRun& run, const Group& g);
// Wrong elements of the output (and damaged canary bytes); adds the
// elements compared to *checked.
size_t Check(const CollRun& run, size_t* checked);

// ---------------------------------------------------------------------------
// Fused operators (soak_fused.cc).

enum class FusedKind { kAllGatherMatmul, kMatmulReduceScatter, kMatmulAllReduce };

struct FusedPlan {
  FusedKind kind = FusedKind::kMatmulAllReduce;
  DType t = DType::kF32;
  FusedOptions opts;
  bool gathered = false;
  uint64_t s = 0;
  std::vector<size_t> m, k, n;  // per group rank (what each kind lets differ)

  std::string Describe() const;
};

FusedPlan PlanFused(std::mt19937_64& rng, int n);
// Runs the fused operator of `p` on `g` and returns its wrong elements
// (adding the elements compared to *checked; *what explains other faults).
size_t RunFused(const FusedPlan& p, const Group& g, size_t* checked, std::string* what);

}  // namespace mc2::tools::soak

#endif  // MC2_TOOLS_SOAK_CASES_H_
