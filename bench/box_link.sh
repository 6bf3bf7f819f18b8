#!/usr/bin/env bash
# box_link.sh: the emulated link against the real one. The same fused
# operator (and an all_reduce) measured across the hosts of a cluster in a
# box, over real TCP links shaped by tc, and on ONE host with link emulation
# (mc2 bench ops --link, MC2_LINK) set to the box's rate and latency, side
# by side, with the ratio real / emulated.
#
# Usage: bench/box_link.sh --hosts H --rate RATE [--delay TIME] [-r REPS]
#            [--ar-bytes SIZE] [--box-name NAME] [--box-subnet A.B.C]
#            [--build DIR] [--json FILE] -- [mc2 bench ops options]
#
# The box has H hosts of one rank each: link emulation gives every rank
# its own port (docs/link-emulation.md), which is the box's host link only
# when a host holds one rank. Steps:
#  1. brings up the box (scripts/cluster.sh, root; taken down at exit, also
#     on an error or interrupt; a box of that name already up is refused);
#  2. measures the link's latency as mc2 sees it: the median over REPS runs
#     of the 8-byte time of `mc2 bench send_recv` between two hosts (both
#     ranks send at once; each call ends when the peer's message arrived:
#     one-way latency plus the software's cost per message);
#  3. emulates the link as bw = RATE (in bytes/s), lat = that latency;
#  4. REPS times, alternating the order: `mc2 bench ops` with the given
#     options across the box (mpirun) and on one host with -n H --link SPEC;
#     `mc2 bench all_reduce` of --ar-bytes (default 16M) across the box and
#     on one host with MC2_LINK=SPEC.
# It prints, per figure (compute-only, comm-only, serial, best pipeline of
# the operator; the all_reduce's time), the medians on the box and
# emulated and real / emulated. --json FILE writes them (scripts/
# record_bench.py records it, kind box_link). The ops options must not
# carry -n, --link or --json.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
hosts="" rate="" delay="" reps=3 ar_bytes=16M box_name=mc2bb box_subnet=10.215.0 json=""
build=${MC2_BUILD_DIR:-$repo/build}
die() { echo "box_link.sh: $*" >&2; exit 2; }
usage() { sed -n '2,32p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }
. "$here/lib.sh"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts) hosts=${2:?--hosts needs a value}; shift 2 ;;
    --rate) rate=${2:?--rate needs a value}; shift 2 ;;
    --delay) delay=${2:?--delay needs a value}; shift 2 ;;
    -r|--reps) reps=${2:?-r needs a value}; shift 2 ;;
    --ar-bytes) ar_bytes=${2:?--ar-bytes needs a value}; shift 2 ;;
    --box-name) box_name=${2:?--box-name needs a value}; shift 2 ;;
    --box-subnet) box_subnet=${2:?--box-subnet needs a value}; shift 2 ;;
    --build) build=${2:?--build needs a value}; shift 2 ;;
    --json) json=${2:?--json needs a value}; shift 2 ;;
    -h|--help) usage ;;
    --) shift; break ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
ops=()
while [[ $# -gt 0 ]]; do  # scripts/record_bench.py appends --json at the end
  case "$1" in
    --json) json=${2:?--json needs a value}; shift 2 ;;
    -n|--nranks|--link|--link=*|-n=*|--nranks=*) die "the ops options must not carry $1" ;;
    *) ops+=("$1"); shift ;;
  esac
done
[[ $hosts =~ ^[2-9]$ ]] || die "--hosts H: expected 2 to 9 hosts"
[[ -n $rate ]] || die "--rate RATE is required (tc syntax, e.g. 100mbit)"
shopt -s nocasematch
[[ $rate =~ ^[0-9]*\.?[0-9]+([kmgt]i?)?(bit|bps)?$ ]] || die "--rate $rate: expected a tc rate such as 100mbit"
shopt -u nocasematch
[[ $reps =~ ^[1-9][0-9]*$ ]] || die "-r $reps: expected a positive count"
ar=$(to_bytes "$ar_bytes")
has_op=0
for a in "${ops[@]+"${ops[@]}"}"; do [[ $a == --operator || $a == --operator=* ]] && has_op=1; done
(( has_op )) || die "the ops options need --operator OP"
require_mc2 "$build"
if [[ -n $json ]]; then
  : >>"$json" 2>/dev/null || die "--json $json: cannot write there"
fi

make_output_dir "" box-link
parse_box "${hosts}x1"
box_up "$box_name" "$box_subnet" "$box_hosts" "$rate" "$delay"
on_box=(mpirun "${box_margs[@]}" -np "$hosts" -H "$(box_hostlist 1)")
heap=$(( (3 * ar + (64 << 20) + (2 << 20) - 1) / (2 << 20) * (2 << 20) ))

run() {  # NAME CMD...: runs CMD, its output in $out/NAME.txt/.err
  local name=$1; shift
  "$@" >"$out/$name.txt" 2>"$out/$name.err" ||
    { tail -n 20 "$out/$name.txt" "$out/$name.err" >&2; die "$name failed: $*"; }
}

# 2. The latency: 8-byte send_recv between the first two hosts.
for ((r = 1; r <= reps; r++)); do
  run "lat$r" mpirun "${box_margs[@]}" -np 2 -H "$(box_hostlist 1 | cut -d, -f1-2)" \
    "$mc2" bench send_recv -b 8 -e 8 -i 200 -w 20 --json "$out/lat$r.json"
done
lat=$(python3 - "$out" "$reps" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
print(f"{statistics.median(json.load(open(f'{out}/lat{r}.json'))['rows'][0]['out_of_place']['time_us'] for r in range(1, reps + 1)):.1f}")
PY
)
spec=$(python3 - "$rate" "$lat" <<'PY'
import re, sys
m = re.fullmatch(r"([0-9]*\.?[0-9]+)([kmgt]?i?)(bit|bps)?", sys.argv[1].lower())
scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
         "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}[m.group(2)]
bytes_per_s = float(m.group(1)) * scale / (8 if (m.group(3) or "bit") == "bit" else 1)
print(f"bw={bytes_per_s / 1e6:.4f}MB/s,lat={sys.argv[2]}us")
PY
)
echo "# box_link: $hosts hosts x 1 rank, real TCP over veth links (MTU $box_mtu) shaped by tc tbf to $rate${delay:+," \
     "netem delay $delay}; measured latency $lat us (8 B send_recv, median of $reps); emulated" \
     "on one host as --link $spec; $reps alternated repetitions; $(nproc) cores"

# 4. Alternating: box first in odd repetitions, emulation first in even ones.
box_ops() { run "box_ops$1" "${on_box[@]}" "$mc2" bench ops "${ops[@]}" --json "$out/box_ops$1.json"; }
emu_ops() { run "emu_ops$1" "$mc2" bench ops -n "$hosts" "${ops[@]}" --link "$spec" --json "$out/emu_ops$1.json"; }
box_ar() {
  run "box_ar$1" "${on_box[@]}" -x "MC2_HEAP_BYTES=$heap" "$mc2" bench all_reduce -b "$ar" -e "$ar" \
    -i 5 -w 1 --json "$out/box_ar$1.json"
}
emu_ar() {
  run "emu_ar$1" env MC2_LINK="$spec" "$mc2" bench all_reduce -n "$hosts" -b "$ar" -e "$ar" \
    -i 5 -w 1 --json "$out/emu_ar$1.json"
}
for ((r = 1; r <= reps; r++)); do
  if (( r % 2 )); then box_ops "$r"; emu_ops "$r"; box_ar "$r"; emu_ar "$r"
  else emu_ar "$r"; box_ar "$r"; emu_ops "$r"; box_ops "$r"; fi
done

python3 - "$out" "$reps" "$hosts" "$rate" "$delay" "$lat" "$spec" "$ar" "${json:-}" <<'PY'
import json, os, statistics, sys
out, reps, hosts, rate, delay, lat, spec, ar, dest = sys.argv[1:10]
reps = int(reps)
load = lambda kind: [json.load(open(f"{out}/{kind}{r}.json")) for r in range(1, reps + 1)]
box_ops, emu_ops, box_ar, emu_ar = load("box_ops"), load("emu_ops"), load("box_ar"), load("emu_ar")

def ops_fig(j, key):
    c = j.get("confirm") or j
    if key == "best_ms" and "best_ms" not in c:
        rows = [x for x in j["rows"] if x.get("pipeline") != "auto"]
        return min(x["time_ms"] for x in rows)
    return c.get(key)

def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None

figures = []
op = box_ops[0].get("op")
for key, label in (("compute_ms", "compute-only"), ("comm_ms", "comm-only"),
                   ("serial_ms", "serial"), ("best_ms", "best pipeline")):
    b, e = med(ops_fig(j, key) for j in box_ops), med(ops_fig(j, key) for j in emu_ops)
    figures.append({"figure": f"{op} {label}", "unit": "ms", "box": b, "emulated": e,
                    "real_over_emulated": b / e if b and e else None})
ar_t = lambda j: j["rows"][0]["out_of_place"]["time_us"] / 1e3
b, e = med(ar_t(j) for j in box_ar), med(ar_t(j) for j in emu_ar)
figures.append({"figure": f"all_reduce {ar} B", "unit": "ms", "box": b, "emulated": e,
                "real_over_emulated": b / e if b and e else None})
best = lambda runs: sorted({f"{(j.get('confirm') or {}).get('best_pipeline')} "
                            f"s={(j.get('confirm') or {}).get('best_splits')}" for j in runs})
j0 = box_ops[0]
print(f"\n# {op} {j0.get('M')}x{j0.get('K')}x{j0.get('N')} {j0.get('dtype')}, {hosts} ranks; "
      f"medians of {reps}; best pipeline on the box: {', '.join(best(box_ops))}; "
      f"emulated: {', '.join(best(emu_ops))}")
print(f"# {'figure':<36} {'box ms':>10} {'emulated ms':>12} {'real/emul':>9}")
fmt = lambda v, s: format(v, s) if v is not None else "N/A"
for f in figures:
    print(f"  {f['figure']:<36} {fmt(f['box'], '10.2f')} {fmt(f['emulated'], '12.2f')} "
          f"{fmt(f['real_over_emulated'], '9.2f')}")
wrong = sum(x.get("wrong", 0) or 0 for j in box_ops + emu_ops for x in j.get("rows", []))
print(f"# #wrong over every pipeline and repetition: {wrong}")
if dest:
    with open(dest, "w") as fh:
        json.dump({"op": op, "M": j0.get("M"), "K": j0.get("K"), "N": j0.get("N"),
                   "dtype": j0.get("dtype"), "ranks": int(hosts), "reps": reps,
                   "box": {"hosts": int(hosts), "ranks_per_host": 1, "rate": rate,
                           "delay": delay or None, "mtu": int(os.environ["BOX_MTU"]),
                           "links": "real TCP over veth pairs shaped by tc tbf (scripts/cluster.sh)"},
                   "latency_us": float(lat), "emulated_link": spec, "all_reduce_bytes": int(ar),
                   "best_box": best(box_ops), "best_emulated": best(emu_ops),
                   "figures": figures, "wrong": wrong}, fh, indent=1)
        fh.write("\n")
PY
