// python/src/trace.cc: mc2's timeline tracing (mc2/trace.h) for Python,
// behind python/mc2/trace.py: recording on and off, the files, step marks
// and user spans.
//
// Python signatures (module mc2._C):
//   trace_enable(dir)          mc2::trace::Enable (kInvalidArgument if dir
//                              cannot be created or written)
//   trace_disable(), trace_enabled() -> bool, trace_flush()
//   trace_mark_step(step), trace_end_step()
//   trace_now_ns() -> int      the clock spans are recorded on
//   trace_record(name, category, start_ns, flops=0, bytes=0)
//                              records a span [start_ns, now] on the calling
//                              thread and the process's rank; category is
//                              "compute", "comm", "wait" or "host"
//   trace_set_thread_name(name)
// The span of trace_record is recorded only while tracing is on, like a
// trace::Scope (its name is interned: a lock per new name).
#include <fmt/format.h>

#include "common.h"

namespace mc2py {
namespace {

mc2::trace::Category ParseCategory(const std::string& name) {
  for (auto c : {mc2::trace::Category::kCompute, mc2::trace::Category::kComm,
                 mc2::trace::Category::kWait, mc2::trace::Category::kHost}) {
    if (name == mc2::trace::CategoryName(c)) return c;
  }
  InvalidArgument("trace", fmt::format("unknown span category '{}' (compute, comm, wait, host)",
                                       name));
}

}  // namespace

void BindTrace(py::module_& m) {
  m.def(
      "trace_enable",
      [](const std::string& dir) {
        py::gil_scoped_release nogil;
        mc2::trace::Enable(dir);
      },
      py::arg("dir"));
  m.def("trace_disable", &mc2::trace::Disable);
  m.def("trace_enabled", &mc2::trace::Enabled);
  m.def("trace_flush", [] {
    py::gil_scoped_release nogil;
    mc2::trace::Flush();
  });
  m.def("trace_mark_step", &mc2::trace::MarkStep, py::arg("step"));
  m.def("trace_end_step", &mc2::trace::EndStep);
  m.def("trace_now_ns", &mc2::trace::internal::NowNs);
  m.def(
      "trace_record",
      [](const std::string& name, const std::string& category, int64_t start_ns, uint64_t flops,
         uint64_t bytes) {
        mc2::trace::Category cat = ParseCategory(category);
        if (!mc2::trace::Enabled()) return;
        mc2::trace::internal::RecordScope(mc2::trace::internal::Intern(name), cat, start_ns,
                                          flops, bytes);
      },
      py::arg("name"), py::arg("category"), py::arg("start_ns"), py::arg("flops") = 0,
      py::arg("bytes") = 0);
  m.def(
      "trace_set_thread_name", [](const std::string& name) { mc2::trace::SetThreadName(name); },
      py::arg("name"));
}

}  // namespace mc2py
