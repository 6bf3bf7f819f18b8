"""Which group an operator runs on, and the operators of that group.

`resolve(group)` turns what a caller passes as `group` (or torch_npu's
`hcom`) into a `Comm`: the rank, the size and the three dense operators of
that group, taking torch tensors, with the extension's signatures. An mc2
Group, or a torch ProcessGroup of the "mc2" backend, gets the fused
operators of the extension (mc2._C); a ProcessGroup of any other backend
gets the same computation over its own collectives (mc2._unfused). None
means torch.distributed's default group when one is initialized, else the
mc2 world.
"""

import contextlib

import torch.distributed as dist

from . import _unfused


def _extension():
    from . import _C  # imported late: mc2.nn on a gloo group does not need it
    return _C


class Comm:
    """The operators of one group (see the module docstring)."""

    def __init__(self, group, fused):
        self.group = group  # an mc2 Group (fused) or a torch ProcessGroup
        self.fused = fused
        self._process_group = None  # a ProcessGroupMC2 over group, made at first use
        if fused:
            self._ops = _extension()
            self.rank = group.rank()
            self.size = group.size()
        else:
            self._ops = _unfused
            self.rank = dist.get_rank(group)
            self.size = dist.get_world_size(group)

    def all_gather_matmul(self, a, b, **kw):
        return self._ops.all_gather_matmul(self.group, a, b, **kw)

    def matmul_reduce_scatter(self, a, b, m_local, **kw):
        return self._ops.matmul_reduce_scatter(self.group, a, b, int(m_local), **kw)

    def matmul_all_reduce(self, a, b, **kw):
        return self._ops.matmul_all_reduce(self.group, a, b, **kw)

    def all_gather_batch_matmul(self, a, b, **kw):
        return self._ops.all_gather_batch_matmul(self.group, a, b, **kw)

    def fail_together(self, op, message):
        """Fails the fused operator `op` that the other ranks are calling,
        on every rank (mc2._C.fail_together; mc2 groups only)."""
        self._ops.fail_together(self.group, op, message)

    def all_reduce(self, tensor):
        """Sums a contiguous tensor over the group, in place."""
        if self.fused:
            if self._process_group is None:
                self._process_group = self._ops.ProcessGroupMC2(self.group)
            from .collectives import all_reduce
            all_reduce(tensor, group=self._process_group)
        else:
            dist.all_reduce(tensor, group=self.group)

    # The MoE operators exist for mc2 groups only.
    def _moe(self, name):
        if not self.fused:
            raise TypeError(f"{name} needs an mc2 group (an mc2 Group or a ProcessGroup of the "
                            f"mc2 backend), not a ProcessGroup of the "
                            f"{dist.get_backend(self.group)} backend")
        return getattr(self._ops, name)

    def moe_route(self, expert_ids, num_experts):
        return self._moe("moe_route")(self.group, expert_ids, int(num_experts))

    def all_to_all_matmul(self, routing, a, b, **kw):
        return self._moe("all_to_all_matmul")(self.group, routing, a, b, **kw)

    def matmul_all_to_all(self, routing, a, b, **kw):
        return self._moe("matmul_all_to_all")(self.group, routing, a, b, **kw)

    def moe_mlp(self, routing, a, w1, w2, **kw):
        return self._moe("moe_mlp")(self.group, routing, a, w1, w2, **kw)

    def split_rows(self, m):
        """This rank's share of m rows split as evenly as possible, the first
        m % size ranks taking one more: (first row, row count)."""
        base, extra = divmod(int(m), self.size)
        count = base + (1 if self.rank < extra else 0)
        return self.rank * base + min(self.rank, extra), count


@contextlib.contextmanager
def agreed(comm, op):
    """Argument checks of the operator `op`, made in Python before any
    communication, fail it on every rank: on an mc2 group a rank whose
    checks raise (TypeError, ValueError) takes part in the agreement of the
    operator its peers are calling (Comm.fail_together), so that every rank
    raises mc2.Error('invalid_argument') with the reason; on another backend
    the error is raised on this rank only.

        with agreed(comm, "all_gather_matmul"):
            ...checks that raise ValueError...
    """
    try:
        yield
    except (TypeError, ValueError) as e:
        if comm.fused:
            comm.fail_together(op, str(e))
        raise


def _is_process_group(group):
    return isinstance(group, dist.ProcessGroup)


def resolve(group=None):
    """The Comm of `group` (an mc2 Group, a torch ProcessGroup, or None)."""
    if isinstance(group, Comm):
        return group
    if group is None:
        if dist.is_available() and dist.is_initialized():
            group = dist.distributed_c10d._get_default_group()
        else:
            from ._world import world
            return Comm(world(), fused=True)
    if _is_process_group(group):
        _C = _extension()
        if isinstance(group, _C.ProcessGroupMC2):
            return Comm(group.group, fused=True)
        return Comm(group, fused=False)
    _C = _extension()
    if isinstance(group, _C.Group):
        return Comm(group, fused=True)
    raise TypeError(f"group must be an mc2 Group, a torch.distributed ProcessGroup or None, "
                    f"not {type(group).__name__}")
