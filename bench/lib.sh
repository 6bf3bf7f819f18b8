# lib.sh: set-up shared by the bench/*.sh scripts (sourced, not run). Each
# script defines die() (its own name in the message) before calling these.

# require_mc2 BUILD: sets mc2 to BUILD/tools/mc2 and checks that it and
# python3 (which joins the JSON outputs) are there.
require_mc2() {
  mc2=$1/tools/mc2
  [[ -x $mc2 ]] || die "$mc2 not found: build mc2_cli, or pass --build DIR"
  command -v python3 >/dev/null || die "python3 not found (used to join the JSON outputs)"
}

# at_exit CMD: runs CMD (a shell command) when the script exits, also on an
# error or an interrupt (INT, TERM, HUP end the script, which runs them);
# the commands run in the reverse order of registration.
_lib_exit_cmds=()
_lib_run_exit() {
  local i
  for i in $(printf '%s\n' "${!_lib_exit_cmds[@]}" | sort -rn); do
    eval "${_lib_exit_cmds[i]}" || true
  done
  _lib_exit_cmds=()
}
at_exit() {
  if [[ ${#_lib_exit_cmds[@]} -eq 0 ]]; then
    trap _lib_run_exit EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    trap 'exit 129' HUP
  fi
  _lib_exit_cmds+=("$1")
}

# make_output_dir KEEP NAME: sets out to KEEP (created if need be), or to a
# new /tmp/mc2-NAME.XXXXXX removed when the script exits.
make_output_dir() {
  if [[ -n $1 ]]; then
    out=$1
    mkdir -p "$out"
  else
    out=$(mktemp -d "/tmp/mc2-$2.XXXXXX")
    at_exit 'rm -rf "$out"'
  fi
}

# to_bytes SIZE: SIZE with an optional K, M or G suffix (powers of 1024) in
# bytes; dies on anything else.
to_bytes() {
  [[ $1 =~ ^([0-9]+)([KMG]?)$ ]] || die "size '$1': expected a count with an optional K, M or G"
  local n=${BASH_REMATCH[1]}
  case ${BASH_REMATCH[2]} in
    K) n=$((n << 10)) ;; M) n=$((n << 20)) ;; G) n=$((n << 30)) ;;
  esac
  echo "$n"
}

# The cluster in a box (scripts/cluster.sh) for the box benchmarks.
# parse_box HOSTSxRANKS: sets box_hosts and box_ranks (ranks per host).
parse_box() {
  [[ $1 =~ ^([1-9][0-9]?)x([1-9][0-9]?)$ ]] ||
    die "--box $1: expected HOSTSxRANKS, e.g. 2x2 (2 hosts of 2 ranks)"
  box_hosts=${BASH_REMATCH[1]} box_ranks=${BASH_REMATCH[2]}
  (( box_hosts >= 2 )) || die "--box $1: a box needs at least 2 hosts"
}

# box_option ARG...: takes one of the options the box scripts share (--box,
# --rate, --delay, --box-name, --box-subnet, --json) off the front of the
# arguments: sets its variable and box_shift, the words it took (0 for any
# other argument).
box_option() {
  box_shift=2
  case "$1" in
    --box) box=${2:?--box needs a value} ;;
    --rate) rate=${2:?--rate needs a value} ;;
    --delay) delay=${2:?--delay needs a value} ;;
    --box-name) box_name=${2:?--box-name needs a value} ;;
    --box-subnet) box_subnet=${2:?--box-subnet needs a value} ;;
    --json) json=${2:?--json needs a value} ;;
    *) box_shift=0 ;;
  esac
}

# check_json_dest: dies unless $json is empty or a file this script can
# write (it is created empty if missing, never truncated here).
check_json_dest() {
  [[ -n $json ]] || return 0
  [[ $json != - ]] || die "--json -: give a file"
  : >>"$json" 2>/dev/null || die "--json $json: cannot write there"
}

# box_up NAME SUBNET HOSTS RATE DELAY: brings up the box NAME (HOSTS hosts,
# links shaped to RATE if not empty, else unshaped, DELAY of latency if not
# empty) and takes it down when
# the script exits, whatever the way. Refuses a box of that name that is up
# already (it is not this script's to reuse or remove). Sets box_cluster
# (the cluster.sh command line for it), box_margs (its mpirun options) and
# box_mtu (its links' MTU, exported as BOX_MTU for the scripts' reports).
box_up() {
  local name=$1 subnet=$2 hosts=$3 rate=$4 delay=$5
  [[ $(id -u) -eq 0 ]] || die "--box needs root (network namespaces and tc; see docs/cluster.md)"
  command -v mpirun >/dev/null || die "mpirun not found (Debian package openmpi-bin)"
  box_cluster=(bash "$(dirname "${BASH_SOURCE[0]}")/../scripts/cluster.sh" --name "$name" --subnet "$subnet")
  [[ ! -e /run/mc2-cluster/$name ]] ||
    die "a box named $name is up already (not started by this script): take it down with" \
        "scripts/cluster.sh --name $name down, or pick another with --box-name/--box-subnet"
  local up=(up "$hosts")
  [[ -z $rate ]] || up+=(--rate "$rate")
  [[ -z $delay ]] || up+=(--delay "$delay")
  # Registered first: a failure half-way through up is undone too.
  at_exit "${box_cluster[*]@Q} down >/dev/null"
  _box_exit_index=$((${#_lib_exit_cmds[@]} - 1))
  "${box_cluster[@]}" "${up[@]}" >&2 || die "cannot bring up the box $name"
  read -r -a box_margs <<<"$("${box_cluster[@]}" mpirun-args)"
  box_mtu=$("${box_cluster[@]}" status | sed -n 's/.*, mtu \([0-9]*\)$/\1/p')
  export BOX_MTU=$box_mtu
}

# box_down: takes down the box box_up brought up (before the script's exit).
box_down() {
  "${box_cluster[@]}" down >/dev/null
  unset '_lib_exit_cmds[_box_exit_index]'
  unset box_cluster
}

# box_hostlist RANKS: the mpirun -H list with RANKS slots per host.
box_hostlist() { "${box_cluster[@]}" hosts "$1"; }
