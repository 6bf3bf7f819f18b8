"""mc2 from Python: collectives, fused compute+communication operators and a
torch.distributed backend over mc2's shared-memory engine (docs/python.md).

- mc2.world(), mc2.init(), mc2.Group: the ranks of `mc2 run`, of mpirun
  (across hosts), or of torchrun (joined on first use);
- mc2.all_reduce(...) and the other collectives (mc2.collectives);
- torch.distributed.init_process_group("mc2") (mc2.backend), and
  mc2.group_of(process_group) for the mc2.Group under an mc2 process group;
- mc2.ddp.allreduce_hook, a DistributedDataParallel communication hook, and
  mc2.ddp.compressed_hook with mc2.ddp.CompressionState (compression);
- mc2.Compressor: compressed all-reduces with error feedback (mc2.compression);
- mc2.trace: timeline tracing (start, stop, mark_step, span), read by
  `mc2 trace report`;
- the fused operators as differentiable torch functions (mc2.ops:
  all_gather_matmul, matmul_reduce_scatter, matmul_all_reduce,
  all_gather_batch_matmul, moe_route, all_to_all_matmul, matmul_all_to_all,
  moe_mlp, and torch_npu's names) and the tensor-parallel layers mc2.nn
  (docs/python-ops.md), over the operators of mc2._C (signatures at the top
  of python/src/ops_dense.cc and ops_moe.cc).
"""
import torch  # noqa: F401  (registers torch's types before mc2._C needs them)
import torch.distributed  # noqa: F401

from ._C import (  # noqa: F401
    Error, Group, MoeRouting, ProcessGroupMC2, Work, launched_by_mc2, launched_by_mpi)
from ._world import init, world  # noqa: F401
from . import backend  # noqa: F401  (registers the "mc2" backend)
from . import _mpirun
_mpirun.install()  # under mpirun: torch's env:// rendezvous without MASTER_ADDR
from .backend import init_process_group  # noqa: F401
from . import ddp  # noqa: F401
from .compression import Compressor  # noqa: F401
from . import trace  # noqa: F401
from .collectives import (  # noqa: F401
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    default_process_group,
    gather,
    invalid_argument as _invalid_argument,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
    send,
)


def group_of(process_group=None):
    """The mc2.Group a process group of the mc2 backend runs on (None: the
    default group of torch.distributed); raises mc2.Error for another
    backend's group."""
    if process_group is None:
        process_group = torch.distributed.distributed_c10d._get_default_group()
    if not isinstance(process_group, ProcessGroupMC2):
        raise _invalid_argument("group_of", f"{type(process_group).__name__} is not a process "
                                "group of the mc2 backend")
    return process_group.group


# The fused operators as differentiable torch functions, and the
# tensor-parallel layers built on them (docs/python-ops.md).
from . import autograd, nn  # noqa: F401,E402
from .ops import (  # noqa: F401,E402
    all_gather_batch_matmul,
    all_gather_matmul,
    all_to_all_matmul,
    matmul_all_reduce,
    matmul_all_to_all,
    matmul_reduce_scatter,
    moe_mlp,
    moe_route,
    npu_all_gather_base_mm,
    npu_mm_all_reduce_base,
    npu_mm_reduce_scatter_base,
)
