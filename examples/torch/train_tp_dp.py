#!/usr/bin/python3
"""Trains a small transformer with tensor + sequence parallelism (mc2.nn)
inside data parallelism (DistributedDataParallel on the mc2 backend).

    build/tools/mc2 run -n 4 /usr/bin/python3 examples/torch/train_tp_dp.py \\
        --tp 2 --trace /tmp/tp_trace
    build/tools/mc2 trace report /tmp/tp_trace

The ranks form a grid: TP groups of --tp consecutive ranks, DP groups of
the ranks with the same position in their TP group. Each DP replica draws
its own batches of a synthetic task (continue a sequence that counts up by
a per-sequence stride, modulo the vocabulary), and the ranks of a TP group
each take their shard of the sequence (examples/torch/tp_model.py).
DistributedDataParallel averages gradients over the DP group; the
parameters that see only a sequence shard get theirs summed over the TP
group (mc2.nn.allreduce_grads). The loss printed is the whole model's
(summed over the TP group, averaged over DP). With --check, rank 0 also
trains the same model unsharded on the same batches and compares the
losses (exit status 1 if they differ by more than --tolerance). With
--trace DIR every rank records its timeline through mc2.trace, one marked
step per training step (rank 0's unsharded reference is left out), for
`mc2 trace report DIR`.
"""

import argparse
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import mc2
import mc2.nn as mnn

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from tp_model import TinyGPT  # noqa: E402


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel group size")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=4, help="sequences per DP replica and step")
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--check", action="store_true",
                   help="rank 0 trains the unsharded model too and compares losses")
    p.add_argument("--tolerance", type=float, default=1e-3)
    p.add_argument("--trace", metavar="DIR",
                   help="record the timeline into DIR (mc2.trace; read with mc2 trace report)")
    return p.parse_args(argv)


def batch(step, replica, a):
    """Sequences [seq + 1, batch] counting up by a stride, from a seed of
    (step, replica): inputs are the first seq tokens, targets the next."""
    gen = torch.Generator().manual_seed(1000 * step + replica)
    start = torch.randint(0, a.vocab, (1, a.batch), generator=gen)
    stride = torch.randint(1, 4, (1, a.batch), generator=gen)
    tokens = (start + stride * torch.arange(a.seq + 1)[:, None]) % a.vocab
    return tokens[:-1], tokens[1:]


def main(argv):
    a = parse(argv)
    world = mc2.world()
    rank, size = world.rank(), world.size()
    if a.tp < 1 or size % a.tp:
        raise SystemExit(f"--tp {a.tp} must divide the {size} ranks")
    dp_size, tp_rank, replica = size // a.tp, rank % a.tp, rank // a.tp
    torch.set_num_threads(1)
    mc2.init_process_group()  # torch.distributed on the mc2 backend, the world of `mc2 run`
    tp = world.split(replica, rank)  # this replica's TP group
    dp_groups = [dist.new_group([r for r in range(size) if r % a.tp == t]) for t in range(a.tp)]
    dp = dp_groups[tp_rank]

    opts = dict(vocab=a.vocab, hidden=a.hidden, heads=a.heads, ffn=4 * a.hidden,
                layers=a.layers, max_seq=a.seq)
    torch.manual_seed(0)
    model = TinyGPT(**opts, tp=tp, tp_size=a.tp)
    sp_params = model.sequence_parallel_params()
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=dp)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    first, count = mnn.sequence_range(a.seq, tp)

    ref = ref_opt = None
    if a.check and rank == 0:
        torch.manual_seed(0)
        ref = TinyGPT(**opts)
        ref_opt = torch.optim.Adam(ref.parameters(), lr=a.lr)

    if a.trace:
        mc2.trace.start(a.trace)
    worst = 0.0
    for step in range(a.steps):
        mc2.trace.mark_step(step)
        inputs, targets = batch(step, replica, a)
        logits = ddp(inputs[first:first + count], first)
        # This shard's part of the mean over the whole sequence: the TP
        # group's parts add up to the model's loss.
        loss = F.cross_entropy(logits.reshape(-1, a.vocab), targets[first:first + count]
                               .reshape(-1), reduction="sum") / (a.seq * a.batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        mnn.allreduce_grads(sp_params, tp)
        with mc2.trace.span("optimizer"):
            opt.step()

        total = loss.detach().reshape(1)
        dist.all_reduce(total)  # over TP (sum) and DP
        total = total.item() / dp_size
        mc2.trace.end_step()
        if ref is not None:
            ref_loss = sum(
                F.cross_entropy(ref(x).reshape(-1, a.vocab), y.reshape(-1))
                for x, y in (batch(step, r, a) for r in range(dp_size))) / dp_size
            ref_opt.zero_grad(set_to_none=True)
            ref_loss.backward()
            ref_opt.step()
            worst = max(worst, abs(ref_loss.item() - total))
        if rank == 0 and (step % 5 == 0 or step == a.steps - 1):
            line = f"step {step:3d}  loss {total:.4f}"
            if ref is not None:
                line += f"  unsharded {ref_loss.item():.4f}"
            print(line, flush=True)
    if a.trace:
        mc2.trace.stop()
    if ref is not None:
        ok = worst <= a.tolerance
        print(f"largest loss difference to the unsharded model: {worst:.2e} "
              f"({'OK' if ok else 'WRONG'})", flush=True)
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
