#!/usr/bin/env bash
# cluster.sh: a cluster in a box. N network namespaces act as N hosts, each
# with its own hostname (a UTS namespace per command), its own loopback and
# one shaped link to a bridge, so that Open MPI sees N nodes that talk over
# TCP and mc2's multi-host code can be tested and measured on one machine.
#
# Usage (as root):
#   scripts/cluster.sh up N [--rate RATE] [--burst BYTES] [--delay TIME] [--mtu BYTES]
#   scripts/cluster.sh down
#   scripts/cluster.sh status              hosts, addresses, shaping
#   scripts/cluster.sh hosts SLOTS         the mpirun -H list: h0:SLOTS,h1:SLOTS,...
#   scripts/cluster.sh mpirun-args         the mpirun options that launch into the box
#   scripts/cluster.sh exec I CMD [ARG...] CMD inside host I, with its hostname
#   scripts/cluster.sh counters            bytes each host sent/received on its link
# Options valid with every command:
#   --name NAME      names of everything made: NAMEh0.. (namespaces and hosts),
#                    NAMEbr (bridge); default mc2. Tests use their own name.
#   --subnet A.B.C   the hosts' /24: host I is A.B.C.(I+1), the bridge A.B.C.254;
#                    default 10.213.0 (only the box's own namespaces use it)
#
# How it works. `up` makes a bridge NAMEbr in the root namespace holding
# A.B.C.254 (mpirun's out-of-band channel reaches the hosts through it), and
# per host a namespace NAMEhI with a veth pair: NAMEhIv on the bridge, eth0
# inside with A.B.C.(I+1). RATE shapes both directions of every host link
# with tc tbf (egress of eth0: what the host sends; egress of NAMEhIv: what
# it receives). Segmentation offloads are turned off where ethtool exists,
# and the tbf burst is at least 64 KiB, because a burst smaller than one
# offloaded segment makes tbf drop everything larger than it. --delay adds
# netem latency, when the kernel has sch_netem (else it is refused). --mtu
# sets the links' MTU (default 9000, the jumbo frames of cluster networks):
# with the offloads off every packet costs the shared cores a softirq on
# both hosts, and at 1500 bytes that cost takes a visible share of the
# cores the ranks compute on, which a real host's NIC would carry.
# Everything `up` makes is recorded in /run/mc2-cluster/NAME; `down` removes
# only what is recorded there, and both commands can be repeated.
#
# mpirun (Open MPI 4.1) starts its daemons through scripts/cluster_rsh.sh,
# which runs them in the host's namespace with the host's hostname, so
# ranks in different namespaces are different nodes to it and talk over TCP
# (its shared memory is used only between ranks of one host).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
name=mc2 subnet=10.213.0 rate="" burst="" delay="" mtu=9000
args=()
die() { echo "cluster.sh: $*" >&2; exit 2; }
usage() { sed -n '2,40p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) name=${2:?--name needs a value}; shift 2 ;;
    --subnet) subnet=${2:?--subnet needs a value}; shift 2 ;;
    --rate) rate=${2:?--rate needs a value}; shift 2 ;;
    --burst) burst=${2:?--burst needs a value}; shift 2 ;;
    --delay) delay=${2:?--delay needs a value}; shift 2 ;;
    --mtu) mtu=${2:?--mtu needs a value}; shift 2 ;;
    -h|--help) usage ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ ${#args[@]} -gt 0 ]] || usage
cmd=${args[0]}
[[ $name =~ ^[a-z][a-z0-9]{0,5}$ ]] || die "--name $name: expected 1-6 lowercase letters or digits, starting with a letter"
[[ $subnet =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] || die "--subnet $subnet: expected A.B.C"
[[ $mtu =~ ^[0-9]{1,5}$ ]] && ((mtu >= 1280 && mtu <= 65535)) ||
  die "--mtu $mtu: expected a byte count from 1280 to 65535"
state_dir=/run/mc2-cluster
state=$state_dir/$name
bridge=${name}br

need_root() {
  [[ $(id -u) -eq 0 ]] || die "$cmd needs root (network namespaces, veth pairs and tc)"
  command -v ip >/dev/null || die "the ip command is missing (Debian package iproute2)"
}

# Reads the recorded state: hosts= subnet= rate= delay=
load_state() {
  [[ -f $state ]] || die "no cluster named $name is up (run: cluster.sh up N)"
  # shellcheck disable=SC1090
  . "$state"
}

host_ns() { echo "${name}h$1"; }

cmd_up() {
  need_root
  local n=${args[1]:-}
  [[ $n =~ ^[1-9][0-9]?$ ]] || die "up N: expected a host count 1-99, not '${n}'"
  if [[ -f $state ]]; then
    local want_rate=$rate want_delay=$delay want_subnet=$subnet want_mtu=$mtu
    mtu=1500  # a state recorded without an MTU
    load_state
    if [[ $hosts == "$n" && $rate == "$want_rate" && $delay == "$want_delay" && $subnet == "$want_subnet" &&
          $mtu == "$want_mtu" ]]; then
      echo "cluster.sh: $name is already up with $n hosts"
      return 0
    fi
    die "$name is up with $hosts hosts (rate '${rate:-none}', delay '${delay:-none}', mtu $mtu): run cluster.sh --name $name down first"
  fi
  if [[ -n $delay ]] && ! netem_available; then
    die "--delay needs the kernel's netem qdisc (sch_netem), which this kernel lacks"
  fi
  local b=$burst
  if [[ -n $rate && -z $b ]]; then b=64kb; fi
  mkdir -p "$state_dir"
  # Record first, so that a failure half-way can still be undone by down.
  printf 'hosts=%s\nsubnet=%s\nrate=%s\ndelay=%s\nburst=%s\nmtu=%s\n' "$n" "$subnet" "$rate" "$delay" "$b" "$mtu" >"$state"
  trap 'echo "cluster.sh: up failed; undoing" >&2; cmd_down >/dev/null 2>&1 || true' ERR
  ip link add "$bridge" type bridge
  ip link set "$bridge" mtu "$mtu"
  ip addr add "$subnet.254/24" dev "$bridge"
  ip link set "$bridge" up
  for ((i = 0; i < n; i++)); do
    local ns veth
    ns=$(host_ns "$i")
    veth=${ns}v
    ip netns add "$ns"
    ip link add "$veth" type veth peer name "${ns}i"
    ip link set "${ns}i" netns "$ns"
    ip link set "$veth" mtu "$mtu"
    ip netns exec "$ns" ip link set "${ns}i" mtu "$mtu"
    ip link set "$veth" master "$bridge"
    ip link set "$veth" up
    ip netns exec "$ns" ip link set "${ns}i" name eth0
    ip netns exec "$ns" ip addr add "$subnet.$((i + 1))/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
    if command -v ethtool >/dev/null; then
      ethtool -K "$veth" tso off gso off gro off >/dev/null 2>&1 || true
      ip netns exec "$ns" ethtool -K eth0 tso off gso off gro off >/dev/null 2>&1 || true
    fi
    if [[ -n $rate || -n $delay ]]; then
      shape "$veth" "$rate" "$b" "$delay"
      ip netns exec "$ns" bash -c "$(declare -f shape); shape eth0 '$rate' '$b' '$delay'"
    fi
  done
  trap - ERR
  echo "cluster.sh: $name up: $n hosts on $subnet.0/24 (rate ${rate:-unshaped}${delay:+, delay $delay})"
}

# shape DEV RATE BURST DELAY: tbf at RATE (and netem DELAY before it).
shape() {
  local dev=$1 r=$2 b=$3 d=$4
  if [[ -n $d ]]; then
    tc qdisc add dev "$dev" root handle 1: netem delay "$d"
    [[ -z $r ]] || tc qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$r" burst "$b" latency 100ms
  else
    tc qdisc add dev "$dev" root tbf rate "$r" burst "$b" latency 100ms
  fi
}

netem_available() {
  local probe=mc2netemprobe$$
  ip netns add "$probe" || return 1
  local ok=1
  ip netns exec "$probe" tc qdisc add dev lo root netem delay 1us >/dev/null 2>&1 || ok=0
  ip netns del "$probe"
  [[ $ok -eq 1 ]]
}

cmd_down() {
  need_root
  if [[ ! -f $state ]]; then
    echo "cluster.sh: $name is not up"
    return 0
  fi
  load_state
  for ((i = 0; i < hosts; i++)); do
    local ns
    ns=$(host_ns "$i")
    # Processes still inside a host would keep its namespace alive.
    if ip netns pids "$ns" >/dev/null 2>&1; then
      local pids
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      [[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
      ip netns del "$ns" 2>/dev/null || true
    fi
    ip link del "${ns}v" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  rm -f "$state"
  rmdir "$state_dir" 2>/dev/null || true
  echo "cluster.sh: $name down"
}

cmd_status() {
  load_state
  echo "cluster $name: $hosts hosts, subnet $subnet.0/24, rate ${rate:-unshaped}, delay ${delay:-none}, mtu $mtu"
  for ((i = 0; i < hosts; i++)); do
    echo "  $(host_ns "$i")  $subnet.$((i + 1))"
  done
}

cmd_hosts() {
  load_state
  local slots=${args[1]:-1} list=""
  [[ $slots =~ ^[1-9][0-9]*$ ]] || die "hosts SLOTS: expected a positive count, not '$slots'"
  for ((i = 0; i < hosts; i++)); do list+="${list:+,}$(host_ns "$i"):$slots"; done
  echo "$list"
}

cmd_mpirun_args() {
  load_state
  # plm_rsh_no_tree_spawn: mpirun starts every daemon itself (a daemon in one
  # namespace could not start one in another). routed direct: daemons talk
  # to mpirun, not to each other. --bind-to none: every host shares the
  # machine's cores, so Open MPI must yield while it waits
  # (mpi_yield_when_idle; it cannot tell that its "hosts" share cores).
  # btl_tcp_links 2: two TCP connections per pair of processes; with one,
  # Open MPI's own traffic in both directions at once between two hosts
  # runs far below the links' full-duplex rate (docs/cluster.md).
  # MC2_BIND=none: for the same reason mc2 must not pin its ranks either;
  # each rank would take its "host's" first core, the same on every host.
  echo "--allow-run-as-root --mca plm_rsh_agent $here/cluster_rsh.sh --mca plm_rsh_no_tree_spawn 1" \
       "--mca routed direct --bind-to none --mca mpi_yield_when_idle 1 -x MC2_BIND=none" \
       "--mca oob_tcp_if_include $subnet.0/24" \
       "--mca btl tcp,self,vader --mca btl_tcp_if_include $subnet.0/24 --mca btl_tcp_links 2"
}

cmd_exec() {
  need_root
  load_state
  local i=${args[1]:-}
  [[ $i =~ ^[0-9]+$ && $i -lt $hosts ]] || die "exec I: expected a host index below $hosts, not '$i'"
  [[ ${#args[@]} -gt 2 ]] || die "exec I CMD: no command given"
  local ns
  ns=$(host_ns "$i")
  exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$ns" "${args[@]:2}"
}

cmd_counters() {
  load_state
  for ((i = 0; i < hosts; i++)); do
    local v
    v=/sys/class/net/$(host_ns "$i")v/statistics
    # The bridge side's rx is what the host sent, its tx what it received.
    echo "$(host_ns "$i") sent $(cat "$v/rx_bytes") received $(cat "$v/tx_bytes")"
  done
}

case "$cmd" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  hosts) cmd_hosts ;;
  mpirun-args) cmd_mpirun_args ;;
  exec) cmd_exec ;;
  counters) cmd_counters ;;
  *) die "unknown command '$cmd' (up, down, status, hosts, mpirun-args, exec, counters)" ;;
esac
