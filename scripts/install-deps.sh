#!/usr/bin/env bash
# Installs dlrec's build and test dependencies from Debian 12's packages.
# The CUDA toolkit is optional: with nvcc on the machine, the CUDA sources build too.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends \
  build-essential cmake make pkg-config git \
  nlohmann-json3-dev libcli11-dev libopenblas-dev \
  libgtest-dev libgmock-dev libsnappy-dev libzstd-dev \
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libcpp-httplib-dev
# Python packages used by tests/python (interop with pyarrow, protocol checks with tritonclient).
python3 -m pip install --quiet --disable-pip-version-check pytest pyarrow numpy 'tritonclient[http,grpc]' \
  || $SUDO apt-get install -y --no-install-recommends python3-pytest python3-numpy
# CUTLASS headers (NVIDIA's nvidia-cutlass package) for the fused GPU kernels in src/fused,
# only where the CUDA sources are built; without them those kernels are skipped (unfused paths).
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  python3 -m pip install --quiet --disable-pip-version-check nvidia-cutlass==4.2.0.0 \
    || echo "install-deps: nvidia-cutlass not installed; the fused CUDA kernels will not be built"
fi
