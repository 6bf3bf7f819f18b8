"""Runs a command as N ranks the way torchrun starts them (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), without `mc2 run`:
the test of the backend's own rendezvous with any launcher that sets these
variables (python.torchrun/2 runs torchrun itself).

    torchrun_style.py N command [args...]

Exits with the first failing rank's status; the others are then ended.
"""
import os
import socket
import subprocess
import sys
import time


def main():
    n = int(sys.argv[1])
    cmd = sys.argv[2:]
    with socket.socket() as s:  # a free port for torch's TCP store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(cmd, env=env))
    status = 0
    while procs:
        for p in list(procs):
            rc = p.poll()
            if rc is None:
                continue
            procs.remove(p)
            if rc != 0 and status == 0:
                status = rc
                for q in procs:
                    q.terminate()
        time.sleep(0.05)
    sys.exit(status)


if __name__ == "__main__":
    main()
