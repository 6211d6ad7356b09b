#!/usr/bin/env bash
# Sets up, builds everything (library, tools, tests, benchmarks) and runs every test with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cd "${OPTFUSE_BUILD_DIR:-build}"
ctest --output-on-failure -j"$(nproc)"
