#!/usr/bin/env bash
# Runs the TP + DP example as a test: a few steps under `mc2 run -n 4` with
# --check (the losses must equal the unsharded model's) and --trace (the
# example records through mc2.trace), then `mc2 trace report` on its trace,
# which must show every step, the fused operators and the example's own
# compute spans.
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
grep -q "^4 rank(s), [0-9]* spans, $steps marked step(s)" "$tmp/report.txt" ||
  { echo "check.sh: the report does not show 4 ranks and $steps marked steps" >&2; exit 1; }
for op in all_gather_matmul matmul_reduce_scatter attention optimizer; do
  grep -q "^$op " "$tmp/report.txt" || { echo "check.sh: the report lists no $op" >&2; exit 1; }
done
