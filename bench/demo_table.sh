#!/usr/bin/env bash
# demo_table.sh: the transformer's step time against pipeline and split
# count, for several rank counts, with and without link emulation.
#
# For each rank count N and each link (auto = emulated, calibrated once per
# N by `mc2 demo` so that a serial step's communication is --comm-ratio x
# its compute, then reused for every split count; none = raw shared
# memory), runs `mc2 demo -n N --link L --splits S` for every split count S
# with the pipelines serial, chunked and fused (and auto once, at the first
# S). Serial runs in every invocation, so each ratio is to the serial step
# of the same run, side by side. Prints one table row per (N, link,
# pipeline, S): median step time over the timed steps, ratio to serial,
# uncovered communication and free time (% of the step), and whether the
# losses were bitwise identical across the pipelines of that run.
#
# Usage: bench/demo_table.sh [-n "2 4"] [-s "1 2 4 8"] [--links "auto none"]
#            [-i/--iters K] [--build DIR] [--keep DIR] [-- DEMO_ARGS...]
# DEMO_ARGS go to every `mc2 demo` (model size, --comm-ratio, ...).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
ranks="2 4" splits="1 2 4 8" links="auto none" iters=2 build=${MC2_BUILD_DIR:-$repo/build}
keep=""
demo_args=()

usage() { sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }
die() { echo "demo_table.sh: $*" >&2; exit 2; }
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) ranks=$2; shift 2 ;;
    -s) splits=$2; shift 2 ;;
    --links) links=$2; shift 2 ;;
    -i|--iters) iters=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    --) shift; demo_args=("$@"); break ;;
    -h|--help) usage ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
require_mc2 "$build"
make_output_dir "$keep" demo-table

runs=()
for n in $ranks; do
  for link in $links; do
    spec=$link
    first=1
    for s in $splits; do
      pipes=serial,chunked,fused
      (( first )) && pipes=serial,chunked,fused,auto
      f=$out/n$n-$link-s$s.json
      echo "demo_table: -n $n --link $spec --splits $s --pipelines $pipes" >&2
      "$mc2" demo -n "$n" --link "$spec" --splits "$s" --pipelines "$pipes" --iters "$iters" \
        --output "$out/demo-n$n-$link-s$s" --json "$f" "${demo_args[@]}" >"$out/n$n-$link-s$s.log"
      if [[ $link == auto && $first == 1 ]]; then
        # Reuse the calibrated link for the other split counts.
        spec=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["link"])' "$f")
      fi
      first=0
      runs+=("$f|$n|$link|$s")
    done
  done
done

python3 - "${runs[@]}" <<'EOF'
import json, sys
print("| ranks | link | splits | pipeline | ran | step ms | vs serial | uncovered % | free % | losses identical |")
print("|---:|---|---:|---|---|---:|---:|---:|---:|---|")
for arg in sys.argv[1:]:
    f, n, link, s = arg.split("|")
    j = json.load(open(f))
    label = f"emulated {j['link']}" if link != "none" else "raw shm"
    for r in j["runs"]:
        print(f"| {n} | {label} | {s} | {r['pipeline']} | {r['ran']} | {r['step_ms']:.0f} | "
              f"{r['speedup']:.2f}x | {r['uncovered_pct']:.1f} | {r['free_pct']:.1f} | "
              f"{'yes' if j['losses_identical'] else 'NO'} |")
EOF
