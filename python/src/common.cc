// python/src/common.cc: mc2.Error, dtype and name mappings, tensor checks.
#include "common.h"

#include <fmt/format.h>

namespace mc2py {

const mc2::Group& PyGroup::Checked(const char* op) const {
  if (!group.valid()) InvalidArgument(op, "the group is empty (this rank is not a member)");
  return group;
}

void InvalidArgument(const std::string& op, const std::string& message) {
  throw mc2::Error(mc2::ErrorCode::kInvalidArgument, message, -1, op);
}

mc2::DType ToDType(at::ScalarType t, const std::string& what) {
  switch (t) {
    case at::kFloat: return mc2::DType::kF32;
    case at::kDouble: return mc2::DType::kF64;
    case at::kHalf: return mc2::DType::kF16;
    case at::kBFloat16: return mc2::DType::kBF16;
    case at::kChar: return mc2::DType::kI8;
    case at::kByte: return mc2::DType::kU8;
    case at::kInt: return mc2::DType::kI32;
    case at::kLong: return mc2::DType::kI64;
    default: break;
  }
  throw mc2::Error(mc2::ErrorCode::kInvalidArgument,
                   fmt::format("{} has dtype {}, which mc2 does not support (float32, float64, "
                               "float16, bfloat16, int8, uint8, int32, int64)",
                               what, c10::toString(t)));
}

at::ScalarType ToScalarType(mc2::DType t) {
  switch (t) {
    case mc2::DType::kF32: return at::kFloat;
    case mc2::DType::kF64: return at::kDouble;
    case mc2::DType::kF16: return at::kHalf;
    case mc2::DType::kBF16: return at::kBFloat16;
    case mc2::DType::kI8: return at::kChar;
    case mc2::DType::kU8: return at::kByte;
    case mc2::DType::kI32: return at::kInt;
    case mc2::DType::kI64: return at::kLong;
  }
  return at::kFloat;
}

mc2::ReduceOp ParseReduceOpName(const std::string& name, const std::string& op) {
  if (auto r = mc2::ParseReduceOp(name)) return *r;
  InvalidArgument(op, fmt::format("unknown reduction '{}' (sum, prod, min, max, avg, band, bor, "
                                  "bxor)",
                                  name));
}

mc2::Algorithm ParseAlgorithmName(const std::string& name, const std::string& op) {
  if (auto a = mc2::ParseAlgorithm(name)) return *a;
  std::string choices;
  for (int i = 0; i < mc2::kNumAlgorithms; ++i)
    choices += fmt::format("{}{}", i ? ", " : "", mc2::AlgorithmName(mc2::Algorithm(i)));
  InvalidArgument(op, fmt::format("unknown algorithm '{}' ({})", name, choices));
}

void CheckCpu(const at::Tensor& t, const std::string& what) {
  if (!t.defined()) {
    throw mc2::Error(mc2::ErrorCode::kInvalidArgument, fmt::format("{} is undefined", what));
  }
  if (!t.device().is_cpu()) {
    throw mc2::Error(mc2::ErrorCode::kInvalidArgument,
                     fmt::format("{} is on {}; mc2 works on CPU tensors", what, t.device().str()));
  }
  if (t.is_sparse() || t.layout() != at::kStrided) {
    throw mc2::Error(mc2::ErrorCode::kInvalidArgument,
                     fmt::format("{} is not a dense (strided) tensor", what));
  }
}

at::Tensor ContiguousInput(const at::Tensor& t, const std::string& what) {
  CheckCpu(t, what);
  return t.is_contiguous() ? t : t.contiguous();
}

namespace {

PyObject* g_error_type = nullptr;  // mc2.Error; one reference held for the process

void RaiseError(const mc2::Error& e) {
  py::object type = py::reinterpret_borrow<py::object>(g_error_type);
  py::object inst = type(e.what());
  inst.attr("code") = mc2::ErrorCodeName(e.code());
  inst.attr("rank") = e.rank();
  inst.attr("op") = e.op();
  inst.attr("seq") = e.seq();
  inst.attr("message") = e.message();
  PyErr_SetObject(g_error_type, inst.ptr());
}

}  // namespace

void BindErrors(py::module_& m) {
  static py::exception<mc2::Error> error(m, "Error", PyExc_RuntimeError);
  g_error_type = error.ptr();
  error.attr("__doc__") =
      "An mc2 failure. Attributes: code (the stable name, e.g. 'peer_died', "
      "'invalid_argument'), rank (the rank that raised it, -1 if none), op (the "
      "operation), seq (its sequence number in its group, 0 if none), message.";
  // Global (not module-local): an mc2::Error thrown inside torch's own
  // bindings (the ProcessGroup calls and Work.wait) becomes mc2.Error too.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const mc2::Error& e) {
      RaiseError(e);
    }
  });
}

}  // namespace mc2py
