"""Programs started by mpirun: torch.distributed's env:// rendezvous
without a launcher's variables.

mpirun sets Open MPI's variables, not torchrun's. When mc2 is imported in a
process that mpirun started (and not `mc2 run`), it fills RANK, WORLD_SIZE,
LOCAL_RANK and LOCAL_WORLD_SIZE from Open MPI's where they are unset, and
the env:// rendezvous (torch.distributed.init_process_group's default) of a
job without MASTER_ADDR meets on a TCPStore that rank 0 opens on a free
port: rank 0 sends its addresses and the port to the other ranks through
mc2's world, which spans the job's hosts, and each rank connects to the
first address it can reach. So

    mpirun -H h0:2,h1:2 -np 4 python3 train.py

runs a script that calls torch.distributed.init_process_group("mc2") (or
"gloo") unchanged. A job that sets MASTER_ADDR keeps torch's own env://.
"""
import datetime
import fcntl
import json
import os
import socket
import struct
import sys

import torch
import torch.distributed as dist

from . import _C

_OMPI = {"RANK": "OMPI_COMM_WORLD_RANK", "WORLD_SIZE": "OMPI_COMM_WORLD_SIZE",
         "LOCAL_RANK": "OMPI_COMM_WORLD_LOCAL_RANK",
         "LOCAL_WORLD_SIZE": "OMPI_COMM_WORLD_LOCAL_SIZE"}
_SIOCGIFADDR = 0x8915
_CONNECT_SECONDS = 2.0


def _addresses():
    """This host's IPv4 addresses, loopback last."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:  # an interface without an IPv4 address
                continue
            found.append(socket.inet_ntoa(raw[20:24]))
    return [a for a in found if not a.startswith("127.")] + ["127.0.0.1"]


def _reachable(addresses, port):
    for address in addresses:
        try:
            socket.create_connection((address, port), timeout=_CONNECT_SECONDS).close()
            return address
        except OSError:
            continue
    from .collectives import invalid_argument
    raise invalid_argument("init_process_group", "under mpirun: rank 0's store (port "
                           f"{port}) is reachable at none of its addresses "
                           f"{', '.join(addresses)}; set MASTER_ADDR and MASTER_PORT")


def _rendezvous(timeout):
    """(store, rank, world size) of a job of mpirun, met through mc2's world."""
    from .collectives import broadcast
    rank, size = int(os.environ[_OMPI["RANK"]]), int(os.environ[_OMPI["WORLD_SIZE"]])
    buf = torch.zeros(4096, dtype=torch.uint8)
    store = None
    if rank == 0:
        # No waiting for the workers here: they learn the port only below.
        store = dist.TCPStore("0.0.0.0", 0, size, True, timeout=timeout, wait_for_workers=False)
        text = json.dumps({"addresses": _addresses(), "port": store.port}).encode()
        buf[:len(text)] = torch.tensor(list(text), dtype=torch.uint8)
    broadcast(buf, src=0)
    info = json.loads(bytes(buf.tolist()).rstrip(b"\0"))
    address = info["addresses"][0]
    if rank != 0:
        address = _reachable(info["addresses"], info["port"])
        store = dist.TCPStore(address, info["port"], size, False, timeout=timeout)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(info["port"])
    return store, rank, size


def _wrap(original):
    def handler(url, timeout=datetime.timedelta(minutes=30), **kwargs):
        if os.environ.get("MASTER_ADDR") or "rank=" in url or "world_size=" in url:
            yield from original(url, timeout=timeout, **kwargs)
            return
        yield _rendezvous(timeout)
        raise RuntimeError("env:// under mpirun cannot rendezvous again")
    handler.mc2_mpirun = True
    return handler


def install():
    """Called when mc2 is imported: does something only under mpirun."""
    if not _C.launched_by_mpi():
        return
    for torch_name, ompi_name in _OMPI.items():
        if not os.environ.get(torch_name) and os.environ.get(ompi_name):
            os.environ[torch_name] = os.environ[ompi_name]
    handlers = getattr(sys.modules.get("torch.distributed.rendezvous"), "_rendezvous_handlers",
                       None)
    if handlers is not None and "env" in handlers and not hasattr(handlers["env"], "mc2_mpirun"):
        handlers["env"] = _wrap(handlers["env"])
