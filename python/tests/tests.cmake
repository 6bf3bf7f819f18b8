# The Python tests (label "python"): pytest files of python/tests run on
# 1..4 ranks under `mc2 run`, each rank running the same tests in the same
# order (collective calls match); -x ends a rank at its first failure, so
# the launcher tears the job down instead of leaving the others waiting.
# They need the built package (PYTHONPATH=build/python) and the mc2 command.
#
# Not run by the sanitizer stages: the extension is not built there (loading
# an instrumented library into Python needs the sanitizer runtime preloaded
# into the interpreter), so the tests carry neither "asan" nor "tsan".
#
# mc2_python_test(FILE RANKS...) adds python.<file>/<n> for each n. Each
# test starts N Python processes that import torch: seconds per test, most
# of it start-up.
function(mc2_python_test file)
  get_filename_component(name ${file} NAME_WE)
  foreach(n ${ARGN})
    set(test python.${name}/${n})
    add_test(NAME ${test}
             COMMAND $<TARGET_FILE:mc2_cli> run -n ${n}
                     ${MC2_PYTHON} -m pytest -x -q -p no:cacheprovider
                     ${CMAKE_CURRENT_SOURCE_DIR}/tests/${file})
    set_tests_properties(${test} PROPERTIES
      LABELS python TIMEOUT 300
      ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;MC2_TIMEOUT=60s;OMP_NUM_THREADS=1;MC2PY_TEST_CLI=$<TARGET_FILE:mc2_cli>"
      # Jobs check /dev/shm and the process table for leftovers (integration tests).
      RESOURCE_LOCK mc2_jobs)
  endforeach()
endfunction()

mc2_python_test(test_fused_bindings.py 1 2 3 4)
mc2_python_test(test_backend.py 1 2 3 4)
mc2_python_test(test_ddp.py 1 2 3)
mc2_python_test(test_compression.py 1 2 3 4)
# mc2.ddp.allreduce_hook with a heap too small for one of the buckets.
mc2_python_test(test_ddp_heap.py 2)
set_property(TEST python.test_ddp_heap/2 APPEND PROPERTY ENVIRONMENT "MC2_HEAP_BYTES=16M")
mc2_python_test(test_bad_input.py 1 2 3)
# Fault tests: each breaks its world on purpose.
mc2_python_test(test_bad_shapes.py 2)
mc2_python_test(test_dead_rank.py 2 3)

# A job that ends right after its DDP hooks' last collective exits cleanly,
# whichever way it leaves (exit_stress.py; a loaded machine, two busy
# loops, is where a thread left running at interpreter exit shows).
add_test(NAME python.exit_stress
         COMMAND ${MC2_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/tests/exit_stress.py
                 $<TARGET_FILE:mc2_cli> ${MC2_PYTHON} --runs 4 --other-runs 1
                 --hooks allreduce,bf16)
set_tests_properties(python.exit_stress PROPERTIES
  LABELS python TIMEOUT 600
  ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;MC2_TIMEOUT=60s"
  RESOURCE_LOCK mc2_jobs)

# The backend's own rendezvous (no `mc2 run`): ranks started as torchrun
# starts them, meeting through torch's TCP store.
add_test(NAME python.torchrun_style/2
         COMMAND ${MC2_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/tests/torchrun_style.py 2
                 ${MC2_PYTHON} -m pytest -x -q -p no:cacheprovider
                 ${CMAKE_CURRENT_SOURCE_DIR}/tests/test_backend.py
                 ${CMAKE_CURRENT_SOURCE_DIR}/tests/test_ddp.py)
set_tests_properties(python.torchrun_style/2 PROPERTIES
  LABELS python TIMEOUT 300
  ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;MC2_TIMEOUT=60s;OMP_NUM_THREADS=1"
  RESOURCE_LOCK mc2_jobs)

# torchrun itself (`python3 -m torch.distributed.run`, 2 workers) starting
# the backend's tests. `-r 1 -t 1`: Debian 12's torch 1.13 on Python 3.11
# fails to parse its default redirect setting ("0") before it starts any
# worker; naming one avoids that.
add_test(NAME python.torchrun/2
         COMMAND ${MC2_PYTHON} -m torch.distributed.run --standalone --nproc_per_node 2
                 -r 1 -t 1 -m pytest -x -q -p no:cacheprovider
                 ${CMAKE_CURRENT_SOURCE_DIR}/tests/test_backend.py)
set_tests_properties(python.torchrun/2 PROPERTIES
  LABELS python TIMEOUT 300
  ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;MC2_TIMEOUT=60s;OMP_NUM_THREADS=1"
  RESOURCE_LOCK mc2_jobs)

# A program written for torchrun runs under `mc2 run` unchanged: the
# launcher gives it torchrun's variables, MASTER_ADDR and MASTER_PORT
# included, for gloo as for mc2.
foreach(backend gloo mc2)
  add_test(NAME python.torchrun_script_${backend}/2
           COMMAND $<TARGET_FILE:mc2_cli> run -n 2 ${MC2_PYTHON}
                   ${CMAKE_CURRENT_SOURCE_DIR}/tests/torchrun_script.py ${backend})
  set_tests_properties(python.torchrun_script_${backend}/2 PROPERTIES
    LABELS python TIMEOUT 120
    ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;MC2_TIMEOUT=60s;OMP_NUM_THREADS=1"
    RESOURCE_LOCK mc2_jobs)
endforeach()

# Under torchrun, mc2's own calls join the world on first use, with
# torch.distributed uninitialised (it then runs on mc2) or on gloo.
foreach(mode mc2 gloo)
  add_test(NAME python.torchrun_first_use_${mode}/2
           COMMAND ${MC2_PYTHON} -m torch.distributed.run --standalone --nproc_per_node 2
                   -r 1 -t 1 ${CMAKE_CURRENT_SOURCE_DIR}/tests/first_use.py ${mode})
  set_tests_properties(python.torchrun_first_use_${mode}/2 PROPERTIES
    LABELS python TIMEOUT 120
    ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;MC2_TIMEOUT=60s;OMP_NUM_THREADS=1"
    RESOURCE_LOCK mc2_jobs)
endforeach()

# Without a launcher: mc2's error says how to start the program.
add_test(NAME python.no_launcher
         COMMAND ${MC2_PYTHON} -m pytest -x -q -p no:cacheprovider
                 ${CMAKE_CURRENT_SOURCE_DIR}/tests/test_no_launcher.py)
set_tests_properties(python.no_launcher PROPERTIES
  LABELS python TIMEOUT 120
  ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python")

# `cmake --install` of the package alone (component mc2_python) into a
# temporary prefix, imported from there by a job of 2 ranks that runs a
# fused operator; the prefix is removed afterwards.
add_test(NAME python.install
         COMMAND bash -c [=[
set -e
prefix=$(mktemp -d "${TMPDIR:-/tmp}/mc2-python-install.XXXXXX")
trap 'rm -rf "$prefix"' EXIT
cmake --install "$1" --prefix "$prefix" --component mc2_python > /dev/null
site="$prefix/$2"
cd "$prefix"
PYTHONPATH="$site" "$3" run -n 2 "$4" -c 'import mc2, torch
assert mc2.__file__.startswith("'"$site"'"), mc2.__file__
c = mc2._C.matmul_all_reduce(mc2.world(), torch.ones(2, 3), torch.ones(3, 4))
assert torch.equal(c, torch.full((2, 4), 6.0)), c'
]=] install-check ${PROJECT_BINARY_DIR} ${MC2_PYTHON_INSTALL_DIR} $<TARGET_FILE:mc2_cli>
                 ${MC2_PYTHON})
set_tests_properties(python.install PROPERTIES LABELS python TIMEOUT 120
                     RESOURCE_LOCK mc2_jobs)

# The fused operators as torch functions and the mc2.nn layers.
mc2_python_test(test_ops.py 1 2 3 4)
mc2_python_test(test_ops_moe.py 1 2 3 4)
mc2_python_test(test_nn.py 1 2 3 4)
# mc2.trace, read back by `mc2 trace report`.
mc2_python_test(test_trace.py 1 2)
mc2_python_test(test_trace_groups.py 2)
# examples/torch: TP + SP inside DDP on 4 ranks, equal to the unsharded
# model, and its trace read by `mc2 trace report`.
add_test(NAME python.example_tp_dp/4
         COMMAND ${PROJECT_SOURCE_DIR}/examples/torch/check.sh ${PROJECT_BINARY_DIR} ${MC2_PYTHON})
set_tests_properties(python.example_tp_dp/4 PROPERTIES
  LABELS python TIMEOUT 300
  ENVIRONMENT "MC2_TIMEOUT=60s;OMP_NUM_THREADS=1"
  RESOURCE_LOCK mc2_jobs)

# Under mpirun, without `mc2 run`: 4 ranks that claim 2 hosts of 2 ranks
# (MC2_HOSTNAME), so the world spans hosts over the net transport; an
# unchanged torch.distributed.init_process_group("mc2") (test_mpirun.py).
find_program(MC2_MPIRUN mpirun)
if(MC2_MPIRUN)
  # 4 ranks on this host over loopback, ranks 0-1 claiming host h0, 2-3 h1.
  set(mc2_mpirun_2x2 ${MC2_MPIRUN} --allow-run-as-root --oversubscribe -np 4
      --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo
      -x PYTHONPATH -x MC2_TIMEOUT -x OMP_NUM_THREADS -x MC2_HEAP_BYTES
      /bin/sh -c "MC2_HOSTNAME=h$((OMPI_COMM_WORLD_RANK / 2)) exec \"$0\" \"$@\"")
  add_test(NAME python.mpirun/2x2
           COMMAND ${mc2_mpirun_2x2}
                   ${MC2_PYTHON} -m pytest -x -q -p no:cacheprovider
                   ${CMAKE_CURRENT_SOURCE_DIR}/tests/test_mpirun.py)
  set_tests_properties(python.mpirun/2x2 PROPERTIES
    LABELS python TIMEOUT 300
    ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;MC2_TIMEOUT=60s;OMP_NUM_THREADS=1;MC2_HEAP_BYTES=64M"
    RESOURCE_LOCK mc2_jobs)
endif()
if(MC2_MPIRUN)
  add_test(NAME python.mpirun_fault/2x2
           COMMAND bash -c [=[
out=$("$@" 2>&1)
n=$(grep -o "1 passed" <<<"$out" | wc -l)  # ranks' lines may interleave
[ "$n" = 4 ] || { echo "$out"; echo "$n of 4 ranks passed"; exit 1; }
]=] mpirun-fault ${mc2_mpirun_2x2}
                   ${MC2_PYTHON} -m pytest -q -p no:cacheprovider
                   ${CMAKE_CURRENT_SOURCE_DIR}/tests/test_mpirun_fault.py)
  set_tests_properties(python.mpirun_fault/2x2 PROPERTIES
    LABELS python TIMEOUT 300
    ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;MC2_TIMEOUT=60s;OMP_NUM_THREADS=1;MC2_HEAP_BYTES=64M"
    RESOURCE_LOCK mc2_jobs)
endif()
