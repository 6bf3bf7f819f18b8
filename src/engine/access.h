// Access: the library's own way into the state behind the public handles.
//
// Group and Work keep their state private so that the public API exposes no
// internal type; the layers below include/ reach it through this struct,
// which the public headers name only as a forward-declared friend (as
// LevelDB keeps DBImpl out of include/). Stateless; any thread may call it
// under the handles' own thread-safety rules.
#ifndef MC2_ENGINE_ACCESS_H_
#define MC2_ENGINE_ACCESS_H_

#include <memory>
#include <utility>

#include "mc2/group.h"
#include "mc2/work.h"

namespace mc2::internal {

class GroupImpl;
class WorkState;

struct Access {
  // The state of `g` on this rank; null for an invalid (empty) group. The
  // group keeps it alive while `g` or any copy of it lives.
  static GroupImpl* Impl(const Group& g) { return g.impl_.get(); }
  // A handle on `impl`, sharing its ownership.
  static Group MakeGroup(std::shared_ptr<GroupImpl> impl) { return Group(std::move(impl)); }
  // A handle on the operation whose state is `state`, sharing its ownership.
  static Work MakeWork(std::shared_ptr<WorkState> state) { return Work(std::move(state)); }
};

}  // namespace mc2::internal

#endif  // MC2_ENGINE_ACCESS_H_
