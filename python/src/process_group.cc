// python/src/process_group.cc: ProcessGroupMC2's calls (process_group.h).
#include "process_group.h"

#include <fmt/format.h>

#include <numeric>

#include "symmetric_storage.h"

namespace mc2py {
namespace {

using c10d::OpType;

mc2::CollectiveOptions Co(std::chrono::milliseconds timeout) {
  mc2::CollectiveOptions co;
  if (timeout.count() > 0) co.timeout = timeout;
  return co;
}

const at::Tensor& One(const std::vector<at::Tensor>& ts, const std::string& op) {
  if (ts.size() != 1) {
    InvalidArgument(op, fmt::format("takes one tensor per call, not {} (mc2 is CPU-only)", ts.size()));
  }
  return ts[0];
}

mc2::ReduceOp MapOp(const c10d::ReduceOp& op, const std::string& name) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return mc2::ReduceOp::kSum;
    case c10d::ReduceOp::AVG: return mc2::ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT: return mc2::ReduceOp::kProd;
    case c10d::ReduceOp::MIN: return mc2::ReduceOp::kMin;
    case c10d::ReduceOp::MAX: return mc2::ReduceOp::kMax;
    case c10d::ReduceOp::BAND: return mc2::ReduceOp::kBand;
    case c10d::ReduceOp::BOR: return mc2::ReduceOp::kBor;
    case c10d::ReduceOp::BXOR: return mc2::ReduceOp::kBxor;
    default: break;
  }
  InvalidArgument(name, "PREMUL_SUM is not supported (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR)");
}

// An input the operations read: the tensor itself, or a contiguous copy.
const void* In(AsyncWork& w, const at::Tensor& t, const std::string& what) {
  CheckCpu(t, what);
  w.Watch(t, what);
  if (t.is_contiguous()) return t.data_ptr();
  at::Tensor c = t.contiguous();
  w.Keep(c);
  return c.data_ptr();
}

// A tensor the operations write (and, with `read`, read first): the tensor
// itself, or a contiguous copy whose result is copied back on success.
void* Out(AsyncWork& w, const at::Tensor& t, const std::string& what, bool read) {
  CheckCpu(t, what);
  w.Watch(t, what);
  if (t.is_contiguous()) return t.data_ptr();
  at::Tensor c = read ? t.contiguous() : at::empty(t.sizes(), t.options());
  w.Keep(c);
  w.OnSuccess([t, c]() mutable { t.copy_(c); });
  return c.data_ptr();
}

// The checks of a list of per-rank tensors against the rank's own tensor.
void CheckList(const std::vector<at::Tensor>& list, const at::Tensor& like, size_t n,
               const std::string& what, const std::string& op) {
  if (list.size() != n) {
    InvalidArgument(op, fmt::format("{} holds {} tensors; the group has {} ranks", what,
                                    list.size(), n));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    CheckCpu(list[i], fmt::format("{}[{}]", what, i));
    if (list[i].numel() != like.numel() || list[i].scalar_type() != like.scalar_type()) {
      InvalidArgument(op, fmt::format("{}[{}] ({} {}) must match the input ({} {})", what, i,
                                      c10::toString(list[i].scalar_type()), list[i].numel(),
                                      c10::toString(like.scalar_type()), like.numel()));
    }
  }
}

// A contiguous buffer of n tensors like `like`, one after the other.
at::Tensor Packed(const at::Tensor& like, size_t n) {
  return at::empty({static_cast<int64_t>(n) * like.numel()}, like.options().memory_format(at::MemoryFormat::Contiguous));
}

// Copies the i-th block of `packed` into each of `list` on success.
void Unpack(AsyncWork& w, const at::Tensor& packed, const std::vector<at::Tensor>& list) {
  int64_t off = 0;
  for (const at::Tensor& t : list) {
    at::Tensor block = packed.narrow(0, off, t.numel());
    off += t.numel();
    w.OnSuccess([t, block]() mutable { t.copy_(block.view(t.sizes())); });
  }
}

}  // namespace

ProcessGroupMC2::ProcessGroupMC2(PyGroup group)
    : c10d::ProcessGroup(group.Checked("ProcessGroupMC2").rank(), group.group.size()),
      group_(std::move(group)) {}

ProcessGroupMC2::~ProcessGroupMC2() = default;

c10::intrusive_ptr<AsyncWork> ProcessGroupMC2::Run(c10d::OpType type, const char* op,
                                                   std::vector<at::Tensor> result,
                                                   const std::function<void(AsyncWork&)>& issue) {
  auto w = c10::make_intrusive<AsyncWork>(rank_, type, op, std::move(result));
  {
    std::lock_guard<std::mutex> lock(*group_.mu);
    try {
      issue(*w);
    } catch (const mc2::Error& e) {
      bool p2p = type == OpType::SEND || type == OpType::RECV;
      if (e.code() != mc2::ErrorCode::kInvalidArgument || w->Issued() || p2p) throw;
      // Peers waiting in this call now meet a barrier and fail with
      // kMismatch instead of waiting for their timeout (process_group.h).
      try {
        mc2::Barrier(group_.group);
      } catch (const mc2::Error&) {
      }
      if (e.op().empty()) throw mc2::Error(e.code(), e.message(), rank_, op);
      throw;
    }
  }
  AsyncWork::Start(w, completer_);
  return w;
}

c10::intrusive_ptr<AsyncWork> ProcessGroupMC2::AllReduce(const at::Tensor& t, mc2::ReduceOp rop,
                                                         const mc2::CollectiveOptions& co) {
  return Run(OpType::ALLREDUCE, "all_reduce", {t}, [&](AsyncWork& w) {
    mc2::DType dt = ToDType(t.scalar_type(), "all_reduce: tensor");
    void* p = Out(w, t, "all_reduce: tensor", /*read=*/true);
    w.Add(mc2::AllReduce(group_.group, p, p, t.numel(), dt, rop, co));
  });
}

c10::intrusive_ptr<AsyncWork> ProcessGroupMC2::Broadcast(const at::Tensor& t, int root,
                                                         const mc2::CollectiveOptions& co) {
  return Run(OpType::BROADCAST, "broadcast", {t}, [&](AsyncWork& w) {
    void* p = Out(w, t, "broadcast: tensor", /*read=*/true);
    w.Add(mc2::Broadcast(group_.group, p, p, Bytes(t), mc2::DType::kU8, root, co));
  });
}

c10::intrusive_ptr<AsyncWork> ProcessGroupMC2::AllReduceBucket(const at::Tensor& bucket,
                                                               mc2::ReduceOp rop) {
  return Run(OpType::ALLREDUCE, "all_reduce", {bucket}, [&](AsyncWork& w) {
    const char* what = "all_reduce: bucket";
    mc2::DType dt = ToDType(bucket.scalar_type(), what);
    CheckCpu(bucket, what);
    if (!bucket.is_contiguous() || bucket.storage_offset() != 0 ||
        Bytes(bucket) != bucket.storage().nbytes()) {
      InvalidArgument("all_reduce", "a gradient bucket must be a contiguous tensor that spans "
                                    "its whole storage (DDP's GradBucket.buffer())");
    }
    MoveStorageToSymmetric(group_.group, bucket);
    void* p = Out(w, bucket, what, /*read=*/true);
    mc2::CollectiveOptions co;
    co.may_run_inline = false;  // backward goes on while the bucket is reduced
    w.Add(mc2::AllReduce(group_.group, p, p, bucket.numel(), dt, rop, co));
  });
}

ProcessGroupMC2::WorkPtr ProcessGroupMC2::broadcast(std::vector<at::Tensor>& tensors,
                                                    const c10d::BroadcastOptions& opts) {
  return Broadcast(One(tensors, "broadcast"), static_cast<int>(opts.rootRank), Co(opts.timeout));
}

ProcessGroupMC2::WorkPtr ProcessGroupMC2::allreduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::AllreduceOptions& opts) {
  return AllReduce(One(tensors, "all_reduce"), MapOp(opts.reduceOp, "all_reduce"),
                   Co(opts.timeout));
}

ProcessGroupMC2::WorkPtr ProcessGroupMC2::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  mc2::ReduceOp rop = MapOp(opts.reduceOp, "all_reduce_coalesced");
  return Run(OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", tensors, [&](AsyncWork& w) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::string what = fmt::format("all_reduce_coalesced: tensors[{}]", i);
      ToDType(tensors[i].scalar_type(), what);
      CheckCpu(tensors[i], what);
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      const at::Tensor& t = tensors[i];
      void* p = Out(w, t, fmt::format("all_reduce_coalesced: tensors[{}]", i), true);
      w.Add(mc2::AllReduce(group_.group, p, p, t.numel(), ToDType(t.scalar_type(), ""), rop,
                           Co(opts.timeout)));
    }
  });
}

ProcessGroupMC2::WorkPtr ProcessGroupMC2::reduce(std::vector<at::Tensor>& tensors,
                                                 const c10d::ReduceOptions& opts) {
  const at::Tensor& t = One(tensors, "reduce");
  mc2::ReduceOp rop = MapOp(opts.reduceOp, "reduce");
  return Run(OpType::REDUCE, "reduce", {t}, [&](AsyncWork& w) {
    mc2::DType dt = ToDType(t.scalar_type(), "reduce: tensor");
    void* p = Out(w, t, "reduce: tensor", true);
    w.Add(mc2::Reduce(group_.group, p, p, t.numel(), dt, rop, static_cast<int>(opts.rootRank),
                      Co(opts.timeout)));
  });
}

ProcessGroupMC2::WorkPtr ProcessGroupMC2::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::AllgatherOptions& opts) {
  const at::Tensor& in = One(inputs, "all_gather");
  if (outputs.size() != 1) InvalidArgument("all_gather", "takes one output list per call");
  std::vector<at::Tensor>& outs = outputs[0];
  return Run(OpType::ALLGATHER, "all_gather", outs, [&](AsyncWork& w) {
    CheckList(outs, in, size_, "output", "all_gather");
    const void* src = In(w, in, "all_gather: input");
    at::Tensor packed = Packed(in, size_);
    w.Keep(packed);
    for (size_t i = 0; i < outs.size(); ++i) w.Watch(outs[i], fmt::format("all_gather: output[{}]", i));
    Unpack(w, packed, outs);
    w.Add(mc2::AllGather(group_.group, src, packed.data_ptr(), Bytes(in), mc2::DType::kU8,
                         Co(opts.timeout)));
  });
}

ProcessGroupMC2::WorkPtr ProcessGroupMC2::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_coalesced";
  if (outputs.size() != static_cast<size_t>(size_))
    InvalidArgument(op, fmt::format("{} output lists for a group of {} ranks (one per rank)",
                                    outputs.size(), size_));
  // Per input i, the list of every rank's block: outputs[r][i].
  std::vector<std::vector<at::Tensor>> per_input(inputs.size());
  std::vector<at::Tensor> all;
  for (size_t r = 0; r < outputs.size(); ++r) {
    if (outputs[r].size() != inputs.size())
      InvalidArgument(op, fmt::format("output list {} holds {} tensors for {} inputs", r,
                                      outputs[r].size(), inputs.size()));
    for (size_t i = 0; i < inputs.size(); ++i) {
      per_input[i].push_back(outputs[r][i]);
      all.push_back(outputs[r][i]);
    }
  }
  return Run(OpType::ALLGATHER_COALESCED, op, all, [&](AsyncWork& w) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      CheckCpu(inputs[i], fmt::format("{}: inputs[{}]", op, i));
      CheckList(per_input[i], inputs[i], size_, fmt::format("outputs[*][{}]", i), op);
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      const void* src = In(w, inputs[i], fmt::format("{}: inputs[{}]", op, i));
      at::Tensor packed = Packed(inputs[i], size_);
      w.Keep(packed);
      for (int r = 0; r < size_; ++r)
        w.Watch(per_input[i][r], fmt::format("{}: outputs[{}][{}]", op, r, i));
      Unpack(w, packed, per_input[i]);
      w.Add(mc2::AllGather(group_.group, src, packed.data_ptr(), Bytes(inputs[i]),
                           mc2::DType::kU8, Co(opts.timeout)));
    }
  });
}

ProcessGroupMC2::WorkPtr ProcessGroupMC2::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                          const c10d::AllgatherOptions& opts) {
  return Run(OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {output}, [&](AsyncWork& w) {
    CheckCpu(output, "output");
    if (output.numel() != input.numel() * size_ || output.scalar_type() != input.scalar_type()) {
      InvalidArgument("all_gather_into_tensor",
                      fmt::format("the output ({} {}) must hold {} x the input ({} {})",
                                  c10::toString(output.scalar_type()), output.numel(), size_,
                                  c10::toString(input.scalar_type()), input.numel()));
    }
    const void* src = In(w, input, "all_gather_into_tensor: input");
    void* dst = Out(w, output, "all_gather_into_tensor: output", false);
    w.Add(mc2::AllGather(group_.group, src, dst, Bytes(input), mc2::DType::kU8, Co(opts.timeout)));
  });
}

ProcessGroupMC2::WorkPtr ProcessGroupMC2::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                 std::vector<at::Tensor>& inputs,
                                                 const c10d::GatherOptions& opts) {
  const at::Tensor& in = One(inputs, "gather");
  int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> outs = rank_ == root && !outputs.empty() ? outputs[0] : std::vector<at::Tensor>{};
  return Run(OpType::GATHER, "gather", outs, [&](AsyncWork& w) {
    if (root < 0 || root >= size_) {
      InvalidArgument("gather", fmt::format("root {} is not a rank of the group of {}", root, size_));
    }
    void* dst = nullptr;
    if (rank_ == root) {
      if (outputs.size() != 1) InvalidArgument("gather", "the root takes one output list");
      CheckList(outs, in, size_, "output", "gather");
      at::Tensor packed = Packed(in, size_);
      w.Keep(packed);
      Unpack(w, packed, outs);
      dst = packed.data_ptr();
    } else if (!outputs.empty() && !outputs[0].empty()) {
      InvalidArgument("gather", "only the root passes output tensors");
    }
    const void* src = In(w, in, "gather: input");
    w.Add(mc2::Gather(group_.group, src, dst, Bytes(in), mc2::DType::kU8, root, Co(opts.timeout)));
  });
}

ProcessGroupMC2::WorkPtr ProcessGroupMC2::scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const c10d::ScatterOptions& opts) {
  const at::Tensor& out = One(outputs, "scatter");
  int root = static_cast<int>(opts.rootRank);
  return Run(OpType::SCATTER, "scatter", {out}, [&](AsyncWork& w) {
    if (root < 0 || root >= size_) {
      InvalidArgument("scatter", fmt::format("root {} is not a rank of the group of {}", root, size_));
    }
    const void* src = nullptr;
    if (rank_ == root) {
      if (inputs.size() != 1) InvalidArgument("scatter", "the root takes one input list");
      CheckList(inputs[0], out, size_, "input", "scatter");
      std::vector<at::Tensor> flat;
      for (const at::Tensor& t : inputs[0]) flat.push_back(t.reshape({-1}));
      at::Tensor packed = at::cat(flat);
      w.Keep(packed);
      for (size_t i = 0; i < inputs[0].size(); ++i) w.Watch(inputs[0][i], fmt::format("scatter: input[{}]", i));
      src = packed.data_ptr();
    } else if (!inputs.empty() && !inputs[0].empty()) {
      InvalidArgument("scatter", "only the root passes input tensors");
    }
    void* dst = Out(w, out, "scatter: output", false);
    w.Add(mc2::Scatter(group_.group, src, dst, Bytes(out), mc2::DType::kU8, root, Co(opts.timeout)));
  });
}

ProcessGroupMC2::WorkPtr ProcessGroupMC2::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const at::Tensor& out = One(outputs, "reduce_scatter");
  if (inputs.size() != 1) InvalidArgument("reduce_scatter", "takes one input list per call");
  mc2::ReduceOp rop = MapOp(opts.reduceOp, "reduce_scatter");
  return Run(OpType::REDUCE_SCATTER, "reduce_scatter", {out}, [&](AsyncWork& w) {
    mc2::DType dt = ToDType(out.scalar_type(), "reduce_scatter: output");
    CheckList(inputs[0], out, size_, "input", "reduce_scatter");
    std::vector<at::Tensor> flat;
    for (const at::Tensor& t : inputs[0]) flat.push_back(t.reshape({-1}));
    at::Tensor packed = at::cat(flat);
    w.Keep(packed);
    for (size_t i = 0; i < inputs[0].size(); ++i) w.Watch(inputs[0][i], fmt::format("reduce_scatter: input[{}]", i));
    void* dst = Out(w, out, "reduce_scatter: output", false);
    w.Add(mc2::ReduceScatter(group_.group, packed.data_ptr(), dst, out.numel(), dt, rop,
                             Co(opts.timeout)));
  });
}

ProcessGroupMC2::WorkPtr ProcessGroupMC2::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  mc2::ReduceOp rop = MapOp(opts.reduceOp, "reduce_scatter_tensor");
  return Run(OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {output}, [&](AsyncWork& w) {
    mc2::DType dt = ToDType(output.scalar_type(), "reduce_scatter_tensor: output");
    CheckCpu(output, "output");
    if (input.numel() != output.numel() * size_ || output.scalar_type() != input.scalar_type()) {
      InvalidArgument("reduce_scatter_tensor",
                      fmt::format("the input ({} {}) must hold {} x the output ({} {})",
                                  c10::toString(input.scalar_type()), input.numel(), size_,
                                  c10::toString(output.scalar_type()), output.numel()));
    }
    const void* src = In(w, input, "reduce_scatter_tensor: input");
    void* dst = Out(w, output, "reduce_scatter_tensor: output", false);
    w.Add(mc2::ReduceScatter(group_.group, src, dst, output.numel(), dt, rop, Co(opts.timeout)));
  });
}

namespace {

// Element counts and displacements (in bytes) of an all-to-all over dim 0.
void Splits(const at::Tensor& t, const std::vector<int64_t>& split_rows, int n,
            const std::string& what, std::vector<size_t>* counts, std::vector<size_t>* displs) {
  int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  size_t row_bytes = rows == 0 ? 0 : Bytes(t) / rows;
  std::vector<int64_t> s = split_rows;
  if (s.empty()) {
    if (rows % n != 0) {
      InvalidArgument("all_to_all", fmt::format("{}'s {} rows cannot be split evenly over {} ranks; "
                                                "pass split sizes",
                                                what, rows, n));
    }
    s.assign(n, rows / n);
  }
  if (static_cast<int>(s.size()) != n) {
    InvalidArgument("all_to_all", fmt::format("{} split sizes has {} entries for {} ranks", what,
                                              s.size(), n));
  }
  int64_t sum = 0;
  for (int64_t x : s) {
    if (x < 0) InvalidArgument("all_to_all", fmt::format("{} split sizes are negative", what));
    sum += x;
  }
  if (sum != rows) {
    InvalidArgument("all_to_all", fmt::format("{} split sizes add up to {}, not to its {} rows",
                                              what, sum, rows));
  }
  size_t off = 0;
  for (int64_t x : s) {
    counts->push_back(x * row_bytes);
    displs->push_back(off);
    off += x * row_bytes;
  }
}

}  // namespace

ProcessGroupMC2::WorkPtr ProcessGroupMC2::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                        std::vector<int64_t>& output_split_sizes,
                                                        std::vector<int64_t>& input_split_sizes,
                                                        const c10d::AllToAllOptions& opts) {
  return Run(OpType::ALLTOALL_BASE, "all_to_all_single", {output}, [&](AsyncWork& w) {
    CheckCpu(output, "output");
    if (output.scalar_type() != input.scalar_type()) {
      InvalidArgument("all_to_all_single", "the input and output dtypes differ");
    }
    std::vector<size_t> sc, sd, rc, rd;
    Splits(input, input_split_sizes, size_, "the input", &sc, &sd);
    Splits(output, output_split_sizes, size_, "the output", &rc, &rd);
    const void* src = In(w, input, "all_to_all_single: input");
    void* dst = Out(w, output, "all_to_all_single: output", false);
    w.Add(mc2::AllToAllV(group_.group, src, sc, sd, dst, rc, rd, mc2::DType::kU8, Co(opts.timeout)));
  });
}

ProcessGroupMC2::WorkPtr ProcessGroupMC2::alltoall(std::vector<at::Tensor>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const c10d::AllToAllOptions& opts) {
  return Run(OpType::ALLTOALL, "all_to_all", outputs, [&](AsyncWork& w) {
    if (static_cast<int>(inputs.size()) != size_ || static_cast<int>(outputs.size()) != size_) {
      InvalidArgument("all_to_all", fmt::format("takes {} input and output tensors (one per rank), "
                                                "not {} and {}",
                                                size_, inputs.size(), outputs.size()));
    }
    std::vector<at::Tensor> flat;
    std::vector<size_t> sc, sd, rc, rd;
    size_t off = 0;
    for (int i = 0; i < size_; ++i) {
      CheckCpu(inputs[i], fmt::format("input[{}]", i));
      if (inputs[i].scalar_type() != inputs[0].scalar_type() ||
          outputs[i].scalar_type() != inputs[0].scalar_type()) {
        InvalidArgument("all_to_all", "every input and output must have one dtype");
      }
      flat.push_back(inputs[i].reshape({-1}));
      sc.push_back(Bytes(inputs[i]));
      sd.push_back(off);
      off += Bytes(inputs[i]);
      w.Watch(inputs[i], fmt::format("all_to_all: input[{}]", i));
    }
    off = 0;
    int64_t total = 0;
    for (int i = 0; i < size_; ++i) {
      CheckCpu(outputs[i], fmt::format("output[{}]", i));
      rc.push_back(Bytes(outputs[i]));
      rd.push_back(off);
      off += Bytes(outputs[i]);
      total += outputs[i].numel();
      w.Watch(outputs[i], fmt::format("all_to_all: output[{}]", i));
    }
    at::Tensor send = at::cat(flat);
    at::Tensor recv = at::empty({total}, inputs[0].options());
    w.Keep(send);
    w.Keep(recv);
    Unpack(w, recv, outputs);
    w.Add(mc2::AllToAllV(group_.group, send.data_ptr(), sc, sd, recv.data_ptr(), rc, rd,
                         mc2::DType::kU8, Co(opts.timeout)));
  });
}

ProcessGroupMC2::WorkPtr ProcessGroupMC2::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const at::Tensor& t = One(tensors, "send");
  return Run(OpType::SEND, "send", {t}, [&](AsyncWork& w) {
    const void* p = In(w, t, "send: tensor");
    w.Add(group_.group.Send(p, Bytes(t), dst, tag));
  });
}

ProcessGroupMC2::WorkPtr ProcessGroupMC2::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const at::Tensor& t = One(tensors, "recv");
  return Run(OpType::RECV, "recv", {t}, [&](AsyncWork& w) {
    void* p = Out(w, t, "recv: tensor", false);
    w.Add(group_.group.Recv(p, Bytes(t), src, tag));
  });
}

ProcessGroupMC2::WorkPtr ProcessGroupMC2::barrier(const c10d::BarrierOptions& opts) {
  return Run(OpType::BARRIER, "barrier", {}, [&](AsyncWork& w) {
    w.Add(mc2::Barrier(group_.group, Co(opts.timeout)));
  });
}

}  // namespace mc2py
