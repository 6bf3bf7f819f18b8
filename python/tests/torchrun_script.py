"""A program written for torchrun, unchanged: it initialises
torch.distributed with the backend named by its argument ("gloo" or "mc2")
through the default env:// rendezvous, all-reduces, and checks the rank
variables. python.torchrun_script_*/2 run it under `mc2 run -n 2`, which
must give it RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT as torchrun does."""
import os
import sys

import torch
import torch.distributed as dist

backend = sys.argv[1]
if backend == "mc2":
    import mc2  # noqa: F401  (registers the backend)

dist.init_process_group(backend)
rank, size = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == backend, dist.get_backend()
assert (rank, size) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
assert os.environ["LOCAL_RANK"] == str(rank) and os.environ["LOCAL_WORLD_SIZE"] == str(size)
assert os.environ["MASTER_ADDR"] == "127.0.0.1", os.environ["MASTER_ADDR"]
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((4,), size * (size + 1) / 2)), t
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} of {size}: {backend} through MASTER_PORT {os.environ['MASTER_PORT']} ok")
