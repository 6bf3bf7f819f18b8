#!/usr/bin/env bash
# compare_mpi.sh: mc2 against Open MPI on the same host, side by side.
#
# For each collective, runs `mc2 bench X -n N ...` and
# `mpirun -np N ./mpi_coll_bench X ...` (same sweep, same columns, same
# checkable data), alternating the two R times to spread drift evenly, joins
# their --json outputs and prints per size the median over the repetitions of
# each side's bus bandwidth, the ratio mc2/MPI (> 1: mc2 is faster), and the
# latency ratio at the smallest size (mc2 time / MPI time: < 1: mc2 is faster).
# "paired" is the median over repetitions of MPI time / mc2 time within a
# repetition (the two runs back to back), which cancels the host's slow
# phases that last seconds and hit whichever side happens to run then.
# The same figures go to summary_COLLECTIVE.json in the output directory
# (--keep), which scripts/record_bench.py records for docs/benchmarks.md.
#
# Usage: bench/compare_mpi.sh [-n N] [-b MIN] [-e MAX] [-f F] [-r REPS]
#            [-i ITERS] [-w WARMUP] [-c 0|1] [-d DTYPE] [--buffers symmetric|private]
#            [--stat avg|median] [--build DIR] [--keep DIR] [--mpich] [--floor]
#            [COLLECTIVE ...]
# --mpich: also run the same program built with MPICH (Debian's mpich and
# libmpich-dev, installed on demand) and report mc2 against the better of
# the two MPIs per size ("best" columns).
# --floor: for all_reduce (f32), also run bench/all_reduce_floor in every
# repetition: the time of the data movement alone (N threads, no
# synchronisation but barriers; see its header), and report MPI / floor,
# the largest ratio any all_reduce could reach against MPI on this host.
# --stat: which time of a run to use: avg (nccl-tests' figure, the default) or
# the median iteration (robust against a loaded machine).
# Collectives default to: all_reduce all_gather reduce_scatter all_to_all broadcast reduce
# The build directory defaults to $MC2_BUILD_DIR, else <repo>/build; it must
# hold tools/mc2 and bench/mpi_coll_bench (built when CMake finds MPI).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
nranks=2 minb=8 maxb=256M factor=2 reps=3 iters=20 warmup=5 check=0 dtype=f32
buffers=symmetric build=${MC2_BUILD_DIR:-$repo/build} keep="" stat=avg mpich=0 floor=0
colls=()

usage() { sed -n '2,29p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }
die() { echo "compare_mpi.sh: $*" >&2; exit 2; }
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) nranks=$2; shift 2 ;;
    -b) minb=$2; shift 2 ;;
    -e) maxb=$2; shift 2 ;;
    -f) factor=$2; shift 2 ;;
    -r|--reps) reps=$2; shift 2 ;;
    -i) iters=$2; shift 2 ;;
    -w) warmup=$2; shift 2 ;;
    -c) check=$2; shift 2 ;;
    -d) dtype=$2; shift 2 ;;
    --buffers) buffers=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --stat) stat=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    --mpich) mpich=1; shift ;;
    --floor) floor=1; shift ;;
    -h|--help) usage ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) colls+=("$1"); shift ;;
  esac
done
[[ ${#colls[@]} -gt 0 ]] || colls=(all_reduce all_gather reduce_scatter all_to_all broadcast reduce)
[[ $reps =~ ^[1-9][0-9]*$ ]] || die "-r $reps: expected a positive count"
[[ $stat == avg || $stat == median ]] || die "--stat $stat: expected avg or median"
progress() { [[ -t 2 ]] && printf "$@" >&2; return 0; }

require_mc2 "$build"
mpib=$build/bench/mpi_coll_bench
[[ -x $mpib ]] || die "$mpib not found: build mpi_coll_bench (needs MPI), or pass --build DIR"
command -v mpirun >/dev/null || die "mpirun not found"

mpirun_args=(--oversubscribe -np "$nranks" --bind-to none --mca btl self,vader)
if [[ $(id -u) -eq 0 ]]; then
  mpirun_args=(--allow-run-as-root "${mpirun_args[@]}")
fi

if (( floor )); then
  floorb=$build/bench/all_reduce_floor
  [[ -x $floorb ]] || die "$floorb not found: build the all_reduce_floor target, or pass --build DIR"
  [[ $dtype == f32 ]] || die "--floor measures f32 only (got -d $dtype)"
  (( nranks <= $(nproc) )) || die "--floor needs a core per rank (-n $nranks, $(nproc) cores)"
fi

make_output_dir "$keep" compare

if (( mpich )); then
  if ! command -v mpicc.mpich >/dev/null || ! command -v mpiexec.mpich >/dev/null; then
    echo "compare_mpi.sh: installing MPICH (mpich, libmpich-dev)" >&2
    sudo=(); [[ $(id -u) -eq 0 ]] || sudo=(sudo)
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
      mpich libmpich-dev >&2 || die "cannot install MPICH"
  fi
  mpichb=$out/mpi_coll_bench_mpich
  mpicc.mpich -O2 -std=c11 -o "$mpichb" "$here/mpi_coll_bench.c" || die "cannot build with MPICH"
fi

sweep=(-b "$minb" -e "$maxb" -f "$factor" -i "$iters" -w "$warmup" -c "$check" -d "$dtype")

failed() {  # what base: show the end of its output (the directory may be removed)
  tail -n 15 "$2.txt" "$2.err" >&2 2>/dev/null || true
  die "$1 failed"
}
run_mc2() {  # collective rep
  "$mc2" bench "$1" -n "$nranks" "${sweep[@]}" --buffers "$buffers" \
    --json "$out/mc2_$1_$2.json" >"$out/mc2_$1_$2.txt" 2>"$out/mc2_$1_$2.err" ||
    failed "mc2 bench $1" "$out/mc2_$1_$2"
}
run_mpi() {
  mpirun "${mpirun_args[@]}" "$mpib" "$1" "${sweep[@]}" \
    --json "$out/mpi_$1_$2.json" >"$out/mpi_$1_$2.txt" 2>"$out/mpi_$1_$2.err" ||
    failed "mpi_coll_bench $1" "$out/mpi_$1_$2"
}

run_floor() {  # collective rep: all_reduce only
  [[ $1 == all_reduce ]] && (( floor )) || return 0
  "$floorb" -n "$nranks" -b "$minb" -e "$maxb" -f "$factor" -i "$iters" -w "$warmup" \
    --json "$out/floor_$1_$2.json" >"$out/floor_$1_$2.txt" 2>"$out/floor_$1_$2.err" ||
    failed "all_reduce_floor" "$out/floor_$1_$2"
}
run_mpich() {
  mpiexec.mpich -n "$nranks" "$mpichb" "$1" "${sweep[@]}" \
    --json "$out/mpich_$1_$2.json" >"$out/mpich_$1_$2.txt" 2>"$out/mpich_$1_$2.err" ||
    failed "mpi_coll_bench (MPICH) $1" "$out/mpich_$1_$2"
}

echo "# compare_mpi: $nranks ranks, sizes $minb..$maxb x$factor, dtype $dtype, mc2 buffers $buffers," \
     "iters $iters, warmup $warmup, $reps repetitions (medians), time: $stat, $(nproc) cores"
echo "# MPI: $(mpirun --version 2>/dev/null | head -1), mpirun ${mpirun_args[*]}"
(( mpich )) && echo "# MPICH: $(mpichversion 2>/dev/null | head -1 | tr -s ' \t' ' '), mpiexec.mpich -n $nranks"
for c in "${colls[@]}"; do
  for ((r = 1; r <= reps; r++)); do
    progress '\r[compare] %s: repetition %d/%d ' "$c" "$r" "$reps"
    # Alternate which side goes first so that slow drift hits both equally.
    if (( r % 2 )); then
      run_mc2 "$c" "$r"; run_mpi "$c" "$r"; (( mpich )) && run_mpich "$c" "$r"; run_floor "$c" "$r"
    else
      run_floor "$c" "$r"; (( mpich )) && run_mpich "$c" "$r"; run_mpi "$c" "$r"; run_mc2 "$c" "$r"
    fi
  done
  progress '\r%40s\r' ''
  python3 - "$out" "$c" "$reps" "$stat" "$mpich" "$floor" <<'EOF'
import json, statistics, sys

out, coll, reps, stat = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with_mpich = sys.argv[5] == "1"
with_floor = sys.argv[6] == "1" and coll == "all_reduce"
def load(side):
    return [json.load(open(f"{out}/{side}_{coll}_{r}.json")) for r in range(1, reps + 1)]
mc2, mpi = load("mc2"), load("mpi")
mpich = load("mpich") if with_mpich else None
floors = load("floor") if with_floor else None

def floor_us(size):
    # Median over repetitions of the floor's time at this size.
    vals = [row["floor_us"] for run in floors for row in run["rows"] if row["size"] == size]
    return statistics.median(vals) if vals else None

def value(m, key):
    # The run's time: its average (nccl-tests) or its median iteration;
    # bandwidths scale with 1 / time.
    if stat == "avg" or key not in ("time_us", "busbw_gbs"):
        return m[key]
    if key == "time_us":
        return m["time_median_us"]
    return m["busbw_gbs"] * m["time_us"] / m["time_median_us"] if m["time_median_us"] else 0.0

def med(runs, i, mode, key):
    vals = [value(run["rows"][i][mode], key) for run in runs if run["rows"][i].get(mode)]
    return statistics.median(vals) if vals else None

def ratio(a, b):
    return a / b if a is not None and b else None

def paired(runs_a, runs_b, i, mode):
    # Median over repetitions of time_b / time_a, each pair from the same
    # repetition (run back to back): the host's slow phases, which last
    # seconds and hit whichever side runs then, cancel within a pair.
    vals = []
    for a, b in zip(runs_a, runs_b):
        ra, rb = a["rows"][i].get(mode), b["rows"][i].get(mode)
        if ra and rb and value(ra, "time_us") > 0:
            vals.append(value(rb, "time_us") / value(ra, "time_us"))
    return statistics.median(vals) if vals else None

def f(v, spec):
    return format(v, spec) if v is not None else "N/A"

sizes = [row["size"] for row in mc2[0]["rows"]]
assert sizes == [row["size"] for row in mpi[0]["rows"]], "the two sweeps have different sizes"
algos = sorted({run["rows"][i]["out_of_place"]["algo"] for run in mc2 for i in range(len(sizes))})
print()
print(f"# {coll}: {mc2[0]['ranks']} ranks; time = {stat} of {mc2[0]['iters']} iterations, "
      f"median of {reps} runs; busbw in GB/s; ratio = mc2/MPI (> 1: mc2 faster); "
      f"mc2 algorithms: {', '.join(algos)}")
print(f"# {'':>10}  {'out-of-place':^43}  {'in-place':^30}")
extra = f"  {'MPICH bw':>8} {'best':>6}" if with_mpich else ""
extra += f"  {'floor us':>9} {'mc2/fl':>6} {'MPI/fl':>6}" if with_floor else ""
print(f"# {'size':>10}  {'mc2 us':>9} {'MPI us':>9} {'mc2 bw':>7} {'MPI bw':>7} {'ratio':>6}"
      f" {'paired':>6}  {'mc2 bw':>7} {'MPI bw':>7} {'ratio':>6}  mc2 algo{extra}")
best_ratios = []
ratios = []
paired_ratios = []
summary_rows = []
for i, size in enumerate(sizes):
    mt, pt = med(mc2, i, "out_of_place", "time_us"), med(mpi, i, "out_of_place", "time_us")
    mb, pb = med(mc2, i, "out_of_place", "busbw_gbs"), med(mpi, i, "out_of_place", "busbw_gbs")
    mbi, pbi = med(mc2, i, "in_place", "busbw_gbs"), med(mpi, i, "in_place", "busbw_gbs")
    # busbw is 0 on one rank: compare speed by time then.
    rb = ratio(mb, pb) if pb else ratio(pt, mt)
    rbi = ratio(mbi, pbi)
    if rb is not None: ratios.append(rb)
    rp = paired(mc2, mpi, i, "out_of_place")
    if rp is not None: paired_ratios.append(rp)
    algo = mc2[-1]["rows"][i]["out_of_place"]["algo"]
    extra = ""
    if with_mpich:
        # mc2 against the better of the two MPIs, by time (works for busbw 0 too).
        ct = med(mpich, i, "out_of_place", "time_us")
        cb = med(mpich, i, "out_of_place", "busbw_gbs")
        best_t = min(t for t in (pt, ct) if t is not None)
        rbest = ratio(best_t, mt)
        if rbest is not None: best_ratios.append(rbest)
        extra = f"  {f(cb, '8.2f')} {f(rbest, '6.2f')}"
    if with_floor:
        fl = floor_us(size)
        extra += f"  {f(fl, '9.2f')} {f(ratio(mt, fl), '6.2f')} {f(ratio(pt, fl), '6.2f')}"
    print(f"  {size:>10}  {f(mt, '9.2f')} {f(pt, '9.2f')} {f(mb, '7.2f')} {f(pb, '7.2f')} "
          f"{f(rb, '6.2f')} {f(rp, '6.2f')}  {f(mbi, '7.2f')} {f(pbi, '7.2f')} {f(rbi, '6.2f')}  {algo}{extra}")
    summary_rows.append({"size": size, "mc2_us": mt, "mpi_us": pt, "mc2_busbw_gbs": mb,
                         "mpi_busbw_gbs": pb, "ratio": rb, "paired": rp,
                         "mc2_busbw_in_place_gbs": mbi, "mpi_busbw_in_place_gbs": pbi,
                         "ratio_in_place": rbi, "mc2_algo": algo})
    if with_mpich:
        summary_rows[-1].update({"mpich_busbw_gbs": cb, "best_mpi_ratio": rbest})
    if with_floor:
        summary_rows[-1].update({"floor_us": fl, "mc2_over_floor": ratio(mt, fl),
                                 "max_ratio": ratio(pt, fl)})
lt_m, lt_p = med(mc2, 0, "out_of_place", "time_us"), med(mpi, 0, "out_of_place", "time_us")
print(f"# latency at {sizes[0]} B: mc2 {f(lt_m, '.2f')} us, MPI {f(lt_p, '.2f')} us, "
      f"ratio mc2/MPI = {f(ratio(lt_m, lt_p), '.2f')} (< 1: mc2 faster)")
if ratios:
    geo = statistics.geometric_mean([r for r in ratios if r > 0])
    big = [r for s, r in zip(sizes, ratios) if s >= (1 << 20)]
    print(f"# busbw ratio mc2/MPI: geometric mean {geo:.2f} over all sizes" +
          (f", {statistics.geometric_mean(big):.2f} over sizes >= 1 MiB" if big else ""))
    print(f"# slowest size against Open MPI: ratio {min(ratios):.2f}" +
          (f" (ratio of medians); {min(paired_ratios):.2f} (median of paired ratios)"
           if paired_ratios else ""))
if with_floor:
    print("# floor: the data movement alone (bench/all_reduce_floor); mc2/fl = mc2's time over it;"
          " MPI/fl = the largest ratio mc2/MPI any all_reduce could reach here")
if best_ratios:
    print(f"# against the better of Open MPI and MPICH: slowest ratio {min(best_ratios):.2f}, "
          f"geometric mean {statistics.geometric_mean([r for r in best_ratios if r > 0]):.2f}")
with open(f"{out}/summary_{coll}.json", "w") as fh:
    json.dump({"collective": coll, "ranks": mc2[0]["ranks"], "dtype": mc2[0]["dtype"],
               "buffers": mc2[0]["buffers"], "iters": mc2[0]["iters"], "reps": reps, "stat": stat,
               "mpich": with_mpich, "rows": summary_rows}, fh, indent=1)
    fh.write("\n")
EOF
done
[[ -n $keep ]] && echo "# raw outputs kept in $out"
exit 0
