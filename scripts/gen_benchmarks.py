#!/usr/bin/python3
"""Writes docs/benchmarks.md from the recorded results in bench/results/*.json.

Usage: scripts/gen_benchmarks.py [--results DIR] [--output FILE | --check FILE]

--output FILE   where to write the page (default: docs/benchmarks.md)
--check FILE    write nothing; exit 1 with a diff if FILE differs from the
                page the results give (the `docs` ctest runs this), or if a
                loss-curve plot next to it does

Each grad_train result also gets its loss curves drawn as
images/NAME_loss.svg next to the page (scripts/plot_curves.py), linked from it.
The page is a pure function of the result files (scripts/record_bench.py
writes them), so it can be regenerated at any time and never drifts from
them. Results are shown in the order of their file names.
"""

import difflib
import importlib.util
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent


def _load_plotter():
    spec = importlib.util.spec_from_file_location("plot_curves",
                                                  pathlib.Path(__file__).with_name("plot_curves.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plot_curves = _load_plotter()
KINDS = ("compare_mpi", "bench_ops", "demo", "demo_infer", "demo_pp", "demo_cp", "demo_fsdp",
         "bench",
         "bench_batch", "torch_compare", "torch_tp", "torch_compress", "grad_overlap",
         "grad_exchange", "grad_train", "box_link")
REQUIRED = ("name", "kind", "date", "commit", "host", "command", "emulated", "result")
# The judged figure of the all_reduce comparison.
HEADLINE_SIZE = 16 << 20

HOW_TO = """\
## How to measure

### Recording a result

Every figure on this page comes from a result file under `bench/results/`,
one per measurement, written by the recorder:

```
scripts/record_bench.py NAME [--note TEXT] -- COMMAND ...
scripts/gen_benchmarks.py
```

The recorder runs COMMAND (`bench/compare_mpi.sh`, `mc2 bench`,
`mc2 bench ops`, `mc2 bench batch`, `mc2 demo`, `mc2 demo infer`,
`mc2 demo pp`, `mc2 demo cp` or `mc2 demo fsdp`), adds
the option that makes it write JSON,
and writes `bench/results/NAME.json` with the date (UTC), the commit (and
whether the tree had uncommitted changes), the host (CPU model, logical
cores), the exact command, `emulated` (the link emulation in force, or
null) and the tool's JSON. The generator then rewrites this page; the
`docs` test fails when the page and the results disagree. The figures of
the project's claims are recorded with:

```
scripts/record_bench.py all_reduce_vs_openmpi -- bench/compare_mpi.sh -n 2 -b 1M -e 64M -f 4 -r 5 --floor all_reduce
scripts/record_bench.py ops_all_gather_matmul -- build/tools/mc2 bench ops -n 2 --operator all_gather_matmul \\
    -m 2048 -k 2048 -N 2048 --pipeline all --link auto
scripts/record_bench.py ops_matmul_reduce_scatter -- build/tools/mc2 bench ops -n 2 \\
    --operator matmul_reduce_scatter -m 2048 -k 2048 -N 2048 --pipeline all --link auto
scripts/record_bench.py ops_matmul_all_reduce -- build/tools/mc2 bench ops -n 2 \\
    --operator matmul_all_reduce -m 2048 -k 2048 -N 2048 --pipeline all --link auto
scripts/record_bench.py demo -- build/tools/mc2 demo
scripts/record_bench.py infer_raw -- build/tools/mc2 demo infer --link none -i 15
scripts/record_bench.py infer_link -- build/tools/mc2 demo infer --link auto -i 15
scripts/record_bench.py pp_link -- build/tools/mc2 demo pp --pp 2 -m 8 --link auto -i 5
scripts/record_bench.py pp_raw -- build/tools/mc2 demo pp --pp 2 -m 8 --link none -i 5
scripts/record_bench.py cp_ring_cp2 -- build/tools/mc2 demo cp --cp 2 --seq 2048 --link auto -i 7
scripts/record_bench.py cp_ring_cp4 -- build/tools/mc2 demo cp --cp 4 --seq 2048 --link auto -i 7
scripts/record_bench.py fsdp_link -- build/tools/mc2 demo fsdp --link auto -i 5
scripts/record_bench.py batch_vs_separate -- build/tools/mc2 bench batch -n 2 --entries 200 --bytes 16K
PYTHONPATH=build/python scripts/record_bench.py torch_vs_gloo -- bench/torch_compare.py -n 2 --reps 3
PYTHONPATH=build/python scripts/record_bench.py torch_tp -- bench/torch_tp.py
scripts/record_bench.py torch_compress -- bench/torch_compress.py
scripts/record_bench.py grad_overlap_dp2 -- build/bench/grad_bench overlap --model demo -n 2 --ratio 0.5
scripts/record_bench.py grad_overlap_dp4 -- build/bench/grad_bench overlap --model demo -n 4 --ratio 0.5
scripts/record_bench.py grad_exchange_raw -- build/bench/grad_bench exchange -n 2 --mib 16
scripts/record_bench.py grad_exchange_link -- build/bench/grad_bench exchange -n 2 --mib 16 \\
    --link bw=20MB/s,lat=10us
scripts/record_bench.py grad_train -- build/bench/grad_bench train -n 2 --steps 200 \\
    --schemes none,bf16,f16,topk@0.3,topk@0.01,threshold,auto
```

Across hosts, on a cluster in a box (root; see "Across hosts" below):

```
scripts/record_bench.py box_all_reduce_vs_openmpi -- bench/compare_mpi.sh --box 2x2 --rate 1gbit \
    -b 8 -e 256M -f 4 -r 5 -i 5 -w 1 all_reduce
scripts/record_bench.py box_ops_all_gather_matmul -- bench/box_ops.sh --box 2x2 --rate auto -- \
    build/tools/mc2 bench ops --operator all_gather_matmul -m 1024 -k 2048 -N 2048 --pipeline all
scripts/record_bench.py box_ops_matmul_reduce_scatter -- bench/box_ops.sh --box 2x2 --rate auto -- \
    build/tools/mc2 bench ops --operator matmul_reduce_scatter -m 1024 -k 2048 -N 2048 --pipeline all
scripts/record_bench.py box_ops_matmul_all_reduce -- bench/box_ops.sh --box 2x2 --rate auto -- \
    build/tools/mc2 bench ops --operator matmul_all_reduce -m 1024 -k 2048 -N 2048 --pipeline all
scripts/record_bench.py box_link -- bench/box_link.sh --hosts 2 --rate 200mbit -r 3 -- \
    --operator all_gather_matmul -m 1024 -k 2048 -N 2048 --pipeline all
```

Record on a quiet machine, from a Release build of a committed tree: on a
machine shared with other work the same command can vary by a factor of
two from one minute to the next. Only ratios measured side by side in one run mean much, which is why
every tool below runs the things it compares in alternation.

### Collectives: `mc2 bench` and `bench/compare_mpi.sh`

`mc2 bench COLLECTIVE -n N -b MIN -e MAX -f FACTOR [--json FILE]` follows
nccl-tests: one row per size with the time, algorithm bandwidth and bus
bandwidth of the out-of-place and the in-place call and `#wrong` (with
`-c 1`), then the average bus bandwidth and OK/FAILED. It starts its own N
ranks, or runs inside `mc2 run`; `mc2 bench --help` lists the other options
(data type, reduction, algorithm, buffers, iterations). A debug build prints
a warning.

- size: bytes per rank as nccl-tests counts them (all_gather: the output,
  reduce_scatter: the input).
- time: the average of the timed iterations, in microseconds, of the
  slowest rank.
- algbw: size / time, in GB/s.
- busbw: algbw times a factor that makes the figure comparable with the
  hardware's bandwidth whatever the rank count, as nccl-tests'
  `doc/PERFORMANCE.md` explains: it counts the bytes each rank must move
  over the slowest link of an optimal algorithm.

| collective | busbw factor (n ranks) |
|---|---|
| all_reduce | 2(n-1)/n |
| all_gather, reduce_scatter, all_to_all | (n-1)/n |
| broadcast, reduce, send_recv | 1 |

`bench/compare_mpi.sh [-n N] [-b MIN] [-e MAX] [-r REPS] [--mpich]
COLLECTIVE...` runs the same sweep through Open MPI's collectives
(`bench/mpi_coll_bench.c`, the same columns and checkable data),
alternating mc2 and MPI `REPS` times. Per size it reports the median over
the repetitions of each side's time and busbw, `ratio` = busbw mc2 / busbw
MPI (> 1: mc2 faster) and `paired` = the median over repetitions of MPI
time / mc2 time of two runs made back to back, which cancels the host's
slow phases. With `--floor` (all_reduce, f32) it also runs
`bench/all_reduce_floor` in every repetition: N threads that do only the
data movement of an all_reduce (each input read once, each reduced element
read once per other rank, each output written once, spinning barriers in
between, mc2's kernels or plain loops, whichever is faster). No all_reduce
moves less data, so MPI / floor is the largest ratio any implementation
could reach against Open MPI on this host. The floor needs a quiet machine:
its spinning threads lose their cores to any other load.

### Fused operators: `mc2 bench ops`

`mc2 bench ops -n N --operator OP -m M -k K -N N --pipeline all --link auto`
times one fused operator (all_gather_matmul, matmul_reduce_scatter,
matmul_all_reduce, all_gather_batch_matmul, moe, moe_mlp) on an M x K x N
problem with every pipeline (serial, chunked, fused, auto) and split count
in round-robin iterations, and checks every pipeline's result against the
serial one. After the sweep it re-times compute-only, comm-only, serial,
the best pipeline and auto on fresh iterations (`--confirm`), because the
best of a sweep is biased low. Times are medians over iterations of the
slowest rank. `mc2 bench ops --help` explains its own columns; the table
below shows, from the confirmation when the run made one:

- compute ms / comm ms: the operator's GEMMs alone and its collective
  alone, timed in the same round-robin iterations as the pipelines;
- floor ms: max(compute ms, comm ms), which no pipeline can beat: it must
  run all of the compute and move all of the bytes;
- serial ms: the serial pipeline (compute, then communicate);
- best: the fastest pipeline and its split count, and its time;
- best overlap: (compute + comm - best) / min(compute, comm), the share of
  the shorter side hidden behind the longer one, at most 100%; `noise`
  when the best time is below the floor (the medians' noise), N/A when
  nothing can be hidden (one rank);
- model ms: the pipeline-fill model's prediction for the best
  configuration, max + min / stages: a prediction, not a bound;
- best vs serial: serial time / best time (> 1: the overlap pays);
- auto ran: what the `auto` pipeline chose, and its time;
- #wrong: elements that differ from the serial result, over all rows.

### The transformer: `mc2 demo`

`mc2 demo` trains the reference tensor-parallel transformer for a few
steps with each pipeline (serial first), from the same weights, and checks
that the losses are bitwise identical across them. Per pipeline:

- step ms: the median step time over the timed steps;
- vs serial: serial step time / this step time;
- communication %: the share of the step in which communication ran;
- uncovered %: the share in which communication ran and no computation
  covered it;
- tokens/s: tokens trained per second.

### Inference: `mc2 demo infer`

`mc2 demo infer` prefills a batch of prompts with the reference
transformer and decodes greedily with a KV cache (docs/models.md
"Inference"), with every pipeline in a rotating round robin on the same
model, and checks that the generated tokens (and their logits) are bitwise
identical across them. Per pipeline:

- TTFT ms: time to first token, the prefill (median over the timed
  generations); vs serial: serial TTFT / this TTFT;
- token p50 / p99 ms: the decode steps' latency (one token per prompt),
  percentiles over every timed step;
- decode tokens/s: tokens decoded per second over the whole batch; vs
  serial: this rate / serial's;
- prefill / decode comm %: the share of the phase in which communication
  ran (from the traced generation), prefill uncovered %: the share no
  computation covered;
- prefill ran / decode ran: the pipelines the fused operators ran in each
  phase (`auto` resolved per call).

### Pipeline parallelism: `mc2 demo pp`

`mc2 demo pp` trains the reference transformer split into pipeline stages
(docs/models.md "Pipeline parallelism and the 3D grid") with each schedule
in turn from the same seed, and checks that their losses are bitwise
identical. Per schedule:

- step ms: the whole step (pipeline, DP gradient exchange, AdamW), the
  slowest rank, median over the timed steps; pipeline ms: the forwards and
  backwards of every micro-batch, from a barrier to the last stage's end;
- bubble formula %: (p - 1) / (m + p - 1) for 1F1B, (p - 1) / (v m + p - 1)
  interleaved; bubble measured %: each stage's time in the pipeline phase
  neither computing nor waiting for a transfer that was still moving after
  its sender finished, from the schedule's own timestamps, mean over stages;
- uncovered send/recv %: per stage, that transfer wait, as a share of the
  pipeline phase;
- collective comm %: the share of the traced step in which the library's
  collectives ran (the TP operators, the DP exchange, the loss).
### Context parallelism: `mc2 demo cp`

`mc2 demo cp` runs ring attention forward and backward (docs/models.md
"Context parallelism") with the ring's transfers waited for before each
block's compute (no-overlap, the baseline) and posted ahead of it
(overlap), alternating on the same inputs, and checks that both give the
same bits. Per variant:

- step ms: forward + backward of the slowest rank (median over the timed
  steps); vs no-overlap: the baseline's step / this step;
- blocked ms: time a rank spent waiting for transfers;
- comm % / uncovered %: the share of the traced step in which a transfer
  ran / in which one ran and no computation covered it.

With `--link auto` the link is calibrated so that the non-overlapped
ring's transfers take as long as its compute: one block's transfer about
one block's compute.

### Sharded data parallelism: `mc2 demo fsdp`

`mc2 demo fsdp` trains the dense transformer with its parameters,
gradients and optimizer state sharded over the ranks (docs/models.md
"Sharded data parallelism"), with prefetch depth 0, 1 and 2 and beside
plain data parallelism, in a rotating round robin over the same steps, and
checks that every configuration's losses are bitwise identical. Per
configuration:

- step ms: the training step (median over the timed steps); vs prefetch 0:
  prefetch 0's step / this step;
- comm % / uncovered %: as above, from the traced step;
- memory MiB: the peak bytes of parameters, gradients and AdamW moments
  per rank (counted while held, activations not included);
  formula MiB: 16 P / N + (1 + prefetch) gathered units + 2 unit
  gradients; vs unsharded %: the peak over plain DP's 16 P.

### PyTorch: `bench/torch_compare.py`

`bench/torch_compare.py -n N --reps R` (with `PYTHONPATH=build/python`)
runs the torch.distributed backends mc2 and gloo (and MPI when torch has
it) side by side, alternating within each repetition, on ranks started as
torchrun starts them: `dist.all_reduce` of float32 from 8 B to 64 MiB
(time per call of the slowest rank; busbw as nccl-tests counts it), the
same through `mc2.all_reduce`, the 8 B all_reduce of `mc2 bench` (C++,
private buffers) for the cost of the Python call, and the median DDP
training step of a 50.4 M-parameter MLP on each backend and on one rank
without DDP (docs/python.md).

### PyTorch DDP with compression: `bench/torch_compress.py`

`bench/torch_compress.py` trains one DDP model per compression scheme of
`mc2.ddp.compressed_hook` (none, f16, bf16, threshold and top-k with error
feedback) under `mc2 run -n 2`, from the same weights on the same data,
the schemes taking their steps in turn. Per scheme: the final loss (mean
over the ranks and the last 20 steps) and its difference to none's, the
bytes one rank received per step with the scheme (wire) and what an
uncompressed all-reduce receives (dense), and the median step time
(forward, backward with the hook's exchanges, optimizer step; the slowest
rank's). Judged: bf16 and top-k end within 2% of none's loss.

### Gradient synchronisation: `bench/grad_bench`

`grad_bench` measures GradSync (docs/grad.md) on in-process ranks, in
three modes, each alternating the ways it compares:

- `overlap --model demo`: the data-parallel training step of `mc2 demo`'s
  model (TP 1) over an emulated link calibrated so that the gradient
  all-reduce takes `--ratio` x the backward (timed first without a link).
  Three copies of the model train in turn: GradSync buckets marked during
  backward (overlapped), every gradient marked after backward, and one
  all-reduce per tensor marked during backward; speedup = the
  after-backward step / this step. Without `--model demo` the backward is
  synthetic (one weight-gradient GEMM per layer) and the per-tensor way
  runs after backward.
- `exchange`: one gradient-sync step (every tensor marked, then `Finish`)
  per way: one all-reduce per tensor, GradSync uncompressed (bucketed), and
  each compression scheme; wire bytes = what one rank receives
  (`GradSyncStats::wire_bytes`), against the dense all-reduce's. `auto`
  (bf16 against dense, measured over its own steps first) and what it chose.
- `train`: the reference transformer trained from the same weights once per
  scheme; the mean loss of the last 10 steps against the first scheme's
  (uncompressed), and the loss curves as a plot.

### Across hosts: the cluster in a box

These need root: each brings up its own cluster in a box
([cluster.md](cluster.md): network namespaces as hosts, veth links shaped
with `tc`, real TCP between them, Open MPI's `mpirun` launching the ranks)
under the name `mc2bb` (`--box-name`, `--box-subnet` to change it), refuses
one of that name that is already up, and takes it down at exit, also after
an error or an interrupt. Every "host" shares the machine's cores, so the
TCP processing competes with the ranks' work: record on a quiet machine,
and with a rate well below what unshaped veth TCP carries there.

- `bench/compare_mpi.sh --box HOSTSxRANKS --rate RATE [--delay TIME] ...
  COLLECTIVE`: mc2 (`mc2 bench` on the ranks of an mpirun job), Open MPI's
  default collectives and Open MPI with its hierarchical `han` component
  (`--mca coll_han_priority 100`; out of place only, since 4.1's han
  crashes on `MPI_IN_PLACE`), alternating, with per size the medians, the
  ratios (of medians, and paired), and the bound the shaped rate sets on
  any implementation: the payload bytes the busiest host link must carry in
  each direction (full duplex) divided by the rate. For H hosts of L ranks
  and a size S: all_reduce 2(H-1)/H x S (reduce-scatter and all-gather of
  the host's sum between the hosts), all_gather and reduce_scatter
  (H-1)/H x S, all_to_all L(H-1)/H x S, broadcast and reduce S. TCP/IP and
  Ethernet headers, which `tc` counts, add about 4.5% at a 1500-byte MTU.
- `bench/box_ops.sh --box HOSTSxRANKS --rate RATE|auto -- build/tools/mc2
  bench ops --operator OP ...`: a fused operator's pipelines across the
  box. The compute and the transfer of a dense operator both grow with M,
  so their balance is set by the link: `--rate auto` calibrates the rate
  (short serial runs; the rate scaled by comm-only / compute-only until
  the two agree within 15%) so that the inter-host transfer takes about as
  long as the compute, the conditions the fused pipelines are built for.
  The table shows serial, the best pipeline, the floor max(compute-only,
  comm-only), serial / best and best / floor.
- `bench/box_link.sh --hosts H --rate RATE -- OPS OPTIONS`: the same
  operator and an all_reduce on H box hosts of one rank each and on one
  host under `--link bw=RATE,lat=LATENCY`, LATENCY being the box link's
  measured 8-byte send_recv time; the table shows both and real /
  emulated ([link-emulation.md](link-emulation.md) says where the two
  differ).

### Exploring

These print tables for a human and are not recorded: `bench/ops_table.sh`
(every dense operator and rank count in three regimes: balanced over an
emulated link, raw shared memory, communication-bound), `bench/demo_table.sh`
(the transformer's step time against pipeline and split count),
`bench/trace_overhead.sh` (what tracing costs on `mc2 bench ops`) and
`build/bench/gemm_bench` (GEMM throughput per backend and type, per core).
Each script's header explains its columns.

### Emulated links

On one host the "link" between ranks is shared memory, so fast that there
is little communication to hide. `--link SPEC` (or `MC2_LINK`) paces every
transfer as a slower link would (`bw=50MB/s,lat=5us`); `--link auto`
calibrates the bandwidth so that communication takes about as long as
computation, the regime the fused operators are built for
([link-emulation.md](link-emulation.md)). A figure measured under emulation
says so: its `link` column reads **emulated** with the setting used; "raw
shm" means no emulation.
"""


def die(msg):
    print(f"gen_benchmarks.py: {msg}", file=sys.stderr)
    sys.exit(2)


def load_results(directory):
    results = []
    for path in sorted(pathlib.Path(directory).glob("*.json")):
        try:
            r = json.loads(path.read_text())
        except ValueError as e:
            die(f"{path}: not valid JSON ({e})")
        if not isinstance(r, dict):
            die(f"{path}: expected a JSON object")
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            die(f"{path}: missing {', '.join(missing)} (write results with scripts/record_bench.py)")
        if r["kind"] not in KINDS:
            die(f"{path}: unknown kind '{r['kind']}' (expected {', '.join(KINDS)})")
        r["_file"] = path.name
        results.append(r)
    return results


def num(v, spec=".2f"):
    return "N/A" if v is None else format(v, spec)


def size_text(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def box_of(r):
    """The cluster in a box a result ran on (its "box" object), or None."""
    res = r.get("result")
    if not isinstance(res, dict):
        return None
    if res.get("box"):
        return res["box"]
    return next((c["box"] for c in res.get("collectives", []) if c.get("box")), None)


def box_text(box):
    delay = f", delay {box['delay']}" if box.get("delay") else ""
    ranks = box.get("ranks_per_host")
    return (f"box {box.get('hosts')} hosts x {ranks} rank{'' if ranks == 1 else 's'}, real TCP at "
            f"{box.get('rate')}{delay}")


def link_text(r):
    if r["kind"] == "box_link":
        return f"{box_text(box_of(r))} / **emulated** `{r['result'].get('emulated_link')}`"
    if box_of(r):
        return box_text(box_of(r))
    return f"**emulated** `{r['emulated']}`" if r["emulated"] else "raw shm"


def source_line(ref, r):
    host = r["host"] if isinstance(r["host"], dict) else {}
    dirty = " (uncommitted changes)" if r.get("dirty") else ""
    note = f" {r['note']}" if r.get("note") else ""
    return (f"- [{ref}] `{r['_file']}`: {r['date']}, commit `{r['commit']}`{dirty}, "
            f"{host.get('cpu', 'unknown CPU')}, {host.get('cores', '?')} cores, "
            f"{link_text(r)}: `{r['command']}`.{note}")


def table(header, rows):
    out = ["| " + " | ".join(h for h, _ in header) + " |",
           "|" + "|".join("---:" if right else "---" for _, right in header) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return out


def compare_rows(r):
    for coll in r["result"].get("collectives", []):
        for row in coll.get("rows", []):
            yield coll, row


def ops_summary(j):
    """Compute-only, comm-only, floor, serial, best (with its overlap and
    model) and auto of one mc2 bench ops result, from its confirmation
    iterations when it ran them, else from its sweep."""
    c = j.get("confirm")
    if c:
        return {"compute": c.get("compute_ms"), "comm": c.get("comm_ms"),
                "floor": c.get("floor_ms"), "serial": c.get("serial_ms"),
                "best": f"{c.get('best_pipeline')} s={c.get('best_splits')}",
                "best_ms": c.get("best_ms"), "below_floor": c.get("best_below_floor"),
                "overlap": c.get("best_overlap"), "model_ms": c.get("best_model_ms"),
                "auto_ran": c.get("auto_ran"), "auto_ms": c.get("auto_ms")}
    rows = [row for row in j.get("rows", []) if row.get("pipeline") != "auto"]
    auto = [row for row in j.get("rows", []) if row.get("pipeline") == "auto"]
    b = min(rows, key=lambda row: row["time_ms"]) if rows else {}
    return {"compute": j.get("compute_ms"), "comm": j.get("comm_ms"),
            "floor": j.get("floor_ms"), "serial": j.get("serial_ms"),
            "best": f"{b.get('pipeline')} s={b.get('splits')}" if b else None,
            "best_ms": b.get("time_ms"), "below_floor": b.get("below_floor"),
            "overlap": b.get("overlap"), "model_ms": b.get("model_ms"),
            "auto_ran": auto[0].get("ran") if auto else None,
            "auto_ms": auto[0].get("time_ms") if auto else None}


def overlap_text(s):
    if s["below_floor"]:
        return "noise"
    return "N/A" if s["overlap"] is None else f"{s['overlap'] * 100:.0f}%"


def ratio(a, b):
    return a / b if a is not None and b else None


def headline(results, refs):
    rows = []
    for r in sorted(results, key=lambda r: KINDS.index(r["kind"])):
        ref = f"[{refs[r['_file']]}]"
        if r["kind"] == "compare_mpi":
            for coll, row in compare_rows(r):
                if coll.get("collective") == "all_reduce" and row.get("size") == HEADLINE_SIZE \
                        and coll.get("box"):
                    rows.append([f"all_reduce {size_text(HEADLINE_SIZE)} across hosts, "
                                 f"{coll.get('ranks')} ranks: mc2 / Open MPI, mc2 / Open MPI han, "
                                 f"time / bound", f"{num(row.get('ratio'))}x (paired "
                                 f"{num(row.get('paired'))}x), {num(row.get('han_ratio'))}x, "
                                 f"{num(row.get('mc2_over_bound'))}", link_text(r), ref])
                elif coll.get("collective") == "all_reduce" and row.get("size") == HEADLINE_SIZE:
                    bound = (f"; at most {num(row['max_ratio'])}x possible (MPI / floor)"
                             if row.get("max_ratio") else "")
                    rows.append([f"all_reduce {size_text(HEADLINE_SIZE)}, {coll.get('ranks')} ranks, "
                                 f"{coll.get('buffers')} buffers: busbw mc2 / Open MPI",
                                 f"{num(row.get('ratio'))}x (paired {num(row.get('paired'))}x)"
                                 f"{bound}", link_text(r), ref])
        elif r["kind"] == "bench_ops":
            j = r["result"]
            s = ops_summary(j)
            if j.get("box"):
                rows.append([f"{j.get('op')} {j.get('M')}x{j.get('K')}x{j.get('N')} across hosts, "
                             f"{j.get('ranks')} ranks: serial / best ({s['best']}), best / floor",
                             f"{num(ratio(s['serial'], s['best_ms']))}x, "
                             f"{num(ratio(s['best_ms'], s['floor']))}", link_text(r), ref])
                continue
            rows.append([f"{j.get('op')} {j.get('M')}x{j.get('K')}x{j.get('N')}, "
                         f"{j.get('ranks')} ranks: serial / best ({s['best']})",
                         f"{num(ratio(s['serial'], s['best_ms']))}x", link_text(r), ref])
        elif r["kind"] == "demo":
            j = r["result"]
            runs = j.get("runs", [])
            fastest = max(runs, key=lambda x: x.get("speedup", 0)) if runs else {}
            same = "identical" if j.get("losses_identical") else "NOT identical"
            rows.append([f"mc2 demo, {j.get('ranks')} ranks: serial step / {fastest.get('pipeline')} step",
                         f"{num(fastest.get('speedup'))}x, losses {same}", link_text(r), ref])
        elif r["kind"] == "demo_infer":
            j = r["result"]
            runs = j.get("runs", [])
            serial = next((x for x in runs if x.get("pipeline") == "serial"), {})
            auto = next((x for x in runs if x.get("pipeline") == "auto"), {})
            same = "identical" if j.get("tokens_identical") else "NOT identical"
            rows.append([f"mc2 demo infer, {j.get('ranks')} ranks: time to first token, serial / auto "
                         f"(auto's prefill ran {auto.get('prefill_ran')})",
                         f"{num(auto.get('ttft_speedup'))}x ({num(serial.get('ttft_ms'), '.1f')} / "
                         f"{num(auto.get('ttft_ms'), '.1f')} ms), tokens {same}", link_text(r), ref])
        elif r["kind"] == "demo_pp":
            j = r["result"]
            for x in j.get("runs", []):
                sched = x.get("schedule") + (f" v={x.get('virtual_stages')}"
                                             if x.get("virtual_stages", 1) > 1 else "")
                rows.append([f"mc2 demo pp, pp {j.get('pp')} x dp {j.get('dp')} x tp {j.get('tp')}, "
                             f"{j.get('micro_batches')} micro-batches, {sched}: bubble measured / formula",
                             f"{num(100 * x.get('bubble_measured', 0), '.1f')}% / "
                             f"{num(100 * x.get('bubble_formula', 0), '.1f')}%", link_text(r), ref])
        elif r["kind"] == "demo_cp":
            j = r["result"]
            runs = j.get("runs", [])
            base = next((x for x in runs if not x.get("overlap")), {})
            over = next((x for x in runs if x.get("overlap")), {})
            same = "identical" if j.get("identical") else "NOT identical"
            rows.append([f"mc2 demo cp, cp {j.get('cp')} x tp {j.get('tp')}, sequence {j.get('seq')}: "
                         f"ring attention step, no-overlap / overlap",
                         f"{num(over.get('speedup'))}x ({num(base.get('step_ms'), '.1f')} / "
                         f"{num(over.get('step_ms'), '.1f')} ms), results {same}", link_text(r), ref])
        elif r["kind"] == "demo_fsdp":
            j = r["result"]
            runs = j.get("runs", [])
            best = max((x for x in runs if x.get("config", "").startswith("prefetch-")),
                       key=lambda x: x.get("speedup_vs_prefetch0", 0), default={})
            same = "identical" if j.get("losses_identical") else "NOT identical"
            rows.append([f"mc2 demo fsdp, {j.get('ranks')} ranks: step without prefetch / "
                         f"{best.get('config')} step",
                         f"{num(best.get('speedup_vs_prefetch0'))}x, losses {same}",
                         link_text(r), ref])
        elif r["kind"] == "bench_batch":
            j = r["result"]
            for c in j.get("cases", []):
                rows.append([f"batch of {c.get('entries')} {c.get('case')} entries, "
                             f"{size_text(j.get('bytes', 0))} each, {j.get('ranks')} ranks: "
                             f"separate calls / one batch",
                             f"{num(c.get('speedup'))}x", link_text(r), ref])
        elif r["kind"] == "box_link":
            for f in r["result"].get("figures", []):
                if f.get("figure", "").endswith(("best pipeline", " B")):
                    rows.append([f"{f['figure']}, {r['result'].get('ranks')} hosts: real link / "
                                 "emulated link", f"{num(f.get('real_over_emulated'))}",
                                 link_text(r), ref])
        elif r["kind"] == "torch_compare":
            rows += torch_headline(r, ref)
        elif r["kind"] == "torch_compress":
            sch = r["result"].get("schemes", {})
            for key in ("bf16", "topk"):
                x = sch.get(key)
                if x:
                    rows.append([f"DDP with {key} compression: final loss vs none, wire / dense "
                                 "bytes", f"{num(x.get('loss_vs_none', 0) * 100, '+.2f')}%, "
                                 f"{num(x.get('wire_bytes_per_step', 0) / max(1, x.get('dense_bytes_per_step', 0)))}x",
                                 link_text(r), ref])
        elif r["kind"] == "grad_overlap":
            j = r["result"]
            w = {x.get("name"): x.get("median_s") for x in j.get("ways", [])}
            what = "demo model" if j.get("model") == "demo" else "synthetic backward"
            bs = {x.get("name"): x.get("backward_sync_s") for x in j.get("ways", [])}
            part = (f" (backward + gradient wait "
                    f"{num(ratio(bs.get('after_backward'), bs.get('overlapped')))}x)"
                    if bs.get("overlapped") else "")
            rows.append([f"GradSync, {what}, DP {j.get('ranks')}, sync = {num(j.get('ratio'))} x "
                         "backward: step syncing after backward / overlapped step",
                         f"{num(ratio(w.get('after_backward'), w.get('overlapped')))}x{part}",
                         link_text(r), ref])
            if "per_tensor" in w:
                rows.append([f"GradSync, {what}, DP {j.get('ranks')}: one all-reduce per tensor / "
                             "buckets (both overlapped)",
                             f"{num(ratio(w.get('per_tensor'), w.get('overlapped')))}x",
                             link_text(r), ref])
            if "per_tensor_after" in w:
                rows.append([f"GradSync, {what}, DP {j.get('ranks')}: per-tensor all-reduces after "
                             "backward / bucketed after backward",
                             f"{num(ratio(w.get('per_tensor_after'), w.get('after_backward')))}x",
                             link_text(r), ref])
        elif r["kind"] == "grad_exchange":
            j = r["result"]
            a = j.get("auto") or {}
            if a:
                rows.append([f"GradSync auto compression, {j.get('ranks')} ranks, "
                             f"{num(j.get('elements', 0) * 4 / 2**20, '.0f')} MiB of gradients: "
                             f"chose (dense / {a.get('lossy')} step)",
                             f"{a.get('chose')} ({num(ratio(a.get('dense_step_s'), a.get('lossy_step_s')))}x)",
                             link_text(r), ref])
        elif r["kind"] == "grad_train":
            j = r["result"]
            for run in j.get("runs", [])[1:]:
                rows.append([f"transformer, {j.get('steps')} steps, DP {j.get('ranks')}: last-10 "
                             f"loss, {run.get('scheme')} vs {j['runs'][0].get('scheme')}",
                             f"{run.get('rel_to_first', 0) * 100:+.2f}%", link_text(r), ref])
        elif r["kind"] == "torch_tp":
            runs = r["result"].get("runs", {})
            single = runs.get("single", {}).get("median_s")
            for key in ("mc2", "gloo"):
                t = runs.get(key, {}).get("median_s")
                if t and single:
                    rows.append([f"torch transformer layer fwd+bwd: {runs[key].get('label')} / "
                                 "unsharded on the same 2 CPUs", f"{num(t / single)}x",
                                 link_text(r), ref])
    if not rows:
        return []
    return ["### Summary", ""] + table(
        [("figure", False), ("value", True), ("link", False), ("source", False)], rows) + [""]


def compare_section(results, refs):
    out = []
    for r in results:
        for coll in r["result"].get("collectives", []):
            box = coll.get("box")
            where = f", across hosts ({box_text(box)})" if box else ""
            out += [f"### {coll.get('collective')}, {coll.get('ranks')} ranks, {coll.get('dtype')}, "
                    f"{coll.get('buffers')} buffers{where}: mc2 against Open MPI "
                    f"[{refs[r['_file']]}]", "",
                    f"Medians of {coll.get('reps')} alternated repetitions, time = {coll.get('stat')} of "
                    f"{coll.get('iters')} iterations, busbw in GB/s, ratio = mc2 / MPI (> 1: mc2 "
                    f"faster).", ""]
            header = [("size", True), ("mc2 us", True), ("MPI us", True), ("mc2 busbw", True),
                      ("MPI busbw", True), ("ratio", True), ("paired", True),
                      ("in-place ratio", True), ("mc2 algorithm", False)]
            rows = [[size_text(row["size"]), num(row.get("mc2_us")), num(row.get("mpi_us")),
                     num(row.get("mc2_busbw_gbs")), num(row.get("mpi_busbw_gbs")),
                     num(row.get("ratio")), num(row.get("paired")), num(row.get("ratio_in_place")),
                     row.get("mc2_algo", "")] for row in coll.get("rows", [])]
            if box:
                header += [("han us", True), ("mc2 / han", True), ("han paired", True),
                           ("bound us", True), ("mc2 / bound", True), ("MPI / bound", True)]
                for cells, row in zip(rows, coll.get("rows", [])):
                    cells += [num(row.get("han_us"), ".1f"), num(row.get("han_ratio")),
                              num(row.get("han_paired")), num(row.get("bound_us"), ".1f"),
                              num(row.get("mc2_over_bound")), num(row.get("mpi_over_bound"))]
                out[-1:-1] = [f"Every host link shaped to {box.get('rate')} each way (tc tbf "
                              "on veth pairs, scripts/cluster.sh); Open MPI han = Open MPI with "
                              f"`{box.get('han')}`, out of place; mc2 / han = han time / mc2 "
                              f"time; bound = {box.get('bound') or 'none stated'}: the payload "
                              "bytes the busiest host link carries each way, full duplex, at the "
                              "shaped rate (H hosts, L ranks per host, S = size)."]
            if any("floor_us" in row for row in coll.get("rows", [])):
                header += [("floor us", True), ("mc2 / floor", True), ("MPI / floor", True)]
                for cells, row in zip(rows, coll.get("rows", [])):
                    cells += [num(row.get("floor_us")), num(row.get("mc2_over_floor")),
                              num(row.get("max_ratio"))]
                out[-1:-1] = ["The floor is the data movement alone (`bench/all_reduce_floor`: "
                              "each input read once, each reduced element read once per other "
                              "rank, each output written once, no synchronisation but barriers); "
                              "MPI / floor is the largest ratio any all_reduce could reach "
                              "against Open MPI on this host.", ""]
            out += table(header, rows) + [""]
    return out


def box_ops_section(results, refs):
    rows = []
    for r in results:
        j = r["result"]
        s = ops_summary(j)
        wrong = sum(row.get("wrong", 0) or 0 for row in j.get("rows", []))
        rows.append([j.get("op"), f"{j['box'].get('hosts')} x {j['box'].get('ranks_per_host')}",
                     j["box"].get("rate") + (" (calibrated)" if j["box"].get("calibration") else ""),
                     f"{j.get('M')}x{j.get('K')}x{j.get('N')}", j.get("dtype"),
                     num(s["compute"], ".1f"), num(s["comm"], ".1f"), num(s["floor"], ".1f"),
                     num(s["serial"], ".1f"), s["best"], num(s["best_ms"], ".1f"),
                     f"{num(ratio(s['serial'], s['best_ms']))}x",
                     num(ratio(s["best_ms"], s["floor"])), wrong, f"[{refs[r['_file']]}]"])
    if not rows:
        return []
    header = [("operator", False), ("hosts x ranks", False), ("link rate", False),
              ("M x K x N", False), ("dtype", False), ("compute ms", True), ("comm ms", True),
              ("floor ms", True), ("serial ms", True), ("best", False), ("best ms", True),
              ("serial / best", True), ("best / floor", True), ("#wrong", True),
              ("source", False)]
    return ["### Fused operators across hosts (`bench/box_ops.sh`)", "",
            "Real TCP between the hosts of a cluster in a box, every host link shaped to the "
            "rate shown (calibrated: chosen so that comm-only ~ compute-only); floor = "
            "max(compute-only, comm-only).", ""] + table(header, rows) + [""]


def box_link_section(results, refs):
    out = []
    for r in results:
        j = r["result"]
        out += [f"### Emulated against real links: {j.get('op')} {j.get('M')}x{j.get('K')}x"
                f"{j.get('N')} and all_reduce, {j.get('ranks')} hosts x 1 rank "
                f"[{refs[r['_file']]}]", "",
                f"`bench/box_link.sh`: on the box ({box_text(j.get('box', {}))}; measured "
                f"latency {num(j.get('latency_us'), '.1f')} us) and on one host with "
                f"`--link {j.get('emulated_link')}`; medians of {j.get('reps')} alternated "
                f"repetitions; best pipeline on the box {', '.join(j.get('best_box', []))}, "
                f"emulated {', '.join(j.get('best_emulated', []))}; #wrong {j.get('wrong')}.", ""]
        rows = [[f.get("figure"), num(f.get("box")), num(f.get("emulated")),
                 num(f.get("real_over_emulated"))] for f in j.get("figures", [])]
        out += table([("figure", False), ("box ms", True), ("emulated ms", True),
                      ("real / emulated", True)], rows) + [""]
    return out


def ops_section(results, refs):
    rows = []
    for r in results:
        j = r["result"]
        s = ops_summary(j)
        wrong = sum(row.get("wrong", 0) or 0 for row in j.get("rows", []))
        rows.append([j.get("op"), j.get("ranks"), f"{j.get('M')}x{j.get('K')}x{j.get('N')}",
                     j.get("dtype"), link_text(r), num(s["compute"], ".1f"),
                     num(s["comm"], ".1f"), num(s["floor"], ".1f"), num(s["serial"], ".1f"),
                     s["best"], num(s["best_ms"], ".1f"), overlap_text(s),
                     num(s["model_ms"], ".1f"), f"{num(ratio(s['serial'], s['best_ms']))}x",
                     s["auto_ran"] or "N/A", num(s["auto_ms"], ".1f"), wrong,
                     f"[{refs[r['_file']]}]"])
    if not rows:
        return []
    header = [("operator", False), ("ranks", True), ("M x K x N", False), ("dtype", False),
              ("link", False), ("compute ms", True), ("comm ms", True), ("floor ms", True),
              ("serial ms", True), ("best", False), ("best ms", True), ("best overlap", True),
              ("model ms", True), ("best vs serial", True), ("auto ran", False),
              ("auto ms", True), ("#wrong", True), ("source", False)]
    return ["### Fused operators (`mc2 bench ops`)", ""] + table(header, rows) + [""]


def demo_section(results, refs):
    out = []
    for r in results:
        j = r["result"]
        out += [f"### The transformer (`mc2 demo`), {j.get('ranks')} ranks, tp {j.get('tp')} "
                f"[{refs[r['_file']]}]", "",
                f"Link: {link_text(r)}. Losses "
                f"{'bitwise identical' if j.get('losses_identical') else 'NOT identical'} "
                "across the pipelines.", ""]
        header = [("pipeline", False), ("ran", False), ("step ms", True), ("vs serial", True),
                  ("communication %", True), ("uncovered %", True), ("tokens/s", True)]
        rows = [[x.get("pipeline"), x.get("ran"), num(x.get("step_ms"), ".0f"),
                 f"{num(x.get('speedup'))}x", num(x.get("comm_pct"), ".1f"),
                 num(x.get("uncovered_pct"), ".1f"), num(x.get("tokens_per_s"), ".0f")]
                for x in j.get("runs", [])]
        out += table(header, rows) + [""]
    return out


def infer_section(results, refs):
    out = []
    for r in results:
        j = r["result"]
        out += [f"### Inference (`mc2 demo infer`), {j.get('ranks')} ranks, tp {j.get('tp')}, "
                f"{j.get('batch')} prompts of {j.get('prompt_len')} tokens, "
                f"{j.get('new_tokens')} new tokens [{refs[r['_file']]}]", "",
                f"Link: {link_text(r)}. Prefill "
                f"{'sequence-parallel' if j.get('sequence_parallel') else 'without sequence parallelism'}. "
                f"Generated tokens {'bitwise identical' if j.get('tokens_identical') else 'NOT identical'} "
                "across the pipelines.", ""]
        header = [("pipeline", False), ("prefill ran", False), ("decode ran", False),
                  ("TTFT ms", True), ("vs serial", True), ("token p50 ms", True),
                  ("token p99 ms", True), ("decode tokens/s", True), ("vs serial", True),
                  ("prefill comm %", True), ("prefill uncovered %", True), ("decode comm %", True)]
        rows = [[x.get("pipeline"), x.get("prefill_ran"), x.get("decode_ran"),
                 num(x.get("ttft_ms"), ".1f"), f"{num(x.get('ttft_speedup'))}x",
                 num(x.get("token_p50_ms"), ".2f"), num(x.get("token_p99_ms"), ".2f"),
                 num(x.get("decode_tokens_per_s"), ".0f"), f"{num(x.get('decode_speedup'))}x",
                 num(x.get("prefill_comm_pct"), ".1f"), num(x.get("prefill_uncovered_pct"), ".1f"),
                 num(x.get("decode_comm_pct"), ".1f")]
                for x in j.get("runs", [])]
        out += table(header, rows) + [""]
    return out


def pp_section(results, refs):
    out = []
    for r in results:
        j = r["result"]
        out += [f"### Pipeline parallelism (`mc2 demo pp`), pp {j.get('pp')} x dp {j.get('dp')} x "
                f"tp {j.get('tp')}, {j.get('layers')} layers, hidden {j.get('hidden')}, batch "
                f"{j.get('batch')} x {j.get('seq_len')} in {j.get('micro_batches')} micro-batches "
                f"[{refs[r['_file']]}]", "",
                f"Link: {link_text(r)}. Losses "
                f"{'bitwise identical' if j.get('losses_identical') else 'NOT identical'} across the "
                "schedules. Bubble: a stage's idle share of the pipeline phase, mean over stages; "
                "uncovered send/recv: per stage, % of the pipeline phase.", ""]
        header = [("schedule", False), ("step ms", True), ("pipeline ms", True),
                  ("bubble formula %", True), ("bubble measured %", True),
                  ("uncovered send/recv % per stage", False), ("collective comm %", True),
                  ("vs first", True)]
        rows = []
        for x in j.get("runs", []):
            sched = x.get("schedule") + (f" v={x.get('virtual_stages')}"
                                         if x.get("virtual_stages", 1) > 1 else "")
            rows.append([sched, num(x.get("step_ms"), ".1f"), num(x.get("pipeline_ms"), ".1f"),
                         num(100 * x.get("bubble_formula", 0), ".1f"),
                         num(100 * x.get("bubble_measured", 0), ".1f"),
                         " / ".join(num(u, ".2f") for u in x.get("stage_uncovered_pct", [])),
                         num(x.get("comm_pct"), ".1f"), f"{num(x.get('speedup'))}x"])
        out += table(header, rows) + [""]
    return out


def cp_section(results, refs):
    out = []
    for r in results:
        j = r["result"]
        out += [f"### Ring attention (`mc2 demo cp`), cp {j.get('cp')} x tp {j.get('tp')}, "
                f"sequence {j.get('seq')}, {j.get('heads')} heads of {j.get('head_dim')}, "
                f"batch {j.get('batch')}, {'causal' if j.get('causal') else 'no mask'} "
                f"[{refs[r['_file']]}]", "",
                f"Link: {link_text(r)}. Output and gradients "
                f"{'bitwise identical' if j.get('identical') else 'NOT identical'} across the variants; "
                f"medians of {j.get('iters')} steps.", ""]
        header = [("ring", False), ("step ms", True), ("vs no-overlap", True),
                  ("forward ms", True), ("backward ms", True), ("blocked ms", True),
                  ("comm %", True), ("uncovered %", True), ("free %", True)]
        rows = [["overlap" if x.get("overlap") else "no-overlap", num(x.get("step_ms"), ".1f"),
                 f"{num(x.get('speedup'))}x", num(x.get("forward_ms"), ".1f"),
                 num(x.get("backward_ms"), ".1f"), num(x.get("wait_ms"), ".1f"),
                 num(x.get("comm_pct"), ".1f"), num(x.get("uncovered_pct"), ".1f"),
                 num(x.get("free_pct"), ".1f")]
                for x in j.get("runs", [])]
        out += table(header, rows) + [""]
    return out


def fsdp_section(results, refs):
    out = []
    for r in results:
        j = r["result"]
        out += [f"### Sharded data parallelism (`mc2 demo fsdp`), {j.get('ranks')} ranks, "
                f"{j.get('layers')} layers, hidden {j.get('hidden')}, ffn {j.get('ffn')}, "
                f"{j.get('batch')} sequences of {j.get('seq_len')} tokens [{refs[r['_file']]}]", "",
                f"Link: {link_text(r)}; without prefetch the forward's all-gathers took "
                f"{num(j.get('gather_over_compute_prefetch0'))} x its compute. Losses "
                f"{'bitwise identical' if j.get('losses_identical') else 'NOT identical'} "
                "across the configurations.", ""]
        header = [("configuration", False), ("step ms", True), ("vs prefetch 0", True),
                  ("comm %", True), ("uncovered %", True), ("memory MiB", True),
                  ("formula MiB", True), ("vs unsharded %", True)]
        mib = 1024.0 * 1024.0
        rows = [[x.get("config"), num(x.get("step_ms"), ".1f"),
                 f"{num(x.get('speedup_vs_prefetch0'))}x", num(x.get("comm_pct"), ".1f"),
                 num(x.get("uncovered_pct"), ".1f"), num(x.get("peak_bytes", 0) / mib, ".1f"),
                 num(x.get("formula_bytes", 0) / mib, ".1f"),
                 num(100.0 * x.get("peak_bytes", 0) / x["unsharded_bytes"]
                     if x.get("unsharded_bytes") else None, ".1f")]
                for x in j.get("runs", [])]
        out += table(header, rows) + [""]
    return out


def bench_section(results, refs):
    out = []
    for r in results:
        j = r["result"]
        out += [f"### `mc2 bench` {j.get('collective')}, {j.get('ranks')} ranks, {j.get('dtype')}, "
                f"{j.get('buffers')} buffers [{refs[r['_file']]}]", "",
                f"Link: {link_text(r)}. Times in us, bandwidths in GB/s.", ""]
        header = [("size", True), ("count", True), ("time", True), ("algbw", True),
                  ("busbw", True), ("in-place time", True), ("in-place busbw", True),
                  ("algorithm", False), ("#wrong", True)]
        rows = []
        for row in j.get("rows", []):
            o, i = row.get("out_of_place") or {}, row.get("in_place") or {}
            wrong = o.get("wrong")
            rows.append([size_text(row["size"]), row.get("count"), num(o.get("time_us")),
                         num(o.get("algbw_gbs")), num(o.get("busbw_gbs")),
                         num(i.get("time_us")), num(i.get("busbw_gbs")), o.get("algo", ""),
                         "N/A" if wrong is None else wrong])
        out += table(header, rows) + [f"", f"Average busbw {num(j.get('avg_busbw_gbs'))} GB/s.", ""]
    return out


def batch_section(results, refs):
    out = []
    for r in results:
        j = r["result"]
        out += [f"### `mc2 bench batch`, {j.get('ranks')} ranks, {j.get('entries')} entries of "
                f"{size_text(j.get('bytes', 0))} [{refs[r['_file']]}]", "",
                f"Link: {link_text(r)}. Time per batch in us: medians of {j.get('reps')} alternated "
                f"repetitions of {j.get('iters')} iterations, slowest rank; #wrong = entries whose "
                f"batch output differs from the separate call's.", ""]
        header = [("case", False), ("entries", True), ("bytes per rank", True),
                  ("separate us", True), ("batch us", True), ("speedup", True), ("#wrong", True)]
        rows = [[c.get("case"), c.get("entries"), c.get("bytes_per_rank"),
                 num(c.get("separate_us"), ".1f"), num(c.get("batch_us"), ".1f"),
                 f"{num(c.get('speedup'))}x", c.get("wrong")] for c in j.get("cases", [])]
        out += table(header, rows) + [""]
    return out


def torch_curve_at(j, backend, size):
    for nbytes, t in j.get("all_reduce", {}).get(backend, []):
        if nbytes == size:
            return t
    return None


def torch_headline(r, ref):
    j, rows = r["result"], []
    n = j.get("ranks")
    big, small = torch_curve_at(j, "mc2", HEADLINE_SIZE), torch_curve_at(j, "mc2", 8)
    gbig, gsmall = torch_curve_at(j, "gloo", HEADLINE_SIZE), torch_curve_at(j, "gloo", 8)
    if big and gbig:
        rows.append([f"torch all_reduce {size_text(HEADLINE_SIZE)}, {n} ranks: busbw mc2 / gloo",
                     f"{num(gbig / big)}x", link_text(r), ref])
    if small and gsmall:
        rows.append([f"torch all_reduce 8 B, {n} ranks: latency mc2 / gloo",
                     f"{num(small / gsmall, '.3f')}x", link_text(r), ref])
    steps = j.get("ddp_step_s", {})
    # DDP unchanged on the backend, and with mc2's DDP hook (buckets in the
    # symmetric heap, gradient_as_bucket_view) where the run measured it.
    for key, label in (("mc2", "mc2"), ("mc2 + mc2.ddp hook", "mc2 + mc2.ddp hook")):
        if steps.get(key) and steps.get("gloo"):
            rows.append([f"DDP step, {n} ranks: {label} / gloo",
                         f"{num(steps[key] / steps['gloo'])}x", link_text(r), ref])
        if steps.get(key) and steps.get("one_rank"):
            rows.append([f"DDP step, {n} ranks: {label} / one rank (compute alone)",
                         f"{num(steps[key] / steps['one_rank'])}x", link_text(r), ref])
    return rows


def torch_section(results, refs):
    out = []
    for r in results:
        j = r["result"]
        n = j.get("ranks") or 1
        factor = 2 * (n - 1) / n if n > 1 else 1.0
        curves = j.get("all_reduce", {})
        names = list(curves)
        others = [nm for nm in names if not nm.startswith("mc2")]
        out += [f"### torch.distributed: the mc2 backend against {', '.join(others)}, {n} ranks "
                f"[{refs[r['_file']]}]", "",
                f"`bench/torch_compare.py`: float32 sum all_reduce, medians of {j.get('reps')} "
                "alternated repetitions; time in us, busbw in GB/s.", ""]
        header = [("size", True)]
        for nm in names:
            header += [(f"{nm} us", True), (f"{nm} busbw", True)]
        rows = []
        for i, (nbytes, _) in enumerate(curves.get(names[0], []) if names else []):
            row = [size_text(nbytes)]
            for nm in names:
                t = curves[nm][i][1]
                row += [num(t * 1e6, ".1f"), num(factor * nbytes / t / 1e9, ".3f")]
            rows.append(row)
        out += table(header, rows) + [""]
        cxx = j.get("cxx_all_reduce_8B_us")
        if cxx is not None:
            out += [f"The same 8 B all_reduce from C++ (`mc2 bench`, private buffers, in the same "
                    f"run): {num(cxx)} us.", ""]
        steps = j.get("ddp_step_s", {})
        if steps:
            m = j.get("model", {})
            out += [f"DDP training step (forward, backward, SGD) of a {m.get('layers')}-layer "
                    f"{m.get('width')} x {m.get('width')} MLP, {num(j.get('parameters', 0) / 1e6, '.1f')} M "
                    f"parameters, batch {m.get('batch_per_rank')} per rank, one thread per rank; "
                    "`one_rank` is the same step without DDP on one rank (the compute alone):", ""]
            out += table([("backend", False), ("step ms", True)],
                         [[b, num(t * 1e3, ".1f")] for b, t in steps.items()]) + [""]
    return out


def torch_tp_section(results, refs):
    out = []
    for r in results:
        j = r["result"]
        c = j.get("config", {})
        out += [f"### A tensor-parallel transformer layer in PyTorch: mc2, gloo, unsharded "
                f"[{refs[r['_file']]}]", "",
                f"`bench/torch_tp.py`: forward and backward of one layer (seq {c.get('seq')}, "
                f"hidden {c.get('hidden')}, {c.get('heads')} heads, ffn {c.get('ffn')}, "
                f"{c.get('dtype')}), {c.get('rounds')} rounds of {c.get('iters')} steps on the "
                "same 2 CPUs; step time of the slowest rank, in ms; check = the loss agrees with "
                "the unsharded layer's.", ""]
        header = [("run", False), ("median ms", True), ("min ms", True), ("vs unsharded", True),
                  ("check", False)]
        rows = [[x.get("label"), num(x.get("median_s", 0) * 1e3, ".1f"),
                 num(x.get("min_s", 0) * 1e3, ".1f"), num(x.get("ratio_to_single")),
                 "OK" if x.get("ok") else "WRONG"] for x in j.get("runs", {}).values()]
        out += table(header, rows) + [""]
    return out


def torch_compress_section(results, refs):
    out = []
    for r in results:
        j = r["result"]
        c = j.get("config", {})
        out += [f"### DDP in PyTorch with each compression scheme [{refs[r['_file']]}]", "",
                f"`bench/torch_compress.py`: {c.get('ranks')} ranks, an MLP of {c.get('layers')} "
                f"hidden layers of {c.get('hidden')} ({c.get('params')} parameters), batch "
                f"{c.get('batch')} per rank, {c.get('steps')} steps; top-k ratio "
                f"{c.get('topk_ratio')}, threshold {c.get('threshold')}, error feedback on. "
                "Bytes one rank received per step; step time of the slowest rank.", ""]
        header = [("scheme", False), ("final loss", True), ("vs none", True), ("wire KB", True),
                  ("dense KB", True), ("wire / dense", True), ("median step ms", True),
                  ("check", False)]
        rows = []
        for name, x in j.get("schemes", {}).items():
            dense = x.get("dense_bytes_per_step", 0)
            rows.append([name, num(x.get("final_loss"), ".4f"),
                         f"{num(x.get('loss_vs_none', 0) * 100, '+.2f')}%",
                         num(x.get("wire_bytes_per_step", 0) / 1e3, ".1f"),
                         num(dense / 1e3, ".1f"),
                         num(x.get("wire_bytes_per_step", 0) / dense if dense else None),
                         num(x.get("median_step_s", 0) * 1e3, ".2f"),
                         ("OK" if x.get("ok") else "OVER 2%") if x.get("judged") else "-"])
        out += table(header, rows) + [""]
    return out


def grad_overlap_section(results, refs):
    out = []
    for r in results:
        j = r["result"]
        if j.get("model") == "demo":
            title = f"the demo model's training step, DP {j.get('ranks')}"
            what = (f"`grad_bench overlap --model demo`: `mc2 demo`'s model ({j.get('layers')} "
                    f"layers, hidden {j.get('hidden')}, ffn {j.get('ffn')}, "
                    f"{num(j.get('grad_bytes', 0) / 2**20, '.1f')} MiB of f32 gradients), TP 1, "
                    f"backward {num(j.get('compute_s', 0) * 1e3)} ms without a link, link "
                    f"{link_text(r)} (gradient all-reduce = {num(j.get('ratio'))} x backward). "
                    f"Whole training step of rank 0, medians of {j.get('reps')} steps per way, the "
                    "ways in turn; speedup = the after-backward step / this step.")
        else:
            mib = j.get("layers", 0) * j.get("hidden", 0) ** 2 * 4 / 2**20
            title = f"a synthetic backward, DP {j.get('ranks')}"
            what = (f"`grad_bench overlap`: {j.get('layers')} layers of {j.get('hidden')} x "
                    f"{j.get('hidden')} f32 gradients ({num(mib, '.1f')} MiB), backward compute "
                    f"{num(j.get('compute_s', 0) * 1e3)} ms, link {link_text(r)} (all-reduce = "
                    f"{num(j.get('ratio'))} x compute). Step time of rank 0, medians of alternated "
                    "repetitions; speedup = the after-backward step / this step.")
        out += [f"### GradSync overlapped with backward: {title} [{refs[r['_file']]}]", "", what, ""]
        ways = j.get("ways", [])
        after = next((w.get("median_s") for w in ways if w.get("name") == "after_backward"), None)
        header = [("way", False), ("median ms", True), ("min ms", True), ("speedup", True)]
        rows = [[w.get("name"), num(w.get("median_s", 0) * 1e3), num(w.get("min_s", 0) * 1e3),
                 f"{num(ratio(after, w.get('median_s')))}x"] for w in ways]
        if ways and all("backward_sync_s" in w for w in ways):  # demo model: backward + grad wait
            after_bs = next((w["backward_sync_s"] for w in ways if w.get("name") == "after_backward"),
                            None)
            header += [("bwd+sync ms", True), ("bwd+sync speedup", True)]
            for row, w in zip(rows, ways):
                row += [num(w["backward_sync_s"] * 1e3),
                        f"{num(ratio(after_bs, w['backward_sync_s']))}x"]
        out += table(header, rows) + [""]
    return out


def grad_exchange_section(results, refs):
    out = []
    for r in results:
        j = r["result"]
        out += [f"### GradSync compression: bytes and time, {j.get('ranks')} ranks, "
                f"{num(j.get('elements', 0) * 4 / 2**20, '.0f')} MiB in {j.get('tensors')} tensors "
                f"[{refs[r['_file']]}]", "",
                f"`grad_bench exchange`, link {link_text(r)}: one gradient-sync step per way, "
                f"medians of {j.get('reps')} alternated repetitions (rank 0); wire bytes = what "
                "one rank receives; vs bucketed = the uncompressed GradSync step / this step.", ""]
        ways = j.get("ways", [])
        base = next((w.get("median_s") for w in ways if w.get("name") == "bucketed"), None)
        rows = [[w.get("name"), w.get("scheme", ""), num(w.get("median_s", 0) * 1e3, ".2f"),
                 w.get("wire_bytes"), num(ratio(w.get("wire_bytes"), w.get("dense_bytes")), ".3f"),
                 f"{num(ratio(base, w.get('median_s')))}x"] for w in ways]
        out += table([("way", False), ("ran", False), ("median ms", True), ("wire bytes", True),
                      ("wire / dense", True), ("vs bucketed", True)], rows) + [""]
        a = j.get("auto")
        if a:
            out += [f"`auto` measured dense against {a.get('lossy')} over {a.get('measuring_steps')} "
                    f"steps (median step, slowest rank: dense {num(a.get('dense_step_s', 0) * 1e3)} "
                    f"ms, {a.get('lossy')} {num(a.get('lossy_step_s', 0) * 1e3)} ms; kept only when "
                    f"{num(a.get('min_speedup'))}x faster) and chose **{a.get('chose')}**.", ""]
    return out


def train_plot_name(r):
    return f"images/{pathlib.Path(r['_file']).stem}_loss.svg"


def train_plot(r):
    j = r["result"]
    return plot_curves.train_svg(j, f"grad_bench train: loss per step, DP {j.get('ranks')}, "
                                    f"{j.get('steps')} steps")


def grad_train_section(results, refs):
    out = []
    for r in results:
        j = r["result"]
        runs = j.get("runs", [])
        first = runs[0].get("scheme") if runs else "?"
        out += [f"### GradSync compression: training, DP {j.get('ranks')}, {j.get('steps')} steps "
                f"[{refs[r['_file']]}]", "",
                f"`grad_bench train`: the reference transformer from the same weights once per "
                f"scheme ({j.get('warmup')} warm-up steps uncompressed; topk@R sends the fraction R "
                f"of each bucket, with error feedback). Last-10 = the mean loss of the last 10 "
                f"steps; vs {first} = its relative difference.", ""]
        rows = [[x.get("scheme"), num(x.get("losses", [None])[0], ".4f"),
                 num(x.get("tail_mean"), ".4f"), f"{x.get('rel_to_first', 0) * 100:+.2f}%",
                 num(x.get("seconds"), ".1f")] for x in runs]
        out += table([("scheme", False), ("first loss", True), ("last-10 loss", True),
                      (f"vs {first}", True), ("run s", True)], rows) + [""]
        out += [f"![loss curves]({train_plot_name(r)})", ""]
    return out


def plots(results):
    """{path relative to the page: SVG text} for every grad_train result."""
    return {train_plot_name(r): train_plot(r) for r in results if r["kind"] == "grad_train"}


def render(results):
    lines = ["# Benchmarks", "",
             "<!-- Generated by scripts/gen_benchmarks.py from bench/results/*.json: edit those",
             "     (scripts/record_bench.py) or the script, not this page. -->", "",
             "How to measure mc2, then the current figures, each with the date, commit, host",
             "and command that produced it. Earlier figures live in the git history of",
             "`bench/results/`.", "", HOW_TO.rstrip("\n"), "", "## Current figures", ""]
    if not results:
        lines += ["No results are recorded yet: `bench/results/` holds no result file. Record",
                  "them with `scripts/record_bench.py` (the commands are under",
                  "[Recording a result](#recording-a-result)), then run",
                  "`scripts/gen_benchmarks.py` to rewrite this page.", ""]
        return "\n".join(lines)
    refs = {r["_file"]: i + 1 for i, r in enumerate(results)}
    by_kind = {k: [r for r in results if r["kind"] == k] for k in KINDS}
    lines += headline(results, refs)
    lines += compare_section(by_kind["compare_mpi"], refs)
    lines += ops_section([r for r in by_kind["bench_ops"] if not box_of(r)], refs)
    lines += box_ops_section([r for r in by_kind["bench_ops"] if box_of(r)], refs)
    lines += box_link_section(by_kind["box_link"], refs)
    lines += demo_section(by_kind["demo"], refs)
    lines += infer_section(by_kind["demo_infer"], refs)
    lines += pp_section(by_kind["demo_pp"], refs)
    lines += cp_section(by_kind["demo_cp"], refs)
    lines += fsdp_section(by_kind["demo_fsdp"], refs)
    lines += bench_section(by_kind["bench"], refs)
    lines += batch_section(by_kind["bench_batch"], refs)
    lines += torch_section(by_kind["torch_compare"], refs)
    lines += torch_tp_section(by_kind["torch_tp"], refs)
    lines += torch_compress_section(by_kind["torch_compress"], refs)
    lines += grad_overlap_section(by_kind["grad_overlap"], refs)
    lines += grad_exchange_section(by_kind["grad_exchange"], refs)
    lines += grad_train_section(by_kind["grad_train"], refs)
    lines += ["### Sources", ""] + [source_line(refs[r["_file"]], r) for r in results] + [""]
    return "\n".join(lines)


def main(argv):
    results_dir, output, check = REPO / "bench" / "results", REPO / "docs" / "benchmarks.md", None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print(__doc__)
            return 0
        if a not in ("--results", "--output", "--check") or i + 1 >= len(argv):
            die(f"unexpected argument {a} (see --help)")
        value = pathlib.Path(argv[i + 1])
        if a == "--results":
            results_dir = value
        elif a == "--output":
            output = value
        else:
            check = value
        i += 2
    if not results_dir.is_dir():
        die(f"results directory {results_dir} does not exist")
    results = load_results(results_dir)
    page = render(results)
    images = plots(results)
    if check is None:
        output.write_text(page)
        for rel, svg in images.items():
            (output.parent / rel).parent.mkdir(exist_ok=True)
            (output.parent / rel).write_text(svg)
        return 0
    for rel, svg in images.items():
        path = check.parent / rel
        if not path.exists() or path.read_text() != svg:
            print(f"gen_benchmarks.py: {path} is missing or differs from what {results_dir} gives; "
                  "run scripts/gen_benchmarks.py and commit it", file=sys.stderr)
            return 1
    try:
        current = check.read_text()
    except OSError as e:
        die(f"cannot read {check}: {e.strerror}")
    if current == page:
        return 0
    sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), page.splitlines(True),
                                               str(check), "generated"))
    print(f"\ngen_benchmarks.py: {check} differs from what {results_dir} gives; "
          "run scripts/gen_benchmarks.py and commit the page", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
