// python/src/ops_common.cc: options, the overlap callable and the agreement
// exchange of the fused-operator bindings.
#include "ops_common.h"

#include <fmt/format.h>

namespace mc2py {

mc2::FusedOptions MakeFusedOptions(const std::string& pipeline, int splits,
                                   const py::object& overlap, std::string* error) {
  mc2::FusedOptions o;
  o.splits = splits;
  if (auto p = mc2::ParsePipeline(pipeline)) {
    o.pipeline = *p;
  } else if (error->empty()) {
    std::string choices;
    for (int i = 0; i < mc2::kNumPipelines; ++i)
      choices += fmt::format("{}{}", i ? ", " : "", mc2::PipelineName(mc2::Pipeline(i)));
    *error = fmt::format("unknown pipeline '{}' ({})", pipeline, choices);
  }
  if (!overlap.is_none()) {
    if (!PyCallable_Check(overlap.ptr())) {
      if (error->empty()) *error = "overlap must be None or a callable";
      return o;
    }
    PyObject* fn = overlap.ptr();  // borrowed: the caller's reference outlives the call
    o.overlap_work = [fn] {
      py::gil_scoped_acquire gil;
      py::handle callable(fn);
      callable();
    };
  }
  return o;
}

std::vector<int64_t> AgreeOrFail(const mc2::Group& g, const std::string& op,
                                 const std::string& local_error, int64_t value) {
  int n = g.size();
  if (n == 1) {
    if (!local_error.empty()) throw mc2::Error(mc2::ErrorCode::kInvalidArgument, local_error, 0, op);
    return {value};
  }
  int64_t mine[2] = {local_error.empty() ? 0 : 1, value};
  std::vector<int64_t> all(2 * n);
  mc2::AllGather(g, mine, all.data(), 2, mc2::DType::kI64).Wait();
  if (!local_error.empty()) throw mc2::Error(mc2::ErrorCode::kInvalidArgument, local_error, g.rank(), op);
  std::vector<int64_t> values(n);
  for (int r = 0; r < n; ++r) {
    if (all[2 * r]) {
      throw mc2::Error(mc2::ErrorCode::kInvalidArgument,
                       fmt::format("rank {} passed invalid arguments (see its error)", r), g.rank(),
                       op);
    }
    values[r] = all[2 * r + 1];
  }
  return values;
}

void BindFailTogether(py::module_& m) {
  m.def(
      "fail_together",
      [](const PyGroup& pg, const std::string& op, const std::string& message) {
        RunAgreed(pg, op.c_str(), message, 0, [](const std::vector<int64_t>&) { return 0; });
      },
      py::arg("group"), py::arg("op"), py::arg("message"),
      "Takes part in the argument agreement of the fused operator the group's other ranks are "
      "calling, and fails it on every rank with `message` (mc2.Error('invalid_argument')).");
}

mc2::DType OperandDType(const at::Tensor& t, const std::string& what, std::string* error) {
  if (t.scalar_type() == at::kFloat) return mc2::DType::kF32;
  if (t.scalar_type() == at::kBFloat16) return mc2::DType::kBF16;
  if (error->empty()) {
    *error = fmt::format("{} has dtype {}; the fused operators take float32 or bfloat16", what,
                         c10::toString(t.scalar_type()));
  }
  return mc2::DType::kF32;
}

void CheckOperand(const at::Tensor& t, int64_t dims, const std::string& what, std::string* error) {
  if (!error->empty()) return;
  if (!t.defined()) {
    *error = what + " is undefined";
  } else if (!t.device().is_cpu() || t.layout() != at::kStrided) {
    *error = fmt::format("{} must be a dense CPU tensor (it is on {})", what, t.device().str());
  } else if (t.dim() != dims) {
    *error = fmt::format("{} must have {} dimensions, not {} (shape {})", what, dims, t.dim(),
                         c10::str(t.sizes()));
  }
}

}  // namespace mc2py
