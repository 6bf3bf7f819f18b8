#!/usr/bin/python3
"""A tensor-parallel transformer layer on CPU: mc2 against no tensor
parallelism and against the gloo backend, side by side.

Usage: bench/torch_tp.py [--seq 512] [--batch 1] [--hidden 1024] [--heads 16]
                         [--ffn 4096] [--iters 10] [--warmup 3] [--rounds 3]
                         [--dtype float32|bfloat16] [--pipeline auto] [--splits 4]
                         [--build build] [--json FILE]

One step is the forward and backward of one transformer layer
(examples/torch/tp_model.py: pre-LayerNorm causal attention and a GELU MLP),
plus, for the parallel runs, the sum of the sequence-parallel parameters'
gradients over the group. Three ways, on the same 2 CPUs, with the same
weights and inputs:

  single  the whole layer in one process, torch.nn.Linear, 2 torch threads
  mc2     TP=2 with sequence parallelism: mc2.nn layers, every TP GEMM a
          fused mc2 operator (forward and backward; --pipeline, --splits),
          under `mc2 run -n 2`, 1 thread per rank (torch's and mc2's GEMMs)
  gloo    TP=2, the same mc2.nn layers on a gloo process group: each TP
          GEMM a torch GEMM and a gloo collective (all-gather; all-reduce
          for the reduce-scatters, which gloo lacks), 1 thread per rank,
          rank r bound to CPU r as `mc2 run` binds its ranks

The three run one after another in each round (`--rounds` rounds, each
starting with the next of the three, so that a change in the machine's
load falls on all of them alike), each `--warmup` untimed steps then
`--iters` timed ones. A parallel step's time is its slowest
rank's. Printed: the median and minimum step time of each, over every
round, and each one's ratio to single; the sum over ranks of the layer's
output loss of the first step must agree with single's (else the row says
WRONG and the exit status is 1). --json FILE writes the same as JSON.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--ffn", type=int, default=4096)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--pipeline", choices=("auto", "serial", "chunked", "fused"), default="auto",
                   help="the mc2 operators' pipeline")
    p.add_argument("--splits", type=int, default=4, help="the mc2 operators' chunk count")
    p.add_argument("--build", default=str(REPO / "build"))
    p.add_argument("--json", dest="json_file")
    p.add_argument("--worker", choices=("single", "mc2", "gloo"), help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    for name in ("seq", "batch", "hidden", "heads", "ffn", "iters", "rounds"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1")
    if a.warmup < 0:
        p.error("--warmup must be at least 0")
    return a


# ---------------------------------------------------------------- worker

def worker(a):
    import torch
    sys.path.insert(0, str(REPO / "examples" / "torch"))
    import mc2.nn as mnn
    from tp_model import Block

    rank, size, tp = 0, 1, None
    if a.worker == "single":
        torch.set_num_threads(2)
    else:
        torch.set_num_threads(1)
        if a.worker == "mc2":
            import mc2
            tp = mc2.world()
            rank, size = tp.rank(), tp.size()
        else:
            import torch.distributed as dist
            rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            cpus = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
            dist.init_process_group("gloo", store=dist.FileStore(a.store, size), rank=rank,
                                    world_size=size)
            tp = dist.distributed_c10d._get_default_group()
    dtype = getattr(torch, a.dtype)
    torch.manual_seed(0)
    opts = {"pipeline": a.pipeline, "splits": a.splits} if a.worker == "mc2" else {}
    layer = Block(a.hidden, a.heads, a.ffn, tp=tp, tp_size=size, **opts)
    layer = layer.to(dtype)
    x = torch.randn(a.seq, a.batch, a.hidden).to(dtype)
    g = torch.randn(a.seq, a.batch, a.hidden).to(dtype)
    if tp is not None:
        x, g = mnn.sequence_shard(x, tp), mnn.sequence_shard(g, tp)
    sp_params = [p for m in (layer.ln1, layer.ln2) for p in m.parameters()]
    x.requires_grad_()

    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        out = layer(x)
        loss = (out.float() * g.float()).sum()
        loss.backward()
        if tp is not None:
            mnn.allreduce_grads(sp_params, tp)
        return loss.item()

    first_loss = step()
    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.iters):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    print("TORCH_TP " + json.dumps({"rank": rank, "loss": first_loss, "times": times}),
          flush=True)


# ---------------------------------------------------------------- driver

def worker_args(a):
    args = [sys.executable, str(pathlib.Path(__file__).resolve())]
    for name in ("seq", "batch", "hidden", "heads", "ffn", "iters", "warmup", "dtype", "pipeline",
                 "splits"):
        args += [f"--{name}", str(getattr(a, name))]
    return args


def collect(outputs, what):
    rows = []
    for text in outputs:
        for line in text.splitlines():
            tag = line.find("TORCH_TP ")
            if tag >= 0:
                rows.append(json.loads(line[tag + len("TORCH_TP "):]))
    if not rows:
        raise SystemExit(f"torch_tp.py: the {what} run printed no result:\n" + "\n".join(outputs))
    steps = [max(r["times"][i] for r in rows) for i in range(len(rows[0]["times"]))]
    return steps, sum(r["loss"] for r in rows)


def run_mode(a, mode, env):
    args = worker_args(a) + ["--worker", mode]
    if mode == "single":
        out = subprocess.run(args, env=env, capture_output=True, text=True)
        outputs = [out.stdout + out.stderr]
        ok = out.returncode == 0
    elif mode == "mc2":
        mc2 = pathlib.Path(a.build) / "tools" / "mc2"
        out = subprocess.run([str(mc2), "run", "-n", "2"] + args, env=env, capture_output=True,
                             text=True)
        outputs = [out.stdout + out.stderr]
        ok = out.returncode == 0
    else:
        with tempfile.TemporaryDirectory(prefix="torch_tp_") as tmp:
            store = os.path.join(tmp, "store")
            procs = [subprocess.Popen(args + ["--store", store],
                                      env=dict(env, RANK=str(r), WORLD_SIZE="2"),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                     for r in range(2)]
            outputs = [p.communicate()[0] for p in procs]
            ok = all(p.returncode == 0 for p in procs)
    if not ok:
        raise SystemExit(f"torch_tp.py: the {mode} run failed:\n" + "\n".join(outputs))
    return collect(outputs, mode)


def main(argv):
    a = parse(argv)
    if a.worker:
        return worker(a)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(pathlib.Path(a.build) / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(OMP_NUM_THREADS="1", MC2_GEMM_THREADS="1")
    modes = ("single", "mc2", "gloo")
    steps = {m: [] for m in modes}
    losses = {}
    for i in range(a.rounds):
        # Each round starts with another run, so that none always follows the same one.
        for m in modes[i % 3:] + modes[:i % 3]:
            s, loss = run_mode(a, m, env)
            steps[m] += s
            losses.setdefault(m, loss)
    ref = losses["single"]
    base = statistics.median(steps["single"])
    labels = {"single": "unsharded, 1 process, 2 threads",
              "mc2": "TP=2 mc2 (fused operators)",
              "gloo": "TP=2 gloo"}
    print(f"# transformer layer fwd+bwd: seq {a.seq} batch {a.batch} hidden {a.hidden} "
          f"heads {a.heads} ffn {a.ffn} {a.dtype}; {a.rounds} rounds x {a.iters} steps; "
          f"{os.cpu_count()} CPUs")
    print(f"{'run':<34}{'median ms':>11}{'min ms':>10}{'vs single':>11}  check")
    result = {"config": {k: getattr(a, k) for k in
                         ("seq", "batch", "hidden", "heads", "ffn", "iters", "warmup", "rounds",
                          "dtype", "pipeline", "splits")},
              "runs": {}}
    wrong = False
    tol = 1e-3 if a.dtype == "float32" else 5e-2
    for m in modes:
        med, low = statistics.median(steps[m]), min(steps[m])
        ok = abs(losses[m] - ref) <= tol * max(1.0, abs(ref))
        wrong |= not ok
        print(f"{labels[m]:<34}{med * 1e3:>11.1f}{low * 1e3:>10.1f}{med / base:>11.2f}  "
              f"{'OK' if ok else 'WRONG'}")
        result["runs"][m] = {"label": labels[m], "median_s": med, "min_s": low,
                             "ratio_to_single": med / base, "loss": losses[m], "ok": ok,
                             "steps_s": steps[m]}
    if a.json_file:
        pathlib.Path(a.json_file).write_text(json.dumps(result, indent=1) + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
