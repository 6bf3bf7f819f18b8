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
