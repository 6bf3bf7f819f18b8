"""mc2 from Python: collectives, fused compute+communication operators and a
torch.distributed backend over mc2's shared-memory engine (docs/python.md).

The fused operators of the C++ core take and return torch tensors in
mc2._C (all_gather_matmul, matmul_reduce_scatter, matmul_all_reduce,
all_gather_batch_matmul, moe_route, all_to_all_matmul, matmul_all_to_all,
moe_mlp; their signatures are at the top of python/src/ops_dense.cc and
ops_moe.cc).
"""
import torch  # noqa: F401  (registers torch's types before mc2._C needs them)
import torch.distributed  # noqa: F401

from ._C import Error, Group, MoeRouting, init, launched_by_mc2, world  # noqa: F401

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
