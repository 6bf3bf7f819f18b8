// python/src/ops_common.h: what the fused-operator bindings share: option
// parsing, the overlap callable, and the agreement on local errors.
#ifndef MC2_PYTHON_OPS_COMMON_H_
#define MC2_PYTHON_OPS_COMMON_H_

#include <string>
#include <vector>

#include "common.h"

namespace mc2py {

// FusedOptions from the Python keywords. `overlap` (None or a callable with
// no arguments) becomes FusedOptions::overlap_work, run with the GIL taken;
// it must outlive the call (it is borrowed, not copied, so that the options
// can be copied without the GIL). An unknown pipeline name or an overlap
// that is not callable sets `error` (for AgreeOrFail) instead of throwing.
mc2::FusedOptions MakeFusedOptions(const std::string& pipeline, int splits,
                                   const py::object& overlap, std::string* error);

// The checks the bindings make on tensors (ranks, dtypes, widths) are local
// to a rank, but the operator is collective: a rank that returned early
// would leave the others waiting. So every binding first all-gathers, with
// the GIL released and the group's lock held by the caller, one small
// message per rank: whether its checks failed and one value (e.g. its row
// count). If any rank's checks failed, every rank throws kInvalidArgument
// (the rank at fault with its reason, the others naming that rank);
// otherwise the values of every rank are returned. Nothing is exchanged in
// a group of one rank.
std::vector<int64_t> AgreeOrFail(const mc2::Group& g, const std::string& op,
                                 const std::string& local_error, int64_t value);

// The collective part of every binding: with the GIL released and the
// group's lock held, agrees on the local checks (AgreeOrFail with `error`
// and `value`), then returns body(every rank's value), the operator call.
// This agreement is every binding's first exchange, and the same exchange
// in each: a rank may make a peer's binding fail by taking part in it with
// an error of its own (mc2._C.fail_together, for arguments that Python
// checks, such as a bias).
template <typename Body>
auto RunAgreed(const PyGroup& pg, const char* op, const std::string& error, int64_t value,
               Body&& body) {
  const mc2::Group& g = pg.Checked(op);
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(*pg.mu);
  return body(AgreeOrFail(g, op, error, value));
}

// Binds mc2._C.fail_together(group, op, message): takes part in the
// agreement of a binding that the group's other ranks are calling and
// raises mc2.Error('invalid_argument', message) there; they raise it too,
// naming this rank. A message "" takes part without failing.
void BindFailTogether(py::module_& m);

// The mc2 dtype of a matrix operand (float32 or bfloat16), or "" and the
// reason in `error`.
mc2::DType OperandDType(const at::Tensor& t, const std::string& what, std::string* error);
// Appends to `error` (if empty) the reason `t` is not a CPU tensor of
// `dims` dimensions.
void CheckOperand(const at::Tensor& t, int64_t dims, const std::string& what, std::string* error);

// A row-major f32 result tensor.
inline at::Tensor F32(std::initializer_list<int64_t> sizes) {
  return at::empty(sizes, at::TensorOptions().dtype(at::kFloat));
}
inline at::Tensor Empty(std::initializer_list<int64_t> sizes, at::ScalarType t) {
  return at::empty(sizes, at::TensorOptions().dtype(t));
}

}  // namespace mc2py

#endif  // MC2_PYTHON_OPS_COMMON_H_
