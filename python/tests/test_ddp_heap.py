"""mc2.ddp.allreduce_hook when the symmetric heap is too small for a
bucket (run with a small heap, MC2_HEAP_BYTES=16M): that bucket stays
private on every rank and is all-reduced from there, the buckets that fit
move into the heap, and training equals one process on the full batch.
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import mc2

mc2.init_process_group()
R, N = dist.get_rank(), dist.get_world_size()
BATCH, STEPS = 12, 2
BIG = 1600  # a 1600 x 1600 layer: a 10 MB bucket, more than the heap has free


def net():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(BIG, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, BIG), torch.nn.Tanh(),
                               torch.nn.Linear(BIG, BIG))


def train(model, shard):
    gen = torch.Generator().manual_seed(11)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(STEPS):
        x, y = torch.randn(BATCH, BIG, generator=gen), torch.randn(BATCH, BIG, generator=gen)
        if shard:
            rows = slice(R * BATCH // N, (R + 1) * BATCH // N)
            x, y = x[rows], y[rows]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def test_a_bucket_too_large_for_the_heap_stays_private():
    model = DDP(net(), bucket_cap_mb=1)
    buckets = []

    def hook(state, bucket):
        buckets.append((bucket.buffer().numel(), bucket.buffer()))
        return mc2.ddp.allreduce_hook(state, bucket)

    model.register_comm_hook(None, hook)
    train(model, shard=True)
    ref = train(net(), shard=False)
    for p, q in zip(model.module.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    group = mc2.group_of()
    big = [b for n, b in buckets if n >= BIG * BIG]
    small = [b for n, b in buckets if n < BIG * BIG]
    assert big and small
    assert not any(group.is_symmetric(b) for b in big)
    assert all(group.is_symmetric(b) for b in small)
