"""Megatron-style tensor-parallel linear layers on mc2's fused operators.

    fc1 = mc2.nn.ColumnParallelLinear(h, 4 * h, group=tp)   # x shard [s, h] -> [S, 4h / p]
    fc2 = mc2.nn.RowParallelLinear(4 * h, h, group=tp)      # [S, 4h / p] -> y shard [s, h]
    y = fc2(gelu(fc1(x)))

With sequence parallelism (the default) activations outside the pair are
sharded along the sequence (their first dimension: rows [s, ...] of the
whole [S, ...], s = S / p), and every TP GEMM is one fused operator, in
both directions:

  ColumnParallelLinear  forward  all_gather_matmul(x, W)
                        backward matmul_reduce_scatter(dy, W^T), W's gradient under it
  RowParallelLinear     forward  matmul_reduce_scatter(a, W)
                        backward all_gather_matmul(dy, W^T), then W's gradient

Without it (sequence_parallel=False) activations outside the pair are
replicated, the column layer multiplies locally and all-reduces its input
gradient (matmul_all_reduce(dy, W^T), W's gradient under it), and the row
layer is matmul_all_reduce forward and local backward.

The group is an mc2 Group, a torch ProcessGroup of the "mc2" backend, or
None (torch.distributed's default group, else the mc2 world); any size,
including sizes that do not divide the features or the sequence (the
first `n % p` ranks take one more). On a ProcessGroup of another backend
the layers compute the same, unfused (mc2.ops).

Weights are stored as the operators read them: [in, out] blocks, the
transpose of torch.nn.Linear's [out, in] (ColumnParallelLinear holds
columns [c0, c0 + out_local) of the whole W^T, RowParallelLinear rows
[r0, r0 + in_local)). `from_linear` shards a torch.nn.Linear. A fresh
layer initialises the whole matrix as torch.nn.Linear does, from torch's
default generator, and keeps its block: seed every rank alike.

Parameters that see only this rank's sequence shard (the row layer's bias
with sequence parallelism, and any LayerNorm the caller runs on shards)
get only this rank's part of their gradient from backward; the row
layer's bias is handled inside (its gradient is the sum over every rank's
rows), a caller's own such parameters need allreduce_grads().
"""

import math

import torch

from . import autograd as _ag
from ._comm import agreed, resolve

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "sequence_range", "sequence_shard",
           "allreduce_grads"]


def _full_init(out_features, in_features, bias, dtype):
    """torch.nn.Linear's initialisation of the whole layer: W [out, in], b."""
    w = torch.empty(out_features, in_features, dtype=torch.float32)
    torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    b = None
    if bias:
        bound = 1 / math.sqrt(in_features) if in_features > 0 else 0
        b = torch.empty(out_features, dtype=torch.float32).uniform_(-bound, bound)
    return w.to(dtype), (b.to(dtype) if b is not None else None)


class _Parallel(torch.nn.Module):
    """What the column and row layers share: the group, the options and
    this rank's block of the whole weight W^T [in, out] (and bias), split
    along its columns (`split_out`, the column layer) or its rows."""

    def __init__(self, in_features, out_features, bias, group, sequence_parallel, pipeline,
                 splits, dtype, weights, split_out):
        super().__init__()
        self.comm = resolve(group)
        self.opts = {"pipeline": pipeline, "splits": int(splits)}
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.sequence_parallel = bool(sequence_parallel)
        first, count = self.comm.split_rows(out_features if split_out else in_features)
        w, b = weights if weights is not None else _full_init(out_features, in_features, bias,
                                                              dtype)
        block = slice(first, first + count)
        w_t = w.t()
        w_block = w_t[:, block] if split_out else w_t[block]
        self.weight = torch.nn.Parameter(w_block.contiguous().to(dtype))
        b_block = b[block] if split_out and b is not None else b
        self.bias = torch.nn.Parameter(b_block.clone().to(dtype)) if b is not None else None
        self._first, self._count = first, count

    @classmethod
    def from_linear(cls, linear, **kw):
        """This rank's block of torch.nn.Linear `linear` (same results)."""
        b = linear.bias.detach() if linear.bias is not None else None
        kw.setdefault("dtype", linear.weight.dtype)
        return cls(linear.in_features, linear.out_features, bias=b is not None,
                   _weights=(linear.weight.detach(), b), **kw)

    def _input_rows(self, x, width, what):
        """x [..., width] as rows [n, width] and its leading shape; a wrong
        width on any rank raises mc2.Error on every rank (on an mc2 group)."""
        with agreed(self.comm, type(self).__name__):
            if not isinstance(x, torch.Tensor) or x.dim() < 1:
                raise ValueError(f"{type(self).__name__}: the input must be a tensor [..., "
                                 f"{width}], not {getattr(x, 'shape', type(x).__name__)}")
            if x.shape[-1] != width:
                raise ValueError(f"{type(self).__name__}: input has {x.shape[-1]} features, "
                                 f"{what} {width}")
        return x.reshape(-1, width).contiguous(), tuple(x.shape[:-1])

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"rank={self.comm.rank}/{self.comm.size}, "
                f"sequence_parallel={self.sequence_parallel}, bias={self.bias is not None}")


class ColumnParallelLinear(_Parallel):
    """y = x W^T + b with W's output features split over the group.

    forward(x): x [s, ..., in] (sequence_parallel: this rank's shard of the
    first dimension; else the whole [S, ..., in], the same on every rank)
    -> [S, ..., out_local], this rank's block of output features.
    weight [in, out_local], bias [out_local]."""

    def __init__(self, in_features, out_features, bias=True, *, group=None,
                 sequence_parallel=True, pipeline="auto", splits=4, dtype=torch.float32,
                 _weights=None):
        super().__init__(in_features, out_features, bias, group, sequence_parallel, pipeline,
                         splits, dtype, _weights, split_out=True)
        self.out_first, self.out_local = self._first, self._count

    def forward(self, x):
        rows, lead = self._input_rows(x, self.in_features, "the layer")
        if self.sequence_parallel:
            out, _ = _ag.AllGatherMatmul.apply(self.comm, self.opts, rows, self.weight,
                                               self.bias, False)
            return out.reshape(-1, *lead[1:], self.out_local)
        out = _ag.CopyMatmul.apply(self.comm, self.opts, rows, self.weight, self.bias)
        return out.reshape(*lead, self.out_local)


class RowParallelLinear(_Parallel):
    """y = x W^T + b with W's input features split over the group.

    forward(x): x [S, ..., in_local], this rank's block of input features
    (a ColumnParallelLinear's output) -> sequence_parallel: this rank's
    shard [s, ..., out] of the sum (s: S split as evenly as possible, the
    first S % p ranks one row more, as sequence_shard); else the whole
    [S, ..., out] on every rank.
    weight [in_local, out], bias [out] (the same on every rank, added once)."""

    def __init__(self, in_features, out_features, bias=True, *, group=None,
                 sequence_parallel=True, pipeline="auto", splits=4, dtype=torch.float32,
                 _weights=None):
        super().__init__(in_features, out_features, bias, group, sequence_parallel, pipeline,
                         splits, dtype, _weights, split_out=False)
        self.in_first, self.in_local = self._first, self._count

    def forward(self, x):
        rows, lead = self._input_rows(x, self.in_local, "this rank's block of the layer")
        if self.sequence_parallel:
            per_row = rows.shape[0] // lead[0] if lead[0] else 1
            m_local = self.comm.split_rows(lead[0])[1]
            out = _ag.MatmulReduceScatter.apply(self.comm, self.opts, rows, self.weight,
                                                m_local * per_row, self.bias)
            return out.reshape(m_local, *lead[1:], self.out_features)
        out = _ag.MatmulAllReduce.apply(self.comm, self.opts, rows, self.weight, self.bias,
                                        None)
        return out.reshape(*lead, self.out_features)


def sequence_range(length, group=None):
    """(first, count): this rank's rows of a sequence of `length`, as
    RowParallelLinear splits its output: length / p, the first length % p
    ranks one row more."""
    return resolve(group).split_rows(length)


def sequence_shard(x, group=None):
    """This rank's rows of the first dimension of x (the same on every rank),
    split as RowParallelLinear splits its output: S / p, the first S % p
    ranks one row more."""
    first, count = sequence_range(x.shape[0], group)
    return x[first:first + count]


def allreduce_grads(params, group=None):
    """Sums each parameter's gradient over the group, in place: for
    parameters used on sequence shards (a LayerNorm's), whose backward saw
    this rank's rows only. Every rank passes the same parameters, in the
    same order, with a gradient on every rank or on none (those without are
    skipped)."""
    comm = resolve(group)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads or comm.size == 1:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    comm.all_reduce(flat)
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset:offset + n].reshape(g.shape))
        offset += n
