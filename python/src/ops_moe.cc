// python/src/ops_moe.cc: the MoE routing and fused operators on torch
// tensors (mc2/moe.h).
//
// Python signatures (module mc2._C; same conventions as ops_dense.cc: CPU
// float32 or bfloat16 operands, copied when not contiguous, float32
// results, collective calls that fail alike on every rank):
//
//   moe_route(group, expert_ids[T, topk] (int32 or int64), num_experts)
//       -> MoeRouting   (collective: exchanges the per-expert counts)
//   all_to_all_matmul(group, routing, a[T, k], b[E/P, k, n], *, pipeline="auto",
//                     splits=4, dispatch_output=False, overlap=None)
//       -> (c[R, n], dispatched_a[R, k] (a's dtype) or None)
//       dispatch + expert GEMM; rows of c in expert-grouped order
//   matmul_all_to_all(group, routing, a[R, k], b[E/P, k, n], *, probs=None,
//                     pipeline="auto", splits=4, overlap=None) -> c[T, n]
//       expert GEMM + combine; probs: float32 [T, topk] gate weights
//   moe_mlp(group, routing, a[T, d], w1[E/P, d, h1], w2[E/P, h2, d], *,
//           activation=None, probs=None, save=False, pipeline="auto",
//           splits=4, overlap=None)
//       -> c[T, d], or with save=True (c, dispatched_x[R, d], y1[R, h1] f32,
//          hidden[R, h2])
//       activation: None (identity, h2 = h1) or a callable taking a float32
//       tensor [rows, h1] and returning one of [rows, h2]; it runs with the
//       GIL on the calling thread, on chunks of rows, so row i of its result
//       must depend on row i of its input only.
//
// MoeRouting (read-only): rank, ranks, num_experts, experts_per_rank, topk,
// num_tokens, counts (a list, P x E row-major), send_slots, num_received
// (R), num_sent, expert_rows(local_expert).
#include <fmt/format.h>

#include "ops_common.h"

namespace mc2py {
namespace {

mc2::MoeRouting MoeRoute(const PyGroup& pg, const at::Tensor& ids_in, int num_experts) {
  const char* op = "moe_route";
  std::string err;
  CheckOperand(ids_in, 2, "expert_ids", &err);
  if (err.empty() && ids_in.scalar_type() != at::kInt && ids_in.scalar_type() != at::kLong) {
    err = fmt::format("expert_ids has dtype {}; it must be int32 or int64",
                      c10::toString(ids_in.scalar_type()));
  }
  at::Tensor ids;
  if (err.empty()) {
    ids = ids_in.to(at::kInt).contiguous();
    if (ids_in.scalar_type() == at::kLong && !ids.eq(ids_in).all().item<bool>()) {
      err = "expert_ids holds values outside the int32 range";
    }
  }
  return RunAgreed(pg, op, err, 0, [&](const std::vector<int64_t>&) {
    return mc2::MoeRoute(pg.group, ids.data_ptr<int32_t>(), static_cast<size_t>(ids.size(0)),
                         static_cast<int>(ids.size(1)), num_experts);
  });
}

// Checks of the expert weights b[E/P, k, n] against the routing.
void CheckExperts(const at::Tensor& b, const mc2::MoeRouting& r, const std::string& what,
                  std::string* err) {
  CheckOperand(b, 3, what, err);
  if (err->empty() && b.size(0) != r.experts_per_rank) {
    *err = fmt::format("{} holds {} experts; the routing puts {} on each rank", what, b.size(0),
                       r.experts_per_rank);
  }
}

// dtype checks of a and the weights; all the same float32 or bfloat16.
mc2::DType SameDType(std::initializer_list<std::pair<const at::Tensor*, const char*>> ts,
                     std::string* err) {
  mc2::DType d = mc2::DType::kF32;
  bool first = true;
  for (auto [t, name] : ts) {
    if (!err->empty()) return d;
    mc2::DType x = OperandDType(*t, name, err);
    if (first) d = x;
    if (!first && x != d && err->empty()) {
      *err = fmt::format("{} must have the dtype of {} ({})", name, ts.begin()->second,
                         c10::toString(ts.begin()->first->scalar_type()));
    }
    first = false;
  }
  return d;
}

// The checks of a[rows, k] times the expert weights b[E/P, k, n], where the
// routing gives `rows` (`what` names them in the message).
mc2::DType ExpertMatmulChecks(const at::Tensor& a, const at::Tensor& b, const mc2::MoeRouting& r,
                              size_t rows, const char* what, std::string* err) {
  CheckOperand(a, 2, "a", err);
  CheckExperts(b, r, "b", err);
  mc2::DType dtype = SameDType({{&a, "a"}, {&b, "b"}}, err);
  if (err->empty() && a.size(0) != static_cast<int64_t>(rows)) {
    *err = fmt::format("a has {} rows; the routing has {} {}", a.size(0), rows, what);
  }
  if (err->empty() && a.size(1) != b.size(1)) {
    *err = fmt::format("a's width ({}) must equal b's rows ({})", a.size(1), b.size(1));
  }
  return dtype;
}

py::tuple AllToAllMatmul(const PyGroup& pg, const mc2::MoeRouting& r, const at::Tensor& a_in,
                         const at::Tensor& b_in, const std::string& pipeline, int splits,
                         bool dispatch_output, const py::object& overlap) {
  std::string err;
  mc2::DType dtype =
      ExpertMatmulChecks(a_in, b_in, r, r.num_tokens, "tokens on this rank", &err);
  mc2::FusedOptions o = MakeFusedOptions(pipeline, splits, overlap, &err);
  at::Tensor a, b, c, dispatched;
  if (err.empty()) {
    a = a_in.contiguous();
    b = b_in.contiguous();
    int64_t R = static_cast<int64_t>(r.num_received());
    c = F32({R, b.size(2)});
    if (dispatch_output) dispatched = Empty({R, a.size(1)}, a.scalar_type());
  }
  RunAgreed(pg, "all_to_all_matmul", err, 0, [&](const std::vector<int64_t>&) {
    return mc2::AllToAllMatmul(
        pg.group, r,
        {.a = a.data_ptr(),
         .b = b.data_ptr(),
         .c = c.data_ptr<float>(),
         .k = static_cast<size_t>(a.size(1)),
         .n = static_cast<size_t>(b.size(2)),
         .dtype = dtype,
         .dispatched_a = dispatch_output ? dispatched.data_ptr() : nullptr},
        o);
  });
  return py::make_tuple(c, dispatch_output ? py::cast(dispatched) : py::none());
}

// probs checked to be float32 [T, topk]; returns it contiguous (or undefined).
at::Tensor CheckProbs(const std::optional<at::Tensor>& probs, const mc2::MoeRouting& r,
                      std::string* err) {
  if (!probs || !probs->defined()) return {};
  CheckOperand(*probs, 2, "probs", err);
  if (!err->empty()) return {};
  if (probs->scalar_type() != at::kFloat) {
    *err = fmt::format("probs has dtype {}; it must be float32", c10::toString(probs->scalar_type()));
  } else if (probs->size(0) != static_cast<int64_t>(r.num_tokens) || probs->size(1) != r.topk) {
    *err = fmt::format("probs must be [{}, {}] (tokens x topk), not {}", r.num_tokens, r.topk,
                       c10::str(probs->sizes()));
  }
  return err->empty() ? probs->contiguous() : at::Tensor();
}

at::Tensor MatmulAllToAll(const PyGroup& pg, const mc2::MoeRouting& r, const at::Tensor& a_in,
                          const at::Tensor& b_in, const std::optional<at::Tensor>& probs_in,
                          const std::string& pipeline, int splits, const py::object& overlap) {
  std::string err;
  mc2::DType dtype = ExpertMatmulChecks(a_in, b_in, r, r.num_received(),
                                        "rows for this rank's experts", &err);
  at::Tensor probs = CheckProbs(probs_in, r, &err);
  mc2::FusedOptions o = MakeFusedOptions(pipeline, splits, overlap, &err);
  at::Tensor a, b, c;
  if (err.empty()) {
    a = a_in.contiguous();
    b = b_in.contiguous();
    c = F32({static_cast<int64_t>(r.num_tokens), b.size(2)});
  }
  RunAgreed(pg, "matmul_all_to_all", err, 0, [&](const std::vector<int64_t>&) {
    return mc2::MatmulAllToAll(
        pg.group, r,
        {.a = a.data_ptr(),
         .b = b.data_ptr(),
         .c = c.data_ptr<float>(),
         .k = static_cast<size_t>(a.size(1)),
         .n = static_cast<size_t>(b.size(2)),
         .dtype = dtype,
         .probs = probs.defined() ? probs.data_ptr<float>() : nullptr},
        o);
  });
  return c;
}

py::object MoeMlp(const PyGroup& pg, const mc2::MoeRouting& r, const at::Tensor& a_in,
                  const at::Tensor& w1_in, const at::Tensor& w2_in, const py::object& activation,
                  const std::optional<at::Tensor>& probs_in, bool save, const std::string& pipeline,
                  int splits, const py::object& overlap) {
  std::string err;
  CheckOperand(a_in, 2, "a", &err);
  CheckExperts(w1_in, r, "w1", &err);
  CheckExperts(w2_in, r, "w2", &err);
  mc2::DType dtype = SameDType({{&a_in, "a"}, {&w1_in, "w1"}, {&w2_in, "w2"}}, &err);
  int64_t d = 0, h1 = 0, h2 = 0;
  if (err.empty()) {
    d = a_in.size(1), h1 = w1_in.size(2), h2 = w2_in.size(1);
    if (a_in.size(0) != static_cast<int64_t>(r.num_tokens)) {
      err = fmt::format("a has {} rows; the routing has {} tokens on this rank", a_in.size(0),
                        r.num_tokens);
    } else if (w1_in.size(1) != d || w2_in.size(2) != d) {
      err = fmt::format("w1 must be [E/P, {d}, h1] and w2 [E/P, h2, {d}] for a of width {d}; "
                        "got w1 {} and w2 {}",
                        c10::str(w1_in.sizes()), c10::str(w2_in.sizes()), fmt::arg("d", d));
    } else if (activation.is_none() && h1 != h2) {
      err = fmt::format("without an activation w2's rows ({}) must equal w1's width ({})", h2, h1);
    } else if (!activation.is_none() && !PyCallable_Check(activation.ptr())) {
      err = "activation must be None or a callable";
    }
  }
  at::Tensor probs = CheckProbs(probs_in, r, &err);
  mc2::FusedOptions o = MakeFusedOptions(pipeline, splits, overlap, &err);
  at::Tensor a, w1, w2, c, dispatched, y1, hidden;
  if (err.empty()) {
    a = a_in.contiguous();
    w1 = w1_in.contiguous();
    w2 = w2_in.contiguous();
    c = F32({static_cast<int64_t>(r.num_tokens), d});
    if (save) {
      int64_t R = static_cast<int64_t>(r.num_received());
      dispatched = Empty({R, d}, a.scalar_type());
      y1 = F32({R, h1});
      hidden = Empty({R, h2}, a.scalar_type());
    }
  }
  mc2::MoeActivation act;
  if (!activation.is_none()) {
    PyObject* fn = activation.ptr();  // borrowed: outlives the call
    act = [fn, h1, h2](const float* in, size_t rows, float* out) {
      py::gil_scoped_acquire gil;
      int64_t n = static_cast<int64_t>(rows);
      at::Tensor x = at::from_blob(const_cast<float*>(in), {n, h1}, at::kFloat);
      py::object res = py::handle(fn)(x);
      at::Tensor y = py::cast<at::Tensor>(res);
      if (y.scalar_type() != at::kFloat || y.dim() != 2 || y.size(0) != n || y.size(1) != h2) {
        throw mc2::Error(mc2::ErrorCode::kInvalidArgument,
                         fmt::format("the activation must return a float32 [{}, {}] tensor, not "
                                     "{} {}",
                                     n, h2, c10::toString(y.scalar_type()), c10::str(y.sizes())),
                         -1, "moe_mlp");
      }
      at::from_blob(out, {n, h2}, at::kFloat).copy_(y);
    };
  }
  RunAgreed(pg, "moe_mlp", err, 0, [&](const std::vector<int64_t>&) {
    return mc2::MoeMlp(pg.group, r,
                       {.a = a.data_ptr(),
                        .w1 = w1.data_ptr(),
                        .w2 = w2.data_ptr(),
                        .c = c.data_ptr<float>(),
                        .d = static_cast<size_t>(d),
                        .h1 = static_cast<size_t>(h1),
                        .h2 = static_cast<size_t>(h2),
                        .dtype = dtype,
                        .act = act,
                        .probs = probs.defined() ? probs.data_ptr<float>() : nullptr,
                        .saved = {.dispatched_x = save ? dispatched.data_ptr() : nullptr,
                                  .y1 = save ? y1.data_ptr<float>() : nullptr,
                                  .hidden = save ? hidden.data_ptr() : nullptr}},
                       o);
  });
  if (!save) return py::cast(c);
  return py::make_tuple(c, dispatched, y1, hidden);
}

}  // namespace

void BindMoeOps(py::module_& m) {
  py::class_<mc2::MoeRouting>(m, "MoeRouting",
                              "Who sends which token to which expert, for one batch (moe_route).")
      .def_readonly("rank", &mc2::MoeRouting::rank)
      .def_readonly("ranks", &mc2::MoeRouting::ranks)
      .def_readonly("num_experts", &mc2::MoeRouting::num_experts)
      .def_readonly("experts_per_rank", &mc2::MoeRouting::experts_per_rank)
      .def_readonly("topk", &mc2::MoeRouting::topk)
      .def_readonly("num_tokens", &mc2::MoeRouting::num_tokens)
      .def_readonly("counts", &mc2::MoeRouting::counts)
      .def_readonly("send_slots", &mc2::MoeRouting::send_slots)
      .def_property_readonly("num_received", &mc2::MoeRouting::num_received)
      .def_property_readonly("num_sent", &mc2::MoeRouting::num_sent)
      .def("expert_rows", &mc2::MoeRouting::expert_rows, py::arg("local_expert"));
  m.def("moe_route", &MoeRoute, py::arg("group"), py::arg("expert_ids"), py::arg("num_experts"),
        "Collective: the routing of this rank's tokens (expert_ids [T, topk], -1 drops a slot).");
  m.def("all_to_all_matmul", &AllToAllMatmul, py::arg("group"), py::arg("routing"), py::arg("a"),
        py::arg("b"), py::kw_only(), py::arg("pipeline") = "auto", py::arg("splits") = 4,
        py::arg("dispatch_output") = false, py::arg("overlap") = py::none(),
        "Dispatch + expert GEMM: (c[R, n] expert-grouped, dispatched_a[R, k] or None).");
  m.def("matmul_all_to_all", &MatmulAllToAll, py::arg("group"), py::arg("routing"), py::arg("a"),
        py::arg("b"), py::kw_only(), py::arg("probs") = py::none(), py::arg("pipeline") = "auto",
        py::arg("splits") = 4, py::arg("overlap") = py::none(),
        "Expert GEMM + combine: c[T, n], each token's probs-weighted sum of its slots' rows.");
  m.def("moe_mlp", &MoeMlp, py::arg("group"), py::arg("routing"), py::arg("a"), py::arg("w1"),
        py::arg("w2"), py::kw_only(), py::arg("activation") = py::none(),
        py::arg("probs") = py::none(), py::arg("save") = false, py::arg("pipeline") = "auto",
        py::arg("splits") = 4, py::arg("overlap") = py::none(),
        "Dispatch, each expert's w1 / activation / w2, combine, in one call.");
}

}  // namespace mc2py
