#!/usr/bin/env bash
# Sets up, builds (Release) and runs `optfuse demo`. Extra arguments go to the demo
# (e.g. `bash scripts/demo.sh --steps 20 --json`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --target optfuse-cli
exec "${OPTFUSE_BUILD_DIR:-build}/optfuse" demo "$@"
