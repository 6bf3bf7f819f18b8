// `mc2 bench`, inside an mc2 job: the sweep of one collective, run by every
// rank, printed by rank 0 in the layout of nccl-tests.
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench.h"
#include "mc2/mc2.h"
#include "output_paths.h"

namespace mc2::tools::bench {

namespace {

using Clock = std::chrono::steady_clock;

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// One rank's send and recv buffers, sized for the largest shape.
struct Buffers {
  SymmetricBuffer send_sym, recv_sym;
  std::unique_ptr<char, FreeDeleter> send_priv, recv_priv;
  char* send = nullptr;
  char* recv = nullptr;

  Buffers(const Group& g, bool symmetric, size_t send_bytes, size_t recv_bytes) {
    if (symmetric) {
      send_sym = g.AllocSymmetric(send_bytes);
      recv_sym = g.AllocSymmetric(recv_bytes);
      send = send_sym.as<char>();
      recv = recv_sym.as<char>();
    } else {
      auto alloc = [](size_t b) {
        void* p = std::aligned_alloc(4096, (b + 4095) / 4096 * 4096);
        if (!p) throw Error(ErrorCode::kSystem, fmt::format("cannot allocate {} bytes", b));
        return static_cast<char*>(p);
      };
      send_priv.reset(alloc(send_bytes));
      recv_priv.reset(alloc(recv_bytes));
      send = send_priv.get();
      recv = recv_priv.get();
    }
    std::memset(send, 0, send_bytes);  // also faults the pages in
    std::memset(recv, 0, recv_bytes);
  }
};

struct ModeResult {
  bool ran = false;
  double avg_us = 0, median_us = 0, min_us = 0;
  double algbw = 0, busbw = 0;
  int64_t wrong = -1;  // -1: not checked
  std::string algo;
};

struct Row {
  Shape shape;
  ModeResult oop, ip;
};

std::string FormatTime(double us) {
  if (us >= 10000.0) return fmt::format("{:7.0f}", us);
  if (us >= 100.0) return fmt::format("{:7.1f}", us);
  return fmt::format("{:7.2f}", us);
}

class Sweep {
 public:
  Sweep(const Config& cfg, const Group& g)
      : cfg_(cfg),
        g_(g),
        n_(g.size()),
        rank_(g.rank()),
        esize_(DTypeSize(cfg.dtype)),
        pattern_(cfg.coll, cfg.dtype, cfg.op, g.size()) {
    opts_.algorithm = cfg.algo;
  }

  int Run();

 private:
  int Partner() const {
    const int p = rank_ ^ 1;
    return p < n_ ? p : -1;
  }
  // The buffer an in-place call works in (the larger of the two).
  char* InPlaceBuffer() const { return cfg_.coll == Coll::kReduceScatter ? buf_->send : buf_->recv; }
  // Issues one call of the collective for `s` and waits for it; returns the
  // call's Work (empty for send_recv), whose algorithm() names what ran.
  // Reading that name builds a string, so the timed loop leaves it to the
  // end (mpi_coll_bench's loop does nothing but the call either).
  Work Once(const Shape& s, bool in_place);
  void PrepareInputs(const Shape& s, bool in_place);
  void PoisonOutputs(const Shape& s, bool in_place);
  // Wrong elements of this rank's output.
  int64_t CheckOutputs(const Shape& s, bool in_place);
  ModeResult Measure(const Shape& s, bool in_place);

  void PrintHeader(size_t nsizes) const;
  void PrintRow(const Row& r) const;
  void Progress(size_t done, size_t total, bool final);
  // False (after saying why) when the file cannot be written.
  bool WriteJson(const std::vector<Row>& rows, int64_t wrong, double avg_busbw) const;

  const Config& cfg_;
  Group g_;
  int n_, rank_;
  size_t esize_;
  Pattern pattern_;
  CollectiveOptions opts_;
  std::unique_ptr<Buffers> buf_;
  std::vector<char> expected_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_progress_{};
  bool progress_shown_ = false;
};

Work Sweep::Once(const Shape& s, bool ip) {
  const size_t c = s.count;
  char* send = buf_->send;
  char* recv = buf_->recv;
  Work w;
  switch (cfg_.coll) {
    case Coll::kAllReduce:
      w = AllReduce(g_, ip ? recv : send, recv, c, cfg_.dtype, cfg_.op, opts_);
      break;
    case Coll::kAllGather:
      w = AllGather(g_, ip ? recv + rank_ * c * esize_ : send, recv, c, cfg_.dtype, opts_);
      break;
    case Coll::kReduceScatter:
      w = ReduceScatter(g_, send, ip ? send + rank_ * c * esize_ : recv, c, cfg_.dtype, cfg_.op,
                        opts_);
      break;
    case Coll::kAllToAll:
      w = AllToAll(g_, ip ? recv : send, recv, c, cfg_.dtype, opts_);
      break;
    case Coll::kBroadcast:
      w = Broadcast(g_, ip ? recv : send, recv, c, cfg_.dtype, cfg_.root, opts_);
      break;
    case Coll::kReduce:
      w = Reduce(g_, ip ? recv : send, recv, c, cfg_.dtype, cfg_.op, cfg_.root, opts_);
      break;
    case Coll::kSendRecv: {
      const int p = Partner();
      if (p < 0) return w;
      Work r = g_.Recv(recv, s.send_bytes, p);
      Work x = g_.Send(send, s.send_bytes, p);
      r.Wait();
      x.Wait();
      return w;
    }
  }
  w.Wait();
  return w;
}

void Sweep::PrepareInputs(const Shape& s, bool ip) {
  const size_t c = s.count;
  char* in = ip ? InPlaceBuffer() : buf_->send;
  switch (cfg_.coll) {
    case Coll::kAllReduce:
    case Coll::kReduce:
    case Coll::kSendRecv:
      if (cfg_.coll == Coll::kSendRecv) in = buf_->send;
      pattern_.Fill(in, c, rank_, 0);
      break;
    case Coll::kAllGather:
      pattern_.Fill(ip ? buf_->recv + rank_ * c * esize_ : buf_->send, c, rank_, 0);
      break;
    case Coll::kReduceScatter:
    case Coll::kAllToAll:
      pattern_.Fill(in, c * n_, rank_, 0);
      break;
    case Coll::kBroadcast:
      if (rank_ == cfg_.root) pattern_.Fill(in, c, rank_, 0);
      break;
  }
}

void Sweep::PoisonOutputs(const Shape& s, bool ip) {
  constexpr int kPoison = 0xA5;  // no small integer of any dtype has this pattern
  const size_t c = s.count, e = esize_;
  switch (cfg_.coll) {
    case Coll::kAllGather:
      if (!ip) {
        std::memset(buf_->recv, kPoison, c * n_ * e);
      } else {
        std::memset(buf_->recv, kPoison, rank_ * c * e);
        std::memset(buf_->recv + (rank_ + 1) * c * e, kPoison, (n_ - rank_ - 1) * c * e);
      }
      break;
    case Coll::kReduceScatter:
      if (!ip) std::memset(buf_->recv, kPoison, c * e);
      break;
    case Coll::kAllToAll:
      if (!ip) std::memset(buf_->recv, kPoison, c * n_ * e);
      break;
    case Coll::kBroadcast:
      if (!ip || rank_ != cfg_.root) std::memset(buf_->recv, kPoison, c * e);
      break;
    case Coll::kAllReduce:
    case Coll::kReduce:
    case Coll::kSendRecv:
      if (!ip) std::memset(buf_->recv, kPoison, c * e);
      break;
  }
}

int64_t Sweep::CheckOutputs(const Shape& s, bool ip) {
  const size_t c = s.count, e = esize_;
  const char* out = buf_->recv;
  size_t elems = c;
  expected_.resize(s.recv_bytes > s.send_bytes ? s.recv_bytes : s.send_bytes);
  char* exp = expected_.data();
  switch (cfg_.coll) {
    case Coll::kAllReduce:
      pattern_.FillReduced(exp, c, 0);
      break;
    case Coll::kReduce:
      if (rank_ != cfg_.root) return 0;
      pattern_.FillReduced(exp, c, 0);
      break;
    case Coll::kBroadcast:
      pattern_.Fill(exp, c, cfg_.root, 0);
      break;
    case Coll::kSendRecv:
      if (Partner() < 0) return 0;
      pattern_.Fill(exp, c, Partner(), 0);
      break;
    case Coll::kAllGather:
      elems = c * n_;
      for (int q = 0; q < n_; ++q) pattern_.Fill(exp + q * c * e, c, q, 0);
      break;
    case Coll::kReduceScatter:
      if (ip) out = buf_->send + rank_ * c * e;
      pattern_.FillReduced(exp, c, rank_ * c);
      break;
    case Coll::kAllToAll:
      elems = c * n_;
      for (int q = 0; q < n_; ++q) pattern_.Fill(exp + q * c * e, c, q, rank_ * c);
      break;
  }
  return static_cast<int64_t>(CountWrong(out, exp, elems, e));
}

ModeResult Sweep::Measure(const Shape& s, bool ip) {
  ModeResult m;
  m.ran = true;
  if (cfg_.check) PrepareInputs(s, ip);
  for (int i = 0; i < cfg_.warmup; ++i) Once(s, ip);
  Barrier(g_).Wait();
  const int iters = cfg_.iters;
  // [0] = the whole loop, [1 + k] = iteration k; the max over ranks of each.
  std::vector<double> t(1 + iters);
  const auto start = Clock::now();
  Work last;
  for (int k = 0; k < iters; ++k) {
    const auto t0 = Clock::now();
    // Only the last call's Work is kept: holding each until the next call
    // would be extra work per call that a plain call-and-wait loop avoids.
    if (k + 1 == iters) last = Once(s, ip);
    else Once(s, ip);
    t[1 + k] = Micros(Clock::now() - t0);
  }
  t[0] = Micros(Clock::now() - start);
  m.algo = cfg_.coll == Coll::kSendRecv ? "p2p" : last.algorithm();
  AllReduce(g_, t.data(), t.data(), t.size(), DType::kF64, ReduceOp::kMax).Wait();
  m.avg_us = t[0] / iters;
  std::vector<double> per(t.begin() + 1, t.end());
  m.median_us = Median(per);
  m.min_us = *std::min_element(per.begin(), per.end());
  m.algbw = m.avg_us > 0 ? static_cast<double>(s.bytes) / (m.avg_us * 1e3) : 0;  // GB/s
  m.busbw = m.algbw * BusFactor(cfg_.coll, n_);
  if (cfg_.check) {
    PrepareInputs(s, ip);
    PoisonOutputs(s, ip);
    Once(s, ip);
    int64_t wrong = CheckOutputs(s, ip);
    AllReduce(g_, &wrong, &wrong, 1, DType::kI64, ReduceOp::kSum).Wait();
    m.wrong = wrong;
  }
  return m;
}

void Sweep::PrintHeader(size_t nsizes) const {
#ifndef NDEBUG
  fmt::print("# WARNING: debug build, figures are not representative\n");
#endif
  const bool reducing = IsReducing(cfg_.coll);
  fmt::print("# mc2 bench {}: {} ranks, buffers {}, dtype {}, op {}, algo {}, iters {}, warmup {}\n",
             CollName(cfg_.coll), n_, cfg_.symmetric ? "symmetric" : "private",
             DTypeName(cfg_.dtype), reducing ? ReduceOpName(cfg_.op) : "none",
             AlgorithmName(cfg_.algo), cfg_.iters, cfg_.warmup);
  fmt::print("# minBytes {} maxBytes {} step: {}(factor) sizes: {} validation: {}{}\n",
             cfg_.min_bytes, cfg_.max_bytes, cfg_.factor, nsizes, cfg_.check ? 1 : 0,
             IsRooted(cfg_.coll) ? fmt::format(" root: {}", cfg_.root) : "");
  fmt::print("# link: none (raw shared memory)\n");
  fmt::print("#\n");
  fmt::print("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>33}  {:>33}\n", "", "", "", "", "",
             "out-of-place                    ", "in-place                    ");
  fmt::print("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}", "size", "count", "type", "redop", "root");
  for (int i = 0; i < 2; ++i)
    fmt::print("  {:>7}  {:>6}  {:>6}  {:>6}", "time", "algbw", "busbw", "#wrong");
  fmt::print("  {}\n", "algo");
  fmt::print("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}", "(B)", "(elements)", "", "", "");
  for (int i = 0; i < 2; ++i) fmt::print("  {:>7}  {:>6}  {:>6}  {:>6}", "(us)", "(GB/s)", "(GB/s)", "");
  fmt::print("\n");
  std::fflush(stdout);
}

void Sweep::PrintRow(const Row& r) const {
  const bool reducing = IsReducing(cfg_.coll);
  fmt::print("{:>12}  {:>12}  {:>8}  {:>6}  {:>6}", r.shape.bytes, r.shape.elements,
             DTypeName(cfg_.dtype), reducing ? ReduceOpName(cfg_.op) : "none",
             IsRooted(cfg_.coll) ? cfg_.root : -1);
  for (const ModeResult* m : {&r.oop, &r.ip}) {
    if (!m->ran) {
      fmt::print("  {:>7}  {:>6}  {:>6}  {:>6}", "N/A", "N/A", "N/A", "N/A");
      continue;
    }
    fmt::print("  {}  {:6.2f}  {:6.2f}  {:>6}", FormatTime(m->avg_us), m->algbw, m->busbw,
               m->wrong < 0 ? std::string("N/A") : std::to_string(m->wrong));
  }
  std::string algo = r.oop.algo;
  if (r.ip.ran && r.ip.algo != r.oop.algo) algo += "/" + r.ip.algo;
  fmt::print("  {}\n", algo);
  std::fflush(stdout);
}

void Sweep::Progress(size_t done, size_t total, bool final) {
  if (rank_ != 0) return;
  const char* env = std::getenv("MC2_BENCH_STDERR_TTY");
  const bool tty = isatty(STDERR_FILENO) || (env && std::strcmp(env, "1") == 0);
  const auto now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (final) {
    if (progress_shown_ && tty) fmt::print(stderr, "\r{:30}\r", "");
    std::fflush(stderr);
    return;
  }
  if (tty) {
    if (elapsed < 0.5 && !progress_shown_) return;
    // Ends with the cursor at the start of the line: the next row (stdout,
    // relayed separately, so maybe before this) simply overwrites it.
    fmt::print(stderr, "\r[bench] {}/{} sizes\r", done, total);
  } else {
    // A log, not a terminal: a line every few seconds once the sweep is long.
    if (elapsed < 2.0 || now - last_progress_ < std::chrono::seconds(5)) return;
    fmt::print(stderr, "[bench] {}/{} sizes, {:.0f} s\n", done, total, elapsed);
  }
  last_progress_ = now;
  progress_shown_ = true;
  std::fflush(stderr);
}

bool Sweep::WriteJson(const std::vector<Row>& rows, int64_t wrong, double avg_busbw) const {
  using nlohmann::json;
  json j;
  j["tool"] = "mc2";
  j["collective"] = CollName(cfg_.coll);
  j["ranks"] = n_;
  j["buffers"] = cfg_.symmetric ? "symmetric" : "private";
  j["dtype"] = DTypeName(cfg_.dtype);
  j["op"] = IsReducing(cfg_.coll) ? ReduceOpName(cfg_.op) : "none";
  j["root"] = IsRooted(cfg_.coll) ? cfg_.root : -1;
  j["algo_requested"] = AlgorithmName(cfg_.algo);
  j["iters"] = cfg_.iters;
  j["warmup"] = cfg_.warmup;
  j["check"] = cfg_.check;
#ifdef NDEBUG
  j["debug_build"] = false;
#else
  j["debug_build"] = true;
#endif
  j["link"] = "none";
  auto mode = [](const ModeResult& m) -> json {
    if (!m.ran) return nullptr;
    return {{"time_us", m.avg_us},     {"time_avg_us", m.avg_us}, {"time_median_us", m.median_us},
            {"time_min_us", m.min_us}, {"algbw_gbs", m.algbw},   {"busbw_gbs", m.busbw},
            {"wrong", m.wrong < 0 ? json(nullptr) : json(m.wrong)}, {"algo", m.algo}};
  };
  json arr = json::array();
  for (const Row& r : rows)
    arr.push_back({{"size", r.shape.bytes},
                   {"count", r.shape.elements},
                   {"out_of_place", mode(r.oop)},
                   {"in_place", mode(r.ip)}});
  j["rows"] = std::move(arr);
  j["wrong_total"] = cfg_.check ? json(wrong) : json(nullptr);
  j["avg_busbw_gbs"] = avg_busbw;
  j["ok"] = wrong == 0;
  const std::string err = WriteOutputFile(cfg_.json_path, j.dump(1) + "\n");
  if (err.empty()) return true;
  fmt::print(stderr, "mc2 bench: cannot write --json {}: {}\n", cfg_.json_path, err);
  return false;
}

int Sweep::Run() {
  const auto shapes =
      SweepShapes(cfg_.coll, cfg_.min_bytes, cfg_.max_bytes, cfg_.factor, esize_, n_);
  size_t max_send = 0, max_recv = 0;
  for (const Shape& s : shapes) {
    max_send = std::max(max_send, s.send_bytes);
    max_recv = std::max(max_recv, s.recv_bytes);
  }
  buf_ = std::make_unique<Buffers>(g_, cfg_.symmetric, max_send, max_recv);
  if (rank_ == 0) PrintHeader(shapes.size());

  std::vector<Row> rows;
  int64_t wrong = 0;
  double bw_sum = 0;
  int bw_n = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Row r;
    r.shape = shapes[i];
    r.oop = Measure(r.shape, false);
    if (cfg_.coll != Coll::kSendRecv) r.ip = Measure(r.shape, true);
    for (const ModeResult* m : {&r.oop, &r.ip}) {
      if (!m->ran) continue;
      bw_sum += m->busbw, ++bw_n;
      if (m->wrong > 0) wrong += m->wrong;
    }
    if (rank_ == 0) {
      PrintRow(r);
      Progress(i + 1, shapes.size(), false);
    }
    rows.push_back(std::move(r));
  }
  if (rank_ == 0) Progress(shapes.size(), shapes.size(), true);
  // No peer may still read this rank's buffers when they are freed.
  Barrier(g_).Wait();
  buf_.reset();

  const double avg_bw = bw_n ? bw_sum / bw_n : 0;
  if (rank_ == 0) {
    if (cfg_.check)
      fmt::print("# Out of bounds values : {} {}\n", wrong, wrong == 0 ? "OK" : "FAILED");
    else
      fmt::print("# Out of bounds values : N/A (not checked, --no-check)\n");
    fmt::print("# Avg bus bandwidth    : {:.4f} \n", avg_bw);
    fmt::print("#\n");
    fmt::print("# {}\n", wrong == 0 ? "OK" : fmt::format("FAILED: {} wrong values", wrong));
    std::fflush(stdout);
    if (!cfg_.json_path.empty() && !WriteJson(rows, wrong, avg_bw)) return kExitWrong;
  }
  return wrong == 0 ? 0 : kExitWrong;
}

}  // namespace

int RunBenchRank(const Config& cfg) {
  ReserveStdoutForJson(cfg.json_path);
  Group g;
  try {
    g = Group::FromEnv();
  } catch (const Error& e) {
    fmt::print(stderr, "mc2 bench: cannot join the job: {}\n", e.what());
    return kExitWrong;
  }
  const bool lead = g.rank() == 0;
  if (cfg.nranks != 0 && cfg.nranks != g.size()) {
    if (lead)
      fmt::print(stderr, "mc2 bench: -n {} does not match the job's {} ranks\n", cfg.nranks,
                 g.size());
    return kExitUsage;
  }
  if (IsRooted(cfg.coll) && cfg.root >= g.size()) {
    if (lead)
      fmt::print(stderr, "mc2 bench: --root {} is out of range for {} ranks\n", cfg.root,
                 g.size());
    return kExitUsage;
  }
  try {
    Sweep sweep(cfg, g);
    return sweep.Run();
  } catch (const Error& e) {
    std::fflush(stdout);
    if (e.code() == ErrorCode::kInvalidArgument) {
      // Raised identically on every rank (e.g. --algo that does not
      // implement the collective): say it once.
      if (lead) fmt::print(stderr, "\nmc2 bench: {}\n", e.message());
      return kExitUsage;
    }
    fmt::print(stderr, "\nmc2 bench: rank {}: {}\n", g.rank(), e.what());
    return kExitWrong;
  } catch (const std::exception& e) {
    fmt::print(stderr, "\nmc2 bench: rank {}: {}\n", g.rank(), e.what());
    return kExitWrong;
  }
}

}  // namespace mc2::tools::bench
