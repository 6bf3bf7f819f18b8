"""mc2's own collective calls on torch tensors, in torch.distributed's style
with mc2's options:

    handle = mc2.all_reduce(t, op="sum", async_op=True, algorithm="ring")
    ...            # t must not change until wait() (see below)
    handle.wait()  # raises mc2.Error if the call failed

Each works in place on CPU tensors (non-contiguous ones are copied and the
result copied back when the call completes) on `group`: a process group of
the mc2 backend, by default torch.distributed's default group if it is an
mc2 one, else a group over mc2.world() made on first use (collectively, by
every rank's first call). With async_op=False a call returns None once its
result is in place; with async_op=True it returns a Work at once.

A tensor handed to an asynchronous call must not be modified until wait()
returned: in-place changes made while the call runs are detected through
the tensor's version counter and fail the call (mc2.Error, code
'invalid_argument'); changes through other aliases of its memory cannot be
detected.
"""
import threading

import torch.distributed as dist

from . import _C
from ._world import world

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "prod": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}
_lock = threading.Lock()
_own_pg = None


def invalid_argument(op, message):
    """An mc2.Error with code 'invalid_argument', as mc2's C++ checks raise."""
    e = _C.Error(f"mc2 error [invalid_argument] {op}: {message}")
    e.code, e.rank, e.op, e.seq, e.message = "invalid_argument", -1, op, 0, message
    return e


def default_process_group():
    """The process group mc2's calls use when none is given (see above)."""
    global _own_pg
    if dist.is_initialized():
        pg = dist.distributed_c10d._get_default_group()
        if isinstance(pg, _C.ProcessGroupMC2):
            return pg
    with _lock:
        if _own_pg is None:
            w = world()
            _own_pg = _C.ProcessGroupMC2(w.split(0, w.rank()))
        return _own_pg


def _pg(group):
    if group is None:
        return default_process_group()
    if not isinstance(group, _C.ProcessGroupMC2):
        raise invalid_argument("collective", "group must be a process group of the mc2 "
                               f"backend, not {type(group).__name__}")
    return group


def _op(op):
    if isinstance(op, str):
        if op not in _OPS:
            raise invalid_argument("collective", f"unknown reduction '{op}' ({', '.join(_OPS)})")
        return _OPS[op]
    return op


def _done(work, async_op):
    if async_op:
        return work
    work.wait()
    return None


_TOPOS = {"auto": "auto", "flat": "direct", "hierarchical": "hierarchical"}


def _topo_algorithm(topo, algorithm, group):
    """The algorithm that `topo` asks for on `group`'s process group."""
    if topo not in _TOPOS:
        raise invalid_argument("all_reduce", f"unknown topo '{topo}' (auto, flat, hierarchical)")
    if topo == "auto" or _pg(group).group.num_hosts() == 1:
        return algorithm  # within one host there is one level
    if algorithm not in ("auto", _TOPOS[topo]):
        raise invalid_argument("all_reduce", f"topo '{topo}' and algorithm '{algorithm}' "
                               "disagree: give one of them")
    return _TOPOS[topo]


def all_reduce(tensor, op="sum", async_op=False, algorithm="auto", group=None,
               compression="none", threshold=1e-6, topk_ratio=0.01, residual=None, topo="auto"):
    """tensor = the reduction of every rank's tensor (op: sum, avg, prod, min,
    max, band, bor, bxor); algorithm: auto, ring, recursive_doubling,
    rabenseifner, tree, direct; across hosts hierarchical or direct (flat).
    topo (a group across hosts): flat (every rank exchanges with every
    other), hierarchical (inside each host first, then between hosts) or
    auto (the selector's choice); within one host it changes nothing.

    compression: none, f16, bf16, threshold (|x| >= threshold travels),
    topk (the topk_ratio largest |x| travel); float32 tensors, op sum or avg,
    algorithm auto. residual: error feedback for threshold and topk (see
    mc2.compression; mc2.Compressor keeps residuals for you)."""
    if not isinstance(op, str):
        op = next((k for k, v in _OPS.items() if v == op), str(op))
    algorithm = _topo_algorithm(topo, algorithm, group)
    if compression != "none" or residual is not None:
        if algorithm != "auto":
            raise invalid_argument("all_reduce", "a compressed all_reduce chooses its own "
                                   f"exchanges: algorithm must be 'auto', not '{algorithm}'")
        from .compression import all_reduce_compressed
        work, _ = all_reduce_compressed(tensor, op, compression, threshold, topk_ratio, residual,
                                        None, group)
        return _done(work, async_op)
    return _done(_C._all_reduce(_pg(group), tensor, op, algorithm, async_op), async_op)


def broadcast(tensor, src=0, async_op=False, algorithm="auto", group=None):
    """tensor = rank src's tensor on every rank."""
    return _done(_C._broadcast(_pg(group), tensor, src, algorithm, async_op), async_op)


def reduce(tensor, dst=0, op="sum", async_op=False, group=None):
    """Rank dst's tensor = the reduction of every rank's (others unchanged)."""
    opts = dist.ReduceOptions()
    opts.reduceOp = _op(op)
    opts.rootRank = dst
    return _done(_pg(group).reduce([tensor], opts), async_op)


def all_gather(tensor_list, tensor, async_op=False, group=None):
    """tensor_list[r] = rank r's tensor."""
    return _done(_pg(group).allgather([tensor_list], [tensor]), async_op)


def all_gather_into_tensor(output, tensor, async_op=False, group=None):
    """output (size x tensor's elements) = every rank's tensor, in rank order."""
    return _done(_pg(group)._allgather_base(output, tensor), async_op)


def reduce_scatter(output, input_list, op="sum", async_op=False, group=None):
    """output = the reduction over ranks of their input_list[this rank]."""
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = _op(op)
    return _done(_pg(group).reduce_scatter([output], [input_list], opts), async_op)


def reduce_scatter_tensor(output, input, op="sum", async_op=False, group=None):
    """output = this rank's block of the reduction of every rank's input."""
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = _op(op)
    return _done(_pg(group)._reduce_scatter_base(output, input, opts), async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      async_op=False, group=None):
    """Rows of input go to the ranks in blocks (even, or input_split_sizes);
    output receives every rank's block for this rank (output_split_sizes)."""
    return _done(_pg(group).alltoall_base(output, input, output_split_sizes or [],
                                          input_split_sizes or [], dist.AllToAllOptions()),
                 async_op)


def all_to_all(output_list, input_list, async_op=False, group=None):
    """output_list[r] = rank r's input_list[this rank]."""
    return _done(_pg(group).alltoall(output_list, input_list, dist.AllToAllOptions()), async_op)


def gather(tensor, gather_list=None, dst=0, async_op=False, group=None):
    """On rank dst, gather_list[r] = rank r's tensor."""
    opts = dist.GatherOptions()
    opts.rootRank = dst
    return _done(_pg(group).gather([gather_list] if gather_list else [], [tensor], opts), async_op)


def scatter(tensor, scatter_list=None, src=0, async_op=False, group=None):
    """tensor = rank src's scatter_list[this rank]."""
    opts = dist.ScatterOptions()
    opts.rootRank = src
    return _done(_pg(group).scatter([tensor], [scatter_list] if scatter_list else [], opts),
                 async_op)


def barrier(async_op=False, group=None):
    """Completes once every rank of the group entered it."""
    return _done(_pg(group).barrier(dist.BarrierOptions()), async_op)


def send(tensor, dst, tag=0, async_op=False, group=None):
    """Sends tensor's bytes to rank dst (matched by a recv with the same tag)."""
    return _done(_pg(group).send([tensor], dst, tag), async_op)


def recv(tensor, src, tag=0, async_op=False, group=None):
    """Receives rank src's send with the same tag into tensor (same size)."""
    return _done(_pg(group).recv([tensor], src, tag), async_op)
