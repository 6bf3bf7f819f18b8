#!/usr/bin/env bash
# The instrumented stages of `make test` (see the Makefile):
#
#   scripts/check_suite.sh asan    the tests labelled "asan" under AddressSanitizer + UBSan
#   scripts/check_suite.sh tsan    the tests labelled "tsan" under ThreadSanitizer
#   scripts/check_suite.sh fuzz    every libFuzzer target for MC2_FUZZ_SECONDS
#
# Each configures its own tree (build-asan, build-tsan, build-fuzz;
# BUILD_ROOT prefixes them), builds only what its tests run, runs ctest
# there and prints how long the build and the run took. Which test runs
# under which sanitizer follows from what that sanitizer can find in it:
# the labels of tests/CMakeLists.txt and the exclusions below, each with its
# reason. Environment: JOBS (2), MC2_FUZZ_SECONDS (30).
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

# The sanitizer builds compile at -O1 (with NDEBUG, as Release): the
# optimisation level both sanitizers' documentation suggests, and it builds
# the instrumented tree in well under half the time of -O3 on a 2-core
# machine, which keeps `make test` inside CI's time.
sanitize_opt=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG")
case "$mode" in
  asan)
    dir="$root/build-asan"
    cmake -S . -B "$dir" "${sanitize_opt[@]}" -DCMAKE_CXX_FLAGS=-g1 -DMC2_SANITIZE=address,undefined \
      -DMC2_BUILD_BENCH=OFF >/dev/null
    ;;
  tsan)
    dir="$root/build-tsan"
    cmake -S . -B "$dir" "${sanitize_opt[@]}" -DCMAKE_CXX_FLAGS=-g1 -DMC2_SANITIZE=thread \
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

# Only the stage's test binaries and the programs they launch: the tools,
# the shared library and the packaging checks' targets are left out when no
# test of the stage needs them (check_<stage>_programs, tests/CMakeLists.txt).
build_start=$(date +%s)
if [ "$mode" = fuzz ]; then
  cmake --build "$dir" -j "$jobs" --target fuzzers
else
  cmake --build "$dir" -j "$jobs" --target "check_${mode}_programs"
fi
build_s=$(elapsed "$build_start")

reports="$src/$dir/sanitizer-reports"
rm -rf "$reports"
mkdir -p "$reports"
supp="$src/tests/sanitizers"
# halt_on_error: the first report ends the process (and so the test);
# exitcode 66 tells a report apart from the program's own failures.
export ASAN_OPTIONS="log_path=$reports/asan:halt_on_error=1:exitcode=66:detect_leaks=1:detect_stack_use_after_return=0:strict_string_checks=1:suppressions=$supp/asan.supp"
# print_suppressions=0: a run whose only leaks are suppressed writes no
# file (LeakSanitizer would otherwise log its table of suppressions used,
# which is not a report).
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="log_path=$reports/ubsan:halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp"
export TSAN_OPTIONS="log_path=$reports/tsan:halt_on_error=1:exitcode=66:second_deadlock_stack=1:suppressions=$supp/tsan.supp"

# The ASan stage also runs every collective and fused operator with strict
# mismatch checking (MC2_CHECK=1: fingerprints compared on every rank
# before data moves, eager path off), so the suite covers both modes: the
# normal and TSan stages run the default. Tests that need one mode set it.
if [ "$mode" = asan ]; then export MC2_CHECK=1; fi

ctest_args=(--test-dir "$dir" --output-on-failure -j "$jobs")
# What runs under each sanitizer is chosen by what that sanitizer can find;
# the normal stage runs every test. Binaries carry the labels "asan" and
# "tsan" (tests/CMakeLists.txt); the packaging, render and docs checks carry
# neither, since they compile other programs, drive a browser or run Python
# and exercise no library code of their own.
#
# Both sanitizers skip tests that only repeat code other tests of the stage
# run, where the repetition is what makes them expensive. Rank counts 2 and
# 3 (a power of two and not; on two CPUs, a CPU per rank and more ranks than
# CPUs) reach the branches of the algorithms' schedules and staging, and 4
# (a power of two with more ranks than CPUs) stays where it is cheap:
#   - the collective sweep at 5 and 8 ranks, and its large-message sweep
#     (the multi-window staging) at 4 as well;
#   - the per-algorithm tests at 5 and 8 ranks;
#   - the trace tests of small calls: loops of hundreds of calls that other
#     tests already make, traced and not, whose spans are counted
#     (tests/trace/overhead_test.cc carries no label at all);
#   - the models' learning tests: a hundred training steps through the code
#     one step of the other model tests runs.
same_code='Ranks/Sweep\.[A-Za-z]+/(5|8)$|Ranks/Sweep\.LargeMessagesMatchReference/4$'
same_code+='|Ranks/Algorithms\.[A-Za-z]+/n(5|8) |TraceRunTest\.SmallAllReduces'
same_code+='|\.LossDecreasesOnLearnableTask$'
case "$mode" in
  # AddressSanitizer + UBSan: every test binary, since all of them run
  # library code on memory, including the integration tests, the only ones
  # that run the launcher, the job's segments and the command-line tools.
  # Besides the repetitions above it skips: the process sample at 4-8 ranks
  # (its in-process twin and the 2- and 3-rank runs cover the same code),
  # bench ops' `--link auto` calibration (its time goes to GEMMs; the other
  # bench ops tests run the same tool code) and the idle-rank CPU test (it
  # waits a fixed time in code every other test runs).
  asan)
    skip="$same_code|Ranks/CasesOnProcesses\.[A-Za-z]+/(4|5|8)$"
    skip+='|BenchOpsLink\.LinkAutoCalibratesAgainstCompute|ProcessesTest\.IdleRankUsesUnderOnePercentOfACore'
    ctest_args+=(-L asan -E "$skip") ;;
  # ThreadSanitizer: the tests where threads share memory -- the engine and
  # transport, the collectives, the recorder, the fused operators and the
  # models that drive them. Not the binaries whose code under test runs on
  # one thread (parsers, reduction kernels, the cost model, trace files) or
  # that launch real processes (each rank runs the same code as the
  # in-process tests, one progress thread each): ASan runs those.
  tsan) ctest_args+=(-L tsan -E "$same_code") ;;
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
