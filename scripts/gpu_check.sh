#!/usr/bin/env bash
# The GPU check: pack here (no GPU needed), run on a machine with an NVIDIA GPU and its driver but
# none of this project's libraries. See bench/README.md ("GPU check") for the device invocation.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/gpu_check.sh pack [BUILD_DIR]   (here: Release build + self-contained archive)
       scripts/gpu_check.sh run                (there: unpack, run the GPU test and benchmark)
       scripts/gpu_check.sh --help

pack  builds test_cuda_ptx, test_device_tensors, bench_gpu and the optfuse CLI (Release, BUILD_DIR default build/),
      copies them with their shared-library closure (ldd; libcuda excluded, it comes with the
      driver; libz3 and ICU's data replaced by stubs, never called) into .gpucheck/, and compresses that into .gpucheck/optfuse-gpucheck.tar.xz. glibc
      and its loader are packed too, but used only if the binaries do not start with the host's.
      An unpacked xz (with its own glibc) is kept next to the archive for hosts without xz.
run   unpacks the archive into a temporary folder under /tmp, prints nvidia-smi if present, runs
      test_cuda_ptx and test_device_tensors (the Optimizer on device tensors; their device tests
      must RUN, not skip, when a device exists) and bench_gpu
      (fused AdamW vs the 4r3w ceiling graph vs cuMemcpyDtoD at 2^24, 2^26, 2^28), and writes
      logs and summary.txt to $OUT (or .gpucheck/out if $OUT is unset).
      Exit status: 0 passed, 77 skipped (no CUDA driver or device), 1 failed.
Environment: BENCH_MIN_TIME (default 0.2 s per benchmark), OPTFUSE_GPU_TARGET (Halide target).
EOF
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACK="$ROOT/.gpucheck"
ARCHIVE="$PACK/optfuse-gpucheck.tar.xz"
# glibc and its loader: not used from the bundle unless the host's glibc cannot run the binaries.
GLIBC_RE='/(ld-linux[^/]*|libc|libm|libdl|libpthread|librt|libresolv|libutil)\.so[.0-9]*$'

pack() {
  local build="${1:-$ROOT/build}"
  cmake -S "$ROOT" -B "$build" -DCMAKE_BUILD_TYPE=Release > /dev/null
  cmake --build "$build" -j2 --target test_cuda_ptx test_device_tensors bench_gpu optfuse-cli
  rm -rf "$PACK/stage" "$PACK/xz" "$ARCHIVE"
  mkdir -p "$PACK/stage/bin" "$PACK/stage/lib" "$PACK/stage/glibc" "$PACK/xz"
  local bins=("$build/tests/test_cuda_ptx" "$build/tests/test_device_tensors" "$build/bench/bench_gpu"
              "$build/optfuse")
  cp "${bins[@]}" "$PACK/stage/bin/"
  local lib
  for lib in $(ldd "${bins[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' |
               sort -u); do
    case "$lib" in
      */libcuda.so*) continue ;;
    esac
    if [[ "$lib" =~ $GLIBC_RE ]]; then
      cp -L "$lib" "$PACK/stage/glibc/"
    else
      cp -L "$lib" "$PACK/stage/lib/"
    fi
  done
  stub_unused_libs "$PACK/stage/lib"
  (cd "$ROOT" && git rev-parse HEAD 2>/dev/null || echo unknown) > "$PACK/stage/COMMIT"
  # The loader under its standard name, whatever path ldd printed for it.
  cp -L "$(ldd /bin/sh | awk '/ld-linux/ {print $1}')" "$PACK/stage/glibc/ld-linux-x86-64.so.2"
  tar -C "$PACK/stage" -cf - . | xz -9e -T2 > "$ARCHIVE"
  # xz for hosts without one: the binary, liblzma and glibc, run through the packed loader.
  cp -L "$(command -v xz)" "$PACK/xz/"
  for lib in $(ldd "$(command -v xz)" | awk '$3 ~ /^\// {print $3}'); do cp -L "$lib" "$PACK/xz/"; done
  cp -L "$PACK/stage/glibc/ld-linux-x86-64.so.2" "$PACK/xz/"
  rm -rf "$PACK/stage"
  du -b "$ARCHIVE" "$PACK/xz" | sed 's/^/packed: /'
  echo "total: $(du -sb "$PACK" | cut -f1) bytes in $PACK (carry [\".gpucheck\"]; limit 64 MiB)"
}

# libLLVM needs libz3 (its SMT solver API) and, through libxml2, ICU's 31 MB data library at load
# time; neither is ever called when optfuse compiles kernels. Replace them with stubs (Z3_*
# functions that abort, an empty icudt*_dat) to keep the archive small: ~8 MB less compressed.
stub_unused_libs() {
  local lib="$1" tmp f
  tmp="$(mktemp -d)"
  for f in "$lib"/libz3.so.*; do
    [[ -e "$f" ]] || continue
    { echo '#include <stdlib.h>'
      nm -D --undefined-only "$lib"/libLLVM*.so* | awk '/ Z3_/ {print "void " $2 "(void) { abort(); }"}'
    } > "$tmp/z3.c"
    cc -shared -fPIC -O2 -o "$f" -Wl,-soname,"$(basename "$f")" "$tmp/z3.c"
  done
  for f in "$lib"/libicudata.so.*; do
    [[ -e "$f" ]] || continue
    nm -D --undefined-only "$lib"/libicuuc.so.* | awk '/ icudt[0-9]+_dat/ {
      print "const char " $2 "[16] __attribute__((aligned(16))) = {0};" }' > "$tmp/icu.c"
    cc -shared -fPIC -o "$f" -Wl,-soname,"$(basename "$f")" "$tmp/icu.c"
  done
  rm -rf "$tmp"
}

run() {
  [[ -f "$ARCHIVE" ]] || { echo "no $ARCHIVE: run 'scripts/gpu_check.sh pack' first" >&2; return 1; }
  local out="${OUT:-$PACK/out}" dir
  mkdir -p "$out"
  dir="$(mktemp -d /tmp/optfuse-gpucheck.XXXXXX)"
  if command -v xz > /dev/null; then
    xz -dc "$ARCHIVE" | tar -C "$dir" -xf -
  else
    "$PACK/xz/ld-linux-x86-64.so.2" --library-path "$PACK/xz" "$PACK/xz/xz" -dc "$ARCHIVE" |
      tar -C "$dir" -xf -
  fi
  export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # Host glibc first; the packed one (through its loader) if the binaries do not start with it.
  local -a exec_with=()
  local glibc=host
  if ! "$dir/bin/optfuse" --help > "$out/start.log" 2>&1; then
    exec_with=("$dir/glibc/ld-linux-x86-64.so.2" --library-path "$dir/lib:$dir/glibc")
    glibc="packed (the host's could not start the binaries: see start.log)"
    "${exec_with[@]}" "$dir/bin/optfuse" --help >> "$out/start.log" 2>&1 ||
      { echo "the packed binaries do not start: see $out/start.log" >&2; return 1; }
  fi
  {
    echo "optfuse GPU check, commit $(cat "$dir/COMMIT"), $(date -u +%FT%TZ), $(uname -srm)"
    echo "glibc: $glibc"
    if command -v nvidia-smi > /dev/null; then nvidia-smi; else echo "nvidia-smi: not found"; fi
  } > "$out/env.log" 2>&1
  cat "$out/env.log"

  local test_rc=0 bench_rc=0
  # Per-test timeout guard: the device test runs 7 optimizers at n = 10^6 (seconds on a GPU).
  (cd "$dir" && timeout 300 "${exec_with[@]}" "$dir/bin/test_cuda_ptx" \
     --gtest_output="xml:$out/test_cuda_ptx.xml") > "$out/test_cuda_ptx.log" 2>&1 || test_rc=$?
  local device_test
  device_test="$(device_test_state "$out/test_cuda_ptx.log" CudaEngine.RunsOnADeviceLikeTheCpu)"
  # The Optimizer on device tensors (state on the device, save / load, the C API).
  local optim_rc=0 optim_test
  (cd "$dir" && timeout 300 "${exec_with[@]}" "$dir/bin/test_device_tensors" \
     --gtest_output="xml:$out/test_device_tensors.xml") > "$out/test_device_tensors.log" 2>&1 ||
    optim_rc=$?
  optim_test="$(device_test_state "$out/test_device_tensors.log" DeviceOptimizer.MatchesTheCpuOptimizer)"
  (cd "$dir" && timeout 400 "${exec_with[@]}" "$dir/bin/bench_gpu" \
     --benchmark_min_time="${BENCH_MIN_TIME:-0.2}" \
     --benchmark_out="$out/bench_gpu.json" --benchmark_out_format=json \
     --benchmark_counters_tabular=true) > "$out/bench_gpu.log" 2>&1 || bench_rc=$?

  summary "$out" "$test_rc" "$device_test" "$bench_rc" "$optim_rc" "$optim_test" |
    tee "$out/summary.txt"
  rm -rf "$dir"
  if [[ $test_rc -ne 0 || $device_test == FAILED || $optim_rc -ne 0 || $optim_test == FAILED ||
        ($bench_rc -ne 0 && $bench_rc -ne 77) ]]; then
    return 1
  fi
  if [[ $device_test == skipped* || $optim_test == skipped* || $bench_rc -eq 77 ]]; then
    # A device test that skips while the benchmark ran (or the reverse) is a failure.
    [[ $device_test == skipped* && $optim_test == skipped* && $bench_rc -eq 77 ]] || return 1
    return 77
  fi
  return 0
}

# "passed", "skipped (why)" or "FAILED" for GoogleTest test $2 in log $1.
device_test_state() {
  local log="$1" name="$2"
  if grep -q "^\[  SKIPPED \] $name" "$log"; then
    echo "skipped ($(grep -o 'no CUDA device.*' "$log" | head -1))"
  elif grep -q "^\[       OK \] $name" "$log"; then
    echo "passed"
  else
    echo "FAILED"
  fi
}

# One screen: test results, and GB/s of AdamW, the ceiling and the copy with the ratios per size.
summary() {
  local out="$1" test_rc="$2" device_test="$3" bench_rc="$4" optim_rc="$5" optim_test="$6"
  echo "== optfuse GPU check summary =="
  echo "test_cuda_ptx: exit $test_rc; $(grep -E '^\[  (PASSED|FAILED) +\]' "$out/test_cuda_ptx.log" |
    tr '\n' ' ')"
  echo "device run test (CudaEngine.RunsOnADeviceLikeTheCpu): $device_test"
  echo "test_device_tensors: exit $optim_rc; $(grep -E '^\[  (PASSED|FAILED) +\]' \
    "$out/test_device_tensors.log" | tr '\n' ' ')"
  echo "device optimizer test (DeviceOptimizer.MatchesTheCpuOptimizer): $optim_test"
  echo "bench_gpu: exit $bench_rc$([[ $bench_rc -eq 77 ]] && echo ' (skipped: no CUDA device)')"
  grep -m1 -o "no CUDA device[^\"']*" "$out/bench_gpu.log" || true
  [[ $bench_rc -eq 0 ]] || return 0
  # Parse the JSON without python: one benchmark object per "name" ... "bytes_per_second" run.
  printf "%-10s %12s %12s %12s %10s %10s\n" n "AdamW GB/s" "4r3w GB/s" "copy GB/s" AdamW/copy \
    AdamW/4r3w
  awk '
    match($0, /"name": *"[^"]*"/) { v = substr($0, RSTART, RLENGTH); sub(/"name": *"/, "", v)
                                    sub(/"$/, "", v); name = v }
    match($0, /"bytes_per_second": *[-+.0-9eE]+/) {
      v = substr($0, RSTART, RLENGTH); sub(/.*: */, "", v); split(name, p, "/")
      bps[p[1], p[2]] = v + 0; sizes[p[2]] = 1 }
    END {
      for (s in sizes) {
        a = bps["BM_GPU_AdamW_Fused", s]; c = bps["BM_GPU_Ceiling_4R3W", s]
        d = bps["BM_GPU_CopyDtoD", s]
        printf "2^%-8d %12.1f %12.1f %12.1f %10.3f %10.3f\n", log(s) / log(2), a / 1e9, c / 1e9,
               d / 1e9, (d > 0 ? a / d : 0), (c > 0 ? a / c : 0)
      }
    }' "$out/bench_gpu.json" | sort -V
  echo "(traffic GB/s: 28 B/element for all three; a DtoD copy of S bytes counts 2 S)"
  grep -m1 -o '"label": "adamw[^"]*' "$out/bench_gpu.json" | sed 's/"label": "/kernel: /' || true
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) rc=0; run || rc=$?; echo "gpu_check: exit $rc"; exit $rc ;;
  -h | --help | help) usage ;;
  *) usage >&2; exit 2 ;;
esac
