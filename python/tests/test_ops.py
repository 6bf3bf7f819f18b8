"""mc2's fused operators as torch functions (mc2.ops, mc2.autograd), on
the mc2 world of `mc2 run -n N`, every rank running this file.

Every rank builds the same full inputs from one seed and computes the
unsharded result and its gradients in float64 with plain torch: the
reference. Each rank then feeds the operator its shard and checks its part
of the output and of the gradients. The operators compute in float32 (or
bf16 with f32 accumulation), so the checks use f32 tolerances.

gradcheck: the operators take no float64, so torch.autograd.gradcheck runs
in float32 on a function that is exact under finite differences: each
operator is linear in each input, so a central difference with any step
gives the derivative up to rounding, and a large step (0.5) keeps the f32
rounding of the operator far below the tolerance. To check the distributed
backward (whose gradient of one rank's input needs every rank's output
gradient), the checked function is global: every rank holds every rank's
inputs, uses its own shard, and the output is every rank's result,
replicated (summed over the group); input gradients are summed over the
group too. Then the Jacobian gradcheck measures, perturbing an element on
every rank at once, is the whole operator's, and so is the one backward
gives.
"""

import re

import pytest
import torch

import mc2
from mc2._comm import resolve

PIPELINES = ["serial", "chunked", "fused", "auto"]


@pytest.fixture(scope="module")
def world():
    return mc2.world()


def shares(total, size, uneven):
    """Row counts of `size` ranks adding up to `total`; uneven: rank 1 gets none."""
    if not uneven or size == 1:
        base, extra = divmod(total, size)
        return [base + (r < extra) for r in range(size)]
    counts = [0] * size
    others = [r for r in range(size) if r != 1]
    for i in range(total):
        counts[others[i % len(others)]] += 1
    return counts


def offset(counts, rank):
    return sum(counts[:rank])


def rnd(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def leaf(x, dtype=torch.float32):
    return x.to(dtype).clone().requires_grad_()


def close(got, want, tol=2e-4):
    got, want = got.double(), want.double()
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    err = (got - want).abs().max().item() if want.numel() else 0.0
    assert err <= tol * scale, f"max error {err} > {tol} * {scale}"


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("uneven", [False, True])
def test_all_gather_matmul(world, pipeline, uneven):
    p, r = world.size(), world.rank()
    gen = torch.Generator().manual_seed(11)
    rows = shares(3 * p + 2, p, uneven)
    M, k = sum(rows), 9
    ns = [5 + (q % 3) for q in range(p)]  # column blocks of different widths
    A, Bs, biases = rnd(gen, M, k), [rnd(gen, k, n) for n in ns], [rnd(gen, n) for n in ns]
    dYs = [rnd(gen, M, n) for n in ns]
    # Reference: every rank's output is gather(A) @ B_q + bias_q; the loss
    # is the sum over ranks of <output, dY>.
    Ar, Br, br = leaf(A, torch.float64), [leaf(b, torch.float64) for b in Bs], \
        [leaf(b, torch.float64) for b in biases]
    sum(((Ar @ Br[q] + br[q]) * dYs[q]).sum() for q in range(p)).backward()

    lo = offset(rows, r)
    a, b, bias = leaf(A[lo:lo + rows[r]]), leaf(Bs[r]), leaf(biases[r])
    out, gathered = mc2.all_gather_matmul(a, b, bias=bias, gather_output=True,
                                          pipeline=pipeline, splits=3)
    close(out, A @ Bs[r] + biases[r])
    close(gathered, A)
    (out * dYs[r].float()).sum().backward()
    close(a.grad, Ar.grad[lo:lo + rows[r]])
    close(b.grad, Br[r].grad)
    close(bias.grad, br[r].grad)


def test_all_gather_matmul_gathered_output_gradient(world):
    """A loss on the gathered copy adds its gradient, reduced over ranks,
    to the shard's."""
    p, r = world.size(), world.rank()
    gen = torch.Generator().manual_seed(12)
    rows = shares(2 * p + 1, p, False)
    M, k, n = sum(rows), 6, 4
    A, Bs = rnd(gen, M, k), [rnd(gen, k, n) for _ in range(p)]
    dYs, dGs = [rnd(gen, M, n) for _ in range(p)], [rnd(gen, M, k) for _ in range(p)]
    Ar = leaf(A, torch.float64)
    sum(((Ar @ Bs[q]) * dYs[q]).sum() + (Ar * dGs[q]).sum() for q in range(p)).backward()

    lo = offset(rows, r)
    a = leaf(A[lo:lo + rows[r]])
    out, gathered = mc2.all_gather_matmul(a, Bs[r].float(), gather_output=True)
    ((out * dYs[r].float()).sum() + (gathered * dGs[r].float()).sum()).backward()
    close(a.grad, Ar.grad[lo:lo + rows[r]])


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("uneven", [False, True])
def test_matmul_reduce_scatter(world, pipeline, uneven):
    p, r = world.size(), world.rank()
    gen = torch.Generator().manual_seed(13)
    rows = shares(3 * p + 1, p, uneven)
    M, n = sum(rows), 7
    ks = [4 + (q % 3) for q in range(p)]  # each rank's slice of the reduction
    As, Bs, bias = [rnd(gen, M, kq) for kq in ks], [rnd(gen, kq, n) for kq in ks], rnd(gen, n)
    dY = rnd(gen, M, n)
    Ar, Br = [leaf(x, torch.float64) for x in As], [leaf(x, torch.float64) for x in Bs]
    br = leaf(bias, torch.float64)
    Y = sum(Ar[q] @ Br[q] for q in range(p)) + br
    (Y * dY).sum().backward()

    lo = offset(rows, r)
    a, b, bi = leaf(As[r]), leaf(Bs[r]), leaf(bias)
    y = mc2.matmul_reduce_scatter(a, b, m_local=rows[r], bias=bi, pipeline=pipeline, splits=2)
    close(y, Y.detach()[lo:lo + rows[r]])
    (y * dY[lo:lo + rows[r]].float()).sum().backward()
    close(a.grad, Ar[r].grad)
    close(b.grad, Br[r].grad)
    close(bi.grad, br.grad)  # the sum over every rank's rows


def test_matmul_reduce_scatter_default_split_and_3d(world):
    """m_local defaults to an even split of the first dimension; leading
    dimensions are rows."""
    p, r = world.size(), world.rank()
    gen = torch.Generator().manual_seed(14)
    S, batch, k, n = 2 * p + 1, 3, 5, 4
    As, Bs = [rnd(gen, S, batch, k) for _ in range(p)], [rnd(gen, k, n) for _ in range(p)]
    Y = sum(As[q] @ Bs[q] for q in range(p))
    counts = shares(S, p, False)
    lo = offset(counts, r)
    y = mc2.matmul_reduce_scatter(As[r].float(), Bs[r].float())
    close(y, Y[lo:lo + counts[r]])


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_matmul_all_reduce(world, pipeline):
    p, r = world.size(), world.rank()
    gen = torch.Generator().manual_seed(15)
    m, n = 2 * p + 3, 6
    ks = [3 + q for q in range(p)]
    As, Bs = [rnd(gen, m, kq) for kq in ks], [rnd(gen, kq, n) for kq in ks]
    bias, x3, dY = rnd(gen, n), rnd(gen, m, n), rnd(gen, m, n)
    Ar, Br = [leaf(x, torch.float64) for x in As], [leaf(x, torch.float64) for x in Bs]
    br, x3r = leaf(bias, torch.float64), leaf(x3, torch.float64)
    Y = sum(Ar[q] @ Br[q] for q in range(p)) + br + x3r
    (Y * dY).sum().backward()  # the replicated output's loss, counted once

    a, b, bi, x = leaf(As[r]), leaf(Bs[r]), leaf(bias), leaf(x3)
    y = mc2.matmul_all_reduce(a, b, bias=bi, x3=x, pipeline=pipeline)
    close(y, Y.detach())
    (y * dY.float()).sum().backward()
    close(a.grad, Ar[r].grad)
    close(b.grad, Br[r].grad)
    close(bi.grad, br.grad)
    close(x.grad, x3r.grad)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_all_gather_batch_matmul(world, shared, pipeline):
    p, r = world.size(), world.rank()
    gen = torch.Generator().manual_seed(16)
    batch, k = 3, 5
    rows = shares(2 * p + 1, p, False)
    M = sum(rows)
    ns = [4 + (q % 2) for q in range(p)]
    A = rnd(gen, batch, M, k)
    Bs = [rnd(gen, k, n) if shared else rnd(gen, batch, k, n) for n in ns]
    dYs = [rnd(gen, batch, M, n) for n in ns]
    Ar, Br = leaf(A, torch.float64), [leaf(x, torch.float64) for x in Bs]
    sum((torch.matmul(Ar, Br[q]) * dYs[q]).sum() for q in range(p)).backward()

    lo = offset(rows, r)
    a, b = leaf(A[:, lo:lo + rows[r]]), leaf(Bs[r])
    out, gathered = mc2.all_gather_batch_matmul(a, b, gather_output=True, pipeline=pipeline,
                                                splits=2)
    close(out, torch.matmul(A, Bs[r]))
    close(gathered, A)
    (out * dYs[r].float()).sum().backward()
    close(a.grad, Ar.grad[:, lo:lo + rows[r]])
    close(b.grad, Br[r].grad)


def test_bfloat16(world):
    """bf16 operands: bf16 results and gradients, f32 accumulation."""
    p, r = world.size(), world.rank()
    gen = torch.Generator().manual_seed(17)
    rows = shares(2 * p, p, False)
    M, k, n = sum(rows), 16, 8
    A = rnd(gen, M, k).bfloat16().double()  # exactly representable in bf16
    B = rnd(gen, k, n).bfloat16().double()
    dY = rnd(gen, M, n).bfloat16().double()
    lo = offset(rows, r)
    a, b = leaf(A[lo:lo + rows[r]], torch.bfloat16), leaf(B, torch.bfloat16)
    out, _ = mc2.all_gather_matmul(a, b)
    assert out.dtype == torch.bfloat16
    close(out, A @ B, tol=1e-2)
    (out.float() * dY.float()).sum().backward()
    assert a.grad.dtype == torch.bfloat16 and b.grad.dtype == torch.bfloat16
    close(a.grad, (p * dY @ B.t())[lo:lo + rows[r]], tol=2e-2)
    close(b.grad, A.t() @ dY, tol=2e-2)


# ---------------------------------------------------------------- gradcheck

class _SumGradOverRanks(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the group (every
    rank holds the same full input and uses only its shard of it)."""

    @staticmethod
    def forward(ctx, comm, x):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        flat = g.reshape(-1, 1).contiguous()
        total = ctx.comm.matmul_all_reduce(flat, torch.ones(1, 1), pipeline="serial", splits=1)
        return None, total.reshape(g.shape)


def _replicate(comm, parts, rank):
    """Every rank's output, each in its own rows of one [sum of rows, w]
    matrix, on every rank (the sum over ranks of a zero-padded copy)."""
    width = parts[rank].shape[1]
    total = sum(x.shape[0] for x in parts)
    return mc2.matmul_all_reduce(
        torch.cat([torch.zeros(sum(x.shape[0] for x in parts[:rank]), width), parts[rank],
                   torch.zeros(sum(x.shape[0] for x in parts[rank + 1:]), width)])
        .reshape(total, width), torch.eye(width), group=comm.group)


@pytest.mark.filterwarnings("ignore:Input #.* requires gradient and is not a double")
def test_gradcheck_all_gather_matmul_and_matmul_reduce_scatter(world):
    p, r = world.size(), world.rank()
    comm = resolve(world)
    gen = torch.Generator().manual_seed(18)
    rows = shares(p + 2, p, False)
    M, k, n = sum(rows), 3, 2
    lo = offset(rows, r)
    A = leaf(rnd(gen, M, k))
    B = leaf(rnd(gen, k, n * p))  # rank q's block: columns [q n, q n + n)

    def agmm(A, B):
        A, B = _SumGradOverRanks.apply(comm, A), _SumGradOverRanks.apply(comm, B)
        out, _ = mc2.all_gather_matmul(A[lo:lo + rows[r]], B[:, r * n:r * n + n].contiguous(),
                                       group=world)
        parts = [torch.zeros(M, n) for _ in range(p)]
        parts[r] = out
        return _replicate(comm, parts, r)

    assert torch.autograd.gradcheck(agmm, (A, B), eps=0.5, atol=1e-3, rtol=1e-3)

    As = leaf(rnd(gen, M, k * p))  # rank q's reduction slice: columns [q k, q k + k)
    Bs = leaf(rnd(gen, k * p, n))

    def mmrs(As, Bs):
        As, Bs = _SumGradOverRanks.apply(comm, As), _SumGradOverRanks.apply(comm, Bs)
        y = mc2.matmul_reduce_scatter(As[:, r * k:r * k + k].contiguous(),
                                      Bs[r * k:r * k + k], m_local=rows[r], group=world)
        parts = [torch.zeros(rows[q], n) for q in range(p)]
        parts[r] = y
        return _replicate(comm, parts, r)

    assert torch.autograd.gradcheck(mmrs, (As, Bs), eps=0.5, atol=1e-3, rtol=1e-3)


def test_bad_dtype_raises_on_every_rank(world):
    """float64 operands on one rank: mc2.Error on every rank, no hang."""
    r = world.rank()
    dtype = torch.float64 if r == 0 else torch.float32
    a, b = torch.ones(2, 3, dtype=dtype), torch.ones(3, 2, dtype=dtype)
    with pytest.raises(mc2.Error):
        mc2.all_gather_matmul(a, b)
    # The group still works.
    out, _ = mc2.all_gather_matmul(torch.ones(1, 3), torch.ones(3, 2))
    close(out, torch.full((world.size(), 2), 3.0))


def test_mismatched_shapes_raise_on_every_rank(world):
    """k differs across ranks (only the shard's rows may): mc2.Error('mismatch')
    everywhere, before any data moves, and the group stays usable
    (docs/python-ops.md, "Errors")."""
    if world.size() == 1:
        pytest.skip("needs two ranks")
    k = 4 if world.rank() == 0 else 5
    with pytest.raises(mc2.Error) as e:
        mc2.all_gather_matmul(torch.ones(2, k), torch.ones(k, 3))
    assert e.value.code == "mismatch", e.value
    out, _ = mc2.all_gather_matmul(torch.ones(1, 3), torch.ones(3, 2))
    close(out, torch.full((world.size(), 2), 3.0))


BAD_ADDENDS = [
    ("bias", "wrong shape", lambda n: torch.ones(n + 1), "bias must have shape"),
    ("bias", "wrong dtype", lambda n: torch.ones(n, dtype=torch.int64), "bias has dtype"),
    ("bias", "not a tensor", lambda n: [1.0] * n, "bias must be a torch.Tensor"),
    ("x3", "wrong shape", lambda n: torch.ones(4, n), "x3 .* must have shape"),
    ("x3", "wrong dtype", lambda n: torch.ones(3, n, dtype=torch.float64), "x3 .* has dtype"),
]


@pytest.mark.parametrize("name,why,make,message", BAD_ADDENDS, ids=[f"{b[0]}-{b[1]}"
                                                                     for b in BAD_ADDENDS])
def test_bad_bias_or_x3_on_one_rank_fails_every_rank(world, name, why, make, message):
    """bias and x3 are checked in Python; a bad one on the last rank only
    fails the call on every rank with mc2.Error('invalid_argument') (not a
    timeout: the check rides on the operator's own agreement), and the
    group stays usable."""
    p, r = world.size(), world.rank()
    bad = r == p - 1
    a, b, n = torch.ones(3, 2), torch.ones(2, 5), 5
    kw = {name: make(n) if bad else (torch.ones(n) if name == "bias" else torch.ones(3, n))}
    calls = [lambda: mc2.matmul_all_reduce(a, b, **kw)]
    if name == "bias":
        calls += [lambda: mc2.all_gather_matmul(a, b, **kw),
                  lambda: mc2.matmul_reduce_scatter(torch.ones(3 * p, 2), b, **kw)]
    for call in calls:
        with pytest.raises(mc2.Error) as e:
            call()
        assert e.value.code == "invalid_argument", e.value
        if bad:
            assert e.value.rank == r
            assert re.search(message, e.value.message), e.value.message
        else:
            assert f"rank {p - 1} passed invalid arguments" in e.value.message
    # The group is usable: a good call gives every rank the sum.
    y = mc2.matmul_all_reduce(a, b, bias=torch.ones(n))
    close(y, torch.full((3, n), 2.0 * p + 1))


def test_npu_names(world):
    """torch_npu's names and arguments: the same results as mc2's."""
    p, r = world.size(), world.rank()
    gen = torch.Generator().manual_seed(19)
    m, k, n = 2 * p + 1, 5, 3  # m need not divide by the rank count
    A, B, bias = rnd(gen, p * m, k).float(), rnd(gen, k, n).float(), rnd(gen, n).float()
    x = A[r * m:(r + 1) * m]
    out, g = mc2.npu_all_gather_base_mm(x, B, world, p, bias=bias, gather_index=0,
                                        gather_output=True, comm_turn=0)
    close(out, A.double() @ B.double() + bias.double())
    close(g, A)
    out, g = mc2.npu_all_gather_base_mm(x, B, world, p, gather_output=False)
    assert g is None
    y = mc2.npu_mm_reduce_scatter_base(A, B, world, p, reduce_op="sum", bias=bias)
    counts = shares(p * m, p, False)
    lo = offset(counts, r)
    close(y, (p * (A.double() @ B.double()) + bias.double())[lo:lo + counts[r]])
    x3 = rnd(gen, p * m, n).float()
    z = mc2.npu_mm_all_reduce_base(A, B, world, reduce_op="sum", bias=bias, x3=x3)
    close(z, p * (A.double() @ B.double()) + bias.double() + x3.double())
    with pytest.raises(mc2.Error, match="reduce_op must be 'sum'"):
        mc2.npu_mm_all_reduce_base(A, B, world, reduce_op="max")
    with pytest.raises(mc2.Error, match=f"world_size is {p + 1}"):
        mc2.npu_all_gather_base_mm(x, B, world, p + 1)
