#!/usr/bin/env bash
# The README's C++ program (examples/quickstart.cpp) twice over an empty cache directory: the
# first process compiles its kernels, the second loads them from the disk cache and compiles none.
set -euo pipefail
exe=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export OPTFUSE_CACHE_DIR="$work/cache"
first=$("$exe")
echo "first run:  $first"
second=$("$exe")
echo "second run: $second"
grep -Eq " [1-9][0-9]* kernels compiled" <<<"$first" || { echo "FAIL: the cold run compiled nothing"; exit 1; }
grep -Eq " 0 kernels compiled, [1-9][0-9]* objects from the disk cache" <<<"$second" ||
  { echo "FAIL: the second run did not start from the disk cache"; exit 1; }
