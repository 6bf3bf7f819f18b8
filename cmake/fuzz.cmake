# -DMC2_FUZZ=ON builds the libFuzzer targets of fuzz/ (see fuzz/CMakeLists.txt).
# It needs clang (CC=clang CXX=clang++; Debian's clang ships libFuzzer in
# libclang-rt-14-dev) and instruments every target of the build: coverage for
# the fuzzer (fuzzer-no-link), plus ASan and UBSan so that a memory error or
# undefined behaviour is a crash the fuzzer reports. Use a build directory of
# its own (`make test-fuzz` uses build-fuzz/).
option(MC2_FUZZ "Build the libFuzzer targets (clang only)" OFF)
if(MC2_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MC2_FUZZ=ON needs clang: configure with CC=clang CXX=clang++ "
                        "(Debian: apt-get install clang libclang-rt-14-dev)")
  endif()
  if(MC2_SANITIZE)
    message(FATAL_ERROR "MC2_FUZZ=ON brings its own sanitizers: leave MC2_SANITIZE empty")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
