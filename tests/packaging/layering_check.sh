#!/usr/bin/env bash
# Proves that the layering of src/ is enforced by the build: a wrong include
# fails to compile.
#
#   tests/packaging/layering_check.sh --binary-dir BUILD [--source-dir SRC]
#       [--cxx COMPILER] [--core-includes "DIR;DIR"] [--engine-includes "DIR;DIR"]
#       [--ops-includes "DIR;DIR"] [--models-includes "DIR;DIR"]
#       [--tools-includes "DIR;DIR"] [--trace-tools-includes "DIR;DIR"]
#       [--implicit-includes "DIR;DIR"]
#
# Each layer src/L is compiled with the public include/ and its own include
# root BUILD/layer_include/L, which holds symlinks to src/L and to the lower
# layers L may use, and nothing else (mc2_layer() in CMakeLists.txt). ctest
# passes the include directories of the real mc2_core, mc2_engine, mc2_ops,
# mc2_models, mc2_cli (tools/) and mc2_trace_tools (tools/lib) targets;
# without them the script assumes SRC/include plus that layer's root. Those
# lists may name the compiler's implicit directories (e.g. /usr/include, from
# fmt's target); like CMake, the script leaves out the ones given with
# --implicit-includes, since -I/usr/include breaks libstdc++'s #include_next.
#
# Checks, each on a probe file placed in a temporary directory as if it were
# a source file of the layer:
#   1. in src/core, #include "engine/group_impl.h" must FAIL to compile, and
#      fail because the header is not found (core may not see engine);
#   2. in src/engine, #include "core/env.h" must compile (engine may see core);
#   3. in src/engine, #include "engine/group_impl.h" must compile (the header
#      itself is fine: check 1 failed only because of the layer root);
#   4. src/ops talks to the engine, never to a transport: its root holds no
#      transport/, #include "transport/transport.h" must FAIL for want of the
#      header, and "engine/channel.h" (the engine's primitive for the fused
#      pipelines) must compile;
#   5. src/models (a library on the public API) sees no internal layer: its
#      root holds only models/, #include "ops/gemm.h" must FAIL for want of
#      the header, and "models/kernels.h" with <mc2/ops.h> must compile;
#   6. tools/ (the `mc2` command) sees only core/, transport/ and ops/ of
#      the internals: its root BUILD/layer_include/tools holds nothing else,
#      #include "trace/recorder.h" and "collectives/selector.h" must FAIL for
#      want of the header, and "trace_tools/analysis.h", <mc2/trace_file.h>
#      and <mc2/tuning.h> must compile;
#   7. the trace tools (tools/lib/trace_tools) see the public API only:
#      #include "core/env.h" must FAIL for want of the header, and
#      "trace_tools/timeline_svg.h" must compile.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
binary_dir=""
cxx="${CXX:-c++}"
core_includes=""
engine_includes=""
ops_includes=""
models_includes=""
tools_includes=""
trace_tools_includes=""
implicit_includes=""

while [ $# -gt 0 ]; do
  case "$1" in
    --binary-dir) binary_dir="$2"; shift 2 ;;
    --source-dir) source_dir="$2"; shift 2 ;;
    --cxx) cxx="$2"; shift 2 ;;
    --core-includes) core_includes="$2"; shift 2 ;;
    --engine-includes) engine_includes="$2"; shift 2 ;;
    --ops-includes) ops_includes="$2"; shift 2 ;;
    --models-includes) models_includes="$2"; shift 2 ;;
    --tools-includes) tools_includes="$2"; shift 2 ;;
    --trace-tools-includes) trace_tools_includes="$2"; shift 2 ;;
    --implicit-includes) implicit_includes="$2"; shift 2 ;;
    -h|--help) sed -n '2,41p' "$0"; exit 0 ;;
    *) echo "layering_check: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$binary_dir" ] || { echo "layering_check: --binary-dir is required" >&2; exit 2; }
binary_dir=$(cd "$binary_dir" && pwd)

fail() { echo "layering_check: FAILED: $*" >&2; exit 1; }

for layer in core engine ops models tools; do
  [ -d "$binary_dir/layer_include/$layer" ] ||
    fail "$binary_dir/layer_include/$layer does not exist (is $binary_dir configured?)"
done
[ -e "$binary_dir/layer_include/core/engine" ] &&
  fail "the core layer's include root contains engine/"
[ -e "$binary_dir/layer_include/ops/transport" ] &&
  fail "the ops layer's include root contains transport/"
[ -z "$core_includes" ] && core_includes="$source_dir/include;$binary_dir/layer_include/core"
[ -z "$engine_includes" ] && engine_includes="$source_dir/include;$binary_dir/layer_include/engine"
[ -z "$ops_includes" ] && ops_includes="$source_dir/include;$binary_dir/layer_include/ops"
[ -z "$models_includes" ] && models_includes="$source_dir/include;$binary_dir/layer_include/models"
[ -z "$tools_includes" ] &&
  tools_includes="$source_dir/include;$source_dir/tools/lib;$binary_dir/layer_include/tools"
[ -z "$trace_tools_includes" ] && trace_tools_includes="$source_dir/include;$source_dir/tools/lib"
extra=$(ls -A "$binary_dir/layer_include/tools" | grep -vxE 'core|transport|ops' || true)
[ -z "$extra" ] || fail "the tools' include root holds more than core/, transport/, ops/: $extra"
case ";$tools_includes;" in
  *";$binary_dir/layer_include/tools;"*) ;;
  *) fail "the mc2 command does not use its include root (includes: $tools_includes)" ;;
esac
case ";$tools_includes;" in
  *";$source_dir/src;"*) fail "the mc2 command sees all of src/ (includes: $tools_includes)" ;;
esac
extra=$(ls -A "$binary_dir/layer_include/models" | grep -vx models || true)
[ -z "$extra" ] || fail "the models layer's include root holds more than models/: $extra"
case ";$core_includes;" in
  *";$binary_dir/layer_include/core;"*) ;;
  *) fail "the core target does not use its layer root (includes: $core_includes)" ;;
esac
case ";$ops_includes;" in
  *";$binary_dir/layer_include/ops;"*) ;;
  *) fail "the ops target does not use its layer root (includes: $ops_includes)" ;;
esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mc2-layering.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# compile LAYER INCLUDES HEADER: compiles a probe in TMP/src/LAYER that
# includes HEADER, with -I for each of INCLUDES; the compiler's output goes
# to TMP/LAYER.log.
compile() {
  local layer="$1" includes="$2" header="$3" flags=() dir
  mkdir -p "$tmp/src/$layer"
  printf '#include "%s"\nint mc2_layering_probe() { return 0; }\n' "$header" \
    > "$tmp/src/$layer/layering_probe.cc"
  IFS=';' read -r -a dirs <<< "$includes"
  for dir in "${dirs[@]}"; do
    [ -n "$dir" ] || continue
    case ";$implicit_includes;" in *";$dir;"*) continue ;; esac
    case " ${flags[*]} " in *" -I$dir "*) continue ;; esac
    flags+=("-I$dir")
  done
  "$cxx" -std=c++20 -fsyntax-only "${flags[@]}" "$tmp/src/$layer/layering_probe.cc" \
    > "$tmp/$layer.log" 2>&1
}

# must_fail LAYER INCLUDES HEADER WHERE WHY: the probe of LAYER including
# HEADER fails to compile, and because HEADER is not found.
must_fail() {
  local layer=$1 includes=$2 header=$3 where=$4 why=$5
  if compile "$layer" "$includes" "$header"; then
    fail "a file of $where compiled with #include \"$header\": $why"
  fi
  if ! grep -q "$header" "$tmp/$layer.log" || ! grep -qiE 'no such file|file not found' "$tmp/$layer.log"; then
    cat "$tmp/$layer.log"
    fail "the probe failed, but not because $header was not found"
  fi
  head -3 "$tmp/$layer.log"
}

# must_compile LAYER INCLUDES HEADER WHERE: the probe of LAYER including
# HEADER compiles.
must_compile() {
  local layer=$1 includes=$2 header=$3 where=$4
  compile "$layer" "$includes" "$header" ||
    { cat "$tmp/$layer.log"; fail "a file of $where cannot include $header"; }
}

echo "== layering_check: core includes engine/group_impl.h (must fail)"
must_fail core "$core_includes" engine/group_impl.h "src/core" \
  "layering is not enforced"

echo "== layering_check: engine includes core/env.h (must compile)"
must_compile engine "$engine_includes" core/env.h "src/engine"

echo "== layering_check: engine includes engine/group_impl.h (must compile)"
must_compile engine "$engine_includes" engine/group_impl.h "src/engine"

echo "== layering_check: ops includes transport/transport.h (must fail)"
must_fail ops "$ops_includes" transport/transport.h "src/ops" \
  "the operators see a transport"

echo "== layering_check: ops includes engine/channel.h (must compile)"
must_compile ops "$ops_includes" engine/channel.h "src/ops"

echo "== layering_check: models includes ops/gemm.h (must fail)"
must_fail models "$models_includes" ops/gemm.h "src/models" \
  "the models see internals"

echo "== layering_check: models includes models/kernels.h and mc2/ops.h (must compile)"
must_compile models "$models_includes" models/kernels.h "src/models"
must_compile models "$models_includes" mc2/ops.h "src/models"

for header in trace/recorder.h collectives/selector.h; do
  echo "== layering_check: tools include $header (must fail)"
  must_fail tools "$tools_includes" "$header" "tools/" "the tools see that layer"
done

echo "== layering_check: tools include trace_tools/analysis.h, mc2/trace_file.h, mc2/tuning.h (must compile)"
for header in trace_tools/analysis.h mc2/trace_file.h mc2/tuning.h; do
  must_compile tools "$tools_includes" "$header" "tools/"
done

echo "== layering_check: trace tools include core/env.h (must fail)"
must_fail trace_tools "$trace_tools_includes" core/env.h "tools/lib/trace_tools" \
  "it sees internals"

echo "== layering_check: trace tools include trace_tools/timeline_svg.h (must compile)"
must_compile trace_tools "$trace_tools_includes" trace_tools/timeline_svg.h "tools/lib/trace_tools"

echo "layering_check: OK: a wrong include fails to build, allowed ones compile"
