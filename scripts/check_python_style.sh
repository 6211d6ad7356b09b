#!/usr/bin/env bash
# Fails when a Python file differs from what `ruff format` makes of it or has a lint finding
# (pyproject.toml's [tool.ruff]: line length, the rules checked and why some are not), as
# scripts/check_format.sh does for C++. Run by scripts/test.sh; ruff comes with the venv of
# scripts/python_setup.sh (pinned there: another version may format differently).
# To fix: scripts/check_python_style.sh --fix
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${OPTFUSE_VENV:-$HOME/.cache/optfuse/venv}
ruff=$(command -v "$VENV/bin/ruff" || command -v ruff || true)
if [[ -z "$ruff" ]]; then
  echo "python style: ruff not found (scripts/python_setup.sh installs it into $VENV)"
  exit 1
fi
# Every Python file of the repository, the `optfuse` command (no .py suffix) too.
files=(. python/scripts/optfuse)
if [[ "${1:-}" == "--fix" ]]; then
  "$ruff" format "${files[@]}"
  "$ruff" check --fix "${files[@]}"
  exit 0
fi
status=0
"$ruff" format --check "${files[@]}" || status=1
"$ruff" check "${files[@]}" || status=1
if ((status)); then
  echo "python style: run scripts/check_python_style.sh --fix (lint findings it cannot fix: by hand)"
  exit 1
fi
echo "python style: ruff format and ruff check clean ($("$ruff" --version))"
