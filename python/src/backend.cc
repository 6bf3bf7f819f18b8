// python/src/backend.cc: the Python face of the torch.distributed backend:
// the ProcessGroup and Work classes, the creator's C++ half (worlds made
// through a c10d Store), and the collectives of mc2's own Python API.
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

#include <fmt/format.h>

#include <chrono>

#include "process_group.h"
#include "world.h"

namespace mc2py {
namespace {

// Group::AllGatherStrings over a c10d Store: each rank sets its string under
// its own key of round `round`, then reads everyone's (Store::get waits for
// a key up to the store's timeout).
mc2::Group::AllGatherStrings StoreAllGather(c10::intrusive_ptr<c10d::Store> store, int rank,
                                            int size) {
  auto round = std::make_shared<int>(0);
  return [store, rank, size, round](const std::string& mine) {
    int r = (*round)++;
    std::string base = fmt::format("mc2/rendezvous/{}/", r);
    store->set(base + std::to_string(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    std::vector<std::string> all(size);
    for (int i = 0; i < size; ++i) {
      std::vector<uint8_t> v = store->get(base + std::to_string(i));
      all[i].assign(v.begin(), v.end());
    }
    return all;
  };
}

// The creator's work for one process group (torch calls it on the group's
// members only). The default group joins this process's mc2 world (`mc2
// run`'s, mpirun's across hosts, or one made now through the store) and takes a group of its own
// split from it, so that its calls never contend with calls on
// mc2.world(). A group of new_group() is a world of its own, made by its
// members through the group's store: torch does not call the creator on
// the other ranks, so it cannot be split from the world. Every world made
// here records its trace spans as the process's rank `job_rank` of
// `job_size` in the job (WorldOptions::trace_rank).
c10::intrusive_ptr<ProcessGroupMC2> CreateProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s,
    const std::vector<int64_t>& global_ranks, int job_rank, int job_size) {
  mc2::WorldOptions options;
  options.trace_rank = job_rank;
  options.trace_world_size = job_size;
  if (timeout_s > 0) {
    options.timeout = std::chrono::nanoseconds(static_cast<int64_t>(timeout_s * 1e9));
  }
  bool is_default = global_ranks.empty();
  PyGroup group;
  if (is_default) {
    std::optional<PyGroup> world = ExistingWorld();
    if (!world && !mc2::Group::LaunchedByMc2() && !mc2::Group::LaunchedByMpi()) {
      SetWorld(PyGroup(mc2::Group::FromRendezvous(rank, size, StoreAllGather(store, rank, size),
                                                  options)));
    }
    PyGroup w = World();
    if (w.group.rank() != rank || w.group.size() != size) {
      throw mc2::Error(mc2::ErrorCode::kInvalidArgument,
                       fmt::format("torch.distributed says rank {} of {}, but this process is "
                                   "rank {} of {} in its mc2 world (mc2 run or mpirun): start "
                                   "the job with either launcher, not both with different sizes",
                                   rank, size, w.group.rank(), w.group.size()),
                       rank, "init_process_group");
    }
    std::lock_guard<std::mutex> lock(*w.mu);
    group = PyGroup(w.group.Split(0, rank));
  } else {
    group = PyGroup(mc2::Group::FromRendezvous(rank, size, StoreAllGather(store, rank, size),
                                               options));
  }
  return c10::make_intrusive<ProcessGroupMC2>(std::move(group));
}

}  // namespace

void BindBackend(py::module_& m) {
  py::class_<AsyncWork, c10d::Work, c10::intrusive_ptr<AsyncWork>>(
      m, "Work",
      "The handle of an asynchronous mc2 call (a torch.distributed Work): wait() blocks "
      "(without the GIL) until the result is in place and raises mc2.Error if the call "
      "failed; get_future() completes at the same moment.");

  py::class_<ProcessGroupMC2, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupMC2>>(
      m, "ProcessGroupMC2", "The torch.distributed process group of the mc2 backend.")
      .def(py::init([](const PyGroup& g) { return c10::make_intrusive<ProcessGroupMC2>(g); }),
           py::arg("group"), "A process group over an mc2.Group (it issues its calls on it).")
      .def_property_readonly("group", &ProcessGroupMC2::group,
                             "The mc2.Group the process group runs on.");

  m.def(
      "_create_process_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s,
         const std::vector<int64_t>& global_ranks, int job_rank, int job_size) {
        py::gil_scoped_release nogil;
        return CreateProcessGroup(store, rank, size, timeout_s, global_ranks, job_rank,
                                  job_size);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::arg("global_ranks"), py::arg("job_rank"), py::arg("job_size"));

  m.def(
      "_join_world",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s) {
        mc2::WorldOptions options;
        if (timeout_s > 0) {
          options.timeout = std::chrono::nanoseconds(static_cast<int64_t>(timeout_s * 1e9));
        }
        py::gil_scoped_release nogil;
        SetWorld(PyGroup(
            mc2::Group::FromRendezvous(rank, size, StoreAllGather(store, rank, size), options)));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      "Makes this process's mc2 world among `size` ranks meeting through `store` (collective; "
      "mc2.world() under torchrun when torch.distributed runs on another backend).");
  m.def("_has_world", []() { return ExistingWorld().has_value(); },
        "Whether this process's mc2 world exists.");

  m.def(
      "_all_reduce",
      [](ProcessGroupMC2& pg, const at::Tensor& t, const std::string& op,
         const std::string& algorithm, bool async_op) {
        mc2::CollectiveOptions co;
        co.algorithm = ParseAlgorithmName(algorithm, "all_reduce");
        co.may_run_inline = !async_op;  // an asynchronous call returns at once
        mc2::ReduceOp rop = ParseReduceOpName(op, "all_reduce");
        py::gil_scoped_release nogil;
        return pg.AllReduce(t, rop, co);
      },
      py::arg("pg"), py::arg("tensor"), py::arg("op"), py::arg("algorithm"),
      py::arg("async_op"));
  m.def(
      "_all_reduce_bucket",
      [](ProcessGroupMC2& pg, const at::Tensor& bucket, const std::string& op) {
        mc2::ReduceOp rop = ParseReduceOpName(op, "all_reduce");
        py::gil_scoped_release nogil;
        return pg.AllReduceBucket(bucket, rop);
      },
      py::arg("pg"), py::arg("bucket"), py::arg("op"));
  m.def(
      "_broadcast",
      [](ProcessGroupMC2& pg, const at::Tensor& t, int root, const std::string& algorithm,
         bool async_op) {
        mc2::CollectiveOptions co;
        co.algorithm = ParseAlgorithmName(algorithm, "broadcast");
        co.may_run_inline = !async_op;
        py::gil_scoped_release nogil;
        return pg.Broadcast(t, root, co);
      },
      py::arg("pg"), py::arg("tensor"), py::arg("root"), py::arg("algorithm"),
      py::arg("async_op"));
}

}  // namespace mc2py
