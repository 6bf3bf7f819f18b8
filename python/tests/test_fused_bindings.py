"""mc2._C's fused operators on torch tensors, on every rank count the suite
runs (mc2 run -n N): each result against the same product computed in
float64 by torch on the full inputs, which every rank builds from one seed.
"""
import pytest
import torch

import mc2
from mc2 import _C

G = mc2.world()
R, N = G.rank(), G.size()
PIPELINES = ["serial", "chunked", "fused", "auto"]


def full(seed, *shape):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen)


def rows_of(x, counts):
    """This rank's block of x's rows when rank r holds counts[r] rows."""
    start = sum(counts[:R])
    return x[start:start + counts[R]]


def close(got, want, dtype):
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert got.dtype == torch.float32
    assert got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max().item())


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_all_gather_matmul(pipeline, dtype):
    counts = [3 + 2 * r for r in range(N)]  # uneven shards
    a = full(1, sum(counts), 24).to(dtype)
    b = full(2, 24, 10 + R).to(dtype)       # n differs across ranks
    c, gathered = _C.all_gather_matmul(G, rows_of(a, counts), b, pipeline=pipeline, splits=3,
                                       gather_output=True)
    close(c, a.double() @ b.double(), dtype)
    assert gathered.dtype == dtype and torch.equal(gathered, a)
    c2, none = _C.all_gather_matmul(G, rows_of(a, counts), b, pipeline=pipeline)
    assert none is None and torch.equal(c2, c)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_matmul_reduce_scatter(pipeline):
    m_locals = [4 + r for r in range(N)]
    k_slices = [8 + 3 * r for r in range(N)]
    a = full(3, sum(m_locals), sum(k_slices))
    b = full(4, sum(k_slices), 12)
    k0 = sum(k_slices[:R])
    mine_a = a[:, k0:k0 + k_slices[R]]  # a column slice: not contiguous, copied
    assert N == 1 or not mine_a.is_contiguous()
    c = _C.matmul_reduce_scatter(G, mine_a, b[k0:k0 + k_slices[R]], m_locals[R],
                                 pipeline=pipeline, splits=2)
    close(c, rows_of(a.double() @ b.double(), m_locals), torch.float32)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_matmul_all_reduce(pipeline):
    a = full(5, 9, 8 * N)
    b = full(6, 8 * N, 7)
    ks = slice(8 * R, 8 * R + 8)
    c = _C.matmul_all_reduce(G, a[:, ks], b[ks], pipeline=pipeline)
    close(c, a.double() @ b.double(), torch.float32)


@pytest.mark.parametrize("shared", [False, True])
def test_all_gather_batch_matmul(shared):
    counts = [2 + r for r in range(N)]
    batch = 3
    a = full(7, batch, sum(counts), 16)
    b = full(8, 16, 5) if shared else full(8, batch, 16, 5)
    start = sum(counts[:R])
    c, gathered = _C.all_gather_batch_matmul(G, a[:, start:start + counts[R]], b,
                                             pipeline="fused", gather_output=True)
    close(c, a.double() @ b.double(), torch.float32)
    assert torch.equal(gathered, a)


def test_overlap_runs_once_during_the_call():
    calls = []
    a = full(9, 4 * N, 16)
    c, _ = _C.all_gather_matmul(G, a[4 * R:4 * R + 4], full(10, 16, 8), pipeline="chunked",
                                overlap=lambda: calls.append(1))
    assert calls == [1]
    close(c, a.double() @ full(10, 16, 8).double(), torch.float32)


def moe_inputs(T, topk, E):
    gen = torch.Generator().manual_seed(11 + R)
    ids = torch.randint(-1, E, (T, topk), generator=gen, dtype=torch.int64)
    x = torch.randn(T, 12, generator=gen)
    probs = torch.rand(T, topk, generator=gen)
    return ids, x, probs


def test_moe_dispatch_and_combine():
    E, topk, T = 2 * N, 2, 7
    per = E // N
    w1_all = full(12, E, 12, 6)       # every expert's weights, the same on every rank
    w2_all = full(13, E, 6, 12)
    ids, x, probs = moe_inputs(T, topk, E)
    routing = _C.moe_route(G, ids, E)
    assert routing.num_tokens == T and routing.experts_per_rank == per
    mine = slice(R * per, R * per + per)
    y1, dispatched = _C.all_to_all_matmul(G, routing, x, w1_all[mine], pipeline="fused",
                                          dispatch_output=True)
    assert y1.shape == (routing.num_received, 6)
    hidden = torch.relu(y1)
    out = _C.matmul_all_to_all(G, routing, hidden, w2_all[mine], probs=probs)
    # Reference: each token through its experts, probs-weighted, dropped slots skipped.
    want = torch.zeros(T, 12, dtype=torch.float64)
    for t in range(T):
        for j in range(topk):
            e = int(ids[t, j])
            if e >= 0:
                h = torch.relu(x[t].double() @ w1_all[e].double())
                want[t] += probs[t, j].double() * (h @ w2_all[e].double())
    close(out, want, torch.float32)
    # The same layer in one call, with a Python activation.
    out2, dx, y1b, hid = _C.moe_mlp(G, routing, x, w1_all[mine], w2_all[mine],
                                    activation=torch.relu, probs=probs, save=True)
    close(out2, want, torch.float32)
    assert torch.equal(dx, dispatched) and torch.equal(y1b, y1)


def test_bad_dtype_on_one_rank_raises_everywhere():
    b = full(14, 8, 4)
    if R == N - 1:
        b = b.double()
    with pytest.raises(mc2.Error) as e:
        _C.matmul_all_reduce(G, full(15, 3, 8), b)
    assert e.value.code == "invalid_argument" and e.value.op == "matmul_all_reduce"
    assert ("float32 or bfloat16" in str(e.value)) == (R == N - 1)
    # The group is still usable afterwards.
    c = _C.matmul_all_reduce(G, full(15, 3, 8), full(14, 8, 4))
    close(c, N * (full(15, 3, 8).double() @ full(14, 8, 4).double()), torch.float32)


def test_unknown_pipeline_names_the_choices():
    with pytest.raises(mc2.Error, match=r"unknown pipeline 'bogus' \(serial, chunked, fused, auto\)"):
        _C.matmul_all_reduce(G, full(15, 3, 8), full(14, 8, 4), pipeline="bogus")


@pytest.mark.skipif(N == 1, reason="needs ranks that disagree")
def test_shapes_that_disagree_raise_mismatch_everywhere():
    k = 8 if R == 0 else 9  # the gathered operand's width must agree
    with pytest.raises(mc2.Error) as e:
        _C.all_gather_matmul(G, full(16, 2, k), full(17, k, 3))
    assert e.value.code == "mismatch"
