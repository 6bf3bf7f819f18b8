#!/usr/bin/env bash
# mc2 across hosts on the cluster in a box (scripts/cluster.sh): the
# collective suite (tests/programs/span_suite.cc) on 2 hosts x 2 ranks
# (started by `mc2 run --hosts`) and on 4 hosts x 1 rank (by mpirun) must
# write, rank by rank, the very bytes of the same suite run by
# `mc2 run -n 4` on one host; the bytes must cross the hosts' links; a rank
# killed on one host (2 x 2 and 4 x 1) must make mpirun exit non-zero
# within the timeout + 2 s naming it, every other rank raising an mc2
# error first (naming the dead rank's host where it has neighbours);
# nothing may be left behind (processes, shared memory, namespaces).
# Needs root; without it the check is skipped (exit 77) with the reason.
#
# Usage: span_check.sh --build-dir DIR --source-dir DIR
set -euo pipefail
build="" src=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --source-dir) src=$2; shift 2 ;;
    *) echo "span_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }
[[ $(id -u) -eq 0 ]] || skip "needs root (network namespaces, veth, tc)"
command -v mpirun >/dev/null || skip "mpirun is missing (Debian package openmpi-bin)"
prog=$build/tests/test_prog_span_suite
mc2=$build/tools/mc2
[[ -x $prog && -x $mc2 ]] || fail "$prog or $mc2 was not built"

name=mc2s
cluster=(bash "$src/scripts/cluster.sh" --name $name --subnet 10.217.0)
work=$(mktemp -d)
cleanup() {
  "${cluster[@]}" down >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
"${cluster[@]}" down >/dev/null 2>&1 || true
shm_before=$(ls /dev/shm | sort)

"${cluster[@]}" up 4 --rate 1gbit >/dev/null
read -r -a margs <<<"$("${cluster[@]}" mpirun-args)"

compare() {  # DIR: every rank's file equals the one-host run's
  for r in 0 1 2 3; do
    cmp -s "$work/one/rank$r.txt" "$1/rank$r.txt" ||
      { diff "$work/one/rank$r.txt" "$1/rank$r.txt" | head -5; fail "$1: rank $r differs from one host"; }
  done
}

mkdir -p "$work/one" "$work/x22" "$work/x41"
"$mc2" run -n 4 "$prog" suite "$work/one" >"$work/one.log" 2>&1 ||
  { cat "$work/one.log"; fail "the suite failed on one host"; }
[[ $(wc -l <"$work/one/rank0.txt") -gt 40 ]] || fail "the one-host run recorded too few cases"

read -r _ sent0 _ recv0 < <("${cluster[@]}" counters | head -1 | awk '{print $1, $3, $4, $5}')
# 2 hosts x 2 ranks through `mc2 run --hosts`.
timeout 120 "$mc2" run --hosts ${name}h0:2,${name}h1:2 --mpirun-args "${margs[*]}" \
    "$prog" suite "$work/x22" >"$work/x22.log" 2>&1 ||
  { cat "$work/x22.log"; fail "the suite failed on 2 hosts x 2 ranks"; }
compare "$work/x22"
read -r _ sent1 _ recv1 < <("${cluster[@]}" counters | head -1 | awk '{print $1, $3, $4, $5}')
# The suite's all-reduces alone move over 20 MiB between the hosts.
(( sent1 - sent0 >= 20 * 1048576 && recv1 - recv0 >= 20 * 1048576 )) ||
  fail "host 0's link carried only $((sent1 - sent0)) B out, $((recv1 - recv0)) B in"
echo "2x2: bitwise equal to one host; host 0 link sent $((sent1 - sent0)) B, received $((recv1 - recv0)) B"

# 4 hosts x 1 rank, mpirun directly.
timeout 120 mpirun "${margs[@]}" -np 4 -H "$("${cluster[@]}" hosts 1)" \
    "$prog" suite "$work/x41" >"$work/x41.log" 2>&1 ||
  { cat "$work/x41.log"; fail "the suite failed on 4 hosts x 1 rank"; }
compare "$work/x41"
echo "4x1: bitwise equal to one host"

# A rank killed on host 1 (global rank 3): mpirun must end non-zero within
# MC2_TIMEOUT + 2 s (plus the job's start-up), naming rank 3, and every
# other rank must raise an mc2 error first: mpirun sends them SIGTERM at
# once, and mc2's grace (src/engine/termination.h) keeps them alive until
# they raised the failure their host neighbour of rank 3 reported.
fault() {  # HOSTS LOG: kill global rank 3
  local start status elapsed_ms
  start=$(date +%s%N)
  set +e
  timeout 60 mpirun "${margs[@]}" -x MC2_TIMEOUT=5s -np 4 -H "$1" "$prog" fault 3 >"$2" 2>&1
  status=$?
  set -e
  elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  [[ $status -ne 0 && $status -ne 124 ]] || { cat "$2"; fail "mpirun exited $status after a rank was killed"; }
  (( elapsed_ms < 5000 + 2000 + 6000 )) || fail "the job took ${elapsed_ms} ms to end after the kill"
  grep -q "mpirun noticed that process rank 3" "$2" || { cat "$2"; fail "mpirun did not name rank 3"; }
  for r in 0 1 2; do
    grep -qE "^rank $r error: mc2 error \[(peer_died|aborted)\]" "$2" ||
      { cat "$2"; fail "rank $r raised no mc2 error after rank 3 was killed"; }
  done
  echo "fault on $1: mpirun exited $status in ${elapsed_ms} ms; ranks 0-2 raised the error"
}
fault ${name}h0:2,${name}h1:2 "$work/fault.log"
# With host neighbours, the error names the death and the host's ranks.
errors=$(grep -E "^rank [0-2] error" "$work/fault.log")
if grep -vq "global ranks 2,3" <<<"$errors" || grep -vqE "has exited|was killed" <<<"$errors"; then
  cat "$work/fault.log"; fail "a rank reported another error than the death of a rank of host 1"
fi
# Alone on its host, rank 3 has no neighbour to see it die: the others
# raise the launcher's termination, which says where the rank is named.
fault "$("${cluster[@]}" hosts 1)" "$work/fault41.log"

"${cluster[@]}" down >/dev/null
sleep 1
if pgrep -f test_prog_span_suite >/dev/null; then fail "processes left behind: $(pgrep -af test_prog_span_suite)"; fi
if pgrep -f "orted.*${name}h" >/dev/null; then fail "orted left behind"; fi
if ip netns list | grep -q "^${name}h"; then fail "namespaces left behind"; fi
[[ "$(ls /dev/shm | sort)" == "$shm_before" ]] ||
  fail "/dev/shm changed: $(comm -13 <(echo "$shm_before") <(ls /dev/shm | sort) | tr '\n' ' ')"
echo "span check passed"
