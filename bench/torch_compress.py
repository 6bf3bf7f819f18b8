#!/usr/bin/python3
"""DistributedDataParallel training with each compression scheme of
mc2.ddp.compressed_hook, side by side: loss, bytes on the wire, step time.

Usage: bench/torch_compress.py [--steps 200] [--batch 64] [--hidden 512]
                               [--layers 3] [--topk-ratio 0.05]
                               [--threshold 1e-3] [--build build] [--json FILE]

Under `mc2 run -n 2` (started by this script), each rank builds one DDP
model per scheme (none, f16, bf16, threshold with error feedback, topk with
error feedback), all from the same initial weights, and trains them on the
same data: a classification task whose labels a fixed random teacher
network gives (an MLP of --layers hidden layers of --hidden, inputs 256,
10 classes; --batch rows per rank and step, SGD with momentum). The
schemes take their steps in turn (step i of each before step i+1 of any,
the order rotating), so a change in the machine's load falls on all of
them alike. A step is forward, backward (the hook's exchanges overlap it)
and the optimizer step; its time is the slowest rank's.

Printed per scheme: the final loss (the mean over ranks and over the last
20 steps), its difference to none's, the bytes one rank received per step
(wire) and what an uncompressed all-reduce receives (dense), and the
median step time. Judged (exit status 1 otherwise): bf16 and topk with
error feedback end within 2% of none's loss. --json FILE writes the same
as JSON with every step's loss.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
SCHEMES = ("none", "f16", "bf16", "threshold", "topk")
JUDGED = ("bf16", "topk")
TAIL = 20


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--topk-ratio", type=float, default=0.05)
    p.add_argument("--threshold", type=float, default=1e-3)
    p.add_argument("--build", default=str(REPO / "build"))
    p.add_argument("--json", dest="json_file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.steps < TAIL:
        p.error(f"--steps must be >= {TAIL}")
    return a


def mlp(a, d_in, d_out, seed):
    import torch
    torch.manual_seed(seed)
    dims = [d_in] + [a.hidden] * a.layers
    layers = []
    for i, o in zip(dims[:-1], dims[1:]):
        layers += [torch.nn.Linear(i, o), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(dims[-1], d_out))


def worker(a):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import mc2

    torch.set_num_threads(1)
    mc2.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    teacher = mlp(a, 256, 10, seed=1)
    init = mlp(a, 256, 10, seed=2).state_dict()
    runs = {}
    for s in SCHEMES:
        m = mlp(a, 256, 10, seed=2)
        m.load_state_dict(init)
        model = DDP(m, gradient_as_bucket_view=True)
        state = mc2.ddp.CompressionState(scheme=s, threshold=a.threshold,
                                          topk_ratio=a.topk_ratio, error_feedback=True)
        model.register_comm_hook(state, mc2.ddp.compressed_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        runs[s] = {"model": model, "state": state, "opt": opt, "loss": [], "times": []}
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(a.steps):
        x = torch.randn(a.batch, 256, generator=gen)
        with torch.no_grad():
            y = teacher(x).argmax(dim=1)
        order = SCHEMES[step % len(SCHEMES):] + SCHEMES[:step % len(SCHEMES)]
        for s in order:
            r = runs[s]
            t0 = time.perf_counter()
            r["opt"].zero_grad()
            loss = torch.nn.functional.cross_entropy(r["model"](x), y)
            loss.backward()
            r["opt"].step()
            r["times"].append(time.perf_counter() - t0)
            r["loss"].append(loss.item())
    out = {s: {"loss": r["loss"], "times": r["times"], "steps": r["state"].steps,
               "wire_bytes": r["state"].wire_bytes, "dense_bytes": r["state"].dense_bytes}
           for s, r in runs.items()}
    params = sum(p.numel() for p in runs["none"]["model"].parameters())
    print("TORCH_COMPRESS " + json.dumps({"rank": rank, "size": size, "params": params,
                                          "runs": out}), flush=True)
    return 0


def main(argv):
    a = parse(argv)
    if a.worker:
        return worker(a)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(pathlib.Path(a.build) / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(OMP_NUM_THREADS="1", MC2_GEMM_THREADS="1")
    mc2 = pathlib.Path(a.build) / "tools" / "mc2"
    args = [sys.executable, str(pathlib.Path(__file__).resolve())] + argv + ["--worker"]
    if a.json_file:
        i = args.index("--json")
        del args[i:i + 2]
    proc = subprocess.run([str(mc2), "run", "-n", "2"] + args, env=env, capture_output=True,
                          text=True)
    rows = [json.loads(line.split("TORCH_COMPRESS ", 1)[1])
            for line in proc.stdout.splitlines() if "TORCH_COMPRESS " in line]
    if proc.returncode != 0 or len(rows) != 2:
        raise SystemExit("torch_compress.py: the training run failed:\n" + proc.stdout +
                         proc.stderr)
    n = len(rows)
    result = {"config": {"steps": a.steps, "batch": a.batch, "hidden": a.hidden,
                         "layers": a.layers, "topk_ratio": a.topk_ratio,
                         "threshold": a.threshold, "ranks": n, "params": rows[0]["params"]},
              "schemes": {}}
    for s in SCHEMES:
        curve = [sum(r["runs"][s]["loss"][i] for r in rows) / n for i in range(a.steps)]
        times = [max(r["runs"][s]["times"][i] for r in rows) for i in range(a.steps)]
        result["schemes"][s] = {
            "final_loss": statistics.mean(curve[-TAIL:]),
            "wire_bytes_per_step": rows[0]["runs"][s]["wire_bytes"] / a.steps,
            "dense_bytes_per_step": rows[0]["runs"][s]["dense_bytes"] / a.steps,
            "median_step_s": statistics.median(times),
            "loss_curve": curve}
    base = result["schemes"]["none"]["final_loss"]
    wrong = False
    c = result["config"]
    print(f"# DDP, {n} ranks, MLP 256-{'-'.join([str(a.hidden)] * a.layers)}-10 "
          f"({c['params']} parameters), batch {a.batch}/rank, {a.steps} steps; topk ratio "
          f"{a.topk_ratio}, threshold {a.threshold}, error feedback on")
    print(f"{'scheme':<11}{'final loss':>11}{'vs none':>9}{'wire KB':>10}{'dense KB':>10}"
          f"{'step ms':>9}  check")
    for s in SCHEMES:
        x = result["schemes"][s]
        rel = (x["final_loss"] - base) / base
        x["loss_vs_none"] = rel
        ok = s not in JUDGED or abs(rel) <= 0.02
        x["judged"] = s in JUDGED
        x["ok"] = ok
        wrong |= not ok
        print(f"{s:<11}{x['final_loss']:>11.4f}{rel * 100:>8.2f}%"
              f"{x['wire_bytes_per_step'] / 1e3:>10.1f}{x['dense_bytes_per_step'] / 1e3:>10.1f}"
              f"{x['median_step_s'] * 1e3:>9.2f}  {'OK' if ok else 'OVER 2%'}"
              f"{'' if s in JUDGED else ' (not judged)'}")
    if a.json_file:
        pathlib.Path(a.json_file).write_text(json.dumps(result, indent=1) + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
