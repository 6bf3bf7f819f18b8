"""The fused operators' contract over plain torch.distributed collectives.

mc2's torch functions (mc2.ops) and modules (mc2.nn) run on mc2 groups
through the fused operators of the extension. Handed a process group of
another backend (gloo, oneCCL, ...), they run the same computation here:
one GEMM and one collective, the collective asynchronous so that the
caller's `overlap` work (a weight-gradient GEMM) runs while it moves, as
Megatron-LM does on those backends. Nothing is fused: this is what a
tensor-parallel layer costs without mc2, and the baseline mc2's benchmarks
compare against.

The functions follow the extension's signatures (mc2._C), with a torch
ProcessGroup in place of an mc2 Group: f32 or bf16 operands, f32 results;
`pipeline` and `splits` are checked and otherwise ignored. Errors are
local (ValueError, TypeError, or the backend's own).
Reduce-scatter is an all-reduce followed by taking this rank's rows, since
gloo in torch 1.13 has no reduce-scatter; row counts that may differ
across ranks are exchanged with a small all-gather.
"""

import torch
import torch.distributed as dist


def _check_pipeline(pipeline, splits):
    if pipeline not in ("auto", "serial", "chunked", "fused"):
        raise ValueError(
            f"pipeline must be one of 'auto', 'serial', 'chunked', 'fused', not {pipeline!r}")
    if not 1 <= int(splits) <= 16:
        raise ValueError(f"splits must be in 1..16, not {splits}")


def _operands(a, b, what):
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"{what}: a and b must be matrices, got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"{what}: a is {tuple(a.shape)} but b is {tuple(b.shape)}: "
                         f"a's columns must equal b's rows")
    if a.dtype != b.dtype or a.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"{what}: a and b must both be float32 or both bfloat16, got "
                        f"{a.dtype} and {b.dtype}")
    return a.contiguous(), b.contiguous()


def _gemm(a, b):
    return torch.matmul(a.float(), b.float())


def _all_gather_counts(pg, count):
    size = dist.get_world_size(pg)
    mine = torch.tensor([count], dtype=torch.int64)
    out = [torch.empty(1, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(out, mine, group=pg)
    return [int(t.item()) for t in out]


def _run_overlap(overlap):
    if overlap is not None:
        overlap()


def _gather_rows(pg, a, overlap):
    """Every rank's rows of the matrix a, in rank order; `overlap` runs while
    they move."""
    if a.dtype == torch.bfloat16:
        # gloo has no bf16; a gather only copies, so send the bits as f16.
        return _gather_rows(pg, a.view(torch.float16), overlap).view(torch.bfloat16)
    rows = _all_gather_counts(pg, a.shape[0])
    top = max(rows)
    padded = a if a.shape[0] == top else torch.cat(
        [a, a.new_zeros(top - a.shape[0], a.shape[1])])
    parts = [torch.empty_like(padded) for _ in rows]
    work = dist.all_gather(parts, padded, group=pg, async_op=True)
    _run_overlap(overlap)
    work.wait()
    return torch.cat([p[:r] for p, r in zip(parts, rows)])


def all_gather_matmul(pg, a, b, *, pipeline="auto", splits=4, gather_output=False,
                      overlap=None):
    """(gather_rows(a of every rank) @ b, the gathered a if gather_output else None)."""
    _check_pipeline(pipeline, splits)
    a, b = _operands(a, b, "all_gather_matmul")
    gathered = _gather_rows(pg, a, overlap)
    return _gemm(gathered, b), (gathered if gather_output else None)


def matmul_reduce_scatter(pg, a, b, m_local, *, pipeline="auto", splits=4, overlap=None):
    """This rank's m_local rows of the sum over ranks of a @ b."""
    _check_pipeline(pipeline, splits)
    a, b = _operands(a, b, "matmul_reduce_scatter")
    rows = _all_gather_counts(pg, int(m_local))
    if sum(rows) != a.shape[0]:
        raise ValueError(f"matmul_reduce_scatter: the ranks' m_local {rows} add up to "
                         f"{sum(rows)}, not to a's {a.shape[0]} rows")
    partial = _gemm(a, b)
    work = dist.all_reduce(partial, group=pg, async_op=True)
    _run_overlap(overlap)
    work.wait()
    first = sum(rows[:dist.get_rank(pg)])
    return partial[first:first + int(m_local)].clone()


def matmul_all_reduce(pg, a, b, *, pipeline="auto", splits=4, overlap=None):
    """The sum over ranks of a @ b, on every rank."""
    _check_pipeline(pipeline, splits)
    a, b = _operands(a, b, "matmul_all_reduce")
    partial = _gemm(a, b)
    work = dist.all_reduce(partial, group=pg, async_op=True)
    _run_overlap(overlap)
    work.wait()
    return partial


def all_gather_batch_matmul(pg, a, b, *, pipeline="auto", splits=4, gather_output=False,
                            overlap=None):
    """(c[e] = gather_rows(a[e]) @ b[e] (or the shared b [k, n]) for every
    entry e, the gathered a [batch, M, k] if gather_output else None)."""
    _check_pipeline(pipeline, splits)
    if a.dim() != 3 or b.dim() not in (2, 3):
        raise ValueError(f"all_gather_batch_matmul: a must be [batch, m, k] and b [batch, k, n] "
                         f"or [k, n], got {tuple(a.shape)} and {tuple(b.shape)}")
    if b.shape[-2] != a.shape[2] or (b.dim() == 3 and b.shape[0] != a.shape[0]):
        raise ValueError(f"all_gather_batch_matmul: a is {tuple(a.shape)} but b is "
                         f"{tuple(b.shape)}")
    if a.dtype != b.dtype or a.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"all_gather_batch_matmul: a and b must both be float32 or both "
                        f"bfloat16, got {a.dtype} and {b.dtype}")
    batch, m, k = a.shape
    # [batch, m, k] -> [m, batch * k]: a rank's rows of every entry are one
    # row block, gathered in one call.
    rows = _gather_rows(pg, a.transpose(0, 1).reshape(m, batch * k), overlap)
    gathered = rows.reshape(-1, batch, k).transpose(0, 1).contiguous()
    c = torch.matmul(gathered.float(), b.float())
    return c, (gathered if gather_output else None)
