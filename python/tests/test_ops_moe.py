"""mc2's MoE operators as torch functions: routing, dispatch + expert GEMM,
expert GEMM + combine, and the fused MLP, with their gradients.

Every rank builds every rank's tokens, routes (top-k: distinct experts per
token, some slots dropped with -1), gate weights and the experts' whole
weights from one seed, and computes the layer unsharded in float64 with
plain torch autograd: the reference. Each rank checks its own outputs and
the gradients of its tokens, its gate weights and its experts' weights.
"""

import pytest
import torch
import torch.nn.functional as F

import mc2


@pytest.fixture(scope="module")
def world():
    return mc2.world()


def close(got, want, tol=2e-4):
    got, want = got.double(), want.double()
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.numel() == 0:
        return
    scale = max(1.0, want.abs().max().item())
    err = (got - want).abs().max().item()
    assert err <= tol * scale, f"max error {err} > {tol} * {scale}"


class Case:
    """Every rank's tokens and routing, the experts' weights, one seed."""

    def __init__(self, p, seed, per_rank=2, topk=2, d=6, h1=8, h2=8):
        gen = torch.Generator().manual_seed(seed)
        self.p, self.E, self.topk, self.d, self.h1, self.h2 = p, per_rank * p, topk, d, h1, h2
        self.per = per_rank
        self.T = [3 + (q % 3) for q in range(p)]
        self.X = [torch.randn(t, d, generator=gen, dtype=torch.float64) for t in self.T]
        self.ids = []
        for t in self.T:
            rows = [torch.randperm(self.E, generator=gen)[:topk] for _ in range(t)]
            ids = torch.stack(rows).to(torch.int32)
            ids[0, -1] = -1  # a dropped slot
            self.ids.append(ids)
        self.probs = [torch.rand(t, topk, generator=gen, dtype=torch.float64) for t in self.T]
        self.W1 = torch.randn(self.E, d, h1, generator=gen, dtype=torch.float64)
        self.W2 = torch.randn(self.E, h2, d, generator=gen, dtype=torch.float64)
        self.dY = [torch.randn(t, d, generator=gen, dtype=torch.float64) for t in self.T]

    def received(self, rank):
        """(source rank, token, slot j, expert) of each row rank `rank`
        receives, in expert-grouped order."""
        rows = []
        for le in range(self.per):
            e = rank * self.per + le
            for q in range(self.p):
                for t in range(self.T[q]):
                    for j in range(self.topk):
                        if int(self.ids[q][t, j]) == e:
                            rows.append((q, t, j, e))
        return rows

    def mine(self, w, rank):
        return w[rank * self.per:(rank + 1) * self.per]


def test_route(world):
    p, r = world.size(), world.rank()
    c = Case(p, 21)
    routing = mc2.moe_route(c.ids[r], c.E)
    assert routing.num_received == len(c.received(r))
    assert routing.num_sent == int((c.ids[r] >= 0).sum())


def test_route_rejects_an_expert_named_twice(world):
    p, r = world.size(), world.rank()
    ids = torch.zeros(2, 2, dtype=torch.int32)
    ids[:, 1] = 1 if r != 0 else 0  # rank 0's tokens name expert 0 twice
    with pytest.raises(mc2.Error) as e:
        mc2.moe_route(ids, 2 * p)
    assert e.value.code == "invalid_argument"
    if r == 0:
        assert "names one expert twice" in e.value.message


@pytest.mark.parametrize("pipeline", ["serial", "chunked", "fused", "auto"])
def test_dispatch_and_combine(world, pipeline):
    p, r = world.size(), world.rank()
    c = Case(p, 22)
    # Reference: y rows (expert-grouped) and the combined output of every rank.
    X = [leaf(x) for x in c.X]
    P = [leaf(x) for x in c.probs]
    W1, W2 = leaf(c.W1), leaf(c.W2)
    recv = [c.received(q) for q in range(p)]
    ys = [torch.stack([X[q][t] @ W1[e] for q, t, j, e in recv[s]]) if recv[s] else
          torch.zeros(0, c.h1, dtype=torch.float64) for s in range(p)]
    gen = torch.Generator().manual_seed(23)
    dYs = [torch.randn(len(recv[s]), c.h1, generator=gen, dtype=torch.float64) for s in range(p)]
    hs = [torch.randn(len(recv[s]), c.h2, generator=gen, dtype=torch.float64) for s in range(p)]
    H = [leaf(x) for x in hs]
    outs = []
    for q in range(p):
        out = torch.zeros(c.T[q], c.d, dtype=torch.float64)
        for s in range(p):
            for i, (q2, t, j, e) in enumerate(recv[s]):
                if q2 == q:
                    out = out.index_add(0, torch.tensor([t]),
                                        (P[q][t, j] * (H[s][i] @ W2[e]))[None])
        outs.append(out)
    loss = sum((ys[s] * dYs[s]).sum() for s in range(p)) + \
        sum((outs[q] * c.dY[q]).sum() for q in range(p))
    loss.backward()

    routing = mc2.moe_route(c.ids[r], c.E)
    x, w1 = leaf(c.X[r], torch.float32), leaf(c.mine(c.W1, r), torch.float32)
    y, disp = mc2.all_to_all_matmul(x, w1, routing, dispatch_output=True, pipeline=pipeline,
                                    splits=2)
    close(y, ys[r].detach())
    close(disp, torch.stack([c.X[q][t] for q, t, j, e in recv[r]]) if recv[r] else
          torch.zeros(0, c.d))
    h, w2 = leaf(hs[r], torch.float32), leaf(c.mine(c.W2, r), torch.float32)
    probs = leaf(c.probs[r], torch.float32)
    out = mc2.matmul_all_to_all(h, w2, routing, probs=probs, pipeline=pipeline, splits=2)
    close(out, outs[r].detach())
    ((y * dYs[r].float()).sum() + (out * c.dY[r].float()).sum()).backward()
    close(x.grad, X[r].grad)
    close(w1.grad, c.mine(W1.grad, r))
    close(h.grad, H[r].grad)
    close(w2.grad, c.mine(W2.grad, r))
    close(probs.grad, P[r].grad)


@pytest.mark.parametrize("with_probs", [False, True])
def test_moe_mlp(world, with_probs):
    p, r = world.size(), world.rank()
    c = Case(p, 24, h1=10, h2=10)
    X = [leaf(x) for x in c.X]
    P = [leaf(x) for x in c.probs]
    W1, W2 = leaf(c.W1), leaf(c.W2)
    for q in range(p):
        out = torch.zeros(c.T[q], c.d, dtype=torch.float64)
        for t in range(c.T[q]):
            for j in range(c.topk):
                e = int(c.ids[q][t, j])
                if e >= 0:
                    row = F.gelu(X[q][t] @ W1[e]) @ W2[e]
                    out = out.index_add(0, torch.tensor([t]),
                                        ((P[q][t, j] if with_probs else 1.0) * row)[None])
        (out * c.dY[q]).sum().backward()
        if q == r:
            want = out.detach()

    routing = mc2.moe_route(c.ids[r], c.E)
    x = leaf(c.X[r], torch.float32)
    w1, w2 = leaf(c.mine(c.W1, r), torch.float32), leaf(c.mine(c.W2, r), torch.float32)
    probs = leaf(c.probs[r], torch.float32) if with_probs else None
    out = mc2.moe_mlp(x, w1, w2, routing, activation=F.gelu, probs=probs)
    close(out, want)
    (out * c.dY[r].float()).sum().backward()
    close(x.grad, X[r].grad)
    close(w1.grad, c.mine(W1.grad, r))
    close(w2.grad, c.mine(W2.grad, r))
    if with_probs:
        close(probs.grad, P[r].grad)


def leaf(x, dtype=torch.float64):
    return x.to(dtype).clone().requires_grad_()
