"""A short DDP training job that leaves the way a user's script may: the
program behind python/tests/exit_stress.py.

    exit_job.py HOOK HOW STEPS

HOOK: "allreduce" (mc2.ddp.allreduce_hook), "bf16" (mc2.ddp.compressed_hook
with its default state, bf16 on the wire) or "topk" (compressed_hook with
top-k keeping every element). HOW: "return" (the script ends, no
destroy_process_group), "sys_exit" (sys.exit(0) after training),
"exception" (an uncaught exception after training: exit status 1),
"sigterm" (a SIGTERM handler that calls sys.exit(0), then SIGTERM to
itself). STEPS steps of DDP training with mc2.init_process_group() and the
hook, each rank's result checked against the same model trained on the
whole batch in this process (prints "trained" once the check passed; with
STEPS 0 nothing is trained or checked), then a new DDP model's first
forward and backward as the program's last statement: the hook's future
callbacks may still be running as the interpreter exits.
"""
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import mc2

BATCH = 8


def data(steps):
    gen = torch.Generator().manual_seed(5)
    return [(torch.randn(BATCH, 16, generator=gen), torch.randn(BATCH, 4, generator=gen))
            for _ in range(max(steps, 1))]


def model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def train(net, rows, steps):
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in data(steps)[:steps]:
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x[rows]), y[rows]).backward()
        opt.step()


def wrap(hook):
    """A DDP model with the hook, and the tolerance of its result."""
    ddp = DDP(model())
    if hook == "allreduce":
        ddp.register_comm_hook(None, mc2.ddp.allreduce_hook)
        return ddp, dict(rtol=1e-5, atol=1e-6)
    if hook == "topk":
        # Top-k of every element keeps the gradients whole: equal to DDP.
        state = mc2.ddp.CompressionState(scheme="topk", topk_ratio=1.0)
        ddp.register_comm_hook(state, mc2.ddp.compressed_hook)
        return ddp, dict(rtol=1e-5, atol=1e-6)
    if hook == "bf16":
        # The hook's default scheme: gradients rounded to bf16 on the wire
        # (8 bits of mantissa), three small steps of lr 0.1.
        ddp.register_comm_hook(mc2.ddp.CompressionState(), mc2.ddp.compressed_hook)
        return ddp, dict(rtol=2e-2, atol=2e-3)
    sys.exit(f"exit_job.py: unknown hook {hook!r}")


def main(hook, how, steps):
    mc2.init_process_group()
    r, n = dist.get_rank(), dist.get_world_size()
    per = BATCH // n
    rows = slice(r * per, (r + 1) * per)
    if steps > 0:
        ddp, tol = wrap(hook)
        ref = model()
        train(ref, slice(0, per * n), steps)
        train(ddp, rows, steps)
        for p, q in zip(ddp.module.parameters(), ref.parameters()):
            torch.testing.assert_close(p.detach(), q.detach(), **tol)
        print(f"rank {r}: trained", flush=True)
    last, _ = wrap(hook)
    x, y = data(steps)[0]
    torch.nn.functional.mse_loss(last(x[rows]), y[rows]).backward()
    if how == "return":
        return
    if how == "sys_exit":
        sys.exit(0)
    if how == "exception":
        raise RuntimeError("exit_job.py: the uncaught exception this run asked for")
    if how == "sigterm":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
    sys.exit(f"exit_job.py: unknown way out {how!r}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
