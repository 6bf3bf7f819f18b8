"""mc2's fused compute+communication operators as torch functions.

    out, _ = mc2.all_gather_matmul(x_shard, w)           # gather(x) @ w
    y = mc2.matmul_reduce_scatter(a, w)                   # my rows of sum(a @ w)
    z = mc2.matmul_all_reduce(a, w, bias=b)               # sum(a @ w) + b
    c, _ = mc2.all_gather_batch_matmul(q_shard, k)        # per entry: gather(q[e]) @ k[e]

Every function is differentiable (mc2.autograd: the backward runs the dual
fused operator) and runs on `group`: an mc2 Group, a torch ProcessGroup of
the "mc2" backend, or None (torch.distributed's default group when one is
initialized, else the mc2 world). On a ProcessGroup of another backend
(gloo, ...) it computes the same result unfused, over that backend's
collectives (mc2._unfused). Every rank of the group must make the same
calls in the same order, as for a collective.

Operands: a and b of one dtype, float32 or bfloat16 (bf16 multiplies with
f32 accumulation); the result has that dtype. Non-contiguous tensors are
copied. a may have more than two dimensions: its leading dimensions are
rows (a [s, batch, h] is s * batch rows, so a sequence-first activation is
sharded and gathered along its first dimension). On an mc2 group, shapes
that disagree across ranks, a dtype the operators do not take, a bad
pipeline name or split count, and a bad bias, x3 or probs on any rank
(checked here, then agreed on in the operator's first exchange) raise
mc2.Error('invalid_argument') on every rank. On another backend a bad
bias, x3 or probs raises ValueError on its rank only (its peers wait for
that backend's timeout).

`pipeline` ("auto", "serial", "chunked", "fused") and `splits` (1..16) are
the operator's (docs/python-ops.md, include/mc2/fused_ops.h).

The torch_npu names (npu_all_gather_base_mm, npu_mm_reduce_scatter_base,
npu_mm_all_reduce_base) take torch_npu's arguments, with `hcom` a group as
above, and none of its limits on shapes, rank counts or bias.
"""

import torch

from . import autograd as _ag
from ._comm import agreed as _agreed, resolve

__all__ = [
    "all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce",
    "all_gather_batch_matmul", "moe_route", "all_to_all_matmul", "matmul_all_to_all", "moe_mlp",
    "npu_all_gather_base_mm", "npu_mm_reduce_scatter_base",
    "npu_mm_all_reduce_base",
]


def _opts(pipeline, splits):
    return {"pipeline": pipeline, "splits": int(splits)}


def _rows(x, name):
    """x as a matrix of rows, and the leading shape to restore."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"{name} must have at least 2 dimensions, got shape {tuple(x.shape)}")
    lead = tuple(x.shape[:-1])
    return x.reshape(-1, x.shape[-1]).contiguous(), lead


def _matrix(x, name):
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"{name} must be a 2-dimensional torch.Tensor, got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    return x.contiguous()


def _addend(x, shape, dtype, name):
    """Checks x, a bias or x3 of `shape` added to a result of `dtype`: None,
    or a CPU tensor of that shape, float32 or `dtype`."""
    if x is None:
        return
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(x).__name__}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, not {tuple(x.shape)}")
    if x.dtype not in (torch.float32, dtype):
        raise ValueError(f"{name} has dtype {x.dtype}; it must be float32 or the operands' "
                         f"dtype ({dtype})")
    if x.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU tensor (it is on {x.device})")


def all_gather_matmul(a, b, *, group=None, bias=None, gather_output=False, pipeline="auto",
                      splits=4):
    """(gather(a) @ b + bias, gather(a) if gather_output else None).

    a [m_r, k] (or [m_r, ..., k]): this rank's rows; row counts may differ
    across ranks and be 0; gather(a) stacks every rank's rows in rank order
    (M rows). b [k, n]: n may differ across ranks (a column block). bias
    [n]: added to this rank's output. Output [M, n] (leading shape
    [M_0, ...]: the first dimension gathered).
    Backward: a's gradient is matmul_reduce_scatter(grad_out, b^T), with
    b's gradient (gather(a)^T grad_out) computed while it communicates."""
    comm = resolve(group)
    with _agreed(comm, "all_gather_matmul"):
        x, lead = _rows(a, "a")
        b = _matrix(b, "b")
        _addend(bias, (b.shape[1],), x.dtype, "bias")
    out, gathered = _ag.AllGatherMatmul.apply(comm, _opts(pipeline, splits), x, b, bias,
                                              bool(gather_output))
    rest = lead[1:]
    out = out.reshape(-1, *rest, out.shape[-1])
    if gathered is not None:
        gathered = gathered.reshape(-1, *rest, gathered.shape[-1])
    return out, gathered


def matmul_reduce_scatter(a, b, *, group=None, m_local=None, bias=None, pipeline="auto",
                          splits=4):
    """This rank's m_local rows of sum over ranks (a @ b), + bias.

    a [m, k] (or [m, ..., k], rows split along the first dimension), b [k, n];
    m and n agree across ranks, k may differ. m_local: this rank's row count
    (of the first dimension); the ranks' counts add up to m; default: m
    split as evenly as possible, the first m % size ranks taking one more.
    bias [n]: the same on every rank, added once to the sum (its gradient
    is the sum over every rank's rows).
    Backward: a's gradient is all_gather_matmul(grad_out, b^T); b's is
    a^T gather(grad_out)."""
    comm = resolve(group)
    with _agreed(comm, "matmul_reduce_scatter"):
        x, lead = _rows(a, "a")
        b = _matrix(b, "b")
        _addend(bias, (b.shape[1],), x.dtype, "bias")
        per_row = x.shape[0] // lead[0] if lead[0] else 1
        if m_local is None:
            m_local = comm.split_rows(lead[0])[1]
        m_local = int(m_local)
        if m_local < 0 or m_local > lead[0]:
            raise ValueError(f"m_local must be in [0, {lead[0]}], not {m_local}")
    out = _ag.MatmulReduceScatter.apply(comm, _opts(pipeline, splits), x, b,
                                        m_local * per_row, bias)
    return out.reshape(m_local, *lead[1:], out.shape[-1])


def matmul_all_reduce(a, b, *, group=None, bias=None, x3=None, pipeline="auto", splits=4):
    """sum over ranks (a @ b) + bias + x3, on every rank.

    a [m, k] (or [..., k]), b [k, n]; m and n agree across ranks, k may
    differ (each rank's slice of the reduction). bias [n] and x3 (the
    output's shape) are added once, after the sum.
    Backward (Megatron-LM's convention: the replicated output's gradient is
    the same on every rank): a's and b's gradients are local GEMMs."""
    comm = resolve(group)
    with _agreed(comm, "matmul_all_reduce"):
        x, lead = _rows(a, "a")
        b = _matrix(b, "b")
        _addend(bias, (b.shape[1],), x.dtype, "bias")
        _addend(x3, (*lead, b.shape[1]), x.dtype, "x3 (the output's shape)")
    if x3 is not None:
        x3 = x3.reshape(-1, b.shape[1])
    out = _ag.MatmulAllReduce.apply(comm, _opts(pipeline, splits), x, b, bias, x3)
    return out.reshape(*lead, out.shape[-1])


def all_gather_batch_matmul(a, b, *, group=None, gather_output=False, pipeline="auto",
                            splits=4):
    """(c, gather(a) if gather_output else None) with c[e] = gather(a[e]) @ b[e].

    a [batch, m_r, k]: this rank's rows (e.g. a sequence slice) of every
    entry; gather(a) [batch, M, k] stacks every rank's rows in rank order.
    b [batch, k, n] (one matrix per entry, e.g. per-head keys) or [k, n]
    (shared by every entry, e.g. a projection). batch and k agree across
    ranks; n may differ. Output [batch, M, n].
    Backward: a's gradient is one reduce-scatter over the batch (for a
    shared b fused with its GEMM: matmul_reduce_scatter(grad_out, b^T)),
    with b's gradient computed while it communicates."""
    comm = resolve(group)
    with _agreed(comm, "all_gather_batch_matmul"):
        if not isinstance(a, torch.Tensor) or a.dim() != 3:
            raise ValueError(f"a must be [batch, m, k], got "
                             f"{getattr(a, 'shape', type(a).__name__)}")
        if not isinstance(b, torch.Tensor) or b.dim() not in (2, 3):
            raise ValueError(f"b must be [batch, k, n] or [k, n], got "
                             f"{getattr(b, 'shape', type(b).__name__)}")
    return _ag.AllGatherBatchMatmul.apply(comm, _opts(pipeline, splits),
                                          a.contiguous(), b.contiguous(), bool(gather_output))


# Mixture of experts (mc2 groups only).

def moe_route(expert_ids, num_experts, *, group=None):
    """The routing of this rank's tokens: expert_ids [T, topk] (int32 or
    int64; -1 drops a slot) to num_experts experts spread evenly over the
    group (a multiple of its size). Collective. A token must not name an
    expert twice (top-k routing never does): the gate-weight gradients of
    matmul_all_to_all and moe_mlp tell slots apart by their expert. Such
    ids, like any bad argument, raise mc2.Error on every rank."""
    comm = resolve(group)
    with _agreed(comm, "moe_route"):
        if not isinstance(expert_ids, torch.Tensor) or expert_ids.dim() != 2:
            raise ValueError(f"expert_ids must be a [tokens, topk] tensor, got "
                             f"{getattr(expert_ids, 'shape', type(expert_ids).__name__)}")
        if expert_ids.shape[1] > 1 and expert_ids.numel():
            s, _ = expert_ids.sort(dim=1)
            if bool(((s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)).any()):
                raise ValueError("expert_ids names one expert twice in a token's row")
    return comm.moe_route(expert_ids, num_experts)


def _experts(w, name):
    if not isinstance(w, torch.Tensor) or w.dim() != 3:
        raise ValueError(f"{name} must be [experts per rank, k, n], got "
                         f"{getattr(w, 'shape', type(w).__name__)}")
    return w.contiguous()


def _gates(probs, routing):
    if probs is None:
        return None
    want = (routing.num_tokens, routing.topk)
    if not isinstance(probs, torch.Tensor) or tuple(probs.shape) != want:
        raise ValueError(f"probs must be [tokens, topk] = {want}, got "
                         f"{getattr(probs, 'shape', type(probs).__name__)}")
    return probs


def all_to_all_matmul(x, w, routing, *, group=None, dispatch_output=False, pipeline="auto",
                      splits=4):
    """Dispatch + expert GEMM: (y [R, n], the dispatched x [R, k] if
    dispatch_output else None). x [T, k]: this rank's tokens; w [E/P, k, n]:
    its experts' weights; y holds, in expert-grouped order (local expert 0's
    rows first, each expert's from rank 0 first), every routed slot's token
    times its expert's weight. Backward: x's gradient is
    matmul_all_to_all(grad_y, w^T) (each token's slots summed), w's the
    per-expert GEMM of the dispatched tokens, run while it communicates."""
    comm = resolve(group)
    with _agreed(comm, "all_to_all_matmul"):
        x, w = _matrix(x, "x"), _experts(w, "w")
    return _ag.MoeDispatchMatmul.apply(comm, _opts(pipeline, splits), routing, x, w,
                                       bool(dispatch_output))


def matmul_all_to_all(h, w, routing, *, group=None, probs=None, pipeline="auto", splits=4):
    """Expert GEMM + combine: out [T, n], out[t] = the sum over t's routed
    slots j of probs[t, j] (1 if probs is None) times its row of h @ w.
    h [R, k] in expert-grouped order (as all_to_all_matmul's y), w
    [E/P, k, n]. Differentiable in h, w and probs."""
    comm = resolve(group)
    with _agreed(comm, "matmul_all_to_all"):
        h, w, probs = _matrix(h, "h"), _experts(w, "w"), _gates(probs, routing)
    return _ag.MoeMatmulCombine.apply(comm, _opts(pipeline, splits), routing, h, w, probs)


def moe_mlp(x, w1, w2, routing, *, group=None, activation=None, probs=None, pipeline="auto",
            splits=4):
    """One MoE layer's experts in one fused call: out [T, d], out[t] = the
    sum over t's routed slots of probs[t, j] * activation(x[t] w1[e]) w2[e].
    w1 [E/P, d, h1], w2 [E/P, h2, d]; activation: None (identity) or a
    row-wise torch function from [rows, h1] to [rows, h2] float32 tensors
    (e.g. torch.nn.functional.gelu). The result equals all_to_all_matmul,
    activation, matmul_all_to_all; its backward is theirs."""
    comm = resolve(group)
    with _agreed(comm, "moe_mlp"):
        x, w1, w2 = _matrix(x, "x"), _experts(w1, "w1"), _experts(w2, "w2")
        probs = _gates(probs, routing)
    return _ag.MoeMlp.apply(comm, _opts(pipeline, splits), routing, activation, x, w1, w2, probs)


# torch_npu's names and arguments.

def _check_npu(hcom, op, world_size, reduce_op, comm_turn):
    comm = resolve(hcom)
    with _agreed(comm, op):
        _npu_args(comm, world_size, reduce_op, comm_turn)
    return comm


def _npu_args(comm, world_size, reduce_op, comm_turn):
    if world_size is not None and int(world_size) != comm.size:
        raise ValueError(f"world_size is {world_size} but the group has {comm.size} ranks")
    if reduce_op != "sum":
        raise ValueError(f"reduce_op must be 'sum' (the operators sum), not {reduce_op!r}")
    if not isinstance(comm_turn, int):
        raise TypeError(f"comm_turn must be an int, not {type(comm_turn).__name__}")


def npu_all_gather_base_mm(x1, x2, hcom=None, world_size=None, *, bias=None, gather_index=0,
                           gather_output=True, comm_turn=0, pipeline="auto", splits=4):
    """torch_npu.npu_all_gather_base_mm: (gather(x1) @ x2 + bias, gather(x1)
    or None). gather_index must be 0 (gather x1); comm_turn is accepted and
    ignored (mc2 chooses the split with `pipeline` and `splits`)."""
    comm = resolve(hcom)
    with _agreed(comm, "all_gather_matmul"):
        _npu_args(comm, world_size, "sum", comm_turn)
        if gather_index != 0:
            raise ValueError(f"gather_index must be 0 (gather x1), not {gather_index}")
    return all_gather_matmul(x1, x2, group=comm, bias=bias, gather_output=gather_output,
                             pipeline=pipeline, splits=splits)


def npu_mm_reduce_scatter_base(input, x2, hcom=None, world_size=None, *, reduce_op="sum",
                               bias=None, comm_turn=0, pipeline="auto", splits=4):
    """torch_npu.npu_mm_reduce_scatter_base: this rank's rows of sum(input @
    x2) + bias; m need not divide by the rank count (even split, the first
    m % size ranks one row more)."""
    comm = _check_npu(hcom, "matmul_reduce_scatter", world_size, reduce_op, comm_turn)
    return matmul_reduce_scatter(input, x2, group=comm, bias=bias, pipeline=pipeline,
                                 splits=splits)


def npu_mm_all_reduce_base(x1, x2, hcom=None, *, reduce_op="sum", bias=None, x3=None,
                           comm_turn=0, pipeline="auto", splits=4):
    """torch_npu.npu_mm_all_reduce_base: sum(x1 @ x2) + bias + x3."""
    comm = _check_npu(hcom, "matmul_all_reduce", None, reduce_op, comm_turn)
    return matmul_all_reduce(x1, x2, group=comm, bias=bias, x3=x3, pipeline=pipeline,
                             splits=splits)
