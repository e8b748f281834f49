#!/usr/bin/env bash
# Creates (or reuses) the project's Python virtual environment: Debian's
# /usr/bin/python3 (3.11) + the peers the tests and benchmarks run in the same
# process as ours: torch (current PyPI build), DeepSpeed, pytest, Hugging Face
# transformers (its Trainer), matplotlib. Never touches the system Python.
#
#   bash scripts/venv.sh            # creates .venv (or $STRATA_VENV), prints its path
#   source "$(bash scripts/venv.sh)/bin/activate"
#
# Versions are pinned so test tolerances and the bench's peers are the ones
# measured; bump them together with the figures in docs/.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${STRATA_VENV:-$PWD/.venv}"
STAMP="$VENV/.strata-venv-3"
if [ ! -f "$STAMP" ]; then
  if [ ! -x "$VENV/bin/python" ]; then
    /usr/bin/python3 -m venv "$VENV" >&2
  fi
  # --no-cache-dir: torch's CUDA wheels are ~3 GB; a cached copy beside the
  # installed one doubled what a fresh machine needs on disk.
  "$VENV/bin/python" -m pip install -q --no-cache-dir --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q --no-cache-dir \
    "torch==2.15.0" "deepspeed==0.19.8" "pytest>=8" "numpy" "transformers" \
    "matplotlib" "ninja" "pybind11" >&2
  touch "$STAMP"
fi
# accelerate: the runtime of Hugging Face's Trainer (tests/python/test_hf_trainer.py).
[ -f "$VENV/.strata-venv-accelerate" ] || { "$VENV/bin/python" -m pip install -q --no-cache-dir "accelerate==1.15.0" >&2 && touch "$VENV/.strata-venv-accelerate"; }
echo "$VENV"
