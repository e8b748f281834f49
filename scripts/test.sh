#!/usr/bin/env bash
# Sets up (Debian packages and the project's venv with torch + DeepSpeed),
# builds, and runs every test: C++ and Python, all through ctest. The README's
# test command.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${STRATA_SKIP_DEPS:-0}" != "1" ]; then bash scripts/install_deps.sh; fi
STRATA_PYTHON="$(bash scripts/venv.sh)/bin/python"
export STRATA_PYTHON
bash scripts/build.sh
ctest --test-dir build --output-on-failure --timeout 900 -j "${STRATA_JOBS:-2}"
