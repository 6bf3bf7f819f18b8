#!/usr/bin/env bash
# ops_table.sh: the fused operators' figures of merit in one table.
#
# Runs `mc2 bench ops --pipelines all --splits 2,3,4,6,8,12,16` for every operator and
# rank count in three regimes and prints one row per run: compute-only and
# comm-only time, their floor max(Tc, Tm) (no pipeline can beat it), serial,
# the best pipeline and its speedup, its ratio to the floor, its overlap
# (Tc + Tm - T) / min(Tc, Tm) (at most 100%; "noise" when T beat the floor),
# the pipeline-fill model max(Tc, Tm) + min(Tc, Tm)/stages (a prediction,
# not a bound), what `auto` chose and its ratio to the best row and to
# serial, and #wrong against the serial result.
#   balanced:      --link auto (EMULATED: calibrated so comm-only ~ compute-only)
#   comm<<compute: --link none (raw shared memory)
#   compute<<comm: --link bw=50MB/s,lat=5us (EMULATED) with a thin GEMM
# Every row comes from one `mc2 bench ops` run, so the pipelines of a row
# ran side by side (round-robin iterations, medians of the slowest rank).
# The sweep's best is the minimum of many noisy medians, so it is biased
# low; the figures in the table come from `--confirm`: fresh round-robin
# iterations of compute-only, comm-only, serial, the best and auto after
# the sweep ("sweep" shows the biased speedup next to it). auto/best and
# auto/serial are medians of the confirmation iterations' ratios (auto and
# the best of one iteration run back to back, so a slow spell of the host
# cancels out); "(medians)" is the ratio of the two medians instead.
#
# Usage: bench/ops_table.sh [-n "2 4"] [--ops "..."] [--regimes "..."]
#            [--splits LIST|sweep] [--iters I] [--confirm C] [--build DIR]
#            [--keep DIR]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
ranks="2 4" ops="all_gather_matmul matmul_reduce_scatter matmul_all_reduce"
regimes="balanced comm<<compute compute<<comm" iters=5 confirm=15 splits=2,3,4,6,8,12,16 build=${MC2_BUILD_DIR:-$repo/build}
keep=""

usage() { sed -n '2,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }
die() { echo "ops_table.sh: $*" >&2; exit 2; }
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) ranks=$2; shift 2 ;;
    --ops) ops=$2; shift 2 ;;
    --regimes) regimes=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --confirm) confirm=$2; shift 2 ;;
    --splits) splits=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    -h|--help) usage ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[[ $confirm =~ ^[1-9][0-9]*$ ]] || die "--confirm $confirm is invalid: the table's figures come from it, expected 1 or more"
require_mc2 "$build"
make_output_dir "$keep" ops-table

runs=()
for regime in $regimes; do
  for n in $ranks; do
    for op in $ops; do
      # Shapes: a GEMM of ~50-200 ms per rank here; the thin one moves as
      # much but computes ~16-32x less.
      case $op in
        moe|moe_mlp) shape=(-m $(( n == 2 ? 2048 : 1024 )) -k 1024 -N 1024 -d bf16) ;;
        all_gather_batch_matmul) shape=(-m 2048 -k 1024 -N 1024 -d bf16) ;;
        *) shape=(-m 2048 -k 2048 -N 1024) ;;
      esac
      case $regime in
        balanced) link=(--link auto) ;;
        "comm<<compute") link=(--link none) ;;
        "compute<<comm")
          link=(--link bw=50MB/s,lat=5us)
          case $op in
            all_gather_matmul) shape=(-m 2048 -k 2048 -N 16) ;;
            *) shape=(-m 2048 -k 64 -N 1024) ;;
          esac ;;
        *) die "unknown regime $regime" ;;
      esac
      tag=$(echo "$regime-$n-$op" | tr -c 'a-z0-9_\n-' '_')
      echo "ops_table: $regime -n $n --operator $op ${shape[*]} ${link[*]}" >&2
      "$mc2" bench ops -n "$n" --operator "$op" "${shape[@]}" "${link[@]}" --pipelines all \
        --splits "$splits" -i "$iters" --confirm "$confirm" -w 1 \
        --json "$out/$tag.json" >"$out/$tag.log"
      runs+=("$out/$tag.json|$regime")
    done
  done
done

python3 - "${runs[@]}" <<'EOF'
import json, sys
print("| regime | op | np | link | Tc ms | Tm ms | floor ms | serial ms | best | best ms "
      "| vs serial | (sweep) | vs floor | overlap | model ms | auto ran | auto ms | auto/best "
      "| (medians) | auto/serial | #wrong |")
print("|---|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
for arg in sys.argv[1:]:
    f, regime = arg.split("|")
    j = json.load(open(f))
    rows = j["rows"]
    c = j["confirm"]
    sweep_best = min((r for r in rows if r["pipeline"] != "auto"), key=lambda r: r["time_ms"])
    wrong = sum(r["wrong"] for r in rows)
    link = "raw shm" if j["link"] == "none" else f"EMULATED {j['link']}"
    serial, best, auto = c["serial_ms"], c["best_ms"], c["auto_ms"]
    overlap = "noise" if c["best_overlap"] is None else f"{100 * c['best_overlap']:.0f}%"
    print(f"| {regime} | {j['op']} | {j['ranks']} | {link} | {c['compute_ms']:.0f} | "
          f"{c['comm_ms']:.0f} | {c['floor_ms']:.0f} | {serial:.0f} | "
          f"{c['best_pipeline']} s={c['best_splits']} | {best:.0f} | {serial / best:.2f}x | "
          f"{j['serial_ms'] / sweep_best['time_ms']:.2f}x | {best / c['floor_ms']:.2f} | "
          f"{overlap} | {c['best_model_ms']:.0f} | {c['auto_ran']} | {auto:.0f} | "
          f"{c['auto_over_best_paired']:.2f} | {auto / best:.2f} | "
          f"{c['auto_over_serial_paired']:.2f} | {wrong} |")
EOF
