"""The torch.distributed backend "mc2" (registered when mc2 is imported).

torch.distributed.init_process_group("mc2") joins the world of `mc2 run`
when the program runs under it, the job's world across hosts under mpirun
(mc2._mpirun makes env:// work there), and otherwise makes a shared-memory
world among the ranks through torch's store (torchrun, or RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT with init_method="env://", which
`mc2 run` sets too): all ranks must then be on one host. new_group() gives a group of its own
among its members.
"""
import datetime
import os

import torch.distributed as dist

from . import _C, _world

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
    """torch.distributed.init_process_group("mc2") through the launcher's
    env:// rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: `mc2 run`
    and torchrun set them). timeout: seconds (torch's default otherwise).
    Does nothing if torch.distributed is initialised already; without a
    launcher, raises mc2.Error saying how to start the program."""
    if dist.is_initialized():
        return
    # Under mpirun env:// needs only Open MPI's variables (mc2._mpirun).
    if not _C.launched_by_mpi() and not all(os.environ.get(v)
                                            for v in _world.TORCHRUN_VARIABLES):
        raise _world.no_launcher_error("init_process_group")
    kwargs = {}
    if timeout is not None:
        kwargs["timeout"] = datetime.timedelta(seconds=timeout)
    dist.init_process_group("mc2", **kwargs)


def _register():
    if "MC2" not in dist.Backend._plugins:
        dist.Backend.register_backend("mc2", _create, extended_api=True)


_register()
