// python/src/world.h: the world of this process, as mc2.world() returns it.
#ifndef MC2_PYTHON_WORLD_H_
#define MC2_PYTHON_WORLD_H_

#include <optional>

#include "common.h"

namespace mc2py {

// Builds the world once (thread-safe) and returns it: under `mc2 run` from
// the launcher's environment (Group::FromEnv). Later calls return the same
// world; options of a later call are ignored. Throws mc2::Error when there
// is no world to join (not launched by `mc2 run`, and no torch.distributed
// rendezvous made one: see SetWorld).
PyGroup World(const mc2::WorldOptions& options = {});
// The world if one exists, without making one.
std::optional<PyGroup> ExistingWorld();
// Installs a world made elsewhere (by the torch backend's rendezvous);
// throws kInvalidArgument if one exists already.
void SetWorld(PyGroup world);

void BindGroup(py::module_& m);

}  // namespace mc2py

#endif  // MC2_PYTHON_WORLD_H_
