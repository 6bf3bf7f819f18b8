#!/usr/bin/env bash
# Checks that an installed mc2 is usable from a project outside the tree.
#
#   tests/packaging/check_install.sh [--build-dir DIR] [--source-dir DIR]
#                                    [--cxx COMPILER] [--keep]
#
# Without --build-dir, configures and builds mc2 (Release, no tests or
# benchmarks) in a temporary directory first; with it, uses that build tree
# as it is (ctest passes the current one). Then:
#   1. cmake --install --prefix TMP/prefix, and checks the installed files
#      (headers, libmc2.so and libmc2_models.so with their SONAMEs, the
#      static libraries, bin/mc2, the CMake package, mc2.pc, mc2_models.pc)
#      and that nothing installed points into the build tree;
#   2. builds examples/hello_allreduce with find_package(mc2)
#      (CMAKE_PREFIX_PATH=TMP/prefix), against mc2::mc2 and mc2::mc2_static;
#   3. builds the same main.cc with pkg-config (PKG_CONFIG_PATH);
#   4. runs each binary under TMP/prefix/bin/mc2 run -n 2 and checks that
#      rank 0 printed the right sums;
#   5. the models are outside the library: libmc2.so defines no
#      mc2::models symbol, hello_allreduce needs no libmc2_models, and a
#      file that includes only <mc2/mc2.h> cannot name mc2::models;
#   6. builds examples/train_transformer with find_package(mc2) against
#      mc2::models, and with pkg-config's mc2_models, runs both on
#      2 ranks (tp 2 and tp 1) and checks that their losses agree.
# Exits 0 when everything passed; the first failure is printed and exits 1.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
build_dir=""
cxx="${CXX:-c++}"
keep=0
jobs="${JOBS:-2}"

while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --source-dir) source_dir="$2"; shift 2 ;;
    --cxx) cxx="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "check_install: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mc2-check-install.XXXXXX")
cleanup() { if [ "$keep" = 1 ]; then echo "check_install: kept $tmp"; else rm -rf "$tmp"; fi; }
trap cleanup EXIT

step() { echo "== check_install: $*"; }
fail() { echo "check_install: FAILED: $*" >&2; exit 1; }

example="$source_dir/examples/hello_allreduce"
[ -f "$example/CMakeLists.txt" ] || fail "no example project at $example"

# Keep the check hermetic: only TMP/prefix may provide mc2.
unset MC2_RANK MC2_WORLD_SIZE MC2_SHM_FDS CMAKE_PREFIX_PATH PKG_CONFIG_PATH || true
export CMAKE_FIND_USE_PACKAGE_REGISTRY=OFF

if [ -z "$build_dir" ]; then
  build_dir="$tmp/build"
  step "configuring and building mc2 in $build_dir"
  cmake -S "$source_dir" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release \
    -DMC2_BUILD_TESTS=OFF -DMC2_BUILD_BENCH=OFF > "$tmp/configure.log" 2>&1 ||
    { cat "$tmp/configure.log"; fail "configuring mc2"; }
  cmake --build "$build_dir" -j "$jobs" > "$tmp/build.log" 2>&1 ||
    { tail -50 "$tmp/build.log"; fail "building mc2"; }
fi
[ -f "$build_dir/CMakeCache.txt" ] || fail "$build_dir is not a configured build tree"
build_dir=$(cd "$build_dir" && pwd)

prefix="$tmp/prefix"
step "cmake --install $build_dir --prefix $prefix"
cmake --install "$build_dir" --prefix "$prefix" > "$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "cmake --install"; }

# --- 1. What was installed ---------------------------------------------------
step "checking the installed files"
pc=$(find "$prefix" -name mc2.pc -path '*/pkgconfig/*' | head -1)
[ -n "$pc" ] || fail "no lib*/pkgconfig/mc2.pc installed"
libdir=$(dirname "$(dirname "$pc")")
for f in include/mc2/mc2.h include/mc2/collectives.h include/mc2/error.h \
         include/mc2/group.h include/mc2/tensor.h include/mc2/work.h include/mc2/models.h \
         include/mc2/ops.h include/mc2/gemm.h include/mc2/fused_ops.h include/mc2/batch_matmul.h \
         include/mc2/moe.h include/mc2/mpi.h include/mc2/models/transformer.h \
         include/mc2/trace_file.h include/mc2/tuning.h \
         bin/mc2; do
  [ -e "$prefix/$f" ] || fail "$f is not installed"
done
for f in libmc2.a libmc2.so libmc2_models.a libmc2_models.so cmake/mc2/mc2Config.cmake \
         cmake/mc2/mc2ConfigVersion.cmake cmake/mc2/mc2Targets.cmake pkgconfig/mc2_models.pc; do
  [ -e "$libdir/$f" ] || fail "${libdir#"$prefix"/}/$f is not installed"
done
[ -x "$prefix/bin/mc2" ] || fail "bin/mc2 is not executable"
if command -v readelf > /dev/null; then
  for lib in libmc2 libmc2_models; do
    soname=$(readelf -d "$libdir/$lib.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    [ "$soname" = $lib.so.0 ] || fail "$lib.so has SONAME '$soname', expected $lib.so.0"
    [ -e "$libdir/$soname" ] || fail "$soname is not installed"
  done
  readelf -d "$libdir/libmc2_models.so" | grep 'NEEDED.*\[libmc2\.so\.0\]' > /dev/null ||
    fail "libmc2_models.so does not link libmc2.so.0"
fi
# Public headers (include/mc2/ and include/mc2/models/) include only
# <mc2/...> (or "mc2/...") and std headers;
# <mc2/mpi.h>, outside the umbrella, is the one that includes <mpi.h>.
bad=$(grep -hE '^\s*#\s*include' "$prefix"/include/mc2/*.h "$prefix"/include/mc2/models/*.h |
      grep -vE '#\s*include\s*[<"]mc2/' | grep -vE '#\s*include\s*<mpi\.h>' |
      grep -E '[/.]' || true)
[ -z "$bad" ] || fail "installed headers include non-public headers: $bad"
if grep -rlF "$build_dir" "$libdir/cmake/mc2" "$pc" "$libdir/pkgconfig/mc2_models.pc" \
  > /dev/null 2>&1; then
  fail "installed package files refer to the build tree $build_dir"
fi

# Runs PROGRAM on 2 ranks under the installed launcher and checks rank 0's line.
run_check() {
  local what="$1" program="$2" out
  step "running $what: mc2 run -n 2 $program"
  if ! out=$("$prefix/bin/mc2" run -n 2 "$program" 2>&1); then
    echo "$out"; fail "$what: mc2 run exited non-zero"
  fi
  echo "$out"
  # Rank r contributes r + i: with 2 ranks sum[i] = 2i + 1.
  echo "$out" | grep -qE '^\[0\] hello_allreduce: 2 ranks, .*sum\[0\]=1 sum\[1\]=3 sum\[999\]=1999: OK$' ||
    fail "$what: rank 0 did not print the expected sums"
}

# --- 2. find_package(mc2) ----------------------------------------------------
for variant in shared static; do
  b="$tmp/example-cmake-$variant"
  static=OFF; [ $variant = static ] && static=ON
  step "building the example with find_package(mc2) ($variant)"
  cmake -S "$example" -B "$b" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER="$cxx" -DHELLO_STATIC=$static > "$b.log" 2>&1 ||
    { cat "$b.log"; fail "configuring the example ($variant)"; }
  found=$(sed -n 's/^mc2_DIR:PATH=//p' "$b/CMakeCache.txt")
  [ "$found" = "$libdir/cmake/mc2" ] || fail "find_package found mc2 in '$found', not in $prefix"
  cmake --build "$b" -j "$jobs" >> "$b.log" 2>&1 ||
    { cat "$b.log"; fail "building the example ($variant)"; }
  if command -v readelf > /dev/null; then
    needs_so=0
    readelf -d "$b/hello_allreduce" | grep -q 'NEEDED.*libmc2\.so' && needs_so=1
    [ $variant = shared ] && [ $needs_so = 0 ] && fail "shared example does not link libmc2.so"
    [ $variant = static ] && [ $needs_so = 1 ] && fail "static example links libmc2.so"
  fi
  run_check "find_package ($variant)" "$b/hello_allreduce"
done

# --- 3. pkg-config -----------------------------------------------------------
step "building the example with pkg-config"
command -v pkg-config > /dev/null || fail "pkg-config is not installed"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
version=$(pkg-config --modversion mc2) || fail "pkg-config cannot find mc2 in $PKG_CONFIG_PATH"
want_version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build_dir/CMakeCache.txt")
[ -z "$want_version" ] || [ "$version" = "$want_version" ] ||
  fail "mc2.pc says version $version, the build is $want_version"
cflags=$(pkg-config --cflags mc2)
libs=$(pkg-config --libs mc2)
static_libs=$(pkg-config --static --libs mc2)
echo "pkg-config mc2 $version: cflags '$cflags' libs '$libs' static '$static_libs'"
# mc2.pc is relocatable (prefix=${pcfiledir}/../..): compare resolved paths.
incdir=$(pkg-config --variable=includedir mc2)
[ "$(cd "$incdir" 2> /dev/null && pwd -P)" = "$(cd "$prefix/include" && pwd -P)" ] ||
  fail "mc2.pc's includedir '$incdir' is not $prefix/include"
case " $cflags " in *" -I$incdir "*) ;; *) fail "Cflags lack -I$incdir" ;; esac
for f in -lmc2 -lfmt -lrt; do
  case " $static_libs " in *" $f "*) ;; *) fail "pkg-config --static --libs lacks $f" ;; esac
done
# shellcheck disable=SC2086  # the flags are meant to split
"$cxx" -std=c++20 -O2 "$example/main.cc" -o "$tmp/hello_pkgconfig" $cflags $libs \
  -Wl,-rpath,"$libdir" || fail "compiling the example with pkg-config's flags"
run_check "pkg-config (shared)" "$tmp/hello_pkgconfig"

# --- 5. The models are not part of the library -----------------------------
step "checking that <mc2/mc2.h> and libmc2 do not contain the models"
if command -v nm > /dev/null; then
  leaked=$(nm -DC --defined-only "$libdir/libmc2.so" | grep -c 'mc2::models::' || true)
  [ "$leaked" = 0 ] || fail "libmc2.so defines $leaked mc2::models symbols"
  nm -DC --defined-only "$libdir/libmc2_models.so" | grep 'mc2::models::TrainSteps' > /dev/null ||
    fail "libmc2_models.so does not define mc2::models::TrainSteps"
fi
if command -v readelf > /dev/null; then
  readelf -d "$tmp/example-cmake-shared/hello_allreduce" | grep 'NEEDED.*libmc2_models' > /dev/null &&
    fail "hello_allreduce (mc2::mc2 only) links libmc2_models"
fi
# A probe that includes only the umbrella header must not see the models;
# the same probe with <mc2/models.h> added must compile (so the first one
# failed for the right reason).
probe() {  # probe EXTRA_INCLUDE: compiles a file that names mc2::models
  printf '#include <mc2/mc2.h>\n%s\nmc2::models::TransformerConfig probe_config;\n' "$1" \
    > "$tmp/umbrella_probe.cc"
  "$cxx" -std=c++20 -fsyntax-only -I"$prefix/include" "$tmp/umbrella_probe.cc" \
    > "$tmp/umbrella_probe.log" 2>&1
}
if probe ""; then
  fail "a file including only <mc2/mc2.h> can name mc2::models (the umbrella includes the models)"
fi
grep -q 'models' "$tmp/umbrella_probe.log" ||
  { cat "$tmp/umbrella_probe.log"; fail "the umbrella probe failed for another reason"; }
probe '#include <mc2/models.h>' ||
  { cat "$tmp/umbrella_probe.log"; fail "<mc2/mc2.h> with <mc2/models.h> does not compile"; }

# --- 6. mc2::models and mc2_models.pc -----------------------------------------
models_example="$source_dir/examples/train_transformer"
[ -f "$models_example/CMakeLists.txt" ] || fail "no example project at $models_example"
model_args=(--steps 3 --layers 1 --hidden 32 --heads 4 --ffn 64 --vocab 16 --seq 8 --batch 4)
# Runs the model example on 2 ranks; prints rank 0's loss per step.
run_model() {
  local what="$1" program="$2" tp="$3" out
  step "running $what: mc2 run -n 2 $program --tp $tp ${model_args[*]}" >&2
  if ! out=$("$prefix/bin/mc2" run -n 2 "$program" --tp "$tp" "${model_args[@]}" 2>&1); then
    echo "$out" >&2; fail "$what: mc2 run exited non-zero"
  fi
  echo "$out" >&2
  # Rows "[0]  step  loss  ...": the step and its loss.
  echo "$out" | sed -nE 's/^\[0\] +([0-9]+) +([0-9.]+) .*/\1 \2/p'
}
b="$tmp/models-cmake"
step "building examples/train_transformer with find_package(mc2) (mc2::models)"
cmake -S "$models_example" -B "$b" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" > "$b.log" 2>&1 ||
  { cat "$b.log"; fail "configuring the models example"; }
cmake --build "$b" -j "$jobs" >> "$b.log" 2>&1 || { cat "$b.log"; fail "building the models example"; }
if command -v readelf > /dev/null; then
  readelf -d "$b/train_transformer" | grep 'NEEDED.*libmc2_models\.so' > /dev/null ||
    fail "the models example does not link libmc2_models.so"
fi
step "building examples/train_transformer with pkg-config (mc2_models)"
models_cflags=$(pkg-config --cflags mc2_models) || fail "pkg-config cannot find mc2_models"
models_libs=$(pkg-config --static --libs mc2_models)
case " $models_libs " in *" -lmc2_models "*"-lmc2 "*) ;;
  *) fail "pkg-config --static --libs mc2_models lacks -lmc2_models before -lmc2: $models_libs" ;;
esac
# shellcheck disable=SC2086  # the flags are meant to split
"$cxx" -std=c++20 -O2 "$models_example/main.cc" -o "$tmp/train_pkgconfig" $models_cflags \
  $(pkg-config --libs mc2_models) -Wl,-rpath,"$libdir" 2> "$tmp/train_pkgconfig.log" ||
  { cat "$tmp/train_pkgconfig.log"; fail "compiling the models example with pkg-config's flags"; }
tp2=$(run_model "find_package (mc2::models, tp 2)" "$b/train_transformer" 2)
tp1=$(run_model "pkg-config (tp 1)" "$tmp/train_pkgconfig" 1)
[ "$(echo "$tp2" | wc -l)" = 3 ] || fail "the models example did not print 3 steps: '$tp2'"
# The loss is a mean over the global batch: any grid computes it, up to
# float rounding in a different order of sums.
paste <(echo "$tp2") <(echo "$tp1") | awk '
  { d = $2 - $4; if (d < 0) d = -d;
    if ($1 != $3 || !($2 > 0) || d > 1e-4 * $2) { print "step " $1 ": " $2 " vs " $4; bad = 1 } }
  END { exit bad }' || fail "the models example's losses differ between tp 2 and tp 1"
echo "losses (tp 2 | tp 1):"; paste <(echo "$tp2") <(echo "$tp1")

step "all checks passed"
