#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time (ctest, `make test-fuzz`):
#   run_fuzz.sh TARGET SEED_CORPUS_DIR ARTIFACT_DIR SECONDS
# The committed seed corpus is only read; new inputs go to a scratch corpus
# that is thrown away. Exits non-zero on any crash, sanitizer report, leak,
# timeout (10 s per input) or out-of-memory, printing the input that caused
# it (kept in ARTIFACT_DIR) so that it can become a regression test.
set -euo pipefail
target=$1 seeds=$2 artifacts=$3 seconds=$4
name=$(basename "$target")
mkdir -p "$artifacts"
work=$(mktemp -d "/tmp/mc2-fuzz-$name-XXXXXX")
trap 'rm -rf "$work"' EXIT
log="$work/log"
status=0
# -max_len: our parsers read short strings and small files; 64 KiB leaves
# room for multi-event traces without slowing every run down.
"$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
  -print_final_stats=1 -artifact_prefix="$artifacts/$name-" "$work" "$seeds" \
  >"$log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  cat "$log"
  echo "fuzz: $name FAILED (status $status); the inputs that failed:"
  for f in "$artifacts/$name-"*; do
    [ -e "$f" ] || continue
    echo "  $f ($(stat -c %s "$f") bytes): $(head -c 300 "$f" | od -An -c | tr -s ' ' | head -c 600)"
  done
  exit 1
fi
grep -E "stat::number_of_executed_units|stat::new_units_added|Done [0-9]+ runs" "$log" || true
echo "fuzz: $name OK for $seconds s"
