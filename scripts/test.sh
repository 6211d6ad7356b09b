#!/usr/bin/env bash
# Sets up, builds everything (library, tools, tests, benchmarks, the Python package) and runs
# every test: Python style (ruff), CTest (C++), pytest (tests/python, against torch.optim), then the wheel a user
# installs (scripts/wheel_test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "test: CPU $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), AVX-512:" \
  "$(grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ' | sed 's/ $//' || true)"
[[ -n "$(grep -o 'avx512f' /proc/cpuinfo | head -1)" ]] || echo "test: no AVX-512 (AVX2 class)"
bash scripts/setup.sh
PY=$(bash scripts/python_setup.sh | tail -1)
bash scripts/check_python_style.sh  # ruff format and lint, as CTest `format` is for C++
BUILD_DIR=${OPTFUSE_BUILD_DIR:-build}
(cd "$BUILD_DIR" && ctest --output-on-failure -j"$(nproc)")
# A fresh kernel cache per build, so the Python tests compile as a new user's first run does.
OPTFUSE_CACHE_DIR="$PWD/$BUILD_DIR/pytest-cache" "$PY" -m pytest -q tests/python
# The wheel: built from build/python (compiled above), repaired, installed into a fresh venv and
# run where the system's Halide and LLVM cannot be found.
bash scripts/wheel_test.sh
