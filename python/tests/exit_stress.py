"""Runs python/tests/exit_job.py under `mc2 run -n 2` many times beside a
busy loop (a loaded machine is where a thread left running at interpreter
exit shows) and fails unless every run ended as its way out asks: status 0
(1 for the uncaught exception), both ranks trained where they train, and
no abort (no "terminate called", no signal).

    exit_stress.py MC2 PYTHON [--runs N] [--other-runs M] [--hooks H,...] [--busy B]

Each hook (default: all three of exit_job.py) runs N times (default 50)
leaving by returning right after the job's first collective, N times
leaving so after three checked steps, and M times (default 5) for each
other way out (sys.exit, an exception, SIGTERM with a handler) right after
the first collective; beside B busy loops (default 2, one per core of a
2-core machine). Prints one line per kind of run and a closing
"N passed, N failed" line.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def one_run(mc2, python, hook, how, steps):
    """Returns None when the run ended as expected, else what was wrong."""
    cmd = [mc2, "run", "-n", "2", python, os.path.join(HERE, "exit_job.py"), hook, how,
           str(steps)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return "no exit within 240 s"
    out = p.stdout + p.stderr
    want = 1 if how == "exception" else 0
    problems = []
    if p.returncode != want:
        problems.append(f"exit status {p.returncode}, expected {want}")
    for r in (0, 1):
        if steps and f"rank {r}: trained" not in out:
            problems.append(f"rank {r} did not report training")
    for sign in ("terminate called", "Aborted", "signal 6", "core dumped", "SIGABRT"):
        if sign in out:
            problems.append(f"output says {sign!r}")
    if not problems:
        return None
    return "; ".join(problems) + "\n--- output ---\n" + out[-3000:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mc2")
    ap.add_argument("python")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--other-runs", type=int, default=5)
    ap.add_argument("--hooks", default="allreduce,bf16,topk")
    ap.add_argument("--busy", type=int, default=2, help="busy loops beside the runs")
    a = ap.parse_args()
    kinds = []
    for hook in a.hooks.split(","):
        # The exit right after the job's first collective (no callback
        # thread exists yet), and after three checked steps.
        for steps in (0, 3):
            kinds.append((hook, "return", steps, a.runs))
        for how in ("sys_exit", "exception", "sigterm"):
            kinds.append((hook, how, 0, a.other_runs))
    os.environ["OMP_NUM_THREADS"] = "1"
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    passed = failed = 0
    try:
        for hook, how, steps, n in kinds:
            t0 = time.monotonic()
            bad = 0
            for i in range(n):
                why = one_run(a.mc2, a.python, hook, how, steps)
                if why is None:
                    passed += 1
                else:
                    failed += 1
                    bad += 1
                    print(f"FAILED {hook}/{how}/{steps} steps, run {i + 1}: {why}", flush=True)
            print(f"{hook:>10} / {how:<9} / {steps} steps: {n - bad}/{n} clean "
                  f"({(time.monotonic() - t0) / max(n, 1):.1f} s a run)", flush=True)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
