#!/usr/bin/env bash
# box_ops.sh: a fused operator across hosts, on a cluster in a box, at
# link-equivalent conditions (the inter-host transfer takes about as long
# as the compute).
#
# Usage: bench/box_ops.sh --box HOSTSxRANKS --rate RATE|auto [--start-rate RATE]
#            [--delay TIME] [--box-name NAME] [--box-subnet A.B.C] [--json FILE]
#            -- BUILD/tools/mc2 bench ops --operator OP [mc2 bench ops options]
#
# Brings up its own box (scripts/cluster.sh, root: HOSTS hosts of RANKS
# ranks, every host link shaped to RATE with tc tbf, DELAY of latency) and
# runs the mc2 bench ops command on its ranks under mpirun, over the real
# TCP links; the box goes down at exit, also on an error or interrupt, and
# a box of that name that is already up is refused.
#
# --rate auto calibrates the rate: for the operator's GEMM shape, the
# compute and the communication both grow with M, so the balance is set by
# the link: starting from --start-rate (default 100mbit) it runs the
# serial pipeline briefly (mc2 bench ops --pipelines serial, its compute-only
# and comm-only times), scales the rate by comm-only / compute-only (the
# transfer time goes as 1 / rate), brings the box up again at the new rate,
# and stops once the two are within 15% of each other (at most 4 rounds),
# then runs the command at that rate. A calibrated rate above 2gbit is
# refused: unshaped veth TCP on a small machine carries about that, so the
# shaping would no longer be the bottleneck (a larger -k/-N, or fewer
# cores, makes the compute longer).
#
# --json FILE (before or after --): the command's JSON (mc2 bench ops
# --json) with a "box" object added: hosts, ranks_per_host, rate, delay,
# calibration (the rounds: rate, compute_ms, comm_ms), links.
# scripts/record_bench.py records it (kind bench_ops). The command must not
# carry -n or --link: the box sets the ranks, and its links are real.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
box="" rate="" start_rate=100mbit delay="" box_name=mc2bb box_subnet=10.215.0 json=""
die() { echo "box_ops.sh: $*" >&2; exit 2; }
usage() { sed -n '2,33p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }
. "$here/lib.sh"

while [[ $# -gt 0 ]]; do
  box_option "$@"
  (( box_shift == 0 )) || { shift "$box_shift"; continue; }
  case "$1" in
    --start-rate) start_rate=${2:?--start-rate needs a value}; shift 2 ;;
    -h|--help) usage ;;
    --) shift; break ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ -n $box ]] || die "--box HOSTSxRANKS is required"
[[ -n $rate ]] || die "--rate RATE|auto is required"
parse_box "$box"
nranks=$((box_hosts * box_ranks))
# The command: BUILD/tools/mc2 bench ops ARGS; a trailing --json is ours
# (scripts/record_bench.py appends it).
[[ $# -ge 3 && $(basename "$1") == mc2 && $2 == bench && $3 == ops ]] ||
  die "expected -- BUILD/tools/mc2 bench ops ... after the options"
mc2=$1
[[ -x $mc2 ]] || die "$mc2 not found or not executable"
shift 3
ops=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --json) json=${2:?--json needs a value}; shift 2 ;;
    --json=*) json=${1#--json=}; shift ;;
    -n|--nranks|-n=*|--nranks=*) die "the command must not carry -n: the box runs $nranks ranks" ;;
    --link|--link=*) die "the command must not carry --link: the box's links are real" ;;
    --tune) die "--tune is not a benchmark run" ;;
    *) ops+=("$1"); shift ;;
  esac
done
has_op=0
for a in "${ops[@]+"${ops[@]}"}"; do [[ $a == --operator || $a == --operator=* ]] && has_op=1; done
(( has_op )) || die "the command needs --operator OP"
check_rate() {
  shopt -s nocasematch
  [[ $1 =~ ^[0-9]*\.?[0-9]+([kmgt]i?)?(bit|bps)?$ ]] || die "rate $1: expected a tc rate such as 100mbit"
  shopt -u nocasematch
}
[[ $rate == auto ]] && check_rate "$start_rate" || check_rate "$rate"
command -v python3 >/dev/null || die "python3 not found (used to read the JSON outputs)"
check_json_dest

make_output_dir "" box-ops
box_at() {  # RATE: (re)creates the box at RATE (only ours: box_up refuses others)
  [[ -z ${box_cluster+x} ]] || box_down
  box_up "$box_name" "$box_subnet" "$box_hosts" "$1" "$delay"
  hostlist=$(box_hostlist "$box_ranks")
}
run_ops() {  # JSON ARGS...: mc2 bench ops on the box's ranks
  local j=$1; shift
  mpirun "${box_margs[@]}" -np "$nranks" -H "$hostlist" "$mc2" bench ops "$@" --json "$j" \
    >"$j.txt" 2>"$j.err" || { tail -n 20 "$j.txt" "$j.err" >&2; die "mc2 bench ops failed on the box"; }
}
times() {  # JSON: "compute_ms comm_ms" of a mc2 bench ops result
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); c=j.get("confirm") or j
print(c["compute_ms"], c["comm_ms"])' "$1"
}

# The command's options but those the calibration runs set themselves.
cal_ops=()
for ((i = 0; i < ${#ops[@]}; i++)); do
  case "${ops[i]}" in
    -i|--iters|-w|--warmup|--pipelines|--confirm|--splits) i=$((i + 1)) ;;
    -i=*|--iters=*|-w=*|--warmup=*|--pipelines=*|--confirm=*|--splits=*) ;;
    *) cal_ops+=("${ops[i]}") ;;
  esac
done
calibration=()
if [[ $rate == auto ]]; then
  r=$start_rate
  for round in 1 2 3 4; do
    box_at "$r"
    # Serial only, few iterations: the balance, not the pipelines.
    run_ops "$out/cal$round.json" "${cal_ops[@]}" --pipelines serial --splits 1 --confirm 0 -i 3 -w 1
    read -r comp comm <<<"$(times "$out/cal$round.json")"
    calibration+=("$r $comp $comm")
    echo "# calibration $round: rate $r: compute-only $comp ms, comm-only $comm ms" >&2
    next=$(python3 - "$r" "$comp" "$comm" <<'PY'
import re, sys
spec, comp, comm = sys.argv[1].lower(), float(sys.argv[2]), float(sys.argv[3])
m = re.fullmatch(r"([0-9]*\.?[0-9]+)([kmgt]?i?)(bit|bps)?", spec)
scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
         "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}[m.group(2)]
bits = float(m.group(1)) * scale * (8 if m.group(3) == "bps" else 1)
if comp <= 0 or comm <= 0:
    sys.exit("box_ops.sh: the calibration measured no compute or no communication")
done = abs(comm / comp - 1) <= 0.15
print("done" if done else f"{max(1, round(bits * comm / comp / 1000))}kbit")
PY
) || die "calibration failed"
    [[ $next == done ]] && break
    (( round < 4 )) || die "no balance after 4 rounds (last: rate $r, compute $comp ms, comm $comm ms)"
    python3 -c 'import sys; sys.exit(int(sys.argv[1][:-4]) > 2000000)' "$next" ||
      die "the balance needs a rate of $next, above what unshaped veth TCP carries here (about" \
          "2gbit): make the GEMMs longer (-k/-N) so the shaped link stays the bottleneck"
    r=$next
  done
  rate=$r
else
  box_at "$rate"
fi

echo "# box: $box_hosts hosts x $box_ranks ranks (scripts/cluster.sh --name $box_name), real TCP over" \
     "veth links (MTU $box_mtu) shaped by tc tbf to $rate${delay:+, netem delay $delay}; mpirun ${box_margs[*]}"
run_ops "$out/result.json" "${ops[@]}"
cat "$out/result.json.txt"
python3 - "$out/result.json" "$box_hosts" "$box_ranks" "$rate" "$delay" "${json:-}" \
    "${calibration[@]+"${calibration[@]}"}" <<'PY'
import json, os, sys
path, hosts, ranks, rate, delay, dest = sys.argv[1:7]
j = json.load(open(path))
j["box"] = {"hosts": int(hosts), "ranks_per_host": int(ranks), "rate": rate,
            "delay": delay or None, "mtu": int(os.environ["BOX_MTU"]),
            "calibration": [dict(zip(("rate", "compute_ms", "comm_ms"),
                                     (c.split()[0], float(c.split()[1]), float(c.split()[2]))))
                            for c in sys.argv[7:]],
            "links": "real TCP over veth pairs shaped by tc tbf (scripts/cluster.sh), not emulated"}
c = j.get("confirm") or {}
if c.get("best_ms") and c.get("floor_ms"):
    print(f"# best {c['best_pipeline']} s={c['best_splits']}: {c['best_ms']:.1f} ms; "
          f"serial / best {c['serial_ms'] / c['best_ms']:.2f}x; best / floor "
          f"{c['best_ms'] / c['floor_ms']:.2f} (floor = max(compute-only, comm-only)); "
          f"medians of the iterations' ratios: serial / best "
          f"{c['serial_over_best_paired']:.2f}x, best / floor {c['best_over_floor_paired']:.2f}")
if dest:
    with open(dest, "w") as fh:
        json.dump(j, fh, indent=1)
        fh.write("\n")
PY
