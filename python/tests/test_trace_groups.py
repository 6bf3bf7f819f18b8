"""mc2.trace with torch.distributed subgroups: a group of dist.new_group()
is a world of its own among its members, and making it must not change the
rank or world size the process's spans are recorded under.

Every rank makes one group per rank (dist.new_group([q]) for each q, as
every rank must), starts tracing, and runs marked steps of a Python span
around a measured sleep plus an all_reduce on its own one-rank group and
one on the default group. Then each rank's file must name its own rank and
the job's world size, hold its own spans, and `mc2 trace report --json -`
must give every rank the compute time it slept (the reference is the sleep
this test measures).
"""
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest
import torch
import torch.distributed as dist

import mc2

STEPS = 3
SLEEP_S = 0.02


@pytest.fixture(scope="module")
def job():
    mc2.init_process_group()
    return dist.get_rank(), dist.get_world_size()


def shared_dir(rank):
    """A directory rank 0 made, its path sent to every rank."""
    path = tempfile.mkdtemp(prefix="mc2-trace-groups.") if rank == 0 else ""
    buf = [path]
    dist.broadcast_object_list(buf, src=0)
    return buf[0]


def test_subgroup_keeps_the_process_identity(job):
    r, p = job
    groups = [dist.new_group([q]) for q in range(p)]
    top = shared_dir(r)
    out = os.path.join(top, "trace")
    slept = 0
    try:
        mc2.trace.start(out)
        for step in range(STEPS):
            mc2.trace.mark_step(step)
            t0 = time.monotonic_ns()
            with mc2.trace.span("py_compute"):
                time.sleep(SLEEP_S)
            slept += time.monotonic_ns() - t0
            mine = torch.full((64,), float(r + 1))
            dist.all_reduce(mine, group=groups[r])
            assert torch.equal(mine, torch.full((64,), float(r + 1)))
            every = torch.full((64,), float(r + 1))
            dist.all_reduce(every)
            assert torch.equal(every, torch.full((64,), float(p * (p + 1) // 2)))
        mc2.trace.end_step()
        mc2.trace.stop()
        dist.barrier()

        with open(os.path.join(out, f"rank-{r}.trace.json")) as f:
            doc = json.load(f)
        meta = doc["otherData"]["mc2"]["ranks"]
        assert [(m["rank"], m["world_size"]) for m in meta] == [(r, p)]
        spans = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        assert {e["pid"] for e in spans} == {r}
        assert sum(e["name"] == "py_compute" for e in spans) == STEPS
        assert sum(e["name"] == "all_reduce" for e in spans) >= STEPS

        if r == 0:
            report = json.loads(subprocess.run(
                [os.environ["MC2PY_TEST_CLI"], "trace", "report", "--json", "-", out],
                check=True, capture_output=True, text=True).stdout)
            assert sorted(x["rank"] for x in report["ranks"]) == list(range(p))
            for rank in report["ranks"]:
                assert [s["step"] for s in rank["steps"]] == list(range(STEPS))
                compute = sum(s["compute_ns"] for s in rank["steps"])
                # Every rank slept about as long as this one measured.
                assert compute >= STEPS * SLEEP_S * 1e9
                assert compute <= 3 * slept
    finally:
        dist.barrier()
        if r == 0:
            shutil.rmtree(top)
