#!/usr/bin/env bash
# Sets up (Debian packages), builds, and runs every test. The README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${STRATA_SKIP_DEPS:-0}" != "1" ]; then bash scripts/install_deps.sh; fi
bash scripts/build.sh
ctest --test-dir build --output-on-failure --timeout 900 -j "${STRATA_JOBS:-2}"
