#!/usr/bin/env bash
# Configures and builds strata into build/ (executables in build/bin/).
# STRATA_WERROR=ON turns warnings into errors (CI sets it).
# STRATA_PYTHON=<venv>/bin/python registers the Python tests (scripts/test.sh sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSTRATA_WERROR="${STRATA_WERROR:-OFF}" -DSTRATA_PYTHON="${STRATA_PYTHON:-}"
cmake --build build -j "${STRATA_JOBS:-2}"
