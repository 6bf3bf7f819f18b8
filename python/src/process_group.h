// python/src/process_group.h: mc2 as a torch.distributed backend: a
// c10d::ProcessGroup over an mc2 Group (torch 1.13's API).
//
// Every call is asynchronous and returns an AsyncWork (async_work.h) whose
// future holds the output tensors. Tensors are CPU tensors; one tensor per
// call (the lists of torch's API are for one tensor per device). Inputs that
// are not contiguous are copied, and so are outputs, whose results are
// copied back before the call completes. Reductions take float32, float64,
// float16, bfloat16, int8, uint8, int32 and int64; the calls that only move
// data take any dtype (bytes). Every ReduceOp but PREMUL_SUM.
//
// Errors: a call's bad arguments raise mc2.Error('invalid_argument') from the
// call itself. So that a bad argument on one rank does not leave the others
// waiting, that rank first issues a barrier in place of the call: the others
// then fail with 'mismatch' (and the world is broken, as after any
// mismatch: docs/errors.md). Failures while a call runs (a dead rank, a
// timeout, a mismatch) are raised by wait() and set on the future.
//
// Thread safety: calls may come from any thread (torch's callbacks issue
// calls too); they are serialised on the group's lock while they are issued.
#ifndef MC2_PYTHON_PROCESS_GROUP_H_
#define MC2_PYTHON_PROCESS_GROUP_H_

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <functional>

#include "async_work.h"
#include "common.h"

namespace mc2py {

class ProcessGroupMC2 : public c10d::ProcessGroup {
 public:
  explicit ProcessGroupMC2(PyGroup group);
  ~ProcessGroupMC2() override;

  const std::string getBackendName() const override { return "mc2"; }
  const PyGroup& group() const { return group_; }

  using WorkPtr = c10::intrusive_ptr<c10d::Work>;
  WorkPtr broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  WorkPtr allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  WorkPtr allreduce_coalesced(std::vector<at::Tensor>& tensors,
                              const c10d::AllreduceCoalescedOptions& opts) override;
  WorkPtr reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  WorkPtr allgather(std::vector<std::vector<at::Tensor>>& outputs,
                    std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override;
  WorkPtr _allgather_base(at::Tensor& output, at::Tensor& input,
                          const c10d::AllgatherOptions& opts) override;
  // outputs[r][i] receives rank r's inputs[i]: one all_gather per input,
  // one Work for all of them.
  WorkPtr allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                              std::vector<at::Tensor>& inputs,
                              const c10d::AllgatherOptions& opts) override;
  WorkPtr gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                 const c10d::GatherOptions& opts) override;
  WorkPtr scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                  const c10d::ScatterOptions& opts) override;
  WorkPtr reduce_scatter(std::vector<at::Tensor>& outputs,
                         std::vector<std::vector<at::Tensor>>& inputs,
                         const c10d::ReduceScatterOptions& opts) override;
  WorkPtr _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                               const c10d::ReduceScatterOptions& opts) override;
  WorkPtr alltoall_base(at::Tensor& output, at::Tensor& input,
                        std::vector<int64_t>& output_split_sizes,
                        std::vector<int64_t>& input_split_sizes,
                        const c10d::AllToAllOptions& opts) override;
  WorkPtr alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                   const c10d::AllToAllOptions& opts) override;
  WorkPtr send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  WorkPtr recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  WorkPtr barrier(const c10d::BarrierOptions& opts) override;

  // The all-reduce of mc2.all_reduce, with mc2's own options (algorithm).
  c10::intrusive_ptr<AsyncWork> AllReduce(const at::Tensor& t, mc2::ReduceOp op,
                                          const mc2::CollectiveOptions& co);
  c10::intrusive_ptr<AsyncWork> Broadcast(const at::Tensor& t, int root,
                                          const mc2::CollectiveOptions& co);
  // The all-reduce of a gradient bucket of DistributedDataParallel
  // (mc2.ddp.allreduce_hook): a contiguous tensor that spans its storage,
  // which is first moved into the symmetric heap (symmetric_storage.h) if
  // it is not there yet, so that this and every later all-reduce of the
  // bucket read and write it in place. Where a heap has no room the bucket
  // stays private (on every rank alike) and is all-reduced as it is.
  c10::intrusive_ptr<AsyncWork> AllReduceBucket(const at::Tensor& bucket, mc2::ReduceOp op);
  // The compressed all-reduce of an f32 tensor (mc2.all_reduce with
  // compression=..., mc2.ddp.compressed_hook; compressed.cc): sum or avg,
  // `residual` an f32 tensor of t's size (or undefined: no error feedback)
  // that the call updates before it returns, `segments` the parts top-k
  // selects from separately. The work completes when the exchange's last
  // collective has and the result is decoded into t; `stats` receives
  // what the exchange moves.
  c10::intrusive_ptr<AsyncWork> AllReduceCompressed(const at::Tensor& t, mc2::ReduceOp op,
                                                    const mc2::CompressionOptions& c,
                                                    const at::Tensor& residual,
                                                    std::vector<size_t> segments,
                                                    mc2::GradSyncStats* stats);

 private:
  // Creates the work, runs `issue(work)` under the group's lock (on a bad
  // argument: the barrier described above, then the error), and starts it.
  c10::intrusive_ptr<AsyncWork> Run(c10d::OpType type, const char* op,
                                    std::vector<at::Tensor> result,
                                    const std::function<void(AsyncWork&)>& issue);

  PyGroup group_;
  Completer completer_;
};

}  // namespace mc2py

#endif  // MC2_PYTHON_PROCESS_GROUP_H_
