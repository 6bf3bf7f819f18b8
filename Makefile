# Newcomer entry points. Each target installs what is missing (Debian
# packages, through scripts/install-deps.sh), configures and builds, so on a
# fresh Debian 12 machine nothing beyond `make` itself is needed first.
#
#   make demo    install deps, build (Release, build/), run the main demo
#   make test    install deps, build, run the whole test suite: the normal
#                build (test-quick), then the tests each sanitizer can find
#                something in under ASan+UBSan (test-asan) and
#                ThreadSanitizer (test-tsan), then every fuzz target for
#                30 s (test-fuzz); CI runs this (.ci/run)
#   make test-quick   only the normal build and suite (the quick check)
#   make test-asan / test-tsan / test-fuzz   one instrumented stage, in its
#                own build directory (build-asan, build-tsan, build-fuzz;
#                scripts/check_suite.sh says which tests each runs and
#                why); any sanitizer report fails it
#   make build   install deps, configure and build
#   make clean   remove the build directories
#
# Variables: BUILD_DIR (build), BUILD_TYPE (Release), JOBS (2),
# CMAKE_ARGS (extra arguments to the configure step), MC2_FUZZ_SECONDS (30).

BUILD_DIR  ?= build
BUILD_TYPE ?= Release
JOBS       ?= 2
CMAKE_ARGS ?=

# The steps depend on each other in order; never run them in parallel.
.NOTPARALLEL:
.PHONY: all deps deps-test configure build demo test test-quick test-asan test-tsan test-fuzz clean

all: build

deps:
	bash scripts/install-deps.sh

# What only the tests need beyond the build (chromium for the timeline
# screenshot check, python3 for the benchmark scripts).
deps-test:
	bash scripts/install-deps.sh --test

configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	$(BUILD_DIR)/tools/mc2 demo

# The stages run in order and the first failure stops `make test`.
test: test-quick test-asan test-tsan test-fuzz

test-quick: deps-test build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

test-asan test-tsan test-fuzz: deps
	JOBS=$(JOBS) bash scripts/check_suite.sh $(@:test-%=%)

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-fuzz
