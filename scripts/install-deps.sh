#!/usr/bin/env bash
# Installs dlrec's build and test dependencies: apt packages from Debian 12 (bookworm), whose
# versions are fixed by the release, and PyPI packages pinned (==) in requirements-*.txt.
# The CUDA toolkit is optional: with nvcc on the machine, the CUDA sources build too.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends \
  build-essential cmake make pkg-config git \
  nlohmann-json3-dev libcli11-dev libopenblas-dev \
  libgtest-dev libgmock-dev libsnappy-dev libzstd-dev zlib1g-dev liblz4-dev libbrotli-dev \
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libcpp-httplib-dev \
  clang-14 libclang-rt-14-dev \
  openmpi-bin libopenmpi-dev procps \
  librocksdb-dev redis-server libhiredis-dev \
  pybind11-dev python3-dev
# pybind11-dev (2.10.3 in Debian 12) and python3-dev (Python's headers) build the Python
# package's extension module (python/, docs/PYTHON.md) in the normal build and in `pip install .`.
# openmpi-bin libopenmpi-dev: Open MPI 4.1 (Debian 12) for training across processes (mpirun,
# docs/DISTRIBUTED.md); tests/dist runs jobs of 2 to 4 ranks with it, and procps' pgrep finds a
# rank to kill in the dead-rank test.
# librocksdb-dev (RocksDB 7.8.3 in Debian 12): the tiered embedding store's persistent tier
# (src/store, docs/SERVING.md); redis-server (7.0.15) and libhiredis-dev (0.14.1): its Redis
# tier and the tests that start a Redis on a loopback port (issue 22). Without them the tiers
# are left out of the build (cmake/Store.cmake says so) and their tests skip visibly.
# clang-14 and libclang-rt-14-dev (Debian 12's clang and its compiler-rt: ASan, UBSan, TSan,
# libFuzzer) build the sanitizer and fuzzing stage of CI (scripts/ci-sanitizers.sh).
PIP="python3 -m pip install --quiet --disable-pip-version-check"
# Python packages used by tests/python (every one pinned, transitive ones included).
$PIP -r requirements-test.txt
# CUTLASS headers for the fused GPU kernels in src/fused, only where the CUDA sources build;
# without them those kernels are skipped (unfused paths).
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  $PIP -r requirements-cuda.txt \
    || echo "install-deps: nvidia-cutlass or nvidia-cusparselt-cu13 not installed; the fused CUDA kernels or the 2:4 sparse GEMMs will not be built"
fi
