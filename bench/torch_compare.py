#!/usr/bin/python3
"""The torch.distributed backend "mc2" against "gloo" (and "mpi" when this
torch has it), side by side in one run, on one host:

  - all_reduce (float32, sum) latency and bus bandwidth from 8 B to 64 MiB:
    dist.all_reduce(t) as a program calls it, and for mc2 also
    mc2.all_reduce (mc2's own call, without torch's dispatcher);
  - the same 8 B all_reduce from C++ (`mc2 bench`, private buffers), for
    the cost of the Python call;
  - a DistributedDataParallel training step (forward, backward with the
    gradient all-reduces, SGD step) of a 12-layer 2048 x 2048 MLP (50.4 M
    parameters), batch 16 per rank, one thread per rank: DDP unchanged on
    each backend; on mc2 also with mc2.ddp.allreduce_hook and
    gradient_as_bucket_view=True ("mc2 + mc2.ddp hook"), and the ranks'
    step under DDP's no_sync(), which communicates nothing ("no_sync
    (compute only)": what the ranks' computing at once costs on this
    machine's shared cores and memory, the floor of any 2-rank step); and
    the same step on one rank without DDP ("one_rank", the compute alone).

Usage: bench/torch_compare.py [-n RANKS] [--reps R] [--max-bytes B (e.g. 1M)]
                              [--ddp-steps S] [--mc2 PATH] [--json FILE]

Every measurement is repeated R times (default 3), the backends alternating
within each repetition so that they share the machine's conditions; the
figures are medians over the repetitions. Ranks are started as torchrun
starts them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so both backends
meet through the same TCP store. Needs the built package on PYTHONPATH
(PYTHONPATH=build/python).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

LAYERS, WIDTH, BATCH = 12, 2048, 16
# The DDP step's extra rows (ddp_step_s in the JSON).
HOOK = "mc2 + mc2.ddp hook"
NO_SYNC = "no_sync (compute only)"


def sizes(max_bytes):
    s, out = 8, []
    while s <= max_bytes:
        out.append(s)
        s *= 4 if s < 1 << 20 else 2
    return out


# ---------------------------------------------------------------- workers

def worker(args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    backend = args.worker
    if backend == "mc2":
        import mc2  # noqa: F401  (registers the backend)
    dist.init_process_group(backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    out = {"backend": backend, "ranks": n, "all_reduce": [], "mc2_all_reduce": []}

    def timed(fn, nbytes):
        # Iterations for about 0.2 s (rank 0's estimate, so that every rank
        # makes the same calls), at least 5; time per call, slowest rank.
        t = torch.ones(max(1, nbytes // 4))
        t0 = time.perf_counter()
        for _ in range(5):
            fn(t)
        count = torch.tensor([max(5, min(20000, int(0.2 / ((time.perf_counter() - t0) / 5))))])
        dist.broadcast(count, 0)
        iters = int(count.item())
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(t)
        took = torch.tensor([(time.perf_counter() - t0) / iters])
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        return took.item()

    for nbytes in sizes(args.max_bytes):
        out["all_reduce"].append([nbytes, timed(lambda t: dist.all_reduce(t), nbytes)])
        if backend == "mc2":
            import mc2
            out["mc2_all_reduce"].append([nbytes, timed(lambda t: mc2.all_reduce(t), nbytes)])

    if args.ddp_steps:
        def model(**ddp_options):
            return torch.nn.parallel.DistributedDataParallel(mlp(), **ddp_options)

        m = model()
        out["ddp_step"] = ddp_steps(m, args.ddp_steps, dist)
        out["parameters"] = sum(p.numel() for p in m.parameters())
        if backend == "mc2":
            # Both ranks compute, nothing is communicated: the floor of a
            # 2-rank step on this machine's shared cores and memory.
            out["ddp_no_sync"] = ddp_steps(m, args.ddp_steps, dist, no_sync=True)
            del m
            import mc2.ddp
            m = model(gradient_as_bucket_view=True)
            m.register_comm_hook(None, mc2.ddp.allreduce_hook)
            out["ddp_step_hook"] = ddp_steps(m, args.ddp_steps, dist)
        del m
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def mlp():
    import torch
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def ddp_steps(model, steps, dist=None, no_sync=False):
    """The median wall time of a training step (forward, backward, SGD
    step) over `steps` steps after 2 unmeasured ones, and the median CPU
    time this process (all its threads) spent in a step; no_sync: backward
    inside DDP's no_sync(), which communicates nothing."""
    import contextlib
    import torch
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    times, cpu = [], []
    for i in range(steps + 2):
        if dist is not None:
            dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad()
        with model.no_sync() if no_sync else contextlib.nullcontext():
            torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return statistics.median(times), statistics.median(cpu)


def one_rank(args):
    import torch
    torch.set_num_threads(1)
    step = ddp_steps(mlp(), args.ddp_steps)
    print("RESULT " + json.dumps({"backend": "one_rank", "ddp_step": step}), flush=True)


# ----------------------------------------------------------------- driver

def cxx_latency(args):
    """mc2 bench's 8 B all_reduce time (us, out of place, private buffers)."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="mc2-torch-compare.") as tmp:
        out = os.path.join(tmp, "bench.json")
        subprocess.run([args.mc2, "bench", "-n", str(args.nranks), "-b", "8", "-e", "8",
                        "--buffers", "private", "-i", "2000", "-w", "100", "--json", out,
                        "all_reduce"], check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)["rows"][0]["out_of_place"]["time_us"]


def launch(backend, n, args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = [sys.executable, os.path.abspath(__file__), "--worker", backend,
            "--max-bytes", str(args.max_bytes), "--ddp-steps", str(args.ddp_steps)]
    procs = []
    for r in range(n if backend != "one_rank" else 1):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(base, env=env, stdout=subprocess.PIPE, text=True))
    result = None
    for p in procs:
        stdout, _ = p.communicate()
        if p.returncode != 0:
            sys.exit(f"torch_compare: a {backend} rank failed (status {p.returncode})")
        for line in stdout.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line[7:])
    return result


_BYTE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
               "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30,
               "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


def byte_count(text):
    """A size as `mc2 bench -b/-e` reads it (core::ParseBytes): 1048576, 64K,
    1.5K, 256M or 2G (K = 1024)."""
    form = f"'{text}' is not a byte count such as 1048576, 64K, 256M or 2G"
    t = text.strip()
    i = 0
    while i < len(t) and (t[i].isdigit() or t[i] == "."):
        i += 1
    unit = t[i:].strip().lower()
    try:
        value = float(t[:i]) * _BYTE_UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(form) from None
    if value != int(value):
        raise argparse.ArgumentTypeError(form)
    if value < 8:
        raise argparse.ArgumentTypeError(f"{text}: the sizes start at 8 bytes")
    return int(value)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--nranks", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-bytes", type=byte_count, default=64 << 20,
                    help="largest all_reduce size, e.g. 1M or 67108864 (K = 1024)")
    ap.add_argument("--ddp-steps", type=int, default=5)
    ap.add_argument("--mc2", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "build", "tools", "mc2"),
                    help="the mc2 command for the C++ latency (default: build/tools/mc2)")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "one_rank":
        return one_rank(args)
    if args.worker:
        return worker(args)

    import torch.distributed as dist
    backends = ["mc2", "gloo"] + (["mpi"] if dist.is_mpi_available() else [])
    runs = {b: [] for b in backends + (["one_rank"] if args.ddp_steps else [])}
    cxx = []
    for rep in range(args.reps):
        for b in runs:
            runs[b].append(launch(b, args.nranks, args))
            print(f"torch_compare: repetition {rep + 1}/{args.reps}: {b} done", file=sys.stderr)
        cxx.append(cxx_latency(args))

    n = args.nranks
    factor = 2 * (n - 1) / n if n > 1 else 1.0

    def median_curve(b, key):
        curves = [r[key] for r in runs[b]]
        return [[curves[0][i][0], statistics.median(x[i][1] for x in curves)]
                for i in range(len(curves[0]))]

    summary = {"ranks": n, "reps": args.reps, "model": {"layers": LAYERS, "width": WIDTH,
                                                        "batch_per_rank": BATCH},
               "all_reduce": {}, "ddp_step_s": {}, "ddp_step_cpu_s": {}}
    for b in backends:
        summary["all_reduce"][b] = median_curve(b, "all_reduce")
    summary["all_reduce"]["mc2 (mc2.all_reduce)"] = median_curve("mc2", "mc2_all_reduce")
    summary["cxx_all_reduce_8B_us"] = statistics.median(cxx)
    if args.ddp_steps:
        # (wall, CPU) medians per configuration; rank 0's CPU time.
        rows = {b: [r["ddp_step"] for r in runs[b]] for b in runs}
        rows[HOOK] = [r["ddp_step_hook"] for r in runs["mc2"]]
        rows[NO_SYNC] = [r["ddp_no_sync"] for r in runs["mc2"]]
        for b, xs in rows.items():
            summary["ddp_step_s"][b] = statistics.median(x[0] for x in xs)
            summary["ddp_step_cpu_s"][b] = statistics.median(x[1] for x in xs)
        summary["parameters"] = runs["mc2"][0]["parameters"]

    names = list(summary["all_reduce"])
    print(f"all_reduce float32 sum, {n} ranks: time (us) and busbw (GB/s), medians of {args.reps}")
    print(f"{'bytes':>10} " + " ".join(f"{nm:>28}" for nm in names))
    for i, (nbytes, _) in enumerate(summary["all_reduce"]["mc2"]):
        cells = []
        for nm in names:
            t = summary["all_reduce"][nm][i][1]
            cells.append(f"{t * 1e6:12.1f} us {factor * nbytes / t / 1e9:8.3f} GB/s")
        print(f"{nbytes:>10} " + " ".join(f"{c:>28}" for c in cells))
    print(f"the same 8 B all_reduce from C++ (mc2 bench, private buffers): "
          f"{summary['cxx_all_reduce_8B_us']:.2f} us")
    if args.ddp_steps:
        print(f"DDP step, {summary['parameters'] / 1e6:.1f} M parameters, batch {BATCH} per rank, "
              "1 thread per rank: wall time, and the CPU time of rank 0's process (all threads)")
        for b, t in summary["ddp_step_s"].items():
            print(f"  {b:>22}: {t * 1e3:8.1f} ms   cpu {summary['ddp_step_cpu_s'][b] * 1e3:8.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
