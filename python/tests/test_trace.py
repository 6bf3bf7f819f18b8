"""mc2.trace: recording from Python, read back by `mc2 trace report`.

Every rank records three marked steps, each a Python span around a sleep
(whose length this test measures itself, the reference) and an
mc2.all_reduce; the files must hold exactly those spans with their names,
categories, flops and steps, and `mc2 trace report --json -` must read them
(the report's tool is the one the test was built with: MC2PY_TEST_CLI).
"""
import glob
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest
import torch

import mc2

STEPS = 3
SLEEP_S = 0.005


@pytest.fixture(scope="module")
def world():
    return mc2.world()


def shared_dir(world):
    """A directory rank 0 made, its path sent to every rank."""
    path = tempfile.mkdtemp(prefix="mc2-trace-test.") if world.rank() == 0 else ""
    buf = torch.zeros(512, dtype=torch.uint8)
    buf[:len(path)] = torch.tensor(list(path.encode()), dtype=torch.uint8)
    mc2.broadcast(buf, src=0, group=None)
    return bytes(buf[buf != 0].tolist()).decode()


def test_spans_steps_and_report(world):
    p, r = world.size(), world.rank()
    top = shared_dir(world)
    out = os.path.join(top, "trace")
    try:
        mc2.trace.start(out)
        assert mc2.trace.enabled()
        slept = []
        for step in range(STEPS):
            mc2.trace.mark_step(step)
            t0 = time.monotonic_ns()
            with mc2.trace.span("py_compute", flops=1000 + r):
                time.sleep(SLEEP_S)
            slept.append(time.monotonic_ns() - t0)
            t = torch.full((256,), float(r))
            mc2.all_reduce(t)
            assert torch.equal(t, torch.full((256,), float(sum(range(p)))))
        with pytest.raises(mc2.Error, match="unknown span category 'gpu'"):
            with mc2.trace.span("x", category="gpu"):
                pass
        mc2.trace.end_step()
        mc2.trace.stop()
        assert not mc2.trace.enabled()
        mc2.barrier()

        # This rank's file: Chrome trace events.
        with open(os.path.join(out, f"rank-{r}.trace.json")) as f:
            events = json.load(f)
        events = events["traceEvents"] if isinstance(events, dict) else events
        mine = [e for e in events if e.get("name") == "py_compute" and e.get("ph") == "X"]
        assert len(mine) == STEPS
        for e, ns in zip(sorted(mine, key=lambda e: e["ts"]), slept):
            assert e["cat"] == "compute"
            assert e["args"]["flops"] == 1000 + r
            # Recorded inside the interval this test measured around it.
            assert SLEEP_S * 1e6 <= e["dur"] <= ns / 1e3 + 1
        assert sum(e.get("name") == "all_reduce" for e in events) >= STEPS

        if r == 0:
            report = json.loads(subprocess.run(
                [os.environ["MC2PY_TEST_CLI"], "trace", "report", "--json", "-", out],
                check=True, capture_output=True, text=True).stdout)
            assert sorted(x["rank"] for x in report["ranks"]) == list(range(p))
            for rank in report["ranks"]:
                assert [s["step"] for s in rank["steps"]] == list(range(STEPS))
            ops = {o["name"]: o for o in report["operators"]}
            assert ops["py_compute"]["calls"] == STEPS * p
            assert ops["py_compute"]["category"] == "compute"
            assert ops["py_compute"]["flops"] == STEPS * sum(1000 + q for q in range(p))
            assert ops["all_reduce"]["category"] == "comm"
            assert len(glob.glob(os.path.join(out, "rank-*.trace.json"))) == p
    finally:
        mc2.barrier()
        if r == 0:
            shutil.rmtree(top)
