#!/usr/bin/env bash
# Sets up the Python package for the tests and benchmarks: a virtual environment (made once, at
# $OPTFUSE_VENV or ~/.cache/optfuse/venv) with torch from PyPI and the build tools, then
# `pip install .` of this checkout into it (incremental: the build stays in build/python).
# Prints the venv's python as its last line. Run scripts/setup.sh first (Debian packages).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${OPTFUSE_VENV:-$HOME/.cache/optfuse/venv}
PY="$VENV/bin/python"
if [[ ! -x "$PY" ]]; then
  echo "python_setup: making $VENV" >&2
  python3 -m venv "$VENV"
fi
# (ruff pinned: scripts/check_python_style.sh checks against its formatting, which versions change.)
RUFF=ruff==0.17.6
NEED=(torch numpy pytest matplotlib nanobind scikit-build-core ninja "$RUFF")
if ! "$PY" -c "import torch, numpy, pytest, matplotlib, nanobind, scikit_build_core, ninja" \
    2>/dev/null || [[ "$("$VENV/bin/ruff" --version 2>/dev/null)" != "ruff ${RUFF#ruff==}" ]]; then
  echo "python_setup: installing ${NEED[*]} (torch is large: minutes on a first run)" >&2
  "$PY" -m pip install -q --disable-pip-version-check "${NEED[@]}" >&2
fi
echo "python_setup: building and installing optfuse into $VENV" >&2
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$PY" -m pip install -q --disable-pip-version-check \
  --no-build-isolation --no-deps . --config-settings=build-dir=build/python >&2
echo "$PY"
