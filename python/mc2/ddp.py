"""A DistributedDataParallel communication hook that runs the gradient
buckets' all-reduces on mc2, in place in mc2's symmetric heap:

    model = DistributedDataParallel(module, gradient_as_bucket_view=True)
    model.register_comm_hook(state, mc2.ddp.allreduce_hook)

state: None (mc2's default process group, mc2.collectives.
default_process_group(): the default group when torch.distributed was
initialised with "mc2", else a group over mc2.world()), or a process group
of the mc2 backend. Each bucket is averaged over the group's ranks (the
all-reduce's "avg": the sum, then one division), as DDP's own all-reduce
does, so the model trains as with DDP's default. DDP itself may run on any
backend (e.g. gloo for its set-up) while the gradients move through mc2.

At a bucket's first all-reduce the hook moves the bucket's storage into
the symmetric heap (one copy, collective over the group; DDP's rebuilt
buckets move at their first all-reduce too): DDP keeps using the same
storage at its new address, and every later all-reduce reads and writes
it in place, where peers read it directly, instead of passing it through
mc2's scratch in windows of a few MiB with a handshake each. With
gradient_as_bucket_view=True the parameters' gradients are views into the
buckets, so nothing is copied in or out either. The buckets take heap
space (the model's gradient bytes; `mc2 run --heap`, MC2_HEAP_BYTES): a
bucket that finds a rank's heap full stays where it is, on every rank
alike, and is all-reduced from there. Moving changes the address only:
a numpy array or data_ptr() taken from a gradient view before the move
keeps the old, freed memory.
"""
from . import _C
from .collectives import default_process_group, invalid_argument


def allreduce_hook(state, bucket):
    pg = default_process_group() if state is None else state
    if not isinstance(pg, _C.ProcessGroupMC2):
        raise invalid_argument("ddp.allreduce_hook", "state must be None or a process group of "
                               f"the mc2 backend, not {type(pg).__name__}")
    fut = _C._all_reduce_bucket(pg, bucket.buffer(), "avg").get_future()
    return fut.then(lambda f: f.value()[0])
