// python/src/ops_dense.cc: the dense and batched fused operators on torch
// tensors (mc2/fused_ops.h, mc2/batch_matmul.h).
//
// Python signatures (module mc2._C; `group` is an mc2.Group; a and b are CPU
// tensors of float32 or bfloat16, both the same; non-contiguous operands are
// copied; results are new float32 tensors):
//
//   all_gather_matmul(group, a[m_r, k], b[k, n], *, pipeline="auto", splits=4,
//                     gather_output=False, overlap=None)
//       -> (c[M, n], gathered_a[M, k] (a's dtype) or None)
//       M = the sum of every rank's m_r, rank 0's rows first.
//   matmul_reduce_scatter(group, a[m, k], b[k, n], m_local, *, pipeline="auto",
//                         splits=4, overlap=None) -> c[m_local, n]
//       this rank's rows of the sum over ranks of a @ b; the m_local of the
//       ranks add up to m.
//   matmul_all_reduce(group, a[m, k], b[k, n], *, pipeline="auto", splits=4,
//                     overlap=None) -> c[m, n]
//   all_gather_batch_matmul(group, a[batch, m_r, k], b[batch, k, n] or b[k, n],
//                           *, pipeline="auto", splits=4, gather_output=False,
//                           overlap=None)
//       -> (c[batch, M, n], gathered_a[batch, M, k] or None)
//       a 2-dimensional b is shared by every batch entry (BatchB::kShared).
//
// pipeline: "serial", "chunked", "fused" or "auto"; splits: 1..16. overlap:
// None or a callable run once during the call, at the first moment the
// pipeline would wait for a transfer (FusedOptions::overlap_work); it runs
// with the GIL and must not communicate on `group`.
//
// Each call holds the group's lock and releases the GIL. It is collective:
// every rank of the group calls it, in the same order. A bad argument on any
// rank (a wrong dtype, rank or width) raises mc2.Error('invalid_argument')
// on every rank; shapes that disagree across ranks raise
// mc2.Error('mismatch') on every rank (the operator's own agreement check).
#include <fmt/format.h>

#include "ops_common.h"

namespace mc2py {
namespace {

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// The operand checks of a [.., k] x [k, n] product; "" if fine.
std::string MatmulChecks(const at::Tensor& a, const at::Tensor& b, int64_t a_dims, int64_t b_dims,
                         mc2::DType* dtype) {
  std::string err;
  CheckOperand(a, a_dims, "a", &err);
  CheckOperand(b, b_dims, "b", &err);
  if (!err.empty()) return err;
  *dtype = OperandDType(a, "a", &err);
  mc2::DType bt = OperandDType(b, "b", &err);
  if (err.empty() && bt != *dtype) {
    err = fmt::format("a ({}) and b ({}) must have the same dtype", c10::toString(a.scalar_type()),
                      c10::toString(b.scalar_type()));
  }
  int64_t ka = a.size(a_dims - 1), kb = b.size(b_dims - 2);
  if (err.empty() && ka != kb) {
    err = fmt::format("a's last dimension ({}) must equal b's rows ({}): a {} x b {}", ka, kb,
                      c10::str(a.sizes()), c10::str(b.sizes()));
  }
  return err;
}

// What every dense binding does before communicating: the operand and
// option checks (the first failure in `err`), and contiguous operands.
struct Operands {
  std::string err;
  mc2::DType dtype = mc2::DType::kF32;
  mc2::FusedOptions options;
  at::Tensor a, b;
};

Operands Prepare(const at::Tensor& a, const at::Tensor& b, int64_t a_dims, int64_t b_dims,
                 const std::string& pipeline, int splits, const py::object& overlap) {
  Operands o;
  o.err = MatmulChecks(a, b, a_dims, b_dims, &o.dtype);
  o.options = MakeFusedOptions(pipeline, splits, overlap, &o.err);
  if (o.err.empty()) {
    o.a = a.contiguous();
    o.b = b.contiguous();
  }
  return o;
}

py::tuple AllGatherMatmul(const PyGroup& pg, const at::Tensor& a_in, const at::Tensor& b_in,
                          const std::string& pipeline, int splits, bool gather_output,
                          const py::object& overlap) {
  Operands x = Prepare(a_in, b_in, 2, 2, pipeline, splits, overlap);
  const at::Tensor &a = x.a, &b = x.b;
  at::Tensor c, gathered;
  RunAgreed(pg, "all_gather_matmul", x.err, x.err.empty() ? a.size(0) : 0,
            [&](const std::vector<int64_t>& rows) {
              int64_t M = Sum(rows), k = a.size(1), n = b.size(1);
              c = F32({M, n});
              if (gather_output) gathered = Empty({M, k}, a.scalar_type());
              return mc2::AllGatherMatmul(
                  pg.group,
                  {.a = a.data_ptr(),
                   .b = b.data_ptr(),
                   .c = c.data_ptr<float>(),
                   .m = static_cast<size_t>(a.size(0)),
                   .k = static_cast<size_t>(k),
                   .n = static_cast<size_t>(n),
                   .dtype = x.dtype,
                   .gathered_a = gather_output ? gathered.data_ptr() : nullptr},
                  x.options);
            });
  return py::make_tuple(c, gather_output ? py::cast(gathered) : py::none());
}

at::Tensor MatmulReduceScatter(const PyGroup& pg, const at::Tensor& a_in, const at::Tensor& b_in,
                               int64_t m_local, const std::string& pipeline, int splits,
                               const py::object& overlap) {
  Operands x = Prepare(a_in, b_in, 2, 2, pipeline, splits, overlap);
  if (x.err.empty() && (m_local < 0 || m_local > a_in.size(0))) {
    x.err = fmt::format("m_local ({}) must be in 0..{} (a's rows)", m_local, a_in.size(0));
  }
  at::Tensor c;
  if (x.err.empty()) c = F32({m_local, x.b.size(1)});
  RunAgreed(pg, "matmul_reduce_scatter", x.err, 0, [&](const std::vector<int64_t>&) {
    return mc2::MatmulReduceScatter(pg.group,
                                    {.a = x.a.data_ptr(),
                                     .b = x.b.data_ptr(),
                                     .c = c.data_ptr<float>(),
                                     .m = static_cast<size_t>(x.a.size(0)),
                                     .k = static_cast<size_t>(x.a.size(1)),
                                     .n = static_cast<size_t>(x.b.size(1)),
                                     .dtype = x.dtype,
                                     .m_local = static_cast<size_t>(m_local)},
                                    x.options);
  });
  return c;
}

at::Tensor MatmulAllReduce(const PyGroup& pg, const at::Tensor& a_in, const at::Tensor& b_in,
                           const std::string& pipeline, int splits, const py::object& overlap) {
  Operands x = Prepare(a_in, b_in, 2, 2, pipeline, splits, overlap);
  at::Tensor c;
  if (x.err.empty()) c = F32({x.a.size(0), x.b.size(1)});
  RunAgreed(pg, "matmul_all_reduce", x.err, 0, [&](const std::vector<int64_t>&) {
    return mc2::MatmulAllReduce(pg.group,
                                {.a = x.a.data_ptr(),
                                 .b = x.b.data_ptr(),
                                 .c = c.data_ptr<float>(),
                                 .m = static_cast<size_t>(x.a.size(0)),
                                 .k = static_cast<size_t>(x.a.size(1)),
                                 .n = static_cast<size_t>(x.b.size(1)),
                                 .dtype = x.dtype},
                                x.options);
  });
  return c;
}

py::tuple AllGatherBatchMatmul(const PyGroup& pg, const at::Tensor& a_in, const at::Tensor& b_in,
                               const std::string& pipeline, int splits, bool gather_output,
                               const py::object& overlap) {
  bool shared = b_in.defined() && b_in.dim() == 2;
  Operands x = Prepare(a_in, b_in, 3, shared ? 2 : 3, pipeline, splits, overlap);
  if (x.err.empty() && !shared && b_in.size(0) != a_in.size(0)) {
    x.err = fmt::format("b's batch ({}) must equal a's ({}), or b must be 2-dimensional (shared)",
                        b_in.size(0), a_in.size(0));
  }
  const at::Tensor &a = x.a, &b = x.b;
  at::Tensor c, gathered;
  RunAgreed(pg, "all_gather_batch_matmul", x.err, x.err.empty() ? a.size(1) : 0,
            [&](const std::vector<int64_t>& rows) {
              int64_t batch = a.size(0), M = Sum(rows), k = a.size(2), n = b.size(b.dim() - 1);
              c = F32({batch, M, n});
              if (gather_output) gathered = Empty({batch, M, k}, a.scalar_type());
              return mc2::AllGatherBatchMatmul(
                  pg.group,
                  {.a = a.data_ptr(),
                   .b = b.data_ptr(),
                   .c = c.data_ptr<float>(),
                   .m = static_cast<size_t>(a.size(1)),
                   .k = static_cast<size_t>(k),
                   .n = static_cast<size_t>(n),
                   .dtype = x.dtype,
                   .batch = static_cast<size_t>(batch),
                   .b_layout = shared ? mc2::BatchB::kShared : mc2::BatchB::kPerBatch,
                   .gathered_a = gather_output ? gathered.data_ptr() : nullptr},
                  x.options);
            });
  return py::make_tuple(c, gather_output ? py::cast(gathered) : py::none());
}

}  // namespace

void BindDenseOps(py::module_& m) {
  m.def("all_gather_matmul", &AllGatherMatmul, py::arg("group"), py::arg("a"), py::arg("b"),
        py::kw_only(), py::arg("pipeline") = "auto", py::arg("splits") = 4,
        py::arg("gather_output") = false, py::arg("overlap") = py::none(),
        "c[M, n] = (the rows a[m_r, k] of every rank, rank 0's first) @ b[k, n]; returns "
        "(c, gathered_a or None).");
  m.def("matmul_reduce_scatter", &MatmulReduceScatter, py::arg("group"), py::arg("a"),
        py::arg("b"), py::arg("m_local"), py::kw_only(), py::arg("pipeline") = "auto",
        py::arg("splits") = 4, py::arg("overlap") = py::none(),
        "This rank's m_local rows of the sum over ranks of a[m, k] @ b[k, n].");
  m.def("matmul_all_reduce", &MatmulAllReduce, py::arg("group"), py::arg("a"), py::arg("b"),
        py::kw_only(), py::arg("pipeline") = "auto", py::arg("splits") = 4,
        py::arg("overlap") = py::none(), "The sum over ranks of a[m, k] @ b[k, n], on every rank.");
  m.def("all_gather_batch_matmul", &AllGatherBatchMatmul, py::arg("group"), py::arg("a"),
        py::arg("b"), py::kw_only(), py::arg("pipeline") = "auto", py::arg("splits") = 4,
        py::arg("gather_output") = false, py::arg("overlap") = py::none(),
        "c[e] = (the rows a[e][m_r, k] of every rank) @ b[e] (or the shared b[k, n]); returns "
        "(c[batch, M, n], gathered_a[batch, M, k] or None).");
}

}  // namespace mc2py
