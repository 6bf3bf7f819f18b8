// python/src/world.cc: mc2.Group, mc2.world() and mc2.init().
#include "world.h"

#include <fmt/format.h>

#include <chrono>

namespace mc2py {
namespace {

std::mutex g_world_mu;
std::optional<PyGroup> g_world;

}  // namespace

PyGroup World(const mc2::WorldOptions& options) {
  std::lock_guard<std::mutex> lock(g_world_mu);
  if (g_world) return *g_world;
  if (!mc2::Group::LaunchedByMc2() && !mc2::Group::LaunchedByMpi()) {
    throw mc2::Error(mc2::ErrorCode::kInvalidArgument,
                     "no mc2 world: start the program with `mc2 run -n N /usr/bin/python3 "
                     "prog.py`, mpirun or torchrun, or call "
                     "torch.distributed.init_process_group(\"mc2\") first (RANK, WORLD_SIZE, "
                     "MASTER_ADDR and MASTER_PORT set)",
                     -1, "world");
  }
  // `mc2 run`'s segments, or (mpirun) a world over the job's hosts.
  g_world = PyGroup(mc2::Group::FromEnv(options));
  return *g_world;
}

std::optional<PyGroup> ExistingWorld() {
  std::lock_guard<std::mutex> lock(g_world_mu);
  return g_world;
}

void SetWorld(PyGroup world) {
  std::lock_guard<std::mutex> lock(g_world_mu);
  if (g_world) InvalidArgument("init", "this process already has an mc2 world");
  g_world = std::move(world);
}

void BindGroup(py::module_& m) {
  py::class_<PyGroup>(m, "Group",
                      "A communicator: an ordered set of ranks that run collectives and fused "
                      "operators together. Cheap handle: copies refer to the same group.")
      .def("rank", [](const PyGroup& g) { return g.Checked("rank").rank(); })
      .def("size", [](const PyGroup& g) { return g.Checked("size").size(); })
      .def("world_rank", [](const PyGroup& g) { return g.Checked("world_rank").world_rank(); })
      .def(
          "num_hosts", [](const PyGroup& g) { return g.Checked("num_hosts").num_hosts(); },
          "The number of hosts the group's ranks live on (1 within one host).")
      .def(
          "split",
          [](const PyGroup& g, int color, int key) -> std::optional<PyGroup> {
            const mc2::Group& grp = g.Checked("split");
            mc2::Group child;
            {
              py::gil_scoped_release nogil;
              std::lock_guard<std::mutex> lock(*g.mu);
              child = grp.Split(color, key);
            }
            if (!child.valid()) return std::nullopt;
            return PyGroup(std::move(child));
          },
          py::arg("color"), py::arg("key") = 0,
          "Collective over this group: one new group per color, ranks ordered by (key, old "
          "rank). A negative color joins no group and returns None.")
      .def(
          "is_symmetric",
          [](const PyGroup& g, const at::Tensor& t) {
            CheckCpu(t, "is_symmetric: tensor");
            return g.Checked("is_symmetric").IsSymmetric(t.data_ptr(), Bytes(t));
          },
          py::arg("tensor"),
          "Whether the tensor's memory lies in this rank's symmetric heap (collectives then "
          "read it in place, e.g. the gradient buckets of mc2.ddp.allreduce_hook).")
      .def("__repr__", [](const PyGroup& g) {
        if (!g.group.valid()) return std::string("<mc2.Group (empty)>");
        return fmt::format("<mc2.Group rank {} of {}>", g.group.rank(), g.group.size());
      });

  m.def(
      "init",
      [](std::optional<double> timeout) {
        mc2::WorldOptions o;
        if (timeout) {
          if (!(*timeout > 0)) InvalidArgument("init", "timeout must be > 0 seconds");
          o.timeout = std::chrono::nanoseconds(static_cast<int64_t>(*timeout * 1e9));
        }
        py::gil_scoped_release nogil;
        return World(o);
      },
      py::arg("timeout") = py::none(),
      "Joins the world of `mc2 run` or mpirun (idempotent) and returns it. timeout: seconds per "
      "operation (default MC2_TIMEOUT, else 300).");
  m.def(
      "world",
      []() {
        py::gil_scoped_release nogil;
        return World();
      },
      "The world group (made on first use, as by init()).");
  m.def("launched_by_mc2", &mc2::Group::LaunchedByMc2,
        "True when this process was started by `mc2 run`.");
  m.def("launched_by_mpi", &mc2::Group::LaunchedByMpi,
        "True when this process was started by mpirun (and not by `mc2 run`).");
}

}  // namespace mc2py
