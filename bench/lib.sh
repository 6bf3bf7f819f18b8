# lib.sh: set-up shared by the bench/*.sh scripts (sourced, not run). Each
# script defines die() (its own name in the message) before calling these.

# require_mc2 BUILD: sets mc2 to BUILD/tools/mc2 and checks that it and
# python3 (which joins the JSON outputs) are there.
require_mc2() {
  mc2=$1/tools/mc2
  [[ -x $mc2 ]] || die "$mc2 not found: build mc2_cli, or pass --build DIR"
  command -v python3 >/dev/null || die "python3 not found (used to join the JSON outputs)"
}

# make_output_dir KEEP NAME: sets out to KEEP (created if need be), or to a
# new /tmp/mc2-NAME.XXXXXX removed when the script exits.
make_output_dir() {
  if [[ -n $1 ]]; then
    out=$1
    mkdir -p "$out"
  else
    out=$(mktemp -d "/tmp/mc2-$2.XXXXXX")
    trap 'rm -rf "$out"' EXIT
  fi
}
