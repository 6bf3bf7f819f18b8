#!/usr/bin/env bash
# trace_overhead.sh: what tracing costs on `mc2 bench ops`, side by side.
#
# Runs the same `mc2 bench ops` configuration with tracing off and with
# MC2_TRACE=DIR (every collective, GEMM, pipeline stage and wait records a
# span), alternating the order each repetition so drift hits both alike,
# and prints per pipeline row the median time of each side over the
# repetitions and the ratio traced/untraced (1.00 = free; 1.03 = +3%).
# The trace files are written at exit, outside the timed loop, and are
# checked to exist (an overhead of nothing because nothing was traced would
# be a wrong answer).
#
# Usage: bench/trace_overhead.sh [-n N] [-r REPS] [--build DIR] [--link SPEC]
#            [--iters I] [-m M -k K -N N] [--dtype f32|bf16] [OP ...]
# OPs default to all_gather_matmul matmul_reduce_scatter matmul_all_reduce;
# each runs --pipelines all --splits 4 (serial, chunked, fused, auto).
# --link defaults to none (raw shared memory); give auto for the emulated,
# balanced case (the calibration then runs once per invocation, so both
# sides of a repetition use the same link).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
nranks=2 reps=5 build=${MC2_BUILD_DIR:-$repo/build} link=none iters=5
m=1024 k=1024 n=1024 dtype=f32
ops=()

usage() { sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }
die() { echo "trace_overhead.sh: $*" >&2; exit 2; }
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) nranks=$2; shift 2 ;;
    -r|--reps) reps=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --link) link=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    -m) m=$2; shift 2 ;;
    -k) k=$2; shift 2 ;;
    -N) n=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    -h|--help) usage ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) ops+=("$1"); shift ;;
  esac
done
[[ ${#ops[@]} -gt 0 ]] || ops=(all_gather_matmul matmul_reduce_scatter matmul_all_reduce)
[[ $reps =~ ^[1-9][0-9]*$ ]] || die "-r $reps: expected a positive count"
require_mc2 "$build"
make_output_dir "" trace-overhead

for op in "${ops[@]}"; do
  shape=(bench ops -n "$nranks" --operator "$op" -m "$m" -k "$k" -N "$n" --dtype "$dtype")
  common=("${shape[@]}" --pipelines all --splits 4 --iters "$iters" --warmup 1)
  linkspec=$link
  if [[ $link == auto ]]; then
    # Calibrate once so both sides run on the same emulated link.
    "$mc2" "${shape[@]}" --pipelines serial --link auto --iters 1 --json "$out/calib.json" \
      >/dev/null
    linkspec=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["link"])' \
      "$out/calib.json")
  fi
  for ((r = 0; r < reps; r++)); do
    if (( r % 2 == 0 )); then order=(off on); else order=(on off); fi
    for side in "${order[@]}"; do
      f=$out/$op.$side.$r.json
      if [[ $side == on ]]; then
        rm -rf "$out/trace"
        MC2_TRACE=$out/trace "$mc2" "${common[@]}" --link "$linkspec" --json "$f" >/dev/null
        ls "$out"/trace/rank-*.trace.json >/dev/null 2>&1 ||
          die "MC2_TRACE set but no trace file written for $op"
      else
        env -u MC2_TRACE "$mc2" "${common[@]}" --link "$linkspec" --json "$f" >/dev/null
      fi
      printf '.' >&2
    done
  done
  echo >&2
done

python3 - "$out" "$reps" "$link" "$nranks" "${ops[@]}" <<'EOF'
import json, statistics, sys
out, reps, link, nranks, ops = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
print(f"# tracing off vs MC2_TRACE on, {nranks} ranks, link {link}"
      f"{' (EMULATED)' if link != 'none' else ' (raw shm)'}, medians of {reps} repetitions")
print(f"# {'op':<22} {'pipeline':>8} {'splits':>6} {'off ms':>9} {'on ms':>9} {'on/off':>7}")
ratios = []
for op in ops:
    rows = {}
    for r in range(reps):
        for side in ("off", "on"):
            j = json.load(open(f"{out}/{op}.{side}.{r}.json"))
            for row in j["rows"]:
                key = (row["pipeline"], row["splits"])
                rows.setdefault(key, {"off": [], "on": []})[side].append(row["time_ms"])
    for (pipe, s), t in rows.items():
        off, on = statistics.median(t["off"]), statistics.median(t["on"])
        ratios.append(on / off)
        print(f"  {op:<22} {pipe:>8} {s:>6} {off:9.2f} {on:9.2f} {on / off:7.3f}")
print(f"# median on/off over all rows: {statistics.median(ratios):.3f}, "
      f"max {max(ratios):.3f}, min {min(ratios):.3f}")
EOF
