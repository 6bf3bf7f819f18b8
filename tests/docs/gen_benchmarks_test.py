#!/usr/bin/python3
"""Tests of scripts/gen_benchmarks.py and scripts/record_bench.py on made-up
results: the page shows the recorded values and the ratios computed from
them, says which figures ran under emulation, and refuses malformed files.

Usage: gen_benchmarks_test.py SOURCE_DIR
"""

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = pathlib.Path(sys.argv.pop(1) if len(sys.argv) > 1 else ".").resolve()
GEN = SOURCE / "scripts" / "gen_benchmarks.py"


def load_recorder():
    spec = importlib.util.spec_from_file_location("record_bench", SOURCE / "scripts" / "record_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(name, kind, result, emulated=None, command="cmd"):
    return {"name": name, "kind": kind, "date": "2030-01-02T03:04:05Z", "commit": "0123456789ab",
            "dirty": False, "host": {"cpu": "Test CPU", "cores": 2, "kernel": "6"},
            "command": command, "emulated": emulated, "env": {}, "note": "", "stdout": "",
            "result": result}


COMPARE = record("ar", "compare_mpi", {"collectives": [{
    "collective": "all_reduce", "ranks": 2, "dtype": "f32", "buffers": "symmetric", "iters": 20,
    "reps": 5, "stat": "avg", "mpich": False, "rows": [
        {"size": 8, "mc2_us": 1.0, "mpi_us": 2.0, "mc2_busbw_gbs": 0.01, "mpi_busbw_gbs": 0.005,
         "ratio": 2.0, "paired": 2.0, "ratio_in_place": 1.5, "mc2_algo": "direct"},
        {"size": 16 << 20, "mc2_us": 1000.0, "mpi_us": 3500.0, "mc2_busbw_gbs": 16.78,
         "mpi_busbw_gbs": 4.79, "ratio": 3.503, "paired": 3.41, "ratio_in_place": 3.0,
         "mc2_algo": "rabenseifner"}]}]}, command="bench/compare_mpi.sh -n 2 all_reduce")

# The sweep's fused row respects the floor (max(150, 140) = 150); the
# confirmation's best (145) beats it, which only noise can do. Model: 8
# stages (2 ranks x 4 splits), 150 + 140 / 8.
OPS = record("ops_agmm", "bench_ops", {
    "op": "all_gather_matmul", "ranks": 2, "dtype": "f32", "M": 2048, "K": 2048, "N": 2048,
    "link": "bw=81 MB/s, lat=5 us", "compute_ms": 150.0, "comm_ms": 140.0, "floor_ms": 150.0,
    "serial_ms": 300.0, "rows": [
        {"pipeline": "serial", "splits": 1, "stages": 1, "time_ms": 300.0, "floor_ms": 150.0,
         "below_floor": False, "overlap": 0.0, "model_ms": 290.0, "wrong": 0, "ran": "serial s=1"},
        {"pipeline": "fused", "splits": 4, "stages": 8, "time_ms": 160.0, "floor_ms": 150.0,
         "below_floor": False, "overlap": (150.0 + 140.0 - 160.0) / 140.0, "model_ms": 167.5,
         "wrong": 0, "ran": "fused s=4"}],
    "confirm": {"compute_ms": 150.0, "comm_ms": 140.0, "floor_ms": 150.0, "serial_ms": 290.0,
                "best_pipeline": "fused", "best_splits": 4, "best_ms": 145.0,
                "best_below_floor": True, "best_overlap": None, "best_model_ms": 167.5,
                "auto_ran": "fused s=4", "auto_ms": 150.0}}, emulated="auto (bw=81MB/s,lat=5us)")

DEMO = record("demo", "demo", {"ranks": 2, "tp": 2, "link": "bw=81MB/s,lat=5us",
                               "losses_identical": True, "runs": [
    {"pipeline": "serial", "ran": "serial s=1", "step_ms": 1000.0, "speedup": 1.0, "comm_pct": 45.0,
     "uncovered_pct": 43.0, "tokens_per_s": 1024.0},
    {"pipeline": "fused", "ran": "fused s=16", "step_ms": 625.0, "speedup": 1.6, "comm_pct": 40.0,
     "uncovered_pct": 8.0, "tokens_per_s": 1638.0}]}, emulated="auto (bw=81MB/s,lat=5us)")

BATCH = record("batch", "bench_batch", {
    "tool": "mc2 bench batch", "ranks": 2, "entries": 200, "bytes": 16384, "iters": 20, "reps": 7,
    "cases": [{"case": "all_reduce", "entries": 200, "bytes_per_rank": 3276800,
               "separate_us": 4000.0, "batch_us": 400.0, "speedup": 10.0, "wrong": 0}]},
    command="build/tools/mc2 bench batch -n 2")

TORCH_TP = record("tp", "torch_tp", {
    "config": {"seq": 512, "batch": 1, "hidden": 1024, "heads": 16, "ffn": 4096, "iters": 10,
               "warmup": 3, "rounds": 3, "dtype": "float32", "pipeline": "auto", "splits": 4},
    "runs": {"single": {"label": "unsharded, 1 process, 2 threads", "median_s": 0.4, "min_s": 0.39,
                        "ratio_to_single": 1.0, "ok": True},
             "mc2": {"label": "TP=2 mc2 (fused operators)", "median_s": 0.2, "min_s": 0.19,
                     "ratio_to_single": 0.5, "ok": True}}},
    command="bench/torch_tp.py")

GRAD_OVERLAP = record("go", "grad_overlap", {
    "ranks": 2, "layers": 8, "hidden": 512, "link": "bw=9B/s,lat=5us", "compute_s": 0.1,
    "ratio": 0.5, "ways": [{"name": "overlapped", "median_s": 0.1, "min_s": 0.09},
                           {"name": "after_backward", "median_s": 0.15, "min_s": 0.14},
                           {"name": "per_tensor_after", "median_s": 0.3, "min_s": 0.29}]},
    emulated="calibrated (bw=9B/s,lat=5us)", command="build/bench/grad_bench overlap -n 2")

GRAD_EXCHANGE = record("gx", "grad_exchange", {
    "ranks": 2, "elements": 1 << 20, "tensors": 4, "link": "bw=1MB/s", "reps": 3, "ways": [
        {"name": "bucketed", "median_s": 0.4, "min_s": 0.4, "wire_bytes": 4000, "dense_bytes": 4000,
         "sent_elements": 1000, "scheme": "none"},
        {"name": "bf16", "median_s": 0.2, "min_s": 0.2, "wire_bytes": 2000, "dense_bytes": 4000,
         "sent_elements": 1000, "scheme": "bf16"}],
    "auto": {"lossy": "bf16", "chose": "bf16", "dense_step_s": 0.5, "lossy_step_s": 0.25,
             "min_speedup": 1.05, "measuring_steps": 9}},
    emulated="bw=1MB/s", command="build/bench/grad_bench exchange -n 2 --link bw=1MB/s")

GRAD_TRAIN = record("gt", "grad_train", {
    "ranks": 2, "steps": 3, "warmup": 0, "runs": [
        {"scheme": "none", "losses": [4.0, 3.0, 2.0], "tail_mean": 3.0, "rel_to_first": 0.0,
         "seconds": 1.0},
        {"scheme": "topk@0.3", "losses": [4.0, 3.5, 2.5], "tail_mean": 3.3, "rel_to_first": 0.1,
         "seconds": 1.5}]}, command="build/bench/grad_bench train -n 2 --steps 3")
# Across a cluster in a box: 2 hosts x 2 ranks at 100mbit (12.5 MB/s); the
# all_reduce bound at 16 MiB is 2 (H-1)/H x S / rate = 16 MiB / 12.5 MB/s.
BOUND_16M_US = (16 << 20) / 12.5e6 * 1e6
BOX = {"hosts": 2, "ranks_per_host": 2, "rate": "100mbit", "rate_bytes_per_s": 12.5e6,
       "delay": None, "links": "real TCP", "han": "--mca coll_han_priority 100",
       "bound": "2(H-1)/H x S / rate"}
BOX_COMPARE = record("box_ar", "compare_mpi", {"collectives": [{
    "collective": "all_reduce", "ranks": 4, "dtype": "f32", "buffers": "symmetric", "iters": 5,
    "reps": 3, "stat": "avg", "mpich": False, "box": BOX, "rows": [
        {"size": 16 << 20, "mc2_us": 1.5e6, "mpi_us": 2.4e6, "mc2_busbw_gbs": 0.017,
         "mpi_busbw_gbs": 0.010, "ratio": 1.6, "paired": 1.55, "ratio_in_place": 1.4,
         "mc2_algo": "hierarchical", "han_us": 3.0e6, "han_ratio": 2.0, "han_paired": 1.9,
         "bound_us": BOUND_16M_US, "mc2_over_bound": 1.5e6 / BOUND_16M_US,
         "mpi_over_bound": 2.4e6 / BOUND_16M_US}]}]},
    command="bench/compare_mpi.sh --box 2x2 --rate 100mbit all_reduce")

BOX_OPS = record("box_ops", "bench_ops", dict(json.loads(json.dumps(OPS["result"])), ranks=4, link="",
                                               box=dict(BOX, mtu=9000, calibration=[
                                                   {"rate": "100mbit", "compute_ms": 150.0,
                                                    "comm_ms": 170.0}])),
                 command="bench/box_ops.sh --box 2x2 --rate auto -- mc2 bench ops")

BOX_LINK = record("box_link", "box_link", {
    "op": "all_gather_matmul", "M": 512, "K": 1024, "N": 1024, "dtype": "f32", "ranks": 2,
    "reps": 3, "box": dict(BOX, ranks_per_host=1), "latency_us": 300.0,
    "emulated_link": "bw=12.5000MB/s,lat=300.0us", "all_reduce_bytes": 16 << 20,
    "best_box": ["fused s=4"], "best_emulated": ["fused s=4"], "wrong": 0, "figures": [
        {"figure": "all_gather_matmul best pipeline", "unit": "ms", "box": 120.0, "emulated": 100.0,
         "real_over_emulated": 1.2},
        {"figure": "all_reduce 16777216 B", "unit": "ms", "box": 1500.0, "emulated": 1400.0,
         "real_over_emulated": 1500.0 / 1400.0}]},
    emulated="bw=12.5000MB/s,lat=300.0us (one-host side)", command="bench/box_link.sh --hosts 2")


# A stand-in for the mc2 command: `mc2 bench ... --json FILE` writes a
# result to FILE, so that the recorder runs without a benchmark.
FAKE_MC2 = """#!/bin/sh
while [ $# -gt 0 ]; do
  if [ "$1" = --json ]; then echo '{"rows": [], "fake": true}' > "$2"; fi
  shift
done
echo fake bench ran
"""


def run_gen(*args):
    return subprocess.run([sys.executable, str(GEN), *args], capture_output=True, text=True)


class GenBenchmarksTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = pathlib.Path(self.tmp.name)
        self.results = self.dir / "results"
        self.results.mkdir()
        self.page = self.dir / "page.md"

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, *records):
        for r in records:
            (self.results / f"{r['name']}.json").write_text(json.dumps(r))

    def generate(self):
        proc = run_gen("--results", str(self.results), "--output", str(self.page))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return self.page.read_text()

    def test_empty_results_say_so(self):
        page = self.generate()
        self.assertIn("## How to measure", page)
        self.assertIn("No results are recorded yet", page)
        self.assertNotIn("### Summary", page)

    def test_summary_rows_carry_the_judged_figures(self):
        self.write(COMPARE, OPS, DEMO)
        lines = self.generate().splitlines()
        summary = [l for l in lines if l.startswith("| all_reduce 16 MiB")]
        self.assertEqual(len(summary), 1)
        self.assertIn("| 3.50x (paired 3.41x) | raw shm |", summary[0])
        ops = [l for l in lines if l.startswith("| all_gather_matmul 2048x2048x2048")]
        # serial / best of the confirmation: 290 / 145.
        self.assertIn(f"| {290.0 / 145.0:.2f}x | **emulated** `auto (bw=81MB/s,lat=5us)` |", ops[0])
        demo = [l for l in lines if l.startswith("| mc2 demo, 2 ranks")]
        self.assertIn("fused step | 1.60x, losses identical |", demo[0])

    def test_tables_and_sources(self):
        self.write(COMPARE, OPS)
        page = self.generate()
        self.assertIn("| 16 MiB | 1000.00 | 3500.00 | 16.78 | 4.79 | 3.50 | 3.41 | 3.00 | rabenseifner |",
                      page)
        self.assertIn("| all_gather_matmul | 2 | 2048x2048x2048 | f32 | **emulated** "
                      "`auto (bw=81MB/s,lat=5us)` | 150.0 | 140.0 | 150.0 | 290.0 | fused s=4 | 145.0 | "
                      "noise | 167.5 | 2.00x | fused s=4 | 150.0 | 0 | [2] |", page)
        self.assertIn("- [1] `ar.json`: 2030-01-02T03:04:05Z, commit `0123456789ab`, Test CPU, 2 cores, "
                      "raw shm: `bench/compare_mpi.sh -n 2 all_reduce`.", page)

    def test_batch_summary_and_table(self):
        self.write(BATCH)
        page = self.generate()
        self.assertIn("| batch of 200 all_reduce entries, 16 KiB each, 2 ranks: separate calls / one "
                      "batch | 10.00x | raw shm | [1] |", page)
        self.assertIn("| all_reduce | 200 | 3276800 | 4000.0 | 400.0 | 10.00x | 0 |", page)

    def test_torch_tp_summary_and_table(self):
        self.write(TORCH_TP)
        page = self.generate()
        self.assertIn("| torch transformer layer fwd+bwd: TP=2 mc2 (fused operators) / unsharded on "
                      "the same 2 CPUs | 0.50x | raw shm | [1] |", page)
        self.assertIn("| TP=2 mc2 (fused operators) | 200.0 | 190.0 | 0.50 | OK |", page)

    def test_ops_without_confirmation_use_the_sweep(self):
        ops = json.loads(json.dumps(OPS))
        del ops["result"]["confirm"]
        self.write(ops)
        page = self.generate()
        # Overlap (150 + 140 - 160) / min(150, 140), as a percentage.
        self.assertIn(f"| 150.0 | 300.0 | fused s=4 | 160.0 | {100 * 130.0 / 140.0:.0f}% | 167.5 | "
                      f"{300.0 / 160.0:.2f}x |", page)

    def test_ops_overlap_is_na_when_nothing_can_be_hidden(self):
        # The tool writes a null overlap, not below the floor, when min(compute,
        # comm) is 0 (one rank): the page says N/A, not noise.
        ops = json.loads(json.dumps(OPS))
        ops["result"]["confirm"]["best_below_floor"] = False
        ops["result"]["confirm"]["best_ms"] = 150.0
        self.write(ops)
        self.assertIn("| fused s=4 | 150.0 | N/A | 167.5 |", self.generate())

    def test_grad_sections_summary_and_plot(self):
        self.write(GRAD_OVERLAP, GRAD_EXCHANGE, GRAD_TRAIN)
        page = self.generate()
        self.assertIn("| GradSync, synthetic backward, DP 2, sync = 0.50 x backward: step syncing "
                      "after backward / overlapped step | 1.50x |", page)
        self.assertIn("| GradSync, synthetic backward, DP 2: per-tensor all-reduces after backward / "
                      "bucketed after backward | 2.00x |", page)
        self.assertIn("| overlapped | 100.00 | 90.00 | 1.50x |", page)
        demo = json.loads(json.dumps(GRAD_OVERLAP))
        demo["name"] = "go_demo"
        demo["result"].update({"model": "demo", "ffn": 2048, "grad_bytes": 1 << 20, "reps": 4})
        demo["result"]["ways"][2]["name"] = "per_tensor"
        for way, bs in zip(demo["result"]["ways"], (0.08, 0.1, 0.2)):
            way["backward_sync_s"] = bs
        self.write(demo)
        page = self.generate()
        self.assertIn("| GradSync, demo model, DP 2: one all-reduce per tensor / buckets (both "
                      "overlapped) | 3.00x |", page)
        self.assertIn("the demo model's training step, DP 2", page)
        self.assertIn("overlapped step | 1.50x (backward + gradient wait 1.25x) |", page)
        self.assertIn("| overlapped | 100.00 | 90.00 | 1.50x | 80.00 | 1.25x |", page)
        self.assertIn("| bf16 | bf16 | 200.00 | 2000 | 0.500 | 2.00x |", page)
        self.assertIn("chose (dense / bf16 step) | bf16 (2.00x) |", page)
        self.assertIn("and chose **bf16**.", page)
        self.assertIn("last-10 loss, topk@0.3 vs none | +10.00% |", page)
        self.assertIn("| topk@0.3 | 4.0000 | 3.3000 | +10.00% | 1.5 |", page)
        self.assertIn("![loss curves](images/gt_loss.svg)", page)
        svg = (self.dir / "images" / "gt_loss.svg").read_text()
        self.assertTrue(svg.startswith("<svg"))
        self.assertEqual(svg.count("<polyline"), 2)
        self.assertIn(">topk@0.3</text>", svg)
        # The check covers the plot too.
        self.assertEqual(run_gen("--results", str(self.results), "--check", str(self.page)).returncode, 0)
        (self.dir / "images" / "gt_loss.svg").write_text(svg.replace("topk", "tOpk"))
        proc = run_gen("--results", str(self.results), "--check", str(self.page))
        self.assertEqual(proc.returncode, 1)
        self.assertIn("gt_loss.svg", proc.stderr)
    def test_box_comparison_shows_han_and_the_bound(self):
        self.write(BOX_COMPARE)
        page = self.generate()
        # A result without an MTU was recorded at 1500 bytes.
        self.assertIn("across hosts (box 2 hosts x 2 ranks, real TCP at 100mbit, MTU 1500)", page)
        self.assertIn(f"| 3000000.0 | 2.00 | 1.90 | {BOUND_16M_US:.1f} | {1.5e6 / BOUND_16M_US:.2f} | "
                      f"{2.4e6 / BOUND_16M_US:.2f} |", page)
        self.assertIn(f"| 1.60x (paired 1.55x), 2.00x, {1.5e6 / BOUND_16M_US:.2f} | box 2 hosts x 2 "
                      "ranks, real TCP at 100mbit, MTU 1500 | [1] |", page)
        self.assertIn("bound = 2(H-1)/H x S / rate", page)

    def test_box_operators_show_best_over_floor(self):
        self.write(BOX_OPS)
        page = self.generate()
        self.assertIn("### Fused operators across hosts", page)
        self.assertNotIn("### Fused operators (`mc2 bench ops`)", page)
        # Confirmation: serial 290, best 145, floor 150.
        self.assertIn(f"| all_gather_matmul | 2 x 2 | 100mbit (calibrated) | 9000 | 2048x2048x2048 | f32 | 150.0 | "
                      f"140.0 | 150.0 | 290.0 | fused s=4 | 145.0 | {290 / 145:.2f}x | {145 / 150:.2f} | 0 |",
                      page)

    def test_box_link_table(self):
        self.write(BOX_LINK)
        page = self.generate()
        self.assertIn("| all_gather_matmul best pipeline | 120.00 | 100.00 | 1.20 |", page)
        self.assertIn(f"| all_reduce 16777216 B, 2 hosts: real link / emulated link | "
                      f"{1500 / 1400:.2f} |", page)
        self.assertIn("box 2 hosts x 1 rank, real TCP at 100mbit, MTU 1500 / **emulated** "
                      "`bw=12.5000MB/s,lat=300.0us`", page)

    def test_sources_say_which_records_had_uncommitted_changes(self):
        clean = dict(COMPARE, name="clean")
        dirty = dict(COMPARE, name="dirty", dirty=True)
        listed = dict(COMPARE, name="listed", dirty=True, dirty_files=["src/a.cc", "b.h"])
        self.write(clean, dirty, listed)
        lines = {name: [l for l in self.generate().splitlines() if f"`{name}.json`" in l]
                 for name in ("clean", "dirty", "listed")}
        for name, found in lines.items():
            self.assertEqual(len(found), 1, name)
        self.assertNotIn("uncommitted", lines["clean"][0])
        self.assertIn("commit `0123456789ab` (uncommitted changes)", lines["dirty"][0])
        self.assertIn("commit `0123456789ab` (uncommitted changes to `src/a.cc`, `b.h`)",
                      lines["listed"][0])

    def test_check_detects_drift(self):
        self.write(COMPARE)
        self.generate()
        self.assertEqual(run_gen("--results", str(self.results), "--check", str(self.page)).returncode, 0)
        self.page.write_text(self.page.read_text().replace("3.50", "9.99"))
        proc = run_gen("--results", str(self.results), "--check", str(self.page))
        self.assertEqual(proc.returncode, 1)
        self.assertIn("9.99", proc.stdout)

    def test_malformed_results_are_refused_by_name(self):
        (self.results / "bad.json").write_text("{not json")
        proc = run_gen("--results", str(self.results), "--output", str(self.page))
        self.assertEqual(proc.returncode, 2)
        self.assertIn("bad.json: not valid JSON", proc.stderr)
        bad = dict(COMPARE)
        del bad["commit"]
        (self.results / "bad.json").write_text(json.dumps(bad))
        proc = run_gen("--results", str(self.results), "--output", str(self.page))
        self.assertEqual(proc.returncode, 2)
        self.assertIn("bad.json: missing commit", proc.stderr)
        self.assertFalse(self.page.exists())


class RecordBenchTest(unittest.TestCase):
    def setUp(self):
        self.rec = load_recorder()

    def test_command_kinds(self):
        self.assertEqual(self.rec.command_kind(["bench/compare_mpi.sh", "all_reduce"]), "compare_mpi")
        self.assertEqual(self.rec.command_kind(["bash", "bench/compare_mpi.sh"]), "compare_mpi")
        self.assertEqual(self.rec.command_kind(["build/tools/mc2", "bench", "all_reduce"]), "bench")
        self.assertEqual(self.rec.command_kind(["build/tools/mc2", "bench", "ops"]), "bench_ops")
        self.assertEqual(self.rec.command_kind(["build/tools/mc2", "bench", "batch"]), "bench_batch")
        self.assertEqual(self.rec.command_kind(["mc2", "demo"]), "demo")
        self.assertEqual(self.rec.command_kind(["bench/torch_tp.py", "--seq", "64"]), "torch_tp")
        self.assertEqual(self.rec.command_kind(["build/bench/grad_bench", "overlap"]), "grad_overlap")
        self.assertEqual(self.rec.command_kind(["build/bench/grad_bench", "exchange"]), "grad_exchange")
        self.assertEqual(self.rec.command_kind(["build/bench/grad_bench", "train"]), "grad_train")
        with self.assertRaises(SystemExit):
            self.rec.command_kind(["build/bench/grad_bench", "-n", "2"])
        self.assertEqual(self.rec.command_kind(["bench/box_ops.sh", "--box", "2x2", "--", "mc2", "bench",
                                                "ops"]), "bench_ops")
        self.assertEqual(self.rec.command_kind(["bench/box_link.sh", "--hosts", "2"]), "box_link")
        self.assertEqual(self.rec.command_kind(["bench/box_batch.sh", "--box", "2x1", "--", "mc2",
                                                "bench", "batch"]), "bench_batch")
        with self.assertRaises(SystemExit):
            self.rec.command_kind(["ls", "-l"])

    def test_emulated_link(self):
        ops = ["mc2", "bench", "ops", "--link", "auto"]
        self.assertEqual(self.rec.emulated_link("bench_ops", ops, {"link": "bw=81MB/s,lat=5us"}),
                         "auto (bw=81MB/s,lat=5us)")
        self.assertIsNone(self.rec.emulated_link("bench_ops", ["mc2", "bench", "ops", "--link", "none"],
                                                 {"link": "none"}))
        self.assertEqual(self.rec.emulated_link("demo", ["mc2", "demo", "--link=bw=1GB/s"], {}), "bw=1GB/s")
        self.assertEqual(self.rec.emulated_link("demo", ["mc2", "demo"], {"link": "bw=9MB/s"}),
                         "auto (bw=9MB/s)")
        self.assertEqual(self.rec.emulated_link("grad_overlap", ["grad_bench", "overlap"],
                                                {"link": "bw=5B/s"}), "calibrated (bw=5B/s)")
        self.assertIsNone(self.rec.emulated_link("grad_exchange", ["grad_bench", "exchange"], {}))
        self.assertEqual(self.rec.emulated_link("grad_exchange",
                                                ["grad_bench", "exchange", "--link", "bw=1GB/s"], {}),
                         "bw=1GB/s")
        # Across a box the links are real, whatever MC2_LINK says.
        self.assertIsNone(self.rec.emulated_link("bench_ops", ["bench/box_ops.sh"],
                                                 {"link": "", "box": BOX}))
        self.assertIsNone(self.rec.emulated_link("compare_mpi", ["bench/compare_mpi.sh"],
                                                 {"collectives": [{"box": BOX}]}))
        self.assertEqual(self.rec.emulated_link("box_link", ["bench/box_link.sh"],
                                                {"emulated_link": "bw=1MB/s,lat=5us"}),
                         "bw=1MB/s,lat=5us (one-host side)")



class RecordBenchTreeTest(unittest.TestCase):
    """The recorder on a repository of its own (a copy of the script in a
    fresh git repository), running a stand-in for mc2."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.repo = pathlib.Path(self.tmp.name)
        (self.repo / "scripts").mkdir()
        shutil.copy(SOURCE / "scripts" / "record_bench.py", self.repo / "scripts")
        (self.repo / "bench" / "results").mkdir(parents=True)
        (self.repo / "code.cc").write_text("int x;\n")
        (self.repo / "other.h").write_text("int z;\n")
        self.mc2 = self.repo / "tools" / "mc2"
        self.mc2.parent.mkdir()
        self.mc2.write_text(FAKE_MC2)
        self.mc2.chmod(0o755)
        env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                   GIT_COMMITTER_EMAIL="t@t")
        for cmd in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "base"]):
            subprocess.run(["git", "-C", str(self.repo), *cmd], check=True, env=env,
                           capture_output=True)
        self.head = subprocess.run(["git", "-C", str(self.repo), "rev-parse", "--short=12", "HEAD"],
                                   check=True, capture_output=True, text=True).stdout.strip()

    def tearDown(self):
        self.tmp.cleanup()

    def record(self, *opts):
        return subprocess.run([sys.executable, str(self.repo / "scripts" / "record_bench.py"), "r",
                               *opts, "--", str(self.mc2), "bench", "all_reduce"],
                              capture_output=True, text=True)

    def result(self):
        return json.loads((self.repo / "bench" / "results" / "r.json").read_text())

    def test_a_clean_tree_records_its_commit(self):
        proc = self.record()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        r = self.result()
        self.assertEqual(r["commit"], self.head)
        self.assertIs(r["dirty"], False)
        self.assertNotIn("dirty_files", r)
        self.assertEqual(r["result"], {"rows": [], "fake": True})

    def test_a_dirty_tree_is_refused_naming_the_changed_files(self):
        (self.repo / "code.cc").write_text("int y;\n")
        proc = self.record()
        self.assertEqual(proc.returncode, 2)
        self.assertIn("uncommitted changes (code.cc)", proc.stderr)
        self.assertIn("--allow-dirty", proc.stderr)
        self.assertNotIn("fake bench ran", proc.stdout, "the command ran")
        self.assertFalse((self.repo / "bench" / "results" / "r.json").exists())

    def test_allow_dirty_records_and_marks_the_record(self):
        (self.repo / "code.cc").write_text("int y;\n")
        subprocess.run(["git", "-C", str(self.repo), "add", "code.cc"], check=True)  # staged
        (self.repo / "other.h").write_text("int w;\n")  # and not
        proc = self.record("--allow-dirty")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("fake bench ran", proc.stdout)
        r = self.result()
        self.assertEqual(r["commit"], self.head)
        self.assertIs(r["dirty"], True)
        self.assertEqual(sorted(r["dirty_files"]), ["code.cc", "other.h"])

    def test_untracked_files_do_not_make_the_tree_dirty(self):
        (self.repo / "notes.txt").write_text("scratch\n")
        proc = self.record()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIs(self.result()["dirty"], False)


if __name__ == "__main__":
    unittest.main(verbosity=1)
