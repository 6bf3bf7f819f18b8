#!/usr/bin/env bash
# Runs the TP + DP example as a test: a few steps under `mc2 run -n 4` with
# --check (the losses must equal the unsharded model's) and MC2_TRACE, then
# `mc2 trace report` on its trace, which must show the fused operators.
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
MC2_TRACE="$tmp/trace" "$build/tools/mc2" run -n 4 \
  "$python" "$here/train_tp_dp.py" --tp 2 --steps 6 --check
"$build/tools/mc2" trace report "$tmp/trace" > "$tmp/report.txt"
cat "$tmp/report.txt"
for op in all_gather_matmul matmul_reduce_scatter; do
  grep -q "^$op " "$tmp/report.txt" || { echo "check.sh: the report lists no $op" >&2; exit 1; }
done
