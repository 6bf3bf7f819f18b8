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
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_format import (HEADLINE_SIZE, box_of, box_text, link_text, num, ratio,  # noqa: E402
                          size_text, table)
from bench_sections_training import (grad_exchange_section, grad_overlap_section,  # noqa: E402
                                     grad_train_section, plots, torch_compress_section,
                                     torch_headline, torch_section, torch_tp_section)
KINDS = ("compare_mpi", "bench_ops", "demo", "demo_infer", "demo_pp", "demo_cp", "demo_fsdp",
         "bench",
         "bench_batch", "torch_compare", "torch_tp", "torch_compress", "grad_overlap",
         "grad_exchange", "grad_train", "box_link")
REQUIRED = ("name", "kind", "date", "commit", "host", "command", "emulated", "result")

# The page's "How to measure" part, kept as Markdown next to this script.
HOW_TO = pathlib.Path(__file__).with_name("benchmarks_how_to.md").read_text()


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


def source_line(ref, r):
    host = r["host"] if isinstance(r["host"], dict) else {}
    dirty = ""
    if r.get("dirty"):
        # Recorded with --allow-dirty: the commit alone does not name the code.
        files = r.get("dirty_files") or []
        dirty = (" (uncommitted changes to " + ", ".join(f"`{f}`" for f in files) + ")"
                 if files else " (uncommitted changes)")
    note = f" {r['note']}" if r.get("note") else ""
    return (f"- [{ref}] `{r['_file']}`: {r['date']}, commit `{r['commit']}`{dirty}, "
            f"{host.get('cpu', 'unknown CPU')}, {host.get('cores', '?')} cores, "
            f"{link_text(r)}: `{r['command']}`.{note}")


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
                "auto_ran": c.get("auto_ran"), "auto_ms": c.get("auto_ms"),
                "serial_over_best_paired": c.get("serial_over_best_paired"),
                "best_over_floor_paired": c.get("best_over_floor_paired")}
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


def headline(results, refs):
    rows = []
    for r in sorted(results, key=lambda r: KINDS.index(r["kind"])):
        ref = f"[{refs[r['_file']]}]"
        if r["kind"] == "compare_mpi":
            for coll, row in compare_rows(r):
                if coll.get("collective") == "all_reduce" and row.get("size") == HEADLINE_SIZE \
                        and coll.get("box"):
                    rows.append([f"all_reduce {size_text(HEADLINE_SIZE)} across hosts, "
                                 f"{coll.get('ranks')} ranks: mc2 / Open MPI, mc2 / Open MPI han"
                                 + (", mc2 / Open MPI one link" if row.get("one_link_ratio")
                                    else "") + ", time / bound",
                                 f"{num(row.get('ratio'))}x (paired "
                                 f"{num(row.get('paired'))}x), {num(row.get('han_ratio'))}x, "
                                 + (f"{num(row.get('one_link_ratio'))}x, "
                                    if row.get("one_link_ratio") else "")
                                 + f"{num(row.get('mc2_over_bound'))}", link_text(r), ref])
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
                             f"{num(ratio(s['best_ms'], s['floor']))}"
                             + (f" (paired {num(s['serial_over_best_paired'])}x, "
                                f"{num(s['best_over_floor_paired'])})"
                                if s.get("best_over_floor_paired") else ""),
                             link_text(r), ref])
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
            pw = {x.get("name"): x.get("speedup_paired") for x in j.get("ways", [])}
            part = (f" (backward + gradient wait "
                    f"{num(ratio(bs.get('after_backward'), bs.get('overlapped')))}x)"
                    if bs.get("overlapped") else "")
            if pw.get("overlapped") and j.get("cap_paired"):
                part += (f"; paired {num(pw['overlapped'])}x, cap {num(j['cap_paired'])}x "
                         "(sync hidden at no cost)")
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
                one_link = any("one_link_ratio" in row for row in coll.get("rows", []))
                header += [("han us", True), ("mc2 / han", True), ("han paired", True)]
                if one_link:
                    header += [("1-link us", True), ("mc2 / 1-link", True), ("1-link paired", True)]
                header += [("bound us", True), ("mc2 / bound", True), ("MPI / bound", True)]
                for cells, row in zip(rows, coll.get("rows", [])):
                    cells += [num(row.get("han_us"), ".1f"), num(row.get("han_ratio")),
                              num(row.get("han_paired"))]
                    if one_link:
                        cells += [num(row.get("mpi_one_link_us"), ".1f"),
                                  num(row.get("one_link_ratio")), num(row.get("one_link_paired"))]
                    cells += [num(row.get("bound_us"), ".1f"),
                              num(row.get("mc2_over_bound")), num(row.get("mpi_over_bound"))]
                out[-1:-1] = [f"Every host link shaped to {box.get('rate')} each way (tc tbf "
                              "on veth pairs, scripts/cluster.sh); Open MPI han = Open MPI with "
                              f"`{box.get('han')}`, out of place; mc2 / han = han time / mc2 "
                              "time; "
                              + ("1-link = Open MPI with its TCP transport as shipped (one "
                                 "connection per pair of processes, where the box's options "
                                 "set two; docs/cluster.md), mc2 / 1-link = its time / mc2 "
                                 "time; " if one_link else "")
                              + f"bound = {box.get('bound') or 'none stated'}: the payload "
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
                     j["box"].get("mtu", 1500),
                     f"{j.get('M')}x{j.get('K')}x{j.get('N')}", j.get("dtype"),
                     num(s["compute"], ".1f"), num(s["comm"], ".1f"), num(s["floor"], ".1f"),
                     num(s["serial"], ".1f"), s["best"], num(s["best_ms"], ".1f"),
                     f"{num(ratio(s['serial'], s['best_ms']))}x",
                     num(ratio(s["best_ms"], s["floor"])), wrong, f"[{refs[r['_file']]}]"])
    if not rows:
        return []
    header = [("operator", False), ("hosts x ranks", False), ("link rate", False), ("MTU", True),
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
                "uncovered send/recv: per stage, % of the pipeline phase; in flight: the most "
                "micro-batches whose activations a stage held at once.", ""]
        header = [("schedule", False), ("step ms", True), ("pipeline ms", True),
                  ("bubble formula %", True), ("bubble measured %", True),
                  ("uncovered send/recv % per stage", False),
                  ("micro-batches in flight per stage", False), ("collective comm %", True),
                  ("vs first", True)]
        rows = []
        for x in j.get("runs", []):
            sched = x.get("schedule") + (f" v={x.get('virtual_stages')}"
                                         if x.get("virtual_stages", 1) > 1 else "")
            rows.append([sched, num(x.get("step_ms"), ".1f"), num(x.get("pipeline_ms"), ".1f"),
                         num(100 * x.get("bubble_formula", 0), ".1f"),
                         num(100 * x.get("bubble_measured", 0), ".1f"),
                         " / ".join(num(u, ".2f") for u in x.get("stage_uncovered_pct", [])),
                         " / ".join(str(n) for n in x.get("stage_peak_in_flight", [])) or "-",
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
