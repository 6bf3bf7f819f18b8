"""The torch.distributed backend "mc2" (registered when mc2 is imported).

torch.distributed.init_process_group("mc2") joins the world of `mc2 run`
when the program runs under it, and otherwise makes a shared-memory world
among the ranks through torch's store (torchrun, or RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT with init_method="env://"): all ranks must be on
one host. new_group() gives a group of its own among its members.
"""
import datetime
import os
import tempfile

import torch.distributed as dist

from . import _C

ProcessGroupMC2 = _C.ProcessGroupMC2


def _create(opts, pg_options=None):
    # torch 1.13's extended creator API: opts is a _DistributedBackendOptions
    # (store, group_rank, group_size, timeout, group_id, global_ranks_in_group).
    return _C._create_process_group(opts.store, opts.group_rank, opts.group_size,
                                    opts.timeout.total_seconds(),
                                    list(opts.global_ranks_in_group))


def init_process_group(timeout=None):
    """torch.distributed.init_process_group("mc2") with what the launcher
    gives: under torchrun (MASTER_ADDR set) its env:// rendezvous; under
    `mc2 run`, the rank and size of mc2's world and a file store named after
    the job (in the temporary directory; torch's FileStore removes it when
    the last rank is done). timeout: seconds (torch's default otherwise).
    Does nothing if torch.distributed is initialised already."""
    if dist.is_initialized():
        return
    kwargs = {}
    if timeout is not None:
        kwargs["timeout"] = datetime.timedelta(seconds=timeout)
    if "MASTER_ADDR" in os.environ or not _C.launched_by_mc2():
        dist.init_process_group("mc2", **kwargs)
        return
    w = _C.world()
    path = os.path.join(tempfile.gettempdir(), f"mc2-torch-store-{os.environ['MC2_JOB_ID']}")
    dist.init_process_group("mc2", init_method=f"file://{path}", rank=w.rank(),
                            world_size=w.size(), **kwargs)


def _register():
    if "MC2" not in dist.Backend._plugins:
        dist.Backend.register_backend("mc2", _create, extended_api=True)


_register()
