#!/usr/bin/env bash
# Installs strata's build and test dependencies from Debian 12's packages.
# CUDA 13 is expected under /usr/local/cuda where present; without it the
# build leaves the CUDA device out.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends \
  build-essential cmake ninja-build pkg-config git clang ca-certificates \
  libabsl-dev libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc \
  libhwy-dev liburing-dev libaio-dev libgoogle-glog-dev libgflags-dev libxxhash-dev \
  nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev \
  fio python3 python3-torch python3-numpy
$SUDO apt-get install -y -q --no-install-recommends pybind11-dev python3-dev  # python/: the strata package's extension
$SUDO apt-get install -y -q --no-install-recommends libclang-rt-14-dev  # scripts/ci_hardening.sh: the ASan/UBSan/libFuzzer runtimes
