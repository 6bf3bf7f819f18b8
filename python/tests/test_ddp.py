"""DistributedDataParallel on the mc2 backend trains exactly as one process
on the full batch (within float32 tolerance): with DDP's own all-reduce,
with find_unused_parameters, and with mc2.ddp.allreduce_hook; PowerSGD's
hook (which waits for a call inside a future's callback) keeps every rank's
model identical.
"""
import copy

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP

import mc2

mc2.init_process_group()
R, N = dist.get_rank(), dist.get_world_size()
BATCH = 24  # divisible by 1, 2, 3 and 4 ranks
STEPS = 3


class Net(torch.nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.a = torch.nn.Linear(16, 64)
        self.b = torch.nn.Linear(64, 8)
        self.c = torch.nn.Linear(64, 8) if unused else None  # never used in forward

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def batches():
    gen = torch.Generator().manual_seed(7)
    return [(torch.randn(BATCH, 16, generator=gen), torch.randn(BATCH, 8, generator=gen))
            for _ in range(STEPS)]


def train(model, data, shard):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in data:
        if shard:
            rows = slice(R * BATCH // N, (R + 1) * BATCH // N)
            x, y = x[rows], y[rows]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def reference(unused=False):
    torch.manual_seed(3)
    return train(Net(unused), batches(), shard=False)


def assert_same_as(ddp_model, ref):
    for (name, p), q in zip(ddp_model.module.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("unused", [False, True])
def test_ddp_equals_single_process(unused):
    torch.manual_seed(3)
    model = DDP(Net(unused), find_unused_parameters=unused)
    assert_same_as(train(model, batches(), shard=True), reference(unused))


@pytest.mark.parametrize("as_view", [False, True])
def test_ddp_with_mc2_hook_equals_single_process(as_view):
    """The hook moves each bucket into the symmetric heap at its first
    all-reduce (and DDP's rebuilt buckets after the first step); training
    is unchanged, with the gradients copied out of the buckets or views
    into them (gradient_as_bucket_view)."""
    torch.manual_seed(3)
    model = DDP(Net(), gradient_as_bucket_view=as_view)
    buckets = []

    def hook(state, bucket):
        buckets.append(bucket.buffer())
        return mc2.ddp.allreduce_hook(state, bucket)

    model.register_comm_hook(None, hook)
    assert_same_as(train(model, batches(), shard=True), reference())
    group = mc2.group_of()
    assert len(buckets) == STEPS and all(group.is_symmetric(b) for b in buckets)
    if as_view:
        assert all(group.is_symmetric(p.grad) for p in model.parameters())


def test_powersgd_hook_keeps_ranks_identical():
    torch.manual_seed(3)
    model = DDP(Net(), bucket_cap_mb=0.01)
    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                   start_powerSGD_iter=2, use_error_feedback=True)
    model.register_comm_hook(state, powersgd.powerSGD_hook)
    train(model, batches() * 2, shard=True)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(N)]
    dist.all_gather(everyone, flat)
    for r in range(N):
        assert torch.equal(everyone[r], flat)
    assert torch.isfinite(flat).all()
