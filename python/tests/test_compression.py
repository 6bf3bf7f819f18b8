"""Compressed all-reduces from Python (mc2.all_reduce(compression=...),
mc2.Compressor, mc2.ddp.compressed_hook) against references computed here
with torch from every rank's input (each rank can make every rank's input:
they are seeded by rank).

The inputs are chosen so that every f32 sum the schemes make is exact
(16-bit values of one binade; multiples of 2^-10 below 2^8), whatever the
order: the results are then compared bitwise, and the references need not
follow mc2's canonical reduction order.
"""
import math

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import mc2

mc2.init_process_group()
W = mc2.world()
R, N = W.rank(), W.size()


def rank_input(r, n, seed, kind):
    g = torch.Generator().manual_seed(1000 * seed + r)
    if kind == "half":
        # +-[1, 2): after rounding to f16 or bf16, 4 of them sum exactly in f32.
        mag = 1 + torch.rand(n, generator=g)
        sign = torch.randint(0, 2, (n,), generator=g) * 2 - 1
        return (mag * sign).float()
    # Multiples of 2^-10 in (-4, 4): sums of a few are exact in f32.
    return (torch.randint(-4096, 4097, (n,), generator=g).float() / 1024)


def mean_or_sum(parts, op):
    s = parts[0].clone()
    for p in parts[1:]:
        s = s + p
    return s / N if op == "avg" else s


def ref_cast(xs, half, op):
    wide = [x.to(half).float() for x in xs]
    return mean_or_sum(wide, op).to(half).float()


def topk_select(g, starts, ratio):
    """(sent, residual) of top-k per segment: largest |g|, ties to the lower index."""
    sent = torch.zeros_like(g)
    bounds = list(starts) + [g.numel()]
    for a, b in zip(bounds[:-1], bounds[1:]):
        seg = g[a:b]
        k = min(max(1, math.ceil(seg.numel() * ratio)), seg.numel())
        order = torch.sort(-seg.abs(), stable=True).indices[:k]
        sent[a + order] = seg[order]
    return sent, g - sent


def threshold_select(g, t):
    keep = g.abs() >= t
    sent = torch.where(keep, g, torch.zeros_like(g))
    return sent, g - sent


@pytest.mark.parametrize("scheme,half", [("f16", torch.float16), ("bf16", torch.bfloat16)])
@pytest.mark.parametrize("op", ["avg", "sum"])
def test_casts_match_reference(scheme, half, op):
    n = 1000 + 7  # not a multiple of the ranks: padding
    xs = [rank_input(r, n, 1, "half") for r in range(N)]
    t = xs[R].clone()
    mc2.all_reduce(t, op=op, compression=scheme)
    assert torch.equal(t, ref_cast(xs, half, op))


@pytest.mark.parametrize("op", ["avg", "sum"])
def test_threshold_matches_reference(op):
    n, thr = 777, 2.5
    xs = [rank_input(r, n, 2, "grid") for r in range(N)]
    t = xs[R].clone()
    mc2.all_reduce(t, op=op, compression="threshold", threshold=thr)
    sent = [threshold_select(x, thr)[0] for x in xs]
    assert torch.equal(t, mean_or_sum(sent, op))


def test_topk_matches_reference_async_noncontiguous():
    n, ratio = 500, 0.05
    xs = [rank_input(r, n, 3, "grid") for r in range(N)]
    big = torch.zeros(n, 2)
    big[:, 0] = xs[R]
    t = big[:, 0]  # not contiguous: reduced in a copy, copied back
    work = mc2.all_reduce(t, op="avg", compression="topk", topk_ratio=ratio, async_op=True)
    work.wait()
    sent = [topk_select(x, [0], ratio)[0] for x in xs]
    assert torch.equal(big[:, 0], mean_or_sum(sent, "avg"))
    assert torch.equal(big[:, 1], torch.zeros(n))


@pytest.mark.parametrize("scheme", ["topk", "threshold"])
def test_error_feedback_conserves_the_residual(scheme):
    n, ratio, thr = 300, 0.1, 3.0
    starts = [0, 100, 250]
    c = mc2.Compressor(scheme, threshold=thr, topk_ratio=ratio)
    res = [torch.zeros(n) for _ in range(N)]
    wire = 0
    for step in range(3):
        xs = [rank_input(r, n, 10 + step, "grid") for r in range(N)]
        t = xs[R].clone()
        c.all_reduce(t, key="w", segments=starts if scheme == "topk" else None)
        sent = []
        for r in range(N):
            g = xs[r] + res[r]
            if scheme == "topk":
                s, res[r] = topk_select(g, starts, ratio)
                pairs = sum(math.ceil(b * ratio) for b in (100, 150, 50))
            else:
                s, res[r] = threshold_select(g, thr)
                pairs = int((g.abs() >= thr).sum())
                if r == R:
                    wire += 8 * (N - 1)  # the pair counts
            if r != R:
                wire += 8 * pairs  # (index, value) pairs of the other ranks
            sent.append(s)
            if r == R:
                # sent + new residual == gradient + old residual, exactly
                assert torch.equal(s + res[r], g)
        assert torch.equal(c.residual("w"), res[R]), f"step {step}"
        assert torch.equal(t, mean_or_sum(sent, "avg")), f"step {step}"
    # Bytes this rank received (none with one rank), and the uncompressed all-reduce's.
    assert c.wire_bytes == (wire if N > 1 else 0)
    assert c.dense_bytes == (3 * (2 * (N - 1) * n * 4 // N) if N > 1 else 0)
    assert c.calls == 3


def test_caller_owned_residual():
    n, ratio = 64, 0.25
    x = rank_input(R, n, 20, "grid")
    residual = torch.zeros(n)
    t = x.clone()
    mc2.all_reduce(t, op="sum", compression="topk", topk_ratio=ratio, residual=residual)
    sent, rest = topk_select(x, [0], ratio)
    assert torch.equal(residual, rest)
    assert int((residual != 0).sum()) <= n - 16


def bad_calls():
    t = torch.ones(8)
    yield lambda: mc2.all_reduce(t, compression="zip")
    yield lambda: mc2.all_reduce(t, compression="topk", topk_ratio=0.0)
    yield lambda: mc2.all_reduce(t, compression="topk", topk_ratio=1.5)
    yield lambda: mc2.all_reduce(t, compression="threshold", threshold=-1.0)
    yield lambda: mc2.all_reduce(t, compression="threshold", threshold=float("nan"))
    yield lambda: mc2.all_reduce(t, op="max", compression="bf16")
    yield lambda: mc2.all_reduce(t, compression="bf16", algorithm="ring")
    yield lambda: mc2.all_reduce(torch.ones(8, dtype=torch.float64), compression="bf16")
    yield lambda: mc2.all_reduce(t, compression="topk", residual=torch.zeros(7))
    yield lambda: mc2.all_reduce(t, compression="topk", residual=torch.zeros(8, dtype=torch.int32))
    yield lambda: mc2.all_reduce(t, compression="bf16", residual=torch.zeros(8))
    yield lambda: mc2.Compressor("topk", topk_ratio=2)
    yield lambda: mc2.Compressor("lz4")
    yield lambda: mc2.Compressor("topk").all_reduce(t, key="k", segments=[0, 9])
    yield lambda: mc2.ddp.CompressionState(scheme="nope")
    yield lambda: mc2.ddp.compressed_hook(None, None)


def test_bad_arguments_raise_invalid_argument_on_every_rank():
    for i, call in enumerate(bad_calls()):
        with pytest.raises(mc2.Error) as e:
            call()
        assert e.value.code == "invalid_argument", f"call {i}: {e.value}"
    c = mc2.Compressor("topk")
    c.all_reduce(torch.ones(8), key="k")
    with pytest.raises(mc2.Error) as e:
        c.all_reduce(torch.ones(9), key="k")
    assert e.value.code == "invalid_argument"
    # The group still works after them.
    t = torch.full((4,), float(R))
    mc2.all_reduce(t, op="sum", compression="bf16")
    assert torch.equal(t, torch.full((4,), float(N * (N - 1) // 2)))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def local_grads(model, r):
    g = torch.Generator().manual_seed(50 + r)
    x, y = torch.randn(6, 16, generator=g), torch.randn(6, 4, generator=g)
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()], (x, y)


@pytest.mark.parametrize("scheme", ["bf16", "topk"])
def test_ddp_compressed_hook_matches_reference(scheme):
    torch.manual_seed(5)
    plain = Net()
    ddp = DDP(Net(), gradient_as_bucket_view=True)
    ddp.module.load_state_dict(plain.state_dict())
    state = mc2.ddp.CompressionState(scheme=scheme, topk_ratio=0.2)
    ddp.register_comm_hook(state, mc2.ddp.compressed_hook)
    grads = [local_grads(plain, r)[0] for r in range(N)]
    x, y = local_grads(plain, R)[1]
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    for i, p in enumerate(ddp.module.parameters()):
        gs = [g[i].reshape(-1) for g in grads]
        if scheme == "bf16":
            want = ref_cast(gs, torch.bfloat16, "avg")
            # Sums of arbitrary gradients: the order may move the last f32 bit.
            torch.testing.assert_close(p.grad.reshape(-1), want, rtol=2 ** -7, atol=1e-7)
        else:
            sel = [topk_select(g, [0], 0.2) for g in gs]
            torch.testing.assert_close(p.grad.reshape(-1), mean_or_sum([s for s, _ in sel], "avg"),
                                       rtol=1e-6, atol=1e-7)
            # The residual is kept per parameter: what this rank did not send.
            assert torch.equal(state.compressor.residual(p), sel[R][1])
    if N > 1:
        assert 0 < state.wire_bytes < state.dense_bytes
    assert state.steps == 1
