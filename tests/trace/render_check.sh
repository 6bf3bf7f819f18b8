#!/usr/bin/env bash
# Checks that `mc2 trace plot` output renders in a browser: traces a real
# 2-rank run of tests/programs/trace_demo.cc, plots it, takes a headless
# Chromium screenshot of the SVG and checks the PNG (size, dimensions, not
# blank). ctest label "render" (`ctest -L render`).
#
# Chromium is installed by `make test` (scripts/install-deps.sh --test), not
# with the build's dependencies: when it is missing the check is skipped
# (exit 77) unless --install is given or RENDER_CHECK_INSTALL=1 is set, in
# which case Debian's `chromium` package is installed (as root or sudo).
#
# Usage: render_check.sh --build-dir BUILD [--source-dir SRC] [--install]
#                        [--keep DIR] [--update-docs]
#   --keep DIR      leave the trace, SVG and PNG in DIR
#   --update-docs   copy the SVG and PNG to SRC/docs/images/timeline-example.*
set -euo pipefail

build_dir=""
source_dir="$(cd "$(dirname "$0")/../.." && pwd)"
install="${RENDER_CHECK_INSTALL:-0}"
keep=""
update_docs=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --source-dir) source_dir="$2"; shift 2 ;;
    --install) install=1; shift ;;
    --keep) keep="$2"; shift 2 ;;
    --update-docs) update_docs=1; shift ;;
    *) echo "render_check: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$build_dir" ] || { echo "render_check: --build-dir is required" >&2; exit 2; }
mc2="$build_dir/tools/mc2"
demo="$build_dir/tests/test_prog_trace_demo"
for f in "$mc2" "$demo"; do
  [ -x "$f" ] || { echo "render_check: $f is not built" >&2; exit 1; }
done

find_chromium() {
  for c in chromium chromium-browser google-chrome; do
    if command -v "$c" >/dev/null 2>&1; then command -v "$c"; return 0; fi
  done
  return 1
}

if ! browser="$(find_chromium)"; then
  if [ "$install" != "1" ]; then
    echo "render_check: SKIP: chromium is not installed (rerun with --install or" \
         "RENDER_CHECK_INSTALL=1 to install Debian's chromium package)"
    exit 77
  fi
  if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo); fi
  echo "render_check: installing chromium"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core
  browser="$(find_chromium)"
fi

work="$(mktemp -d)"
cleanup() { [ -n "$keep" ] || rm -rf "$work"; }
trap cleanup EXIT
if [ -n "$keep" ]; then mkdir -p "$keep"; rm -rf "$work"; work="$keep"; fi

# A real traced run: 3 steps of 4 overlapped all_reduces, then a serial
# all_gather.
env -u MC2_TRACE MC2_TRACE="$work/trace" MC2_HEAP_BYTES=64M \
  "$mc2" run -n 2 "$demo" 3 4 96 262144
"$mc2" trace report "$work/trace"
"$mc2" trace merge "$work/trace" -o "$work/trace.json"
"$mc2" trace plot "$work/trace" -o "$work/timeline.svg" --width 1400 \
  --title "mc2 timeline: trace_demo, 2 ranks (all_reduce overlapped with matmul tiles)"

svg="$work/timeline.svg"
width="$(grep -o '<svg[^>]*' "$svg" | sed -n 's/.* width="\([0-9.]*\)".*/\1/p' | head -1)"
height="$(grep -o '<svg[^>]*' "$svg" | sed -n 's/.* height="\([0-9.]*\)".*/\1/p' | head -1)"
width="${width%.*}"; height="${height%.*}"
[ -n "$width" ] && [ -n "$height" ] || { echo "render_check: no size in $svg" >&2; exit 1; }

png="$work/timeline.png"
rm -f "$png"
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --mute-audio \
  --no-first-run --window-size="$width,$height" --screenshot="$png" "file://$svg" \
  >"$work/chromium.log" 2>&1 || true
if [ ! -s "$png" ]; then
  echo "render_check: FAIL: chromium wrote no screenshot; its log:" >&2
  cat "$work/chromium.log" >&2
  exit 1
fi

# PNG signature, IHDR dimensions, and enough content not to be blank (a
# blank page of this size compresses to a few KiB).
sig="$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')"
[ "$sig" = "89504e470d0a1a0a" ] || { echo "render_check: FAIL: not a PNG" >&2; exit 1; }
dims="$(od -An -tu1 -j16 -N8 "$png" | tr -s ' ' | sed 's/^ //')"
read -r w3 w2 w1 w0 h3 h2 h1 h0 <<<"$dims"
pw=$(( (w3 << 24) | (w2 << 16) | (w1 << 8) | w0 ))
ph=$(( (h3 << 24) | (h2 << 16) | (h1 << 8) | h0 ))
bytes="$(stat -c %s "$png")"
echo "render_check: screenshot ${pw}x${ph}, $bytes bytes"
[ "$pw" -ge "$width" ] && [ "$ph" -ge "$height" ] ||
  { echo "render_check: FAIL: screenshot smaller than the SVG (${width}x${height})" >&2; exit 1; }
[ "$bytes" -ge 15000 ] ||
  { echo "render_check: FAIL: the screenshot looks blank ($bytes bytes)" >&2; exit 1; }

if [ "$update_docs" = "1" ]; then
  mkdir -p "$source_dir/docs/images"
  cp "$svg" "$source_dir/docs/images/timeline-example.svg"
  cp "$png" "$source_dir/docs/images/timeline-example.png"
  echo "render_check: updated docs/images/timeline-example.{svg,png}"
fi
echo "render_check: PASS"
