#!/usr/bin/env bash
# Time to first step, cold vs warm cache: `optfuse demo` start-up (engine creation until every
# kernel of the first step is ready to call), each run a fresh process.
#   cold: an empty cache directory (Halide compiles the kernel and the runtime)
#   warm: the directory the cold run filled (no compilation: objects read, checked, loaded)
# Usage: bench/warm_start.sh [path/to/optfuse] [runs]   (default build/optfuse, 5 runs)
set -euo pipefail
cli=${1:-build/optfuse}
runs=${2:-5}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(demo --layers 2 --d-model 256 --vocab 1024 --steps 1 --json)
field() { python3 -c "import json,sys; j=json.load(sys.stdin); print(j['$1'], j['kernels_compiled'], j['runtime_compiles'], j['disk_hits'])"; }
echo "run  kind  startup_ms  kernels_compiled  runtime_compiles  disk_hits"
for i in $(seq "$runs"); do
  rm -rf "$dir/cache"
  echo "$i    cold  $("$cli" "${args[@]}" --cache-dir "$dir/cache" 2>/dev/null | field startup_ms)"
  echo "$i    warm  $("$cli" "${args[@]}" --cache-dir "$dir/cache" 2>/dev/null | field startup_ms)"
done
