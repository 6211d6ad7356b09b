#!/usr/bin/env bash
# The fuzz_smoke CTest test (tests/CMakeLists.txt): builds the libFuzzer targets of
# tests/fuzz/CMakeLists.txt with clang and runs each for a bounded time over a fresh corpus seeded
# from tests/fuzz/corpus/; fails on any crash, sanitizer report, leak, timeout or out-of-memory.
# Exits 77 (CTest: skipped) where clang++-14 or its libFuzzer is missing.
#   tests/fuzz/smoke.sh SOURCE_DIR BUILD_DIR [SECONDS_PER_TARGET]
# OPTFUSE_FUZZ_CXX picks the compiler (default clang++-14), OPTFUSE_FUZZ_JOBS the build's -j (2).
set -euo pipefail
src=$1
build=$2
seconds=${3:-15}
cxx=${OPTFUSE_FUZZ_CXX:-clang++-14}

skip() {
  echo "fuzz_smoke: skipped: $1 (scripts/setup.sh installs clang-14 and libclang-rt-14-dev)"
  exit 77
}
command -v "$cxx" >/dev/null || skip "$cxx not found"
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  >"$probe/probe.cpp"
"$cxx" -fsanitize=fuzzer,address,undefined "$probe/probe.cpp" -o "$probe/probe" 2>/dev/null ||
  skip "$cxx cannot link -fsanitize=fuzzer,address,undefined (no libFuzzer runtime)"

start=$SECONDS
cmake -S "$src/tests/fuzz" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
cmake --build "$build" -j"${OPTFUSE_FUZZ_JOBS:-2}" >"$build/build.log" 2>&1 ||
  { tail -n 40 "$build/build.log"; echo "fuzz_smoke: the build failed"; exit 1; }
echo "fuzz_smoke: built in $((SECONDS - start)) s"

# (A crash exits libFuzzer with 77, CTest's skip code here: it is turned into status 1.)
status=0
for target in graph_text graph_json optim_config; do
  work=$build/corpus/$target  # new inputs go here: the committed seeds stay as they are
  artifacts=$build/artifacts/$target/
  log=$build/fuzz_$target.log
  rm -rf "$work" "$artifacts"
  mkdir -p "$work" "$artifacts"
  if "$build/fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -dict="$src/tests/fuzz/$target.dict" -artifact_prefix="$artifacts" \
    "$work" "$src/tests/fuzz/corpus/$target" >"$log" 2>&1; then
    echo "fuzz_$target: ok, $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$log")"
  else
    tail -n 60 "$log"
    echo "fuzz_$target: FAILED: the input is in $artifacts, the log in $log"
    status=1
  fi
done
exit $status
