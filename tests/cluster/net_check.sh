#!/usr/bin/env bash
# mc2 across hosts on the cluster in a box (scripts/cluster.sh): the
# collective suite (tests/programs/net_suite.cc) on 2 hosts x 2 ranks
# (started by `mc2 run --hosts`) and on 4 hosts x 1 rank (by mpirun) must
# write, rank by rank, the very bytes of the same suite run by
# `mc2 run -n 4` on one host; so must the fused-operator suite
# (tests/programs/net_ops.cc: every operator, every pipeline), and a bad
# shape on one rank must raise an mc2::Error on every rank of every host
# (no hang), and a stalled producer must time out naming the missing
# chunk; a few training steps of the reference transformer on 4 hosts x 1
# rank and on 2 hosts x 2 ranks (pipeline stages on different hosts) must
# give the losses and weights of one host; the bytes must cross
# the hosts' links; a rank killed on one host (2 x 2 and 4 x 1, and inside
# fused operator calls) must make mpirun exit non-zero within the timeout
# + 2 s naming it, every other rank raising an mc2 error first (naming the
# dead rank's host where it has neighbours);
# nothing may be left behind (processes, shared memory, namespaces).
# The collective suite includes a mixed mc2::Batch (fused across hosts,
# also checked in the program against the separate collectives), and a
# batch's errors must reach every rank.
# Needs root; without it the check is skipped (exit 77) with the reason.
#
# Usage: net_check.sh --build-dir DIR --source-dir DIR
set -euo pipefail
build="" src=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --source-dir) src=$2; shift 2 ;;
    *) echo "net_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }
[[ $(id -u) -eq 0 ]] || skip "needs root (network namespaces, veth, tc)"
command -v mpirun >/dev/null || skip "mpirun is missing (Debian package openmpi-bin)"
prog=$build/tests/test_prog_net_suite
ops=$build/tests/test_prog_net_ops
hier=$build/tests/test_prog_net_hier
mc2=$build/tools/mc2
[[ -x $prog && -x $ops && -x $hier && -x $mc2 ]] || fail "$prog, $ops, $hier or $mc2 was not built"

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

compare() {  # DIR [ONE]: every rank's file equals the one-host run's (in ONE)
  local one=${2:-$work/one}
  for r in 0 1 2 3; do
    cmp -s "$one/rank$r.txt" "$1/rank$r.txt" ||
      { diff "$one/rank$r.txt" "$1/rank$r.txt" | head -5; fail "$1: rank $r differs from one host"; }
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

# A batch's errors across hosts: entries that differ on one rank raise
# kMismatch on every rank before data moves, a bad root kInvalidArgument
# naming the entry, and the group works after both. (The suite above ran
# a mixed batch fused across hosts against the separate collectives and
# against the same batch on one host.)
timeout 60 mpirun "${margs[@]}" -x MC2_TIMEOUT=10s -np 4 -H ${name}h0:2,${name}h1:2 \
    "$prog" batch_bad >"$work/batch_bad.log" 2>&1 ||
  { cat "$work/batch_bad.log"; fail "the batch error run failed"; }
for r in 0 1 2 3; do
  grep -q "^rank $r error: .*\[mismatch\].*mismatched operations across ranks: rank $r called batch" \
      "$work/batch_bad.log" &&
    grep -q "^rank $r error: .*\[invalid_argument\]: batch entry 1 (broadcast): root 4 is out of range" \
      "$work/batch_bad.log" &&
    grep -q "^rank $r: batch_bad ok" "$work/batch_bad.log" ||
    { cat "$work/batch_bad.log"; fail "rank $r did not raise both batch errors and recover"; }
done
echo "batch: mismatched entries and a bad root raised their errors on every rank across hosts"

# The hierarchical and flat algorithms of all_gather(v), reduce_scatter(v),
# all_to_all(v) and broadcast against each other and a reference
# (tests/programs/net_hier.cc), on aligned layouts, on layouts that are
# not (hosts of unequal sizes; ranks dealt round robin over the hosts),
# and with a tuning table that the defaults must follow.
hier_run() {  # LABEL MPIRUN-ARGS... -- PROGRAM-ARGS...
  local label=$1; shift
  local args=() ; while [[ $1 != -- ]]; do args+=("$1"); shift; done; shift
  timeout 60 mpirun "${margs[@]}" "${args[@]}" "$hier" "$@" >"$work/hier.log" 2>&1 ||
    { cat "$work/hier.log"; fail "net_hier $label failed"; }
}
hier_run 2x2 -np 4 -H ${name}h0:2,${name}h1:2 -- aligned
hier_run 4x1 -np 4 -H "$("${cluster[@]}" hosts 1)" -- single
hier_run "2+1" -np 3 -H ${name}h0:2,${name}h1:1 -- unaligned
hier_run "2x2 round robin" -np 4 -H ${name}h0:2,${name}h1:2 --map-by node -- unaligned
echo '{"all_gather@2": {"2": [[1.8e19, "direct"]]}, "all_to_all@2": {"2": [[1.8e19, "hierarchical"]]}}' \
  >"$work/table.json"
hier_run "2x2 with a table" -np 4 -H ${name}h0:2,${name}h1:2 -x MC2_TUNING_FILE="$work/table.json" \
  -- aligned table
echo "hierarchical and flat collectives: equal to the reference on 2x2, 4x1, 2+1, 2x2 round robin"

# The fused operators: one host, then 2 hosts x 2 ranks and 4 hosts x 1
# rank (the latter with 4 KiB MPI pieces, so chunks travel in many).
mkdir -p "$work/ops1" "$work/ops22" "$work/ops41"
"$mc2" run -n 4 "$ops" suite "$work/ops1" >"$work/ops1.log" 2>&1 ||
  { cat "$work/ops1.log"; fail "the operator suite failed on one host"; }
[[ $(wc -l <"$work/ops1/rank0.txt") -ge 40 ]] || fail "the one-host operator run recorded too few cases"
read -r _ sent0 _ recv0 < <("${cluster[@]}" counters | head -1 | awk '{print $1, $3, $4, $5}')
timeout 120 "$mc2" run --hosts ${name}h0:2,${name}h1:2 --mpirun-args "${margs[*]}" \
    "$ops" suite "$work/ops22" >"$work/ops22.log" 2>&1 ||
  { cat "$work/ops22.log"; fail "the operator suite failed on 2 hosts x 2 ranks"; }
compare "$work/ops22" "$work/ops1"
read -r _ sent1 _ recv1 < <("${cluster[@]}" counters | head -1 | awk '{print $1, $3, $4, $5}')
# Host 0's ranks hand host 1 about 300 KB of operands and partial sums.
(( sent1 - sent0 >= 300000 && recv1 - recv0 >= 300000 )) ||
  fail "operators: host 0's link carried only $((sent1 - sent0)) B out, $((recv1 - recv0)) B in"
echo "operators 2x2: bitwise equal to one host; host 0 link sent $((sent1 - sent0)) B, received $((recv1 - recv0)) B"
timeout 120 mpirun "${margs[@]}" -x MC2_MPI_PIECE_BYTES=4096 -np 4 -H "$("${cluster[@]}" hosts 1)" \
    "$ops" suite "$work/ops41" >"$work/ops41.log" 2>&1 ||
  { cat "$work/ops41.log"; fail "the operator suite failed on 4 hosts x 1 rank"; }
compare "$work/ops41" "$work/ops1"
echo "operators 4x1: bitwise equal to one host"
# A bad shape on one rank: every rank raises it (a mismatch, then an
# invalid argument), and the group still works after.
set +e
timeout 60 mpirun "${margs[@]}" -x MC2_TIMEOUT=10s -np 4 -H ${name}h0:2,${name}h1:2 \
    "$ops" bad >"$work/bad.log" 2>&1
status=$?
set -e
[[ $status -eq 0 ]] || { cat "$work/bad.log"; fail "the bad-shape run exited $status"; }
for r in 0 1 2 3; do
  grep -q "^rank $r error: .*\[mismatch\].*args.k differs" "$work/bad.log" &&
    grep -q "^rank $r error: .*\[invalid_argument\]" "$work/bad.log" &&
    grep -q "^rank $r: bad ok" "$work/bad.log" ||
    { cat "$work/bad.log"; fail "rank $r did not raise both errors and recover"; }
done
echo "operators: a bad shape on one rank raised an error on every rank"

# A stalled producer: rank 1 (host 0) sleeps in the middle of a fused
# MatmulAllReduce whose timeout is 1 s; the ranks waiting for its chunks
# must raise kTimeout naming the missing chunk (or kAborted carrying it),
# and the job must end. How soon a job ends is printed, not judged here or
# below (a loaded host delays any step): `timeout 60` catches a hang, and
# each rank's error says what ended it.
start=$(date +%s%N)
set +e
timeout 60 mpirun "${margs[@]}" -np 4 -H ${name}h0:2,${name}h1:2 "$ops" stall >"$work/stall.log" 2>&1
status=$?
set -e
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
[[ $status -ne 0 && $status -ne 124 ]] || { cat "$work/stall.log"; fail "the stalled job exited $status"; }
grep -qE "^rank [023] error: .*\[timeout\].*timed out waiting for chunk [0-9]+ of 4 from rank 1" "$work/stall.log" ||
  { cat "$work/stall.log"; fail "no rank reported the timeout naming rank 1's chunk"; }
if grep -E "^rank [0-3] error" "$work/stall.log" | grep -vqE "\[(timeout|aborted)\].*from rank 1"; then
  cat "$work/stall.log"; fail "a rank reported another error than the stalled chunk"
fi
echo "operators: a stalled producer across hosts timed out naming its chunk (${elapsed_ms} ms)"

# A receive whose sender never sends (rank 3, host 1): with MC2_TIMEOUT=2s
# rank 0's receive must fail with kTimeout naming rank 3, and the other
# ranks (in a barrier rank 0 never joins) must learn of it, not hang.
start=$(date +%s%N)
set +e
timeout 60 mpirun "${margs[@]}" -x MC2_TIMEOUT=2s -np 4 -H ${name}h0:2,${name}h1:2 \
    "$ops" stall_recv >"$work/stall_recv.log" 2>&1
status=$?
set -e
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
[[ $status -ne 0 && $status -ne 124 ]] || { cat "$work/stall_recv.log"; fail "the stalled receive exited $status"; }
for r in 0 1 2 3; do
  grep -qE "^rank $r error: .*\[timeout\].*receive from rank 3 \(tag 7, 4096 bytes\) did not complete within the timeout" \
      "$work/stall_recv.log" ||
    { cat "$work/stall_recv.log"; fail "rank $r did not report the receive's timeout naming rank 3"; }
done
echo "send/recv: a receive from a silent rank across hosts timed out on every rank (${elapsed_ms} ms)"

# mc2 topo inside an mpirun job: the map of both hosts, and the link
# between them measured (not a local relaunch).
timeout 60 mpirun "${margs[@]}" -np 4 -H ${name}h0:2,${name}h1:2 "$mc2" topo >"$work/topo.log" 2>&1 ||
  { cat "$work/topo.log"; fail "mc2 topo failed across hosts"; }
grep -q "^# 4 rank(s) on 2 host(s)" "$work/topo.log" && grep -qE "^ +cross-host +0-2 " "$work/topo.log" ||
  { cat "$work/topo.log"; fail "mc2 topo did not map 2 hosts and measure the cross-host link"; }
echo "topo: 4 ranks on 2 hosts mapped, cross-host link measured"

# GradSync over hosts: each bucket's all-reduce hierarchical or flat
# (measured, agreed across ranks, forced either way), every result bitwise
# the per-tensor all-reduce's; on one host nothing spans levels.
grad=$build/tests/test_prog_net_grad
"$mc2" run -n 4 "$grad" one-host >"$work/grad1.log" 2>&1 ||
  { cat "$work/grad1.log"; fail "GradSync levels failed on one host"; }
for hosts in ${name}h0:2,${name}h1:2 "$("${cluster[@]}" hosts 1)"; do
  timeout 120 mpirun "${margs[@]}" -np 4 -H "$hosts" "$grad" hosts >"$work/grad.log" 2>&1 ||
    { cat "$work/grad.log"; fail "GradSync levels failed on $hosts"; }
  [[ $(grep -c "net_grad ok" "$work/grad.log") -eq 4 ]] ||
    { cat "$work/grad.log"; fail "GradSync levels: not every rank passed on $hosts"; }
  echo "GradSync on $hosts: $(grep -c '^bucket ' "$work/grad.log") buckets measured hierarchical vs flat, results bitwise per-tensor"
done

# Training steps of the reference transformer (TP over the 4 hosts; TP 2 x
# DP 2 with MoE over EP 2; TP 2 x PP 2, whose stages on 2 hosts x 2 ranks
# are one host each: TP inside a host, PP across), against one host.
mkdir -p "$work/train1" "$work/train22" "$work/train41"
"$mc2" run -n 4 "$ops" train "$work/train1" >"$work/train1.log" 2>&1 ||
  { cat "$work/train1.log"; fail "training failed on one host"; }
grep -q "^train_pp_interleaved_params " "$work/train1/rank0.txt" ||
  fail "the one-host training recorded no pipeline-parallel run"
timeout 120 "$mc2" run --hosts ${name}h0:2,${name}h1:2 --mpirun-args "${margs[*]}" \
    "$ops" train "$work/train22" >"$work/train22.log" 2>&1 ||
  { cat "$work/train22.log"; fail "training failed on 2 hosts x 2 ranks"; }
compare "$work/train22" "$work/train1"
echo "training 2x2 (PP across the hosts): losses and weights bitwise equal to one host"
timeout 120 mpirun "${margs[@]}" -np 4 -H "$("${cluster[@]}" hosts 1)" \
    "$ops" train "$work/train41" >"$work/train41.log" 2>&1 ||
  { cat "$work/train41.log"; fail "training failed on 4 hosts x 1 rank"; }
compare "$work/train41" "$work/train1"
echo "training 4x1: losses and weights bitwise equal to one host"

# A rank killed on host 1 (global rank 3): mpirun must end non-zero, naming
# rank 3, and every other rank must raise an mc2 error first (peer_died or
# aborted: the death, not the 5 s timeout): mpirun sends them SIGTERM at
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

# The same inside a fused operator: rank 1 (host 0) dies in the middle of
# fused MatmulAllReduce calls over both hosts (tests/programs/
# fused_fault_probe.cc); every other rank must raise an mc2 error (the
# death, a death that followed it -- a rank exits once it raised its error
# -- or the launcher's termination), and none may finish.
# Python under mpirun on 2 hosts x 2 ranks: an unchanged
# init_process_group, collectives, a fused operator and DDP across the
# box's hosts against references (python/tests/test_mpirun.py), when the
# package was built.
if [[ -f $build/python/mc2/__init__.py ]] && /usr/bin/python3 -c "import torch" 2>/dev/null; then
  timeout 180 mpirun "${margs[@]}" -x PYTHONPATH=$build/python -x MC2_TIMEOUT=60s \
      -x OMP_NUM_THREADS=1 -x MC2_HEAP_BYTES=64M -np 4 -H ${name}h0:2,${name}h1:2 \
      /usr/bin/python3 -m pytest -x -q -p no:cacheprovider "$src/python/tests/test_mpirun.py" \
      >"$work/python.log" 2>&1 || { cat "$work/python.log"; fail "Python under mpirun failed on 2x2"; }
  [[ $(grep -o "[0-9]* passed" "$work/python.log" | wc -l) == 4 ]] ||
    { cat "$work/python.log"; fail "not every rank's Python tests passed"; }
  echo "python 2x2: test_mpirun.py passed on every rank"
else
  echo "python 2x2: skipped (the Python package was not built)"
fi

fprog=$build/tests/test_prog_fused_fault_probe
[[ -x $fprog ]] || fail "$fprog was not built"
start=$(date +%s%N)
set +e
timeout 60 mpirun "${margs[@]}" -x MC2_TIMEOUT=5s -np 4 -H ${name}h0:2,${name}h1:2 \
    "$fprog" kill >"$work/ffault.log" 2>&1
status=$?
set -e
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
[[ $status -ne 0 && $status -ne 124 ]] || { cat "$work/ffault.log"; fail "mpirun exited $status after a rank died in a fused call"; }
grep -q "mpirun noticed that process rank 1" "$work/ffault.log" ||
  { cat "$work/ffault.log"; fail "mpirun did not name rank 1"; }
! grep -q "^rank .: finished\|wrong result" "$work/ffault.log" ||
  { cat "$work/ffault.log"; fail "a rank finished or computed a wrong result after the kill"; }
for r in 0 2 3; do
  grep -qE "^rank $r: failed after [0-9]+ ms: (peer_died|aborted): " "$work/ffault.log" ||
    { cat "$work/ffault.log"; fail "rank $r raised no mc2 error after rank 1 died in a fused call"; }
done
echo "fused fault: mpirun exited $status in ${elapsed_ms} ms; ranks 0, 2, 3 raised the error"

"${cluster[@]}" down >/dev/null
sleep 1
# The programs themselves (their path), not e.g. a build naming them.
left="/tests/test_prog_(net_suite|net_ops|fused_fault_probe)( |$)|test_mpirun.py"
if pgrep -f "$left" >/dev/null; then fail "processes left behind: $(pgrep -af "$left")"; fi
if pgrep -f "orted.*${name}h" >/dev/null; then fail "orted left behind"; fi
if ip netns list | grep -q "^${name}h"; then fail "namespaces left behind"; fi
[[ "$(ls /dev/shm | sort)" == "$shm_before" ]] ||
  fail "/dev/shm changed: $(comm -13 <(echo "$shm_before") <(ls /dev/shm | sort) | tr '\n' ' ')"
echo "net check passed"
