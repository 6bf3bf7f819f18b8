#!/usr/bin/env bash
# cluster_rsh.sh: Open MPI's launch agent (plm_rsh_agent) for the cluster in
# a box (scripts/cluster.sh). Called as `cluster_rsh.sh HOST COMMAND...`,
# like ssh: runs COMMAND (joined into one shell command, as ssh does) in the
# network namespace of HOST (NAMEhI) with its own UTS namespace whose
# hostname is HOST, so that the daemon and its ranks see the host they were
# started on.
set -euo pipefail
die() { echo "cluster_rsh.sh: $*" >&2; exit 255; }
# Open MPI may pass ssh options before the host; none is needed here.
while [[ $# -gt 0 && $1 == -* ]]; do shift; done
host=${1:?usage: cluster_rsh.sh HOST COMMAND...}
shift
[[ $# -gt 0 ]] || die "no command for $host"
[[ $host =~ ^([a-z][a-z0-9]{0,5})h([0-9]+)$ ]] || die "$host is not a host of a cluster.sh cluster (NAMEhI)"
[[ -f /run/mc2-cluster/${BASH_REMATCH[1]} ]] || die "no cluster named ${BASH_REMATCH[1]} is up (scripts/cluster.sh up N)"
ip netns list | grep -qw "^$host" || die "host $host does not exist in cluster ${BASH_REMATCH[1]}"
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
