#!/usr/bin/env bash
# Installs the Debian packages mc2 needs to build, test and benchmark.
# Idempotent: packages already present are skipped, and apt is not touched at
# all when nothing is missing. Works as root or through sudo.
#
# Usage: scripts/install-deps.sh [--test]
#   --test  also what only the test suite and the benchmark scripts use:
#           Debian's chromium (the headless screenshot of the SVG timeline,
#           tests/trace/render_check.sh), python3 (bench/*.sh join JSON),
#           iproute2 and ethtool (the cluster in a box, scripts/cluster.sh),
#           python3-pytest (the Python package's tests)
set -euo pipefail

with_test=0
for arg in "$@"; do
  case "$arg" in
    --test) with_test=1 ;;
    *) echo "install-deps: unknown argument $arg (expected --test)" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake pkg-config
  libopenblas-dev          # f32 sgemm
  libdnnl-dev              # bf16 matmul (Debian's OpenBLAS has no sbgemm)
  libopenmpi-dev openmpi-bin  # multi-host engine and the comparison baseline
  libhwloc-dev             # topology
  libcli11-dev             # command line
  nlohmann-json3-dev       # tuning tables, traces, --json output
  libfmt-dev               # formatting
  libgtest-dev libgmock-dev  # tests
  libbenchmark-dev         # micro-benchmarks
  procps                   # ps/pgrep used by the leak checks in tests
  clang libclang-rt-14-dev # the fuzz targets (libFuzzer) of `make test-fuzz`
  libomp-14-dev            # OpenMP for the clang (fuzz) build
  python3-dev pybind11-dev # the Python package's extension (python/)
  python3-torch libtorch-dev  # PyTorch: tensors and the torch.distributed backend
)
if (( with_test )); then
  packages+=(chromium fonts-dejavu-core python3 iproute2 ethtool python3-pytest)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
