"""A DistributedDataParallel communication hook that runs the gradient
buckets' all-reduces on mc2:

    model = DistributedDataParallel(module, process_group=pg)
    model.register_comm_hook(state, mc2.ddp.allreduce_hook)

state: None (mc2's default process group, mc2.collectives.
default_process_group(): the default group when torch.distributed was
initialised with "mc2", else a group over mc2.world()), or a process group
of the mc2 backend. Each bucket is averaged over the group's ranks (the
all-reduce's "avg": the sum, then one division), as DDP's own all-reduce
does, so the model trains as with DDP's default. DDP itself may run on any
backend (e.g. gloo for its set-up) while the gradients move through mc2.
"""
import torch.distributed as dist

from . import _C
from .collectives import default_process_group, invalid_argument


def allreduce_hook(state, bucket):
    pg = default_process_group() if state is None else state
    if not isinstance(pg, _C.ProcessGroupMC2):
        raise invalid_argument("ddp.allreduce_hook", "state must be None or a process group of "
                               f"the mc2 backend, not {type(pg).__name__}")
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.AVG
    fut = pg.allreduce([bucket.buffer()], opts).get_future()
    return fut.then(lambda f: f.value()[0])
