#!/usr/bin/env bash
# The instrumented stages of `make test` (see the Makefile):
#
#   scripts/check_suite.sh asan    the suite under AddressSanitizer + UBSan
#   scripts/check_suite.sh tsan    the suite under ThreadSanitizer (a subset)
#   scripts/check_suite.sh fuzz    every libFuzzer target for MC2_FUZZ_SECONDS
#
# Each configures and builds its own tree (build-asan, build-tsan,
# build-fuzz; BUILD_ROOT prefixes them), runs ctest there and prints how
# long the build and the run took. Environment: JOBS (2), MC2_FUZZ_SECONDS
# (30).
#
# Every sanitizer report fails the stage, whichever process it comes from.
# The runtimes write reports to files (log_path) instead of stderr, so that
# a report from a process nobody checks the exit status of -- a rank the
# launcher ended, a survivor of a fault test exiting non-zero on purpose --
# is still seen: after ctest, any file in the report directory fails the
# stage and is printed. Processes killed on purpose (SIGKILL, SIGSTOP then
# SIGKILL) write nothing, and abort() is not a report (handle_abort=0, the
# default), so the fault tests need no exception. Suppressions live in
# tests/sanitizers/*.supp, each with its reason.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mode=${1:?usage: check_suite.sh asan|tsan|fuzz}
jobs=${JOBS:-2}
root=${BUILD_ROOT:-.}
src=$(pwd)

stage_start=$(date +%s)
elapsed() { echo $(( $(date +%s) - $1 )); }

case "$mode" in
  asan)
    dir="$root/build-asan"
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-g1 -DMC2_SANITIZE=address,undefined \
      -DMC2_BUILD_BENCH=OFF >/dev/null
    ;;
  tsan)
    dir="$root/build-tsan"
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-g1 -DMC2_SANITIZE=thread \
      -DMC2_BUILD_BENCH=OFF >/dev/null
    ;;
  fuzz)
    dir="$root/build-fuzz"
    CC=clang CXX=clang++ cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-g1 -DMC2_FUZZ=ON \
      -DMC2_BUILD_TESTS=OFF -DMC2_BUILD_BENCH=OFF \
      -DMC2_FUZZ_SECONDS="${MC2_FUZZ_SECONDS:-30}" >/dev/null
    ;;
  *) echo "check_suite.sh: unknown stage '$mode' (asan, tsan or fuzz)" >&2; exit 2 ;;
esac

build_start=$(date +%s)
if [ "$mode" = fuzz ]; then
  cmake --build "$dir" -j "$jobs" --target fuzzers
else
  cmake --build "$dir" -j "$jobs"
fi
build_s=$(elapsed "$build_start")

reports="$src/$dir/sanitizer-reports"
rm -rf "$reports"
mkdir -p "$reports"
supp="$src/tests/sanitizers"
# halt_on_error: the first report ends the process (and so the test);
# exitcode 66 tells a report apart from the program's own failures.
export ASAN_OPTIONS="log_path=$reports/asan:halt_on_error=1:exitcode=66:detect_leaks=1:detect_stack_use_after_return=0:strict_string_checks=1:suppressions=$supp/asan.supp"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp"
export UBSAN_OPTIONS="log_path=$reports/ubsan:halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp"
export TSAN_OPTIONS="log_path=$reports/tsan:halt_on_error=1:exitcode=66:second_deadlock_stack=1:suppressions=$supp/tsan.supp"

# The ASan stage also runs every collective and fused operator with strict
# mismatch checking (MC2_CHECK=1: fingerprints compared on every rank
# before data moves, eager path off), so the suite covers both modes: the
# normal and TSan stages run the default. Tests that need one mode set it.
if [ "$mode" = asan ]; then export MC2_CHECK=1; fi

ctest_args=(--test-dir "$dir" --output-on-failure -j "$jobs")
case "$mode" in
  # The packaging checks compile and link other programs against the build
  # and say nothing about memory or threads: the normal stage runs them.
  asan) ctest_args+=(-LE 'packaging|render') ;;
  # ThreadSanitizer costs 5-15x; it runs the layers where threads share
  # memory: everything but the packaging checks and the real-process
  # integration tests, whose processes run the same code as the in-process
  # tests (one progress thread each) and which ASan covers.
  tsan) ctest_args+=(-LE 'packaging|render|integration') ;;
  fuzz) ctest_args+=(-L fuzz) ;;
esac

run_start=$(date +%s)
status=0
ctest "${ctest_args[@]}" || status=$?
run_s=$(elapsed "$run_start")

if [ -n "$(ls -A "$reports")" ]; then
  echo "check_suite.sh $mode: sanitizer reports (each fails the stage):"
  for f in "$reports"/*; do
    echo "==== $f"
    cat "$f"
  done
  status=1
fi
echo "check_suite.sh $mode: build ${build_s} s, tests ${run_s} s, total $(elapsed "$stage_start") s: $([ $status -eq 0 ] && echo OK || echo FAILED)"
exit $status
