"""mc2's own calls under torchrun without init_process_group: the first
call joins the world through torchrun's variables. With the argument
"gloo", torch.distributed runs on gloo first, and mc2 meets the other ranks
through gloo's store, leaving the default group on gloo. Run by
python.torchrun_first_use*/2 under torchrun itself."""
import os
import sys

import torch
import torch.distributed as dist

import mc2

assert not mc2.launched_by_mc2()
size = int(os.environ["WORLD_SIZE"])
if len(sys.argv) > 1 and sys.argv[1] == "gloo":
    dist.init_process_group("gloo")
t = torch.ones(8)
mc2.all_reduce(t)                           # joins here
assert torch.equal(t, torch.full((8,), float(size))), t
w = mc2.world()
assert (w.rank(), w.size()) == (int(os.environ["RANK"]), size)
if len(sys.argv) > 1 and sys.argv[1] == "gloo":
    assert dist.get_backend() == "gloo"     # the default group stays gloo's
    u = torch.ones(2)
    dist.all_reduce(u)
    assert u[0] == size
else:
    assert dist.get_backend() == "mc2"      # joined through init_process_group()
out, _ = mc2.all_gather_matmul(torch.ones(2, 3), torch.ones(3, 4))
assert torch.equal(out, torch.full((2 * size, 4), 3.0)), out
print(f"rank {w.rank()}: joined on first use")
