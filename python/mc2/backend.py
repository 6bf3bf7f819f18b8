"""The torch.distributed backend "mc2" (registered when mc2 is imported).

torch.distributed.init_process_group("mc2") joins the world of `mc2 run`
when the program runs under it, and otherwise makes a shared-memory world
among the ranks through torch's store (torchrun, or RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT with init_method="env://"): all ranks must be on
one host. new_group() gives a group of its own among its members.
"""
import datetime
import os

import torch
import torch.distributed as dist

from . import _C

ProcessGroupMC2 = _C.ProcessGroupMC2


def _create(opts, pg_options=None):
    # torch 1.13's extended creator API: opts is a _DistributedBackendOptions
    # (store, group_rank, group_size, timeout, group_id, global_ranks_in_group).
    # The process's rank and size in the job name its trace (a new_group's
    # world has ranks of its own); the default group is being made when
    # global_ranks_in_group is empty.
    global_ranks = list(opts.global_ranks_in_group)
    if global_ranks:
        job_rank, job_size = dist.get_rank(), dist.get_world_size()
    else:
        job_rank, job_size = opts.group_rank, opts.group_size
    return _C._create_process_group(opts.store, opts.group_rank, opts.group_size,
                                    opts.timeout.total_seconds(), global_ranks, job_rank,
                                    job_size)


def init_process_group(timeout=None):
    """torch.distributed.init_process_group("mc2") with what the launcher
    gives: under torchrun (MASTER_ADDR set) its env:// rendezvous; under
    `mc2 run`, the rank and size of mc2's world and a TCP store that rank 0
    opens on a free port of 127.0.0.1 (the port reaches the other ranks
    through mc2 itself). timeout: seconds (torch's default otherwise).
    Does nothing if torch.distributed is initialised already."""
    if dist.is_initialized():
        return
    kwargs = {}
    if timeout is not None:
        kwargs["timeout"] = datetime.timedelta(seconds=timeout)
    if "MASTER_ADDR" in os.environ or not _C.launched_by_mc2():
        dist.init_process_group("mc2", **kwargs)
        return
    from .collectives import broadcast
    w = _C.world()
    rank, size = w.rank(), w.size()
    store_timeout = kwargs.get("timeout", datetime.timedelta(seconds=300))
    store = None
    port = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, size, True, store_timeout, wait_for_workers=False)
        port[0] = store.port
    broadcast(port, src=0)
    if rank != 0:
        store = dist.TCPStore("127.0.0.1", int(port.item()), size, False, store_timeout)
    dist.init_process_group("mc2", store=store, rank=rank, world_size=size, **kwargs)


def _register():
    if "MC2" not in dist.Backend._plugins:
        dist.Backend.register_backend("mc2", _create, extended_api=True)


_register()
