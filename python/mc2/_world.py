"""mc2.world() and mc2.init(): the process's mc2 world, made on first use.

Under `mc2 run` the world is the launcher's; under mpirun, the job's ranks
on every host (shared memory inside a host, the net transport between
hosts). Under torchrun (or any
launcher that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT) the first
call joins through torch's env:// rendezvous: it initialises
torch.distributed with the mc2 backend (mc2.init_process_group()), or, when
torch.distributed is initialised already with another backend, makes the
world through that job's store. Without a launcher it raises mc2.Error
saying how to start the program.
"""
import os
import threading

import torch.distributed as dist

from . import _C

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_lock = threading.Lock()


def _invalid_argument(op, message):
    e = _C.Error(f"mc2 error [invalid_argument] {op}: {message}")
    e.code, e.rank, e.op, e.seq, e.message = "invalid_argument", -1, op, 0, message
    return e


def no_launcher_error(op):
    """The mc2.Error of a program started without a launcher."""
    missing = ", ".join(v for v in TORCHRUN_VARIABLES if not os.environ.get(v))
    return _invalid_argument(op, "this program was started without a launcher: start it "
                             "with `mc2 run -n N /usr/bin/python3 prog.py` or torchrun ("
                             f"{missing} not set)")


def torchrun_environment():
    """True when torchrun's variables are set (and `mc2 run`'s are not)."""
    return not _C.launched_by_mc2() and all(os.environ.get(v) for v in TORCHRUN_VARIABLES)


def _join(timeout):
    if _C._has_world() or _C.launched_by_mc2() or _C.launched_by_mpi():
        return  # the world is the launcher's, made by _C.world()
    if not torchrun_environment():
        raise no_launcher_error("world")
    if not dist.is_initialized():
        from .backend import init_process_group
        init_process_group(timeout)  # the mc2 backend's creator makes the world
        return
    # torch.distributed runs on another backend: meet through its store.
    store = dist.PrefixStore("mc2/world/", dist.distributed_c10d._get_default_store())
    seconds = timeout if timeout is not None else 0.0
    _C._join_world(store, dist.get_rank(), dist.get_world_size(), seconds)


def world():
    """The world group, an mc2.Group: `mc2 run`'s ranks, or torchrun's
    (joined on first use, collectively; see the module docstring)."""
    with _lock:
        _join(None)
    return _C.world()


def init(timeout=None):
    """Joins the world (as world() does) and returns it. timeout: seconds
    per operation (default MC2_TIMEOUT, else 300)."""
    if timeout is not None and not timeout > 0:
        raise _invalid_argument("init", "timeout must be > 0 seconds")
    with _lock:
        _join(timeout)
    return _C.init(timeout)
