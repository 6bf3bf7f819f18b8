#!/usr/bin/env bash
# The cluster in a box (scripts/cluster.sh) works as documented: two shaped
# "hosts" come up (twice: idempotent), Open MPI runs 2 hosts x 2 ranks across
# them with a checked all_reduce, the bytes cross the veth links (interface
# counters), each host has its own hostname, and `down` (twice) leaves no
# namespace, link, state file or process behind. Needs root; without it the
# check is skipped (exit 77) with the reason.
#
# Usage: cluster_check.sh --build-dir DIR --source-dir DIR
set -euo pipefail
build="" src=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --source-dir) src=$2; shift 2 ;;
    *) echo "cluster_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }
[[ $(id -u) -eq 0 ]] || skip "needs root (network namespaces, veth, tc)"
command -v mpirun >/dev/null || skip "mpirun is missing (Debian package openmpi-bin)"
bench=$build/bench/mpi_coll_bench
[[ -x $bench ]] || skip "$bench was not built (MPI not found at configure time)"

cluster=(bash "$src/scripts/cluster.sh" --name mc2t --subnet 10.214.0)
cleanup() { "${cluster[@]}" down >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup

"${cluster[@]}" up 2 --rate 400mbit
out=$("${cluster[@]}" up 2 --rate 400mbit)
[[ $out == *"already up"* ]] || fail "a second identical up should be a no-op, said: $out"
if "${cluster[@]}" up 3 2>/dev/null; then fail "up with another host count must be refused while up"; fi

for i in 0 1; do
  h=$("${cluster[@]}" exec $i hostname)
  [[ $h == "mc2th$i" ]] || fail "host $i has hostname '$h', expected mc2th$i"
  # Both ends of each link carry the default MTU (jumbo frames).
  m=$("${cluster[@]}" exec $i cat /sys/class/net/eth0/mtu)
  [[ $m == 9000 ]] || fail "host $i's eth0 has MTU $m, expected 9000"
  m=$(cat "/sys/class/net/mc2th${i}v/mtu")
  [[ $m == 9000 ]] || fail "the bridge side of host $i's link has MTU $m, expected 9000"
done
if "${cluster[@]}" up 2 --rate 400mbit --mtu 1500 2>/dev/null; then
  fail "up with another MTU must be refused while up"
fi

read -r _ sent0 _ recv0 < <("${cluster[@]}" counters | head -1 | awk '{print $1, $3, $4, $5}')
# 2 hosts x 2 ranks, a checked 4 MiB all_reduce (-c 1: every result verified).
log=$(mktemp)
# shellcheck disable=SC2046
if ! timeout 120 mpirun $("${cluster[@]}" mpirun-args) -np 4 -H "$("${cluster[@]}" hosts 2)" \
    "$bench" all_reduce -b 4M -e 4M -i 3 -w 1 >"$log" 2>&1; then
  cat "$log"
  fail "mpirun across the box failed"
fi
grep -qE '^ +4194304' "$log" || { cat "$log"; fail "no 4 MiB row in the benchmark output"; }
grep -q 'FAILED' "$log" && { cat "$log"; fail "the all_reduce results were wrong"; }
read -r _ sent1 _ recv1 < <("${cluster[@]}" counters | head -1 | awk '{print $1, $3, $4, $5}')
# An all_reduce of 4 MiB between two hosts moves at least 2 MiB each way
# per call (4 calls with the warm-up).
(( sent1 - sent0 >= 8 * 1048576 )) || fail "host 0 sent only $((sent1 - sent0)) bytes over its link"
(( recv1 - recv0 >= 8 * 1048576 )) || fail "host 0 received only $((recv1 - recv0)) bytes over its link"
echo "host 0 link: sent $((sent1 - sent0)) B, received $((recv1 - recv0)) B"

"${cluster[@]}" down
out=$("${cluster[@]}" down)
[[ $out == *"not up"* ]] || fail "a second down should be a no-op, said: $out"
if ip netns list | grep -q '^mc2th'; then fail "namespaces left behind: $(ip netns list)"; fi
if ip link show mc2tbr >/dev/null 2>&1; then fail "bridge mc2tbr left behind"; fi
[[ ! -e /run/mc2-cluster/mc2t ]] || fail "state file left behind"
if pgrep -f 'orted.*mc2th' >/dev/null; then fail "orted processes left behind"; fi
echo "cluster check passed"
