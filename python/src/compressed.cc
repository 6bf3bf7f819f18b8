// python/src/compressed.cc: the compressed all-reduce of mc2's Python API
// (mc2.all_reduce(..., compression=...), mc2.Compressor and
// mc2.ddp.compressed_hook): ProcessGroupMC2::AllReduceCompressed over
// mc2::CompressedAllReduce (mc2/grad.h), and its binding.
#include <torch/csrc/utils/pybind.h>

#include <fmt/format.h>

#include <memory>

#include "process_group.h"

namespace mc2py {

c10::intrusive_ptr<AsyncWork> ProcessGroupMC2::AllReduceCompressed(
    const at::Tensor& t, mc2::ReduceOp rop, const mc2::CompressionOptions& c,
    const at::Tensor& residual, std::vector<size_t> segments, mc2::GradSyncStats* stats) {
  return Run(c10d::OpType::ALLREDUCE, "all_reduce", {t}, [&](AsyncWork& w) {
    const std::string what = "all_reduce: tensor";
    CheckCpu(t, what);
    if (t.scalar_type() != at::kFloat) {
      InvalidArgument("all_reduce", fmt::format("compression '{}' takes float32 tensors, not {}",
                                                mc2::CompressionName(c.scheme),
                                                c10::toString(t.scalar_type())));
    }
    if (rop != mc2::ReduceOp::kSum && rop != mc2::ReduceOp::kAvg) {
      InvalidArgument("all_reduce", "a compressed all_reduce sums or averages (op 'sum' or 'avg')");
    }
    float* res = nullptr;
    if (residual.defined()) {
      CheckCpu(residual, "all_reduce: residual");
      if (residual.scalar_type() != at::kFloat || !residual.is_contiguous() ||
          residual.numel() != t.numel()) {
        InvalidArgument("all_reduce",
                        fmt::format("the residual must be a contiguous float32 tensor of the "
                                    "tensor's {} elements, not {} {}",
                                    t.numel(), c10::toString(residual.scalar_type()),
                                    residual.numel()));
      }
      if (residual.data_ptr() == t.data_ptr()) {
        InvalidArgument("all_reduce", "the residual must not be the tensor itself");
      }
      res = residual.data_ptr<float>();
    }
    // The tensor itself, or a contiguous copy decoded into and copied back.
    at::Tensor work_t = t.is_contiguous() ? t : t.contiguous();
    const size_t n = static_cast<size_t>(t.numel());
    auto op = std::make_shared<mc2::CompressedAllReduce>(
        group_.group, work_t.data_ptr<float>(), n, c, rop == mc2::ReduceOp::kAvg,
        std::span<float>(res, res ? n : 0), std::move(segments));
    w.Watch(t, what);
    if (!work_t.is_same(t)) w.Keep(work_t);
    op->Start();
    *stats = op->stats();
    w.Add(op->pending());
    w.OnSuccess([op]() { op->Finish(); });
    if (!work_t.is_same(t)) w.OnSuccess([t, work_t]() mutable { t.copy_(work_t); });
  });
}

void BindCompression(py::module_& m) {
  m.def(
      "_all_reduce_compressed",
      [](ProcessGroupMC2& pg, const at::Tensor& t, const std::string& op,
         const std::string& scheme, double threshold, double topk_ratio,
         std::optional<at::Tensor> residual, std::vector<size_t> segments) {
        mc2::ReduceOp rop = ParseReduceOpName(op, "all_reduce");
        std::optional<mc2::Compression> c = mc2::ParseCompression(scheme);
        if (!c) {
          InvalidArgument("all_reduce", fmt::format("unknown compression '{}' (none, f16, bf16, "
                                                    "threshold, topk)",
                                                    scheme));
        }
        mc2::CompressionOptions co;
        co.scheme = *c;
        co.threshold = static_cast<float>(threshold);
        co.topk_ratio = topk_ratio;
        mc2::GradSyncStats stats;
        c10::intrusive_ptr<AsyncWork> w;
        {
          py::gil_scoped_release nogil;
          w = pg.AllReduceCompressed(t, rop, co, residual.value_or(at::Tensor()),
                                     std::move(segments), &stats);
        }
        py::dict s;
        s["dense_bytes"] = stats.dense_bytes;
        s["wire_bytes"] = stats.wire_bytes;
        s["sent_elements"] = stats.sent_elements;
        return py::make_tuple(w, s);
      },
      py::arg("pg"), py::arg("tensor"), py::arg("op"), py::arg("scheme"), py::arg("threshold"),
      py::arg("topk_ratio"), py::arg("residual"), py::arg("segments"));
}

}  // namespace mc2py
