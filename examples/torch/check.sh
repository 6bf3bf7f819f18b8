#!/usr/bin/env bash
# Runs the TP + DP example as a test: a few steps under `mc2 run -n 4` with
# --check (the losses must equal the unsharded model's) and --trace (the
# example records through mc2.trace), then `mc2 trace report` on its trace,
# whose numbers must show every rank with every step, compute time in each,
# and each rank's own optimizer and fused-operator spans.
#
#   examples/torch/check.sh BUILD_DIR [PYTHON]
#
# Everything it writes goes to a temporary directory it removes.
set -euo pipefail
build=${1:?usage: check.sh BUILD_DIR [PYTHON]}
python=${2:-/usr/bin/python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
steps=6
"$build/tools/mc2" run -n 4 \
  "$python" "$here/train_tp_dp.py" --tp 2 --steps $steps --check --trace "$tmp/trace"
"$build/tools/mc2" trace report "$tmp/trace" > "$tmp/report.txt"
cat "$tmp/report.txt"
"$build/tools/mc2" trace report --json "$tmp/report.json" "$tmp/trace" > /dev/null
# The report's numbers, rank by rank: every rank recorded every step, spent
# compute time in each, and recorded its own optimizer steps and the fused
# operators of its layers (a rank that recorded under another's number, or
# not at all, fails here).
"$python" - "$tmp/report.json" "$tmp/trace" $steps 4 <<'PY'
import json, sys
report, trace, steps, ranks = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
r = json.load(open(report))
fail = []
if sorted(x["rank"] for x in r["ranks"]) != list(range(ranks)):
    fail.append(f"ranks {[x['rank'] for x in r['ranks']]}, expected 0..{ranks - 1}")
for x in r["ranks"]:
    if [s["step"] for s in x["steps"]] != list(range(steps)):
        fail.append(f"rank {x['rank']}: steps {[s['step'] for s in x['steps']]}")
    if any(s["compute_ns"] <= 0 for s in x["steps"]):
        fail.append(f"rank {x['rank']}: a step with no compute")
for q in range(ranks):
    doc = json.load(open(f"{trace}/rank-{q}.trace.json"))
    meta = doc["otherData"]["mc2"]["ranks"]
    if [(m["rank"], m["world_size"]) for m in meta] != [(q, ranks)]:
        fail.append(f"rank-{q}.trace.json names {meta}")
    names = [e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"]
    for op, want in (("optimizer", steps), ("all_gather_matmul", steps),
                     ("matmul_reduce_scatter", steps), ("attention", steps)):
        if names.count(op) < want:
            fail.append(f"rank {q}: {names.count(op)} {op} spans, expected >= {want}")
if fail:
    sys.exit("check.sh: " + "; ".join(fail))
print(f"check.sh: {ranks} ranks x {steps} steps, each with compute, optimizer and fused spans")
PY
