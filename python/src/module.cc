// python/src/module.cc: the extension module mc2._C. The Python package
// (python/mc2/__init__.py) imports torch first, then this module, and
// re-exports what users call.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "async_work.h"
#include "common.h"
#include "world.h"

namespace mc2py {
void BindDenseOps(py::module_& m);
void BindFailTogether(py::module_& m);
void BindMoeOps(py::module_& m);
void BindBackend(py::module_& m);
void BindCompression(py::module_& m);
void BindTrace(py::module_& m);
}  // namespace mc2py

namespace {

// ProcessGroup and Store objects cross between torch's extension and this
// one, which works only if both use the same pybind11 internals (same
// pybind11 ABI version, compiler and standard library). Then torch's
// registration of c10d::ProcessGroup is visible here; if it is not, say so
// at import instead of failing later with an obscure type error.
void CheckTorchAbi() {
  pybind11::module_::import("torch.distributed");
  if (pybind11::detail::get_type_info(typeid(c10d::ProcessGroup)) == nullptr) {
    throw pybind11::import_error(
        "mc2._C: torch's ProcessGroup type is not visible to mc2's pybind11: mc2 was built "
        "against a pybind11 ABI (PYBIND11_INTERNALS_VERSION, compiler or C++ library) "
        "different from the one of the installed torch; rebuild mc2 against Debian's "
        "pybind11-dev and python3-torch");
  }
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "mc2: collectives and fused compute+communication operators (C++ core)";
  CheckTorchAbi();
  mc2py::BindErrors(m);
  mc2py::BindGroup(m);
  mc2py::BindDenseOps(m);
  mc2py::BindFailTogether(m);
  mc2py::BindMoeOps(m);
  mc2py::BindBackend(m);
  mc2py::BindCompression(m);
  mc2py::BindTrace(m);
  // Before the interpreter finalizes (see Completer).
  pybind11::module_::import("atexit").attr("register")(
      pybind11::cpp_function([] { mc2py::Completer::StopAllAtExit(); }));
}
