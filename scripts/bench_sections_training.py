"""The PyTorch and gradient-synchronisation sections of docs/benchmarks.md
(scripts/gen_benchmarks.py renders the page)."""
import pathlib

from bench_format import HEADLINE_SIZE, link_text, num, ratio, size_text, table
import plot_curves


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
        if ways and all("speedup_paired" in w for w in ways):
            header += [("paired speedup", True)]
            for row, w in zip(rows, ways):
                row += [f"{num(w['speedup_paired'])}x"]
        if j.get("cap_paired"):
            out += [f"Paired speedup: the median over steps of the after-backward step / this "
                    f"way's step of the same round. The cap, a sync hidden entirely at no cost "
                    f"(the after-backward step without its wait), is "
                    f"{num(j['cap_paired'])}x: the forward and the backward bound the step.", ""]
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
