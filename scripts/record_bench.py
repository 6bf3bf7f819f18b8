#!/usr/bin/python3
"""Runs one benchmark command and records its result under bench/results/.

Usage: scripts/record_bench.py NAME [--results DIR] [--note TEXT] [--allow-dirty] -- COMMAND ...

COMMAND is one of
  bench/compare_mpi.sh ...        (the recorder adds --keep DIR and reads the
                                   summary_COLLECTIVE.json files it writes;
                                   with --box, across a cluster in a box)
  bench/box_ops.sh ... -- BUILD/tools/mc2 bench ops ...
                                  (mc2 bench ops across a cluster in a box;
                                   the recorder adds --json FILE; kind bench_ops)
  bench/box_link.sh ...           (the box against link emulation; the
                                   recorder adds --json FILE)
  BUILD/tools/mc2 bench ...       (the recorder adds --json FILE)
  BUILD/tools/mc2 bench ops ...   (the recorder adds --json FILE)
  BUILD/tools/mc2 bench batch ... (the recorder adds --json FILE)
  BUILD/tools/mc2 demo ...        (the recorder adds --json FILE, and --output DIR
                                   in a temporary directory unless given)
  BUILD/tools/mc2 demo infer ...  (the same)
  BUILD/tools/mc2 demo fsdp ...   (the same)
  BUILD/tools/mc2 demo pp ...     (the same)
  BUILD/tools/mc2 demo cp ...     (the same)
  bench/torch_compare.py ...      (the recorder adds --json FILE)
  bench/torch_tp.py ...           (the recorder adds --json FILE)
  bench/torch_compress.py ...     (the recorder adds --json FILE)
  BUILD/bench/grad_bench overlap|exchange|train ...
                                  (the recorder adds --json FILE)
and must not carry those options itself. The command runs with the caller's
environment; its standard output is shown and recorded.

A record names the commit its figures were measured on, so the recorder
refuses to run when tracked files have uncommitted changes (it exits 2
naming them) unless given --allow-dirty; a record made that way carries
dirty: true and the changed files (dirty_files), and the page says so.

Writes DIR/NAME.json (DIR defaults to bench/results), replacing an earlier
result of that name (git keeps the old one), with: name, kind, date (UTC),
commit, dirty (whether tracked files had uncommitted changes; dirty_files
lists them when they had), host (CPU model,
logical cores, kernel), command (the exact command line, as run), emulated
(the link emulation in force, or null on raw shared memory), env (the MC2_*
variables set), note, stdout, and result (the tool's JSON). Then
regenerate the page: scripts/gen_benchmarks.py.
"""

import datetime
import json
import os
import pathlib
import platform
import re
import shlex
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def die(msg):
    print(f"record_bench.py: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv):
    if "--" not in argv:
        die("expected NAME [--results DIR] [--note TEXT] [--allow-dirty] -- COMMAND ... "
            "(see --help)")
    sep = argv.index("--")
    opts, command = argv[:sep], argv[sep + 1:]
    if not command:
        die("no command after --")
    name, results, note, allow_dirty = None, REPO / "bench" / "results", "", False
    i = 0
    while i < len(opts):
        a = opts[i]
        if a == "--allow-dirty":
            allow_dirty = True
            i += 1
        elif a in ("--results", "--note"):
            if i + 1 >= len(opts):
                die(f"{a} needs a value")
            if a == "--results":
                results = pathlib.Path(opts[i + 1])
            else:
                note = opts[i + 1]
            i += 2
        elif a.startswith("-"):
            die(f"unknown option {a} (see --help)")
        elif name is None:
            name = a
            i += 1
        else:
            die(f"unexpected argument {a}: one NAME, then -- COMMAND")
    if name is None:
        die("missing NAME (the result file's name, e.g. all_reduce_vs_openmpi)")
    if not NAME_RE.match(name):
        die(f"NAME '{name}' must be letters, digits, '_', '.' or '-'")
    return name, results, note, allow_dirty, command


def command_kind(command):
    """Which tool the command runs: compare_mpi, bench, bench_ops, bench_batch,
    demo, demo_infer, demo_pp, demo_cp, demo_fsdp, torch_compare, torch_tp, torch_compress,
    grad_overlap, grad_exchange, grad_train or box_link (box_batch.sh: bench_batch)."""
    first = [os.path.basename(c) for c in command[:2]]
    if "box_ops.sh" in first:
        return "bench_ops"
    if "box_link.sh" in first:
        return "box_link"
    if "box_batch.sh" in first:
        return "bench_batch"
    if "torch_compare.py" in (os.path.basename(c) for c in command[:2]):
        return "torch_compare"
    if "torch_tp.py" in (os.path.basename(c) for c in command[:2]):
        return "torch_tp"
    if "torch_compress.py" in (os.path.basename(c) for c in command[:2]):
        return "torch_compress"
    if os.path.basename(command[0]) == "compare_mpi.sh" or (
            len(command) > 1 and os.path.basename(command[1]) == "compare_mpi.sh"):
        return "compare_mpi"
    if os.path.basename(command[0]) == "grad_bench" and len(command) > 1:
        if command[1] in ("overlap", "exchange", "train"):
            return "grad_" + command[1]
        die(f"cannot record '{shlex.join(command)}': grad_bench needs a mode "
            "(overlap, exchange or train) first")
    if os.path.basename(command[0]) == "mc2" and len(command) > 1:
        if command[1] == "bench":
            if len(command) > 2 and command[2] in ("ops", "batch"):
                return "bench_" + command[2]
            return "bench"
        if command[1] == "demo":
            sub = command[2] if len(command) > 2 else ""
            return {"infer": "demo_infer", "pp": "demo_pp", "cp": "demo_cp", "fsdp": "demo_fsdp"}.get(sub, "demo")
    die(f"cannot record '{shlex.join(command)}': expected bench/compare_mpi.sh, "
        "mc2 bench, mc2 bench ops, mc2 bench batch, mc2 demo, bench/torch_compare.py, "
        "bench/torch_tp.py, bench/torch_compress.py, grad_bench, bench/box_ops.sh, "
        "bench/box_batch.sh or bench/box_link.sh")


def option_value(command, name):
    """The value of `name VALUE` or `name=VALUE` in the command, else None."""
    for i, a in enumerate(command):
        if a == name and i + 1 < len(command):
            return command[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1:]
    return None


def git(*args, strip=True):
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True,
                             text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.strip() if strip else out


def changed_files():
    """Tracked files with uncommitted changes (staged or not), or None when
    git cannot tell (not a repository, no git)."""
    status = git("status", "--porcelain", "--untracked-files=no", strip=False)
    if status is None:
        return None
    # Porcelain v1: two status letters, a space, the path ("OLD -> NEW" for a
    # rename).
    return [line[3:] for line in status.splitlines() if line.strip()]


def check_tree(allow_dirty):
    """The tree's changed files ([] when clean); exits naming them when there
    are any and `allow_dirty` is false, or when git cannot tell."""
    changed = changed_files()
    if changed is None and not allow_dirty:
        die(f"cannot tell whether {REPO} has uncommitted changes (git status failed): a record "
            "must name the code it measured; pass --allow-dirty to record anyway")
    if changed and not allow_dirty:
        shown = ", ".join(changed[:20]) + (f" and {len(changed) - 20} more" if len(changed) > 20 else "")
        die(f"the tree has uncommitted changes ({shown}): a record must name the code it "
            "measured; commit or stash them, or pass --allow-dirty to record anyway (the record "
            "then says dirty: true and lists the files)")
    return changed


def host_info():
    cpu = platform.processor() or "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release()}


def emulated_link(kind, command, result):
    """The link emulation a result ran under, or None on raw shared memory.

    mc2 bench ops and mc2 demo (infer, pp, cp, fsdp) take --link (the demo's
    default is auto) and report the link they used (the calibrated one for
    `auto`); mc2 bench and compare_mpi.sh follow MC2_LINK. grad_bench overlap
    always calibrates its own link (reported as `link`); grad_bench exchange
    takes --link; grad_bench train follows MC2_LINK. Results measured across a cluster in a
    box (a "box" object) ran over real links: None; box_link.sh's compares
    the box with the emulated link it names.
    """
    if kind == "box_link":
        return f"{result.get('emulated_link')} (one-host side)" if isinstance(result, dict) else None
    boxes = [c.get("box") for c in result.get("collectives", [])] if isinstance(result, dict) else []
    if isinstance(result, dict) and (result.get("box") or any(boxes)):
        return None
    if kind == "grad_overlap":
        return f"calibrated ({result.get('link')})"
    if kind == "grad_exchange":
        requested = option_value(command, "--link") or "none"
        return None if requested == "none" else requested
    demos = ("demo", "demo_infer", "demo_pp", "demo_cp", "demo_fsdp")
    requested = option_value(command, "--link") if kind in ("bench_ops",) + demos else None
    if requested is None and kind in demos:
        requested = "auto"  # mc2 demo's default
    if requested is None:
        requested = os.environ.get("MC2_LINK", "")
    resolved = result.get("link") if isinstance(result, dict) else None
    if requested in ("", "none"):
        return None if resolved in (None, "", "none") else resolved
    if requested == "auto" and resolved not in (None, "", "none"):
        return f"auto ({resolved})"
    return requested


def main(argv):
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    name, results, note, allow_dirty, command = parse_args(argv)
    kind = command_kind(command)
    added = {"compare_mpi": ["--keep"], "bench": ["--json"], "bench_ops": ["--json"],
             "bench_batch": ["--json"],
             "demo": ["--json"], "demo_infer": ["--json"], "demo_pp": ["--json"], "demo_cp": ["--json"],
             "demo_fsdp": ["--json"],
             "torch_compare": ["--json"], "torch_tp": ["--json"],
             "torch_compress": ["--json"], "grad_overlap": ["--json"],
             "grad_exchange": ["--json"], "grad_train": ["--json"],
             "box_link": ["--json"]}[kind]
    for opt in added:
        if option_value(command, opt) is not None:
            die(f"the command carries {opt}: the recorder sets it")
    if not results.is_dir():
        die(f"results directory {results} does not exist")
    changed = check_tree(allow_dirty)
    commit = git("rev-parse", "--short=12", "HEAD")

    with tempfile.TemporaryDirectory(prefix="mc2-record.") as tmp:
        run = list(command)
        if kind == "compare_mpi":
            run += ["--keep", f"{tmp}/keep"]
        else:
            run += ["--json", f"{tmp}/result.json"]
            if kind in ("demo", "demo_infer", "demo_pp", "demo_cp", "demo_fsdp") and option_value(command, "--output") is None \
                    and option_value(command, "-o") is None:
                run += ["--output", f"{tmp}/demo"]
        date = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
        print(f"record_bench.py: running {shlex.join(run)}", file=sys.stderr)
        proc = subprocess.run(run, stdout=subprocess.PIPE, text=True)
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            die(f"the command failed (exit {proc.returncode}); nothing recorded")
        if kind == "compare_mpi":
            files = sorted(pathlib.Path(tmp, "keep").glob("summary_*.json"))
            if not files:
                die("compare_mpi.sh wrote no summary_*.json; nothing recorded")
            result = {"collectives": [json.loads(f.read_text()) for f in files]}
        else:
            try:
                result = json.loads(pathlib.Path(tmp, "result.json").read_text())
            except (OSError, ValueError) as e:
                die(f"cannot read the command's JSON output: {e}; nothing recorded")

    record = {
        "name": name,
        "kind": kind,
        "date": date.isoformat().replace("+00:00", "Z"),
        "commit": commit,
        "dirty": bool(changed) if changed is not None else None,
        "host": host_info(),
        "command": shlex.join(command),
        "emulated": emulated_link(kind, command, result),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MC2_")},
        "note": note,
        "stdout": proc.stdout,
        "result": result,
    }
    if changed:
        record["dirty_files"] = changed
    path = results / f"{name}.json"
    replaced = path.exists()
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"record_bench.py: {'replaced' if replaced else 'wrote'} {path}; "
          "now run scripts/gen_benchmarks.py", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
