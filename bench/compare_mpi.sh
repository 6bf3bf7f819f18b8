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
#            [--box HOSTSxRANKS --rate RATE [--delay TIME] [--box-name NAME]
#             [--box-subnet A.B.C]] [COLLECTIVE ...]
# --box: across hosts, on a cluster in a box (scripts/cluster.sh, root) that
# the script brings up itself (HOSTS hosts of RANKS ranks, every host link
# shaped to RATE in tc syntax, e.g. 100mbit, and DELAY of latency) and takes
# down at exit, also on an error or interrupt; it refuses a box of that name
# that is already up. mc2 bench and mpi_coll_bench run under mpirun with the
# box's options; Open MPI runs twice, with its default collectives and with
# its hierarchical han component (--mca coll_han_priority 100; out of
# place only: 4.1's han crashes on MPI_IN_PLACE), and a third time with
# its TCP transport as shipped (one connection per pair of processes,
# btl_tcp_links 1, where the box's options set 2: see docs/cluster.md,
# "Full duplex"). Per size it adds han's and the shipped transport's times
# and ratios and the bound the shaped rate sets on any
# implementation (the bytes the busiest host link must carry each way,
# full duplex, at RATE: all_reduce 2(H-1)/H x S, all_gather and
# reduce_scatter (H-1)/H x S, all_to_all L(H-1)/H x S, broadcast and reduce
# S; S = size, H hosts, L ranks per host; payload bytes only). Default box
# name mc2bb, subnet 10.215.0 (keep them apart from the tests' boxes).
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
box="" rate="" delay="" box_name=mc2bb box_subnet=10.215.0 nranks_given=0
colls=()

usage() { sed -n '2,46p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }
die() { echo "compare_mpi.sh: $*" >&2; exit 2; }
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) nranks=$2; nranks_given=1; shift 2 ;;
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
    --box) box=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --box-name) box_name=$2; shift 2 ;;
    --box-subnet) box_subnet=$2; shift 2 ;;
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

if [[ -n $box ]]; then
  parse_box "$box"
  [[ -n $rate ]] || die "--box needs --rate (the shaped link rate the bound is computed from)"
  shopt -s nocasematch
  [[ $rate =~ ^[0-9]*\.?[0-9]+([kmgt]i?)?(bit|bps)?$ ]] ||
    die "--rate $rate: expected a tc rate such as 100mbit or 1gbit"
  shopt -u nocasematch
  (( ! mpich && ! floor )) || die "--mpich and --floor measure one host: not with --box"
  (( ! nranks_given || nranks == box_hosts * box_ranks )) ||
    die "-n $nranks disagrees with --box $box ($((box_hosts * box_ranks)) ranks)"
  nranks=$((box_hosts * box_ranks))
  grep -q "MCA coll: han" <<<"$(ompi_info 2>/dev/null)" ||
    die "this Open MPI has no coll/han component (ompi_info | grep han)"
  # mc2's symmetric heap per rank: the largest send and receive buffers
  # (all_gather's output is the size, its input size / N) and slack.
  heap=$(( (2 * $(to_bytes "$maxb") + (128 << 20) + (2 << 20) - 1) / (2 << 20) * (2 << 20) ))
elif [[ -n $rate || -n $delay ]]; then
  die "--rate and --delay go with --box"
fi
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
if [[ -n $box ]]; then
  box_up "$box_name" "$box_subnet" "$box_hosts" "$rate" "$delay"
  mpirun_args=("${box_margs[@]}" -np "$nranks" -H "$(box_hostlist "$box_ranks")")
  mpi1_args=()
  for ((i = 0; i < ${#mpirun_args[@]}; i++)); do
    mpi1_args+=("${mpirun_args[i]}")
    [[ ${mpirun_args[i]} == btl_tcp_links ]] && { mpi1_args+=(1); ((i++)) || true; }
  done
fi
han_args=(--mca coll_han_priority 100)

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

sweep=(-b "$minb" -e "$maxb" -f "$factor" -i "$iters" -w "$warmup" -d "$dtype")
# mpi_coll_bench takes nccl-tests' -c 0|1; mc2 bench checks unless --no-check.
mpi_sweep=("${sweep[@]}" -c "$check")
mc2_sweep=("${sweep[@]}")
[[ $check == 1 ]] || mc2_sweep+=(--no-check)

failed() {  # what base: show the end of its output (the directory may be removed)
  tail -n 15 "$2.txt" "$2.err" >&2 2>/dev/null || true
  die "$1 failed"
}
run_mc2() {  # collective rep
  local launch=()
  # Across the box mc2 bench runs on the ranks of an mpirun job.
  [[ -z $box ]] || launch=(mpirun "${mpirun_args[@]}" -x "MC2_HEAP_BYTES=$heap")
  "${launch[@]}" "$mc2" bench "$1" -n "$nranks" "${mc2_sweep[@]}" --buffers "$buffers" \
    --json "$out/mc2_$1_$2.json" >"$out/mc2_$1_$2.txt" 2>"$out/mc2_$1_$2.err" ||
    failed "mc2 bench $1" "$out/mc2_$1_$2"
}
run_han() {  # collective rep: Open MPI with its hierarchical collectives, --box only
  [[ -n $box ]] || return 0
  # Out of place only: han in Open MPI 4.1 crashes on MPI_IN_PLACE.
  mpirun "${mpirun_args[@]}" "${han_args[@]}" "$mpib" "$1" "${mpi_sweep[@]}" --in-place 0 \
    --json "$out/han_$1_$2.json" >"$out/han_$1_$2.txt" 2>"$out/han_$1_$2.err" ||
    failed "mpi_coll_bench $1 (han)" "$out/han_$1_$2"
}
run_mpi1() {  # collective rep: Open MPI's TCP as shipped (one link), --box only
  [[ -n $box ]] || return 0
  mpirun "${mpi1_args[@]}" "$mpib" "$1" "${mpi_sweep[@]}" \
    --json "$out/mpi1_$1_$2.json" >"$out/mpi1_$1_$2.txt" 2>"$out/mpi1_$1_$2.err" ||
    failed "mpi_coll_bench $1 (one link)" "$out/mpi1_$1_$2"
}
run_mpi() {
  mpirun "${mpirun_args[@]}" "$mpib" "$1" "${mpi_sweep[@]}" \
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
  mpiexec.mpich -n "$nranks" "$mpichb" "$1" "${mpi_sweep[@]}" \
    --json "$out/mpich_$1_$2.json" >"$out/mpich_$1_$2.txt" 2>"$out/mpich_$1_$2.err" ||
    failed "mpi_coll_bench (MPICH) $1" "$out/mpich_$1_$2"
}

echo "# compare_mpi: $nranks ranks, sizes $minb..$maxb x$factor, dtype $dtype, mc2 buffers $buffers," \
     "iters $iters, warmup $warmup, $reps repetitions (medians), time: $stat, $(nproc) cores"
echo "# MPI: $(mpirun --version 2>/dev/null | head -1), mpirun ${mpirun_args[*]}"
(( mpich )) && echo "# MPICH: $(mpichversion 2>/dev/null | head -1 | tr -s ' \t' ' '), mpiexec.mpich -n $nranks"
[[ -z $box ]] || echo "# box: $box_hosts hosts x $box_ranks ranks (scripts/cluster.sh --name $box_name), real TCP" \
  "over veth links (MTU $box_mtu) shaped by tc tbf to $rate${delay:+, netem delay $delay}; Open MPI han: ${han_args[*]}"
for c in "${colls[@]}"; do
  for ((r = 1; r <= reps; r++)); do
    progress '\r[compare] %s: repetition %d/%d ' "$c" "$r" "$reps"
    # Alternate which side goes first so that slow drift hits both equally.
    if (( r % 2 )); then
      run_mc2 "$c" "$r"; run_mpi "$c" "$r"; run_han "$c" "$r"; run_mpi1 "$c" "$r"
      (( mpich )) && run_mpich "$c" "$r"; run_floor "$c" "$r"
    else
      run_floor "$c" "$r"; (( mpich )) && run_mpich "$c" "$r"
      run_mpi1 "$c" "$r"; run_han "$c" "$r"; run_mpi "$c" "$r"; run_mc2 "$c" "$r"
    fi
  done
  progress '\r%40s\r' ''
  python3 - "$out" "$c" "$reps" "$stat" "$mpich" "$floor" "$box" "$rate" "$delay" "$box_name" <<'EOF'
import json, os, statistics, sys

out, coll, reps, stat = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with_mpich = sys.argv[5] == "1"
with_floor = sys.argv[6] == "1" and coll == "all_reduce"
box_spec, rate_spec, delay_spec, box_name = sys.argv[7:11]
def load(side):
    return [json.load(open(f"{out}/{side}_{coll}_{r}.json")) for r in range(1, reps + 1)]
mc2, mpi = load("mc2"), load("mpi")
mpich = load("mpich") if with_mpich else None
floors = load("floor") if with_floor else None
han = load("han") if box_spec else None
mpi1 = load("mpi1") if box_spec else None

def rate_bytes_per_s(spec):
    # tc's rate units: bit, kbit, mbit, gbit, tbit (powers of 1000), their
    # binary forms kibit.. (powers of 1024), and bps, kbps.. (bytes/s).
    import re
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)([kmgt]?i?)(bit|bps)?", spec.lower())
    if not m:
        sys.exit(f"compare_mpi.sh: --rate {spec}: expected a tc rate such as 100mbit or 1gbit")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
             "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}[m.group(2)]
    unit = m.group(3) or "bit"
    return float(m.group(1)) * scale / (8 if unit == "bit" else 1)

# The bound the shaped links set (box only): the bytes the busiest host
# link must carry in each direction (full duplex) at the shaped rate, for
# S = the size (nccl-tests' bytes per rank), H hosts of L ranks. Payload
# only: the TCP/IP and Ethernet headers that tbf also counts cost ~4.5% more.
BOUND_TEXT = {
    "all_reduce": "2(H-1)/H x S / rate", "all_gather": "(H-1)/H x S / rate",
    "reduce_scatter": "(H-1)/H x S / rate", "all_to_all": "L(H-1)/H x S / rate",
    "broadcast": "S / rate", "reduce": "S / rate"}
def bound_us(size):
    if not box_spec or coll not in BOUND_TEXT:
        return None
    H, L = (int(x) for x in box_spec.split("x"))
    factor = {"all_reduce": 2 * (H - 1) / H, "all_gather": (H - 1) / H,
              "reduce_scatter": (H - 1) / H, "all_to_all": L * (H - 1) / H,
              "broadcast": 1.0, "reduce": 1.0}[coll]
    return factor * size / rate_bytes_per_s(rate_spec) * 1e6

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
if han:
    print(f"# box {box_spec} ({box_name}), rate {rate_spec}{', delay ' + delay_spec if delay_spec else ''}; "
          f"han = Open MPI with coll_han_priority 100; r/han = han time / mc2 time; "
          f"1link = Open MPI with btl_tcp_links 1 (as shipped); r/1l = its time / mc2 time; "
          f"bound = {BOUND_TEXT.get(coll, 'none stated')} (H hosts, L ranks per host, "
          f"payload bytes each way, full duplex); mc2/bd = mc2 time / bound")
    extra += (f"  {'han us':>10} {'r/han':>6} {'paired':>6}  {'1link us':>10} {'r/1l':>6} "
              f"{'paired':>6}  {'bound us':>10} {'mc2/bd':>6} {'MPI/bd':>6}")
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
    if han:
        ht = med(han, i, "out_of_place", "time_us")
        rh, rhp = ratio(ht, mt), paired(mc2, han, i, "out_of_place")
        ot = med(mpi1, i, "out_of_place", "time_us")
        ro, rop = ratio(ot, mt), paired(mc2, mpi1, i, "out_of_place")
        bd = bound_us(size)
        extra += (f"  {f(ht, '10.1f')} {f(rh, '6.2f')} {f(rhp, '6.2f')}  {f(ot, '10.1f')} "
                  f"{f(ro, '6.2f')} {f(rop, '6.2f')}  {f(bd, '10.1f')} "
                  f"{f(ratio(mt, bd), '6.2f')} {f(ratio(pt, bd), '6.2f')}")
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
    if han:
        summary_rows[-1].update({"han_us": ht, "han_ratio": rh, "han_paired": rhp,
                                 "mpi_one_link_us": ot, "one_link_ratio": ro,
                                 "one_link_paired": rop,
                                 "bound_us": bd, "mc2_over_bound": ratio(mt, bd),
                                 "mpi_over_bound": ratio(pt, bd)})
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
if han:
    rows_big = [r for r in summary_rows if r["size"] >= (16 << 20)]
    if rows_big:
        def worst(key, pick):
            vals = [r[key] for r in rows_big if r.get(key) is not None]
            return f(pick(vals), ".2f") if vals else "N/A"
        print(f"# sizes >= 16 MiB: slowest mc2/MPI {worst('ratio', min)} (paired "
              f"{worst('paired', min)}), slowest mc2/han {worst('han_ratio', min)} (paired "
              f"{worst('han_paired', min)}), slowest mc2/one-link MPI {worst('one_link_ratio', min)} "
              f"(paired {worst('one_link_paired', min)}), largest mc2/bound "
              f"{worst('mc2_over_bound', max)}, largest MPI/bound {worst('mpi_over_bound', max)}")
summary = {"collective": coll, "ranks": mc2[0]["ranks"], "dtype": mc2[0]["dtype"],
           "buffers": mc2[0]["buffers"], "iters": mc2[0]["iters"], "reps": reps, "stat": stat,
           "mpich": with_mpich, "rows": summary_rows}
if box_spec:
    H, L = (int(x) for x in box_spec.split("x"))
    summary["box"] = {"hosts": H, "ranks_per_host": L, "rate": rate_spec,
                      "rate_bytes_per_s": rate_bytes_per_s(rate_spec), "delay": delay_spec or None,
                      "mtu": int(os.environ["BOX_MTU"]),
                      "links": "real TCP over veth pairs shaped by tc tbf (scripts/cluster.sh), "
                               "not emulated",
                      "han": "--mca coll_han_priority 100",
                      "one_link": "--mca btl_tcp_links 1 (Open MPI's TCP as shipped)",
                      "bound": BOUND_TEXT.get(coll)}
with open(f"{out}/summary_{coll}.json", "w") as fh:
    json.dump(summary, fh, indent=1)
    fh.write("\n")
EOF
done
[[ -n $keep ]] && echo "# raw outputs kept in $out"
exit 0
