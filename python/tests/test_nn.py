"""mc2.nn's tensor-parallel layers against the same layers unsharded.

Every rank builds the same torch.nn.Linear layers from one seed and runs
them on the whole input in float64: the reference. The parallel layers are
sharded from those (from_linear), or made fresh from the same seed, and run
on the mc2 world of `mc2 run -n N` (every rank running this file) or on a
group split from it. Outputs, input gradients and every parameter's
gradient must equal this rank's part of the reference's (f32 tolerances:
the operators compute in float32), and so must the parameters after a few
SGD steps.
"""

import pytest
import torch
import torch.nn.functional as F

import mc2
import mc2.nn as mnn


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


def split(n, size, rank):
    base, extra = divmod(n, size)
    return rank * base + min(rank, extra), base + (rank < extra)


class Mlp(torch.nn.Module):
    def __init__(self, h, f):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(h, f), torch.nn.Linear(f, h)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def parallel_mlp(ref, group, sp, **kw):
    fc1 = mnn.ColumnParallelLinear.from_linear(ref.fc1, group=group, sequence_parallel=sp, **kw)
    fc2 = mnn.RowParallelLinear.from_linear(ref.fc2, group=group, sequence_parallel=sp, **kw)
    return fc1, fc2


def check_mlp(group, rank, size, sp, pipeline, seq=7, batch=2, h=6, f=10):
    torch.manual_seed(3)
    ref = Mlp(h, f)
    fc1, fc2 = parallel_mlp(ref, group, sp, pipeline=pipeline, splits=2)
    ref = ref.double()
    X, dY = torch.randn(seq, batch, h, dtype=torch.float64), torch.randn(seq, batch, h,
                                                                          dtype=torch.float64)
    Xr = X.clone().requires_grad_()
    Y = ref(Xr)
    (Y * dY).sum().backward()

    s0, s = split(seq, size, rank)
    x = (X[s0:s0 + s] if sp else X).float().requires_grad_()
    y = fc2(F.gelu(fc1(x)))
    want_y = Y.detach()[s0:s0 + s] if sp else Y.detach()
    close(y, want_y)
    (y * (dY[s0:s0 + s] if sp else dY).float()).sum().backward()
    close(x.grad, Xr.grad[s0:s0 + s] if sp else Xr.grad)
    c0, c = split(f, size, rank)  # fc1's output features, fc2's input features
    close(fc1.weight.grad, ref.fc1.weight.grad[c0:c0 + c].t())
    close(fc1.bias.grad, ref.fc1.bias.grad[c0:c0 + c])
    close(fc2.weight.grad, ref.fc2.weight.grad[:, c0:c0 + c].t())
    close(fc2.bias.grad, ref.fc2.bias.grad)


@pytest.mark.parametrize("pipeline", ["serial", "chunked", "fused", "auto"])
@pytest.mark.parametrize("sp", [True, False])
def test_mlp_equals_unsharded(world, sp, pipeline):
    check_mlp(world, world.rank(), world.size(), sp, pipeline)


def test_mlp_on_a_split_group(world):
    """Two groups side by side (ranks 0..p/2-1 and the rest), each its own TP group."""
    rank, size = world.rank(), world.size()
    half = (size + 1) // 2
    color = 0 if rank < half else 1
    group = world.split(color, rank)
    assert group.size() == (half if color == 0 else size - half)
    check_mlp(group, group.rank(), group.size(), True, "auto")


def test_fresh_layers_hold_their_block_of_one_init(world):
    """A fresh layer initialises the whole matrix as torch.nn.Linear does
    (from torch's generator, seeded alike on every rank) and keeps its block."""
    rank, size = world.rank(), world.size()
    torch.manual_seed(5)
    col = mnn.ColumnParallelLinear(6, 9)
    torch.manual_seed(5)
    ref = torch.nn.Linear(6, 9)
    c0, c = split(9, size, rank)
    assert torch.equal(col.weight.detach(), ref.weight.detach()[c0:c0 + c].t())
    assert torch.equal(col.bias.detach(), ref.bias.detach()[c0:c0 + c])
    torch.manual_seed(5)
    row = mnn.RowParallelLinear(9, 6)
    torch.manual_seed(5)
    ref = torch.nn.Linear(9, 6)
    assert torch.equal(row.weight.detach(), ref.weight.detach()[:, c0:c0 + c].t())
    assert torch.equal(row.bias.detach(), ref.bias.detach())


def test_training_equals_unsharded(world):
    """Three SGD steps with a sequence-parallel LayerNorm in front of the
    MLP (its gradient summed over the group by allreduce_grads): the
    parameters stay equal to the unsharded model's."""
    rank, size = world.rank(), world.size()
    torch.manual_seed(7)
    h, f, seq = 8, 12, 2 * size + 3
    ln, ref = torch.nn.LayerNorm(h), Mlp(h, f)
    pln = torch.nn.LayerNorm(h)
    pln.load_state_dict(ln.state_dict())
    fc1, fc2 = parallel_mlp(ref, world, True)
    params = list(pln.parameters()) + list(fc1.parameters()) + list(fc2.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    ref_opt = torch.optim.SGD(list(ln.parameters()) + list(ref.parameters()), lr=0.1)
    s0, s = split(seq, size, rank)
    for step in range(3):
        X = torch.randn(seq, h)
        ref_opt.zero_grad()
        ((ref(ln(X)) + X) ** 2).sum().backward()
        ref_opt.step()
        opt.zero_grad()
        x = X[s0:s0 + s]
        ((fc2(F.gelu(fc1(pln(x)))) + x) ** 2).sum().backward()
        mnn.allreduce_grads(list(pln.parameters()), world)
        opt.step()
    c0, c = split(f, size, rank)
    close(pln.weight, ln.weight.detach())
    close(pln.bias, ln.bias.detach())
    close(fc1.weight, ref.fc1.weight.detach()[c0:c0 + c].t())
    close(fc2.weight, ref.fc2.weight.detach()[:, c0:c0 + c].t())
    close(fc2.bias, ref.fc2.bias.detach())


def test_bfloat16_layers(world):
    rank, size = world.rank(), world.size()
    torch.manual_seed(9)
    ref = Mlp(16, 32)
    fc1, fc2 = parallel_mlp(ref, world, True, dtype=torch.bfloat16)
    assert fc1.weight.dtype == torch.bfloat16
    X = torch.randn(2 * size, 16)
    s0, s = split(2 * size, size, rank)
    y = fc2(F.gelu(fc1(X[s0:s0 + s].bfloat16())))
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert fc1.weight.grad.dtype == torch.bfloat16
    close(y.float(), ref(X)[s0:s0 + s].detach(), tol=5e-2)


def test_wrong_input_width_is_a_clear_error(world):
    """A wrong width on one rank raises mc2.Error on every rank (the check
    is agreed on like the operators' own), and the layer stays usable."""
    fc1 = mnn.ColumnParallelLinear(6, 4, group=world)
    bad = world.rank() == world.size() - 1
    with pytest.raises(mc2.Error) as e:
        fc1(torch.ones(2, 5 if bad else 6))
    assert e.value.code == "invalid_argument"
    if bad:
        assert "input has 5 features, the layer 6" in e.value.message
    assert fc1(torch.ones(2, 6)).shape == (2 * world.size(), fc1.out_local)


@pytest.mark.parametrize("sp", [True, False])
def test_mlp_on_torch_process_groups(world, sp):
    """The same layers on torch.distributed process groups: the mc2
    backend's (the fused operators of its mc2.Group) and gloo's (the same
    computation over gloo's collectives, unfused)."""
    import torch.distributed as dist
    from mc2._comm import resolve
    mc2.init_process_group()
    pg = dist.distributed_c10d._get_default_group()
    assert resolve(pg).fused and resolve(None).fused
    check_mlp(pg, world.rank(), world.size(), sp, "auto")
    gloo = dist.new_group(backend="gloo")
    try:
        assert not resolve(gloo).fused
        check_mlp(gloo, world.rank(), world.size(), sp, "auto")
    finally:
        # Gloo's threads must stop before the interpreter exits: a group
        # left to the process's end can abort it ("terminate called
        # without an active exception").
        dist.barrier(group=gloo)
        dist.destroy_process_group(gloo)
