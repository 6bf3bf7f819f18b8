// python/src/common.h: what every part of the mc2._C extension shares: the
// Python face of mc2::Error, the Group handle, tensor checks and dtypes.
#ifndef MC2_PYTHON_COMMON_H_
#define MC2_PYTHON_COMMON_H_

#include <torch/extension.h>

#include <memory>
#include <mutex>
#include <string>

#include "mc2/mc2.h"

namespace mc2py {

namespace py = pybind11;

// A Group as Python sees it: the mc2::Group and the lock that serialises
// calls on it. mc2 requires that calls on one group come from one thread at
// a time; Python code (and the torch backend's callbacks) may call from
// several, so every call on the group holds `mu` while it is issued (an
// asynchronous collective: while it is submitted; a fused operator: for the
// whole call). Copies share the group and the lock.
struct PyGroup {
  mc2::Group group;
  std::shared_ptr<std::mutex> mu = std::make_shared<std::mutex>();

  PyGroup() = default;
  explicit PyGroup(mc2::Group g) : group(std::move(g)) {}
  // Throws kInvalidArgument naming `op` when the handle is empty.
  const mc2::Group& Checked(const char* op) const;
};

// Throws mc2::Error(kInvalidArgument) from the extension's own checks, with
// `op` the operation the user called.
[[noreturn]] void InvalidArgument(const std::string& op, const std::string& message);

// The element type of a torch dtype; throws kInvalidArgument naming `what`
// (e.g. "all_reduce: tensor") for a dtype mc2 has no counterpart for.
mc2::DType ToDType(at::ScalarType t, const std::string& what);
at::ScalarType ToScalarType(mc2::DType t);
// "sum", "avg", ... -> ReduceOp; kInvalidArgument naming the choices.
mc2::ReduceOp ParseReduceOpName(const std::string& name, const std::string& op);
// "auto", "ring", ... -> Algorithm; kInvalidArgument naming the choices.
mc2::Algorithm ParseAlgorithmName(const std::string& name, const std::string& op);

// `t` checked to be a defined CPU tensor (kInvalidArgument naming `what`
// otherwise) and made contiguous: the tensor itself when it is, else a
// contiguous copy (the documented rule for inputs).
at::Tensor ContiguousInput(const at::Tensor& t, const std::string& what);
// Checks `t` is a defined CPU tensor (kInvalidArgument naming `what`).
void CheckCpu(const at::Tensor& t, const std::string& what);
// Bytes of `t`'s elements.
inline size_t Bytes(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * t.element_size();
}

// Registers mc2.Error (a RuntimeError subclass with the attributes code,
// rank, op, seq and message) and the translator that raises it for every
// mc2::Error reaching Python, including through torch's own bindings.
void BindErrors(py::module_& m);

}  // namespace mc2py

#endif  // MC2_PYTHON_COMMON_H_
