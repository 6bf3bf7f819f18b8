# Sanitizer builds: -DMC2_SANITIZE=address,undefined (ASan + UBSan) or
# -DMC2_SANITIZE=thread (TSan), applied to every target of the build (the
# library, tools, tests and the programs the tests launch), so a report can
# come from any process of a job. `make test-asan` / `make test-tsan` build
# and run the suite this way (see the Makefile and tests/sanitizers/).
#
# Every report must fail the run, whatever process it comes from:
# - -fno-sanitize-recover=all makes a UBSan finding abort the process like an
#   ASan one instead of printing and carrying on;
# - the Makefile also sets log_path for all three runtimes and fails when any
#   report file appears, which catches reports from processes whose exit
#   status nobody looks at (a rank ended by the launcher, a survivor of a
#   fault test that exits non-zero on purpose).
set(MC2_SANITIZE "" CACHE STRING "Sanitizers: '', 'address,undefined', 'address', 'undefined' or 'thread'")
if(MC2_SANITIZE)
  if(NOT MC2_SANITIZE MATCHES "^(address,undefined|undefined,address|address|undefined|thread)$")
    message(FATAL_ERROR "MC2_SANITIZE='${MC2_SANITIZE}' is invalid: expected address,undefined, "
                        "address, undefined or thread")
  endif()
  add_compile_options(-fsanitize=${MC2_SANITIZE} -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${MC2_SANITIZE})
  # Tells tests that measure speed (e.g. the tracing overhead test) that the
  # build is instrumented, so they can relax their bounds or skip.
  add_compile_definitions(MC2_SANITIZED=1)
endif()
