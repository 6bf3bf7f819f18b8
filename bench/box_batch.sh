#!/usr/bin/env bash
# box_batch.sh: `mc2 bench batch` across hosts, on a cluster in a box: a
# batch of collectives (one exchange) against the same collectives as
# separate calls, where every call pays the network's latency.
#
# Usage: bench/box_batch.sh --box HOSTSxRANKS [--rate RATE] [--delay TIME]
#            [--box-name NAME] [--box-subnet A.B.C] [--json FILE]
#            -- BUILD/tools/mc2 bench batch [mc2 bench batch options]
#
# Brings up its own box (scripts/cluster.sh, root: HOSTS hosts of RANKS
# ranks; links shaped to RATE with tc tbf, or unshaped without --rate, and
# DELAY of latency) and runs the command on its ranks under mpirun, over
# the real TCP links; the box goes down at exit, also on an error or
# interrupt, and a box of that name that is already up is refused.
#
# --json FILE (before or after --): the command's JSON (mc2 bench batch
# --json) with a "box" object added: hosts, ranks_per_host, rate
# ("unshaped" without --rate), delay, mtu, links. scripts/record_bench.py
# records it (kind bench_batch). The command must not carry -n: the box
# sets the ranks.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
box="" rate="" delay="" box_name=mc2bb box_subnet=10.215.0 json=""
die() { echo "box_batch.sh: $*" >&2; exit 2; }
usage() { sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }
. "$here/lib.sh"

while [[ $# -gt 0 ]]; do
  box_option "$@"
  (( box_shift == 0 )) || { shift "$box_shift"; continue; }
  case "$1" in
    -h|--help) usage ;;
    --) shift; break ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ -n $box ]] || die "--box HOSTSxRANKS is required"
parse_box "$box"
nranks=$((box_hosts * box_ranks))
[[ $# -ge 3 && $(basename "$1") == mc2 && $2 == bench && $3 == batch ]] ||
  die "expected -- BUILD/tools/mc2 bench batch ... after the options"
mc2=$1
[[ -x $mc2 ]] || die "$mc2 not found or not executable"
shift 3
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --json) json=${2:?--json needs a value}; shift 2 ;;
    --json=*) json=${1#--json=}; shift ;;
    -n|--nranks|-n=*|--nranks=*) die "the command must not carry -n: the box runs $nranks ranks" ;;
    *) args+=("$1"); shift ;;
  esac
done
command -v python3 >/dev/null || die "python3 not found (used to write the JSON output)"
check_json_dest

make_output_dir "" box-batch
box_up "$box_name" "$box_subnet" "$box_hosts" "$rate" "$delay"
hostlist=$(box_hostlist "$box_ranks")
shaping="unshaped"
[[ -z $rate ]] || shaping="shaped by tc tbf to $rate"
echo "# box: $box_hosts hosts x $box_ranks ranks (scripts/cluster.sh --name $box_name), real TCP over" \
     "veth links (MTU $box_mtu) $shaping${delay:+, netem delay $delay}; mpirun ${box_margs[*]}"
mpirun "${box_margs[@]}" -np "$nranks" -H "$hostlist" "$mc2" bench batch \
    "${args[@]+"${args[@]}"}" --json "$out/result.json" ||
  die "mc2 bench batch failed on the box"
[[ -z $json ]] || python3 - "$out/result.json" "$box_hosts" "$box_ranks" "${rate:-unshaped}" \
    "$delay" "$json" <<'PY'
import json, os, sys
path, hosts, ranks, rate, delay, dest = sys.argv[1:7]
j = json.load(open(path))
j["box"] = {"hosts": int(hosts), "ranks_per_host": int(ranks), "rate": rate,
            "delay": delay or None, "mtu": int(os.environ["BOX_MTU"]),
            "links": "real TCP over veth pairs (scripts/cluster.sh), not emulated"}
with open(dest, "w") as fh:
    json.dump(j, fh, indent=1)
    fh.write("\n")
PY
