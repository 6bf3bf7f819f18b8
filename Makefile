# Newcomer entry points. Each target installs what is missing (Debian
# packages, through scripts/install-deps.sh), configures and builds, so on a
# fresh Debian 12 machine nothing beyond `make` itself is needed first.
#
#   make demo    install deps, build (Release, build/), run the main demo
#   make test    install deps, build, run the whole test suite
#   make build   install deps, configure and build
#   make clean   remove the build directory
#
# Variables: BUILD_DIR (build), BUILD_TYPE (Release), JOBS (2),
# CMAKE_ARGS (extra arguments to the configure step).

BUILD_DIR  ?= build
BUILD_TYPE ?= Release
JOBS       ?= 2
CMAKE_ARGS ?=

# The steps depend on each other in order; never run them in parallel.
.NOTPARALLEL:
.PHONY: all deps configure build demo test clean

all: build

deps:
	bash scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	$(BUILD_DIR)/tools/mc2 bench all_reduce -n 4 -b 8 -e 64M -f 4 -c 1

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD_DIR)
